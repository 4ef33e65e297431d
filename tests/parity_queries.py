"""Keyword arguments for search_messages that exercise every path of the search contract.

Parity suites run each entry against a legacy store and its upgraded copy and require the
same rows, order, snippets and context. The words are common in agent transcripts (Python
from the stdlib, shell output, tool-call JSON, CJK chat) so that most entries have hits.
"""

from __future__ import annotations

from typing import Any

PARITY_QUERIES: list[dict[str, Any]] = [
    # --- plain words (word index, BM25 rank) ---
    {"query": "def"},
    {"query": "import"},
    {"query": "return self"},
    {"query": "error"},
    {"query": "test file"},
    {"query": "terminal"},
    {"query": "function"},
    {"query": "Traceback"},
    {"query": "python"},
    {"query": "DEF"},
    {"query": "exit code"},
    # --- quoted phrases, kept verbatim (special characters inside them included) ---
    {"query": '"import os"'},
    {"query": '"return self"'},
    {"query": '"no such file or directory"'},
    {"query": '"def __init__"'},
    {"query": '"name": "terminal"'},
    {"query": '"self.assertEqual(x, y)" def'},
    # --- prefixes and stars ---
    {"query": "pyth*"},
    {"query": "imp* ret*"},
    {"query": "***def"},
    {"query": "te**"},
    {"query": "*"},
    {"query": "def *return"},
    # --- boolean operators ---
    {"query": "error OR exception"},
    {"query": "def AND return"},
    {"query": "import NOT os"},
    {"query": "self OR error NOT test"},
    {"query": "def and return"},
    {"query": "def AND AND return"},
    # --- NEAR ---
    {"query": "NEAR(def return)"},
    {"query": "NEAR(def return, 5)"},
    {"query": "def NEAR return"},
    # --- dotted, hyphenated and underscored terms ---
    {"query": "os.path"},
    {"query": "os.path.join"},
    {"query": "chat-send"},
    {"query": "P2.2"},
    {"query": "my-app.config.ts"},
    {"query": "foo_bar"},
    {"query": "__init__"},
    {"query": "tool_calls"},
    {"query": "sys.argv[1]"},
    {"query": "v1.2.3-rc1"},
    {"query": "self.assertEqual"},
    # --- column-operator lookalikes ---
    {"query": "TODO: fix"},
    {"query": "content: foo"},
    {"query": "content:error"},
    {"query": "role: assistant"},
    {"query": "{content}: def"},
    # --- unmatched quotes ---
    {"query": '"unterminated def'},
    {"query": 'def "return'},
    {"query": '"import" "os'},
    # --- leading and trailing operators ---
    {"query": "AND def OR"},
    {"query": "NOT error"},
    {"query": "OR"},
    {"query": "return NOT"},
    {"query": "and import"},
    {"query": "Not test"},
    # --- CJK: 1, 2 and 3+ characters, Chinese, Japanese, Korean ---
    {"query": "的"},
    {"query": "数据"},
    {"query": "数据库"},
    {"query": "数据库连接"},
    {"query": "です"},
    {"query": "ありがとう"},
    {"query": "テスト"},
    {"query": "합니다"},
    {"query": "확인"},
    {"query": "한"},
    {"query": "中文。"},
    {"query": '"数据库"'},
    {"query": "数据-库"},
    # --- mixed CJK and Latin ---
    {"query": "Python 编程"},
    {"query": "python 数据库"},
    {"query": "error 的"},
    {"query": "terminal テスト"},
    # --- CJK with operators ---
    {"query": "数据库 OR 服务器"},
    {"query": "数据库 AND 连接"},
    {"query": "数据库 NOT 错误"},
    {"query": "测试文件 NOT 错误信息"},
    {"query": "数据库 NOT NOT 服务器"},
    {"query": "AND 数据库 OR"},
    # --- CJK LIKE-scan escaping ---
    {"query": "100%的"},
    {"query": "数_据"},
    {"query": "路径\\的"},
    # --- filters: source, exclude, role, empty lists, combinations ---
    {"query": "def", "source_filter": ["cli"]},
    {"query": "def", "source_filter": ["telegram", "discord"]},
    {"query": "def", "exclude_sources": ["cli"]},
    {"query": "def", "source_filter": []},
    {"query": "def", "exclude_sources": []},
    {"query": "def", "source_filter": ["cli", "slack"], "exclude_sources": ["cli"]},
    {"query": "def", "role_filter": ["assistant"]},
    {"query": "def", "role_filter": []},
    {"query": "error", "role_filter": ["tool"], "source_filter": ["cli", "slack"]},
    {"query": "terminal", "role_filter": ["tool", "assistant"], "exclude_sources": ["whatsapp"]},
    {"query": "system", "role_filter": ["system"]},
    {"query": "数据库", "source_filter": ["telegram"]},
    {"query": "数据库", "exclude_sources": []},
    {"query": "数据库", "source_filter": []},
    {"query": "的", "exclude_sources": ["cli"], "role_filter": ["user"]},
    {"query": "的", "source_filter": []},
    {"query": "的", "exclude_sources": []},
    {"query": "합니다", "role_filter": ["system"]},
    # --- sort ---
    {"query": "def", "sort": "newest"},
    {"query": "def", "sort": "oldest"},
    {"query": "def", "sort": " NEWEST "},
    {"query": "def", "sort": "relevance"},
    {"query": "self", "sort": "Oldest", "limit": 50},
    {"query": "数据库", "sort": "oldest"},
    {"query": "数据库", "sort": "newest"},
    {"query": "的", "sort": "oldest"},
    # --- limit and offset ---
    {"query": "def", "limit": 5},
    {"query": "def", "limit": 5, "offset": 5},
    {"query": "def", "limit": 1000},
    {"query": "def", "limit": 0},
    {"query": "self", "limit": 3, "offset": 10_000},
    {"query": "的", "limit": 3, "offset": 2},
    {"query": "数据库", "limit": 2, "offset": 1},
    {"query": "error", "limit": -1},
    # --- include_inactive (the LIKE scan never filters on visibility) ---
    {"query": "def", "include_inactive": True},
    {"query": "数据库", "include_inactive": True},
    {"query": "的", "include_inactive": True},
    {"query": "error", "include_inactive": True, "sort": "newest", "limit": 50},
    # --- hostile input ---
    {"query": ""},
    {"query": "   "},
    {"query": "\x00"},
    {"query": "def\x00return"},
    {"query": "\x01\x02\x1f"},
    {"query": "def\nreturn\tself"},
    {"query": "a" * 5000},
    {"query": "def " * 1000},
    {"query": "数" * 3000},
    {"query": "!@#$%^&*()"},
    {"query": "..."},
    {"query": "---"},
    {"query": "'; DROP TABLE messages; --"},
    {"query": '""'},
    {"query": '"' * 7},
    {"query": "😀 emoji"},
    {"query": "Robert'); --", "role_filter": ["user'); --"]},
]

# Lone surrogates cannot be encoded for SQLite: the legacy application raised
# UnicodeEncodeError on these, hermes_store returns []. Compare them only against
# hermes_store itself (for example inline layout against external-content layout).
UNENCODABLE_QUERIES: list[dict[str, Any]] = [
    {"query": "\ud800"},
    {"query": "def\udcff"},
    {"query": "数据库\ud800"},
    {"query": "的\ud800"},
    {"query": "def", "source_filter": ["\udcff"]},
    {"query": "的", "role_filter": ["\ud800"]},
]

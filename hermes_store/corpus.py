"""Deterministic, realistic Hermes agent transcripts for the demo, benchmarks and tests."""

from __future__ import annotations

import base64
import bisect
import functools
import gc
import json
import operator
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeAlias, TypeVar

__all__ = [
    "MESSAGE_COLUMNS",
    "MULTIMODAL_PREFIX",
    "SESSION_COLUMNS",
    "SOURCES",
    "Corpus",
    "Row",
    "Transcript",
    "Value",
    "generate",
    "iter_transcripts",
    "populate",
]

Value: TypeAlias = str | int | float | None
"""A value of one column, as the stdlib sqlite3 driver binds it."""

Row: TypeAlias = dict[str, Value]
"""One row, keyed by column name."""

SESSION_COLUMNS: Final[tuple[str, ...]] = (
    "id",
    "source",
    "user_id",
    "session_key",
    "chat_id",
    "chat_type",
    "thread_id",
    "model",
    "model_config",
    "system_prompt",
    "parent_session_id",
    "started_at",
    "ended_at",
    "end_reason",
    "message_count",
    "tool_call_count",
    "api_call_count",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cwd",
    "git_branch",
    "git_repo_root",
    "billing_provider",
    "billing_base_url",
    "billing_mode",
    "estimated_cost_usd",
    "actual_cost_usd",
    "cost_status",
    "cost_source",
    "pricing_version",
    "title",
    "rewind_count",
    "archived",
)
"""The `sessions` columns a corpus fills: all exist in every store at schema 17 or later."""

MESSAGE_COLUMNS: Final[tuple[str, ...]] = (
    "session_id",
    "role",
    "content",
    "tool_call_id",
    "tool_calls",
    "tool_name",
    "timestamp",
    "token_count",
    "finish_reason",
    "reasoning",
    "platform_message_id",
    "observed",
    "active",
    "compacted",
)
"""The `messages` columns a corpus fills (never `id`: AUTOINCREMENT assigns it)."""

SOURCES: Final[tuple[str, ...]] = ("cli", "telegram", "discord", "slack", "whatsapp")
"""Session sources, most frequent first."""

MULTIMODAL_PREFIX: Final = "\x00json:"
"""How the store marks content that is a JSON list of parts."""

# --------------------------------------------------------------------------------------
# Real text: a fixed set of standard-library modules that every CPython 3.11+ ships.
# --------------------------------------------------------------------------------------

# fmt: off
_STDLIB_FILES: Final[tuple[str, ...]] = tuple(
    sorted(
        (
            "argparse.py", "ast.py", "asyncio/base_events.py", "asyncio/tasks.py",
            "base64.py", "bisect.py", "calendar.py", "collections/__init__.py",
            "concurrent/futures/_base.py", "configparser.py", "contextlib.py", "copy.py",
            "csv.py", "dataclasses.py", "difflib.py", "email/message.py", "enum.py",
            "fnmatch.py", "fractions.py", "ftplib.py", "functools.py", "getopt.py",
            "gettext.py", "glob.py", "gzip.py", "heapq.py", "hmac.py", "http/client.py",
            "http/server.py", "importlib/__init__.py", "inspect.py", "ipaddress.py",
            "json/__init__.py", "json/decoder.py", "json/encoder.py", "keyword.py",
            "linecache.py", "locale.py", "logging/__init__.py", "logging/handlers.py",
            "mimetypes.py", "netrc.py", "numbers.py", "operator.py", "optparse.py", "os.py",
            "pickle.py", "platform.py", "plistlib.py", "pprint.py", "queue.py", "quopri.py",
            "random.py", "sched.py", "secrets.py", "selectors.py", "shlex.py", "shutil.py",
            "signal.py", "smtplib.py", "socket.py", "sqlite3/__init__.py", "statistics.py",
            "subprocess.py", "tarfile.py", "tempfile.py", "textwrap.py", "threading.py",
            "timeit.py", "tokenize.py", "trace.py", "traceback.py", "types.py", "typing.py",
            "unittest/case.py", "urllib/parse.py", "urllib/request.py", "uuid.py",
            "warnings.py", "weakref.py", "zipapp.py",
        )
    )
)
# fmt: on


@dataclass(frozen=True)
class _TextPool:
    """The standard-library text, read once per process, with line and file offsets."""

    text: str
    lines: list[str]
    line_starts: list[int]
    file_starts: list[int]
    file_first_lines: list[int]
    names: tuple[str, ...]

    def slice(self, u: float, length: int) -> tuple[int, str]:
        """Return (offset, text) of `length` characters starting at a line near fraction u."""
        text = self.text
        start = int(u * len(text))
        newline = text.find("\n", start)
        start = newline + 1 if 0 <= newline < len(text) - 1 else 0
        chunk = text[start : start + length]
        while len(chunk) < length:
            chunk += "\n" + text[: length - len(chunk) - 1]
        return start, chunk

    def file_slice(self, u: float, length: int) -> tuple[int, str]:
        """Like `slice`, but within one file: up to `length` characters, never past its end."""
        text = self.text
        start, _ = self.slice(u, 0)
        f = bisect.bisect_right(self.file_starts, start) - 1
        begin = self.file_starts[f]
        end = self.file_starts[f + 1] - 1 if f + 1 < len(self.file_starts) else len(text)
        if start + length > end:  # move back so that the cut ends at the end of the file
            start = max(begin, end - length)
            if start > begin:
                start = text.find("\n", start - 1, end) + 1 or begin
        return start, text[start : min(start + length, end)]

    def where(self, offset: int) -> tuple[str, int]:
        """Return (module path, 1-based line number) of a text offset."""
        f = bisect.bisect_right(self.file_starts, offset) - 1
        line = bisect.bisect_right(self.line_starts, offset) - 1
        return self.names[f], line - self.file_first_lines[f] + 1

    def line_at(self, index: int) -> tuple[str, int, str]:
        """Return (module path, line number, text) of the line with a global index."""
        f = bisect.bisect_right(self.file_first_lines, index) - 1
        return self.names[f], index - self.file_first_lines[f] + 1, self.lines[index]


@functools.lru_cache(maxsize=1)
def _text_pool() -> _TextPool:
    """Read the fixed standard-library files once (missing ones are skipped)."""
    base = os.path.dirname(os.__file__)
    names: list[str] = []
    parts: list[str] = []
    for rel in _STDLIB_FILES:
        try:
            with open(os.path.join(base, rel), encoding="utf-8", errors="replace") as fh:
                body = fh.read().replace("\x00", "")
        except OSError:
            continue
        if body.strip():
            names.append(rel)
            parts.append(body.rstrip("\n"))
    if not parts:  # stdlib shipped as a zip or stripped: fall back to built-in prose
        names.append("fallback.txt")
        parts.append("\n".join(_ASSISTANT_SENTENCES * 200))
    file_starts: list[int] = []
    file_first_lines: list[int] = []
    lines: list[str] = []
    offset = 0
    for body in parts:
        file_starts.append(offset)
        file_first_lines.append(len(lines))
        lines.extend(body.split("\n"))
        offset += len(body) + 1
    text = "\n".join(parts)
    line_starts: list[int] = []
    pos = 0
    for line in lines:
        line_starts.append(pos)
        pos += len(line) + 1
    return _TextPool(text, lines, line_starts, file_starts, file_first_lines, tuple(names))


# --------------------------------------------------------------------------------------
# Distributions: piecewise-linear quantile tables (plain arithmetic only, so the same
# seed gives bit-identical values on every platform, with no libm in the loop).
# --------------------------------------------------------------------------------------

# fmt: off
_TOOL_OUTPUT_CHARS: Final = (
    252, 391, 543, 675, 798, 918, 1037, 1159, 1284, 1413, 1546, 1686, 1833, 1988, 2153,
    2330, 2520, 2726, 2950, 3195, 3465, 3767, 4109, 4497, 4946, 5478, 6119, 6919, 7962,
    9415, 11686, 16232, 20000,
)  # lognormal, median 2.5 k, mean ~3.9 k before the per-tool caps; 250..20 000
_SESSION_MESSAGES: Final = (
    2, 6, 9, 11, 13, 16, 18, 20, 22, 24, 27, 29, 32, 35, 38, 41, 45, 49, 53, 58, 63, 69,
    75, 83, 91, 102, 114, 130, 151, 180, 225, 318, 700,
)  # lognormal, median 45, mean ~78 messages
_SESSION_GAP_S: Final = (
    0, 286, 581, 886, 1202, 1529, 1869, 2222, 2589, 2972, 3372, 3791, 4230, 4692, 5178,
    5693, 6238, 6819, 7440, 8107, 8827, 9611, 10468, 11417, 12477, 13678, 15066, 16707,
    18715, 21304, 24953, 31192, 47685,
)  # exponential, mean 2.5 h between session starts
_USER_THINK_S: Final = (
    3, 4.42, 7.0, 9.48, 12, 15, 17, 20, 23, 27, 30, 34, 38, 43, 48, 54, 60, 67, 75, 84,
    94, 105, 119, 135, 154, 178, 208, 247, 300, 380, 514, 814, 2458,
)
_MODEL_LATENCY_S: Final = (
    0.6, 1.13, 1.47, 1.74, 1.99, 2.23, 2.46, 2.69, 2.91, 3.15, 3.38, 3.62, 3.87, 4.14,
    4.41, 4.7, 5.0, 5.32, 5.67, 6.04, 6.45, 6.9, 7.39, 7.95, 8.58, 9.31, 10, 11, 13, 14,
    17, 22, 42,
)
_TOOL_LATENCY_S: Final = (
    0.04, 0.11, 0.16, 0.22, 0.27, 0.32, 0.38, 0.44, 0.5, 0.57, 0.64, 0.71, 0.79, 0.88,
    0.98, 1.08, 1.2, 1.33, 1.47, 1.63, 1.82, 2.02, 2.27, 2.55, 2.88, 3.29, 3.8, 4.46,
    5.35, 6.66, 8.82, 14, 38,
)
# fmt: on

_EPOCH: Final = 1_745_000_000.0  # 2025-04-18 UTC: the first session starts shortly after

# Shares, tuned so that a 10k corpus has ~3 % rewound, ~3 % compacted, ~6 % CJK messages.
# Besides chance, every 9th session (the 2nd, 11th, ...) is in Chinese, Japanese or Korean
# in turn, and the first occasion of each rare feature is always taken (see `generate`).
_CJK_EVERY: Final = 9
_P_CJK_SESSION: Final = 0.01
_P_CJK_USER_IN_EN: Final = 0.05
_P_REWIND_PER_TURN: Final = 0.035
_P_COMPACT_SESSION: Final = 0.1
_P_COMPRESSION_SPLIT: Final = 0.7
_P_DELEGATION: Final = 0.03
_P_OPEN_SESSION: Final = 0.015
_P_SYSTEM_NOTE: Final = 0.012
_P_ARCHIVED: Final = 0.03

# --------------------------------------------------------------------------------------
# Vocabulary (English).
# --------------------------------------------------------------------------------------

# fmt: off
_IDENTS: Final = (
    "chat-send", "P2.2", "my-app.config.ts", "foo_bar", "session_search", "hermes_state.py",
    "messages_fts", "messages_fts_trigram", "gateway.run", "tool_calls", "api-v2.users.list",
    "v0.4.1", "build-42", "tsconfig.build.json", "docker-compose.yml", "pre-commit",
    "x86_64-linux-gnu", "utf-8", "auth_token", "next.config.js", "k8s.deploy.yaml",
    "redis-cache", "rate_limit", "user_id", "state.db", "e2e-tests", "issue-16751",
    "PR-1234", "fts5-trigram", "schema_version", "compression_locks", "async_delegations",
    "sqlite3.OperationalError", "retry_after", "max_tokens", "cron-daily.backup", "py3.11",
    "node-18.x", "release-2025.06", "ws-client.reconnect", "P1.3", "web_extract",
    "read_file", "config.yaml", "CHANGELOG.md", "eslint.config.mjs", "pyproject.toml",
    "alembic.ini", "idx_messages_session", "top-p", "gpt-4.1-mini", "end_reason",
    "session_key", "chat_id", "load-test.k6.js", "v2.3.0-rc.1", "snake_case_name",
)
_PATHS: Final = (
    "src/app/page.tsx", "src/lib/chat-send.ts", "packages/web/my-app.config.ts",
    "hermes_state.py", "gateway/run.py", "gateway/platforms/telegram.py",
    "gateway/platforms/discord.py", "tools/terminal_tool.py", "tools/file_tools.py",
    "tests/test_hermes_state.py", "tests/gateway/test_session_keys.py", "docs/setup.md",
    "README.md", "~/.hermes/config.yaml", "~/.hermes/sessions/sessions.json",
    "/etc/nginx/sites-enabled/default", "scripts/backup-db.sh", "migrations/0007_add_index.sql",
    "src/components/ChatInput.tsx", "api/v2/users/list.py", "infra/k8s/deploy.yaml",
    ".github/workflows/ci.yml", "Makefile", "pyproject.toml", "package.json",
    "src/utils/foo_bar.py", "notebooks/eval-2025-06.ipynb", "cli/main.py",
    "data/export/sessions-2025-06-12.jsonl", "agent/prompt_builder.py",
    "agent/context_compressor.py", "run_agent.py", "web/src/routes/api.search.ts",
)
# fmt: on
# fmt: off
_BRANCHES: Final = (
    "main", "feat/fts-external-content", "fix/gateway-reconnect", "feature/chat-send",
    "fix/P2.2-login", "chore/bump-deps", "perf/trigram-index", "release/2025.06",
)
_VERSIONS: Final = ("v0.4.1", "v0.5.0", "1.20.1", "2.0.3", "v2.3.0-rc.1", "3.11.7", "0.6.9")
_CITIES: Final = (
    "Lisbon", "Berlin", "Tokyo", "Seoul", "Shanghai", "San Francisco", "Toronto", "Nairobi",
    "Osaka", "Taipei", "Austin", "Melbourne",
)
# fmt: on
_URLS: Final = (
    "https://docs.python.org/3/library/sqlite3.html",
    "https://www.sqlite.org/fts5.html#external_content_tables",
    "https://github.com/example-org/hermes-agent/issues/43690",
    "https://news.ycombinator.com/item?id=40012345",
    "https://example.com/blog/2025/06/fts5-external-content",
    "https://alembic.sqlalchemy.org/en/latest/batch.html",
    "https://docs.sqlalchemy.org/en/20/dialects/sqlite.html",
    "https://weather.example.org/forecast?city=lisbon",
    "https://www.example.net/recipes/quick-pasta-15-min",
)
# fmt: off
_COMMANDS: Final = (
    "python -m pytest tests/ -q", "git log --oneline -n 20", "npm run build",
    "ruff check . --fix", "mypy --strict hermes_store", "docker compose up -d",
    "sqlite3 ~/.hermes/state.db 'PRAGMA integrity_check'", "make test", "pip install -e .",
)
# fmt: on
_ERRORS: Final = (
    "sqlite3.OperationalError: database is locked",
    "TypeError: 'NoneType' object is not subscriptable",
    "KeyError: 'session_id'",
    "ModuleNotFoundError: No module named 'hermes_store'",
    "AssertionError: assert 3 == 4",
    "ECONNREFUSED 127.0.0.1:5432",
    "TimeoutError: timed out after 30s",
    'fts5: syntax error near "."',
    "Error: Cannot find module './my-app.config'",
    "PermissionError: [Errno 13] Permission denied: '/var/log/hermes.log'",
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe4 in position 12",
    "429 Too Many Requests: rate limit exceeded, retry_after=20",
)
_CLI_PROMPTS: Final = (
    "Can you look at {path} and figure out why {ident} is failing?",
    "Run the test suite and fix whatever breaks in {path}.",
    "TODO: fix the flaky test in {path}, it times out on CI about one run in five.",
    "I'm getting `{err}` when I run `{cmd}`. Any idea?",
    "Refactor {ident} so it no longer imports from {path2}.",
    "What does P2.2 in the roadmap mean for the {ident} work?",
    "Add a --json flag to the export command and document it in README.md.",
    "Search the codebase for every use of {ident} and list the call sites.",
    "The build on {branch} is red. Check the CI log and tell me what broke.",
    "Write a migration that adds an index on {ident} and a test for it.",
    "Please review the diff on {branch} before I open the PR.",
    "Why is state.db 750 MB? I only have a few hundred sessions.",
    "Bump {ident} to {ver} and make sure nothing else depends on the old API.",
    "Explain what {path} does, briefly, I'm new to this repo.",
    "Can you make {ident} handle an empty list without crashing?",
    "Set up pre-commit with ruff and mypy for this project.",
    "git status looks weird after the rebase, can you sort it out?",
    "Benchmark {ident} on 50k messages and compare it with main.",
    "Rename foo_bar to {ident2} everywhere, including the docs.",
    'Find out why searching for "{ident}" returns nothing while the message is clearly there.',
    "TODO: fix {ident} before the release; leave a note in CHANGELOG.md.",
    "Check that my-app.config.ts still builds after the {ident} change.",
    "The chat-send endpoint returns 500 on long messages. Reproduce it and fix it.",
    "Delete the stale branches that were merged into main last month.",
    "Show me the last 10 commits that touched {path}.",
    "Can you write a small script that dumps {ident} counts per day to CSV?",
    "ok, now do the same for {path2}",
    "Looks good. Commit it with a conventional commit message.",
    "Hmm, that broke {ident}. Revert the last change and try a different approach.",
    "Is {ident} thread-safe? We call it from the gateway and the cron runner.",
)
_GATEWAY_PROMPTS: Final = (
    "hey, what's on my calendar tomorrow?",
    "remind me to call the dentist at 5pm",
    "can you summarise this for me: {url}",
    "what's the weather in {city} this weekend?",
    "did the nightly backup run ok?",
    "check if {url} is up",
    "find me a good recipe for dinner, something quick",
    "what was the name of that library we talked about last week? something with fts",
    "status of the deploy?",
    "ok thanks! can you also add it to my todo list",
    "how much did we spend on the API this month?",
    "restart the {ident} service on the home server",
    "search my notes for {ident}",
    "send the report to the team channel when it's done",
    "what time is it in {city} right now",
    "can you look up flights from {city} to {city2} next Friday",
    "P2.2 is done, mark it in the tracker",
    "the chat-send bot is spamming the group again, can you mute it",
    "yes go ahead",
    "no, the other one",
    "lol that worked, thanks",
    "TODO: fix the garage door automation, it fired twice last night",
    "can you check {path} on the server and tell me if the cron job changed it",
)
_OBSERVED_CHATTER: Final = (
    "anyone up for lunch?",
    "pushed the fix, CI is running",
    "lol",
    "+1",
    "who broke the staging deploy",
    "meeting moved to 3pm",
    "nice!",
    "brb",
    "can someone review PR-1234?",
    "the chat-send bot is quiet today",
)
_ASSISTANT_SENTENCES: Final = (
    "I looked at {path} and the problem is in how {ident} handles an empty result.",
    "The test failure comes from a race between the writer and the FTS trigger.",
    "I ran the suite again and all {num} tests pass now.",
    "The fix is a one-line change: {ident} now checks for None before indexing.",
    "I left a TODO: fix comment where the retry logic still needs a backoff.",
    "Nothing else imports {ident}, so the rename is safe.",
    "Note that {path2} still pins the old version; I did not touch it.",
    "The index on {ident} brings the query from 1.8 s down to 12 ms on the sample store.",
    "I couldn't reproduce `{err}` locally, but the CI log shows it on Python 3.11 only.",
    "You may want to run `{cmd}` yourself to double-check.",
    "The config in my-app.config.ts overrides the default, which is why the flag was ignored.",
    "P2.2 depends on the chat-send refactor, so I'd do that first.",
    "I kept the old behaviour behind a flag so nothing breaks for existing users.",
    "The store is large mostly because message text is kept three times: once in messages "
    "and once per FTS table.",
    "Done. The branch {branch} is pushed and ready for review.",
    "I'd suggest backing up state.db before running the upgrade.",
    "The JSON export now includes tool_calls and tool_name for each message.",
    "There are {num} call sites; most of them are in tests.",
    "I also updated the docs in README.md to match.",
    "That endpoint returns 429 when we exceed the rate limit, so I added retry_after handling.",
    "The root cause is that foo_bar was mutated while we iterated over it.",
    "The deploy of {ver} finished without errors and the health check is green.",
    "The version in {path} was {ver}, so the changelog entry was missing.",
    "Both the word index and the trigram index are rebuilt by the same trigger.",
    "I'd rather not touch {path2} in this change; it deserves its own PR.",
)
_GATEWAY_SENTENCES: Final = (
    "Sure, I've added that to your list.",
    "It's currently 18 degrees and sunny in {city}, with rain expected on Sunday.",
    "The nightly backup finished at 03:12 and the archive is 212 MB.",
    "I found three notes that mention {ident}; the most recent one is from last Tuesday.",
    "Reminder set for 17:00.",
    "Flights from {city} to {city2} start at 240 EUR; the 08:15 one is direct.",
    "Done, I muted the chat-send bot in this group for 24 hours.",
    "You spent 41.20 USD on the API this month, most of it on {model}.",
    "The page is up and answers in 180 ms.",
    "Here is the short version: the article argues that FTS5 external content halves the "
    "database size without changing search results.",
)
_CHAT_SENTENCES: Final = _GATEWAY_SENTENCES + _ASSISTANT_SENTENCES
_BULLETS: Final = (
    "- `{path}`: guard against an empty {ident}",
    "- added a regression test in `tests/test_{word}.py`",
    "- `{ident}` renamed, old name kept as an alias",
    "- TODO: fix the docs for {ident} once the API settles",
    "- bumped `{ident2}` to {ver}",
    "- removed the dead code path in `{path2}`",
    "- {num} files changed, no behaviour change outside {ident}",
)
_PREFACES: Final = (
    "Let me check.",
    "I'll run the tests first.",
    "Looking at the file now.",
    "Searching the codebase.",
    "Let me reproduce that.",
    "Checking the logs.",
    "One moment, I'll look it up.",
    "I'll read {path} first.",
)
_REASONING: Final = (
    "The user wants the smallest change that fixes {ident}.",
    "I should read {path} before editing anything.",
    "The error mentions {ident}; probably a None that slipped through.",
    "Running the tests will confirm whether the fix is complete.",
    "Keep the answer short, the user asked for brevity.",
    "Two call sites need the same change; do both in one patch.",
    "I need the exact command output before guessing.",
)
_TITLES: Final = (
    "Fix {ident} test failure",
    "Debug {ident}",
    "Refactor {path}",
    "Weather and reminders",
    "state.db size investigation",
    "Review {branch}",
    "Add index on {ident}",
    "Deploy {ver}",
    "Notes search",
    "External-content FTS5 migration",
    "Daily briefing",
    "CI failure on {branch}",
    "Trip planning: {city}",
    "TODO cleanup in {path}",
    "chat-send 500 on long messages",
    "P2.2 follow-up",
)
# fmt: off
_COMMITS: Final = (
    "feat(gateway): add chat-send retries", "fix(search): quote dotted identifiers like P2.2",
    "chore: bump ruff to 0.6.9", "docs: explain state.db size",
    "refactor(state): split hermes_state.py", "test: cover messages_fts triggers",
    "fix: TODO cleanup in foo_bar", "perf(fts): external-content FTS5",
    'revert: "feat: my-app.config.ts loader"', "ci: run e2e-tests on py3.11 and py3.12",
    "feat(cli): sessions optimize command", "fix(telegram): handle edited messages",
)
_AUTHORS: Final = (
    "Alex Chen <alex@example.com>", "Mei Tanaka <mei@example.org>",
    "Min-ji Park <minji@example.net>", "Sam Okafor <sam@example.com>",
    "dependabot[bot] <support@github.com>",
)
_LS_NAMES: Final = (
    ".git", ".github", ".venv", "README.md", "pyproject.toml", "package.json", "src",
    "tests", "docs", "node_modules", "my-app.config.ts", "tsconfig.build.json",
    "docker-compose.yml", "Makefile", "CHANGELOG.md", "state.db", "state.db-wal",
    "alembic.ini", "scripts", "foo_bar.py", ".env.example", "LICENSE", "uv.lock",
)
# fmt: on
_SYSTEM_NOTES: Final = (
    "[Background process proc_{hex} finished with exit code 0]",
    "[Session resumed after gateway restart]",
    "[Note: the user's timezone is now Asia/Tokyo]",
    "[System: model switched to {model}]",
)
_WORDS: Final = ("search", "gateway", "state", "corpus", "cli", "cron", "fts", "export")
_SYSTEM_PROMPT_BASE: Final = (
    "You are Hermes, an AI agent. You help the user with software engineering, research "
    "and everyday tasks. Use the tools you are given; prefer reading files and running "
    "commands over guessing. Be concise. When you change code, run the tests. Never print "
    "secrets. If a request is ambiguous, ask one short clarifying question.\n\n"
    "## Tools\nterminal, read_file, write_file, patch, search_files, web_search, "
    "web_extract, execute_code, browser_navigate, todo, memory, session_search, "
    "delegate_task, send_message, cronjob, skill_view.\n"
)
_MEMORY_LINES: Final = (
    "User prefers short answers and British spelling.",
    "Project hermes-agent lives in ~/code/hermes-agent; tests run with pytest -q.",
    "User's timezone: Europe/Lisbon.",
    "Never push to main directly; open a PR.",
    "The home server is reachable as nas.local; backups run at 03:00.",
    "User is learning Japanese; answer in Japanese when asked in Japanese.",
    "TODO: fix the garage automation (reported twice).",
)

# --------------------------------------------------------------------------------------
# Vocabulary (CJK). Chinese and Japanese phrases are written with ASCII , ? ! : ( ) and
# converted to their full-width forms at import, to keep the source free of confusables.
# --------------------------------------------------------------------------------------

_FULLWIDTH: Final = str.maketrans(
    {",": "\uff0c", "?": "\uff1f", "!": "\uff01", ":": "\uff1a", "(": "\uff08", ")": "\uff09"}
)


def _fullwidth(phrases: tuple[str, ...]) -> tuple[str, ...]:
    """Return the phrases with ASCII punctuation turned into full-width punctuation."""
    return tuple(p.translate(_FULLWIDTH) for p in phrases)


_ZH: Final = _fullwidth(
    (
        "帮我看一下这个测试为什么失败了",
        "数据库迁移之后搜索结果不一样了",
        "请把会话记录导出成 JSON 格式",
        "全文搜索的索引太大了,能不能压缩一下?",
        "这个函数的返回值有问题",
        "部署到生产环境之前先跑一遍单元测试",
        "我想把 {ident} 的配置改成默认值",
        "为什么 {path} 里的中文注释显示成乱码?",
        "帮我写一个脚本,每天凌晨备份数据库",
        "日志里有很多重复的错误信息",
        "性能比之前慢了大概三倍",
        "能解释一下外部内容表是怎么工作的吗?",
        "会话标题应该是唯一的",
        "内存占用越来越高,是不是有内存泄漏?",
        "好的,我已经修改了配置文件,现在重新运行测试。",
        "测试全部通过了,一共 {num} 个用例。",
        "问题出在触发器上:删除时传入的文本和插入时不一致。",
        "建议先备份 state.db,然后再执行升级。",
        "这是一个已知问题,可以暂时跳过。",
        "我查看了 {path},发现缺少一个索引。",
        "搜索中文关键词的时候需要至少三个字符。",
        "明天上午十点提醒我开会",
        "把这段话翻译成英文",
        "北京今天的天气怎么样?",
        "周末去上海出差,帮我订一家酒店",
        "TODO: 修复 {ident} 的超时问题",
        "代码审查的意见我都回复了",
        "测试",
    )
)
_JA: Final = _fullwidth(
    (
        "このテストが失敗する原因を調べてください",
        "データベースのマイグレーションが終わりました",
        "検索結果がアップグレード前と同じか確認してください",
        "ファイルサイズが大きすぎるので圧縮したいです",
        "エラーメッセージをログに出力しないでください",
        "セッションのタイトルは重複できません",
        "トリガーの名前はそのまま残しておきます",
        "ありがとうございます、助かりました!",
        "{path} の設定を確認しました。問題はキャッシュの有効期限です。",
        "新しいブランチを作成してプルリクエストを送ります",
        "明日の会議の資料をまとめてもらえますか?",
        "ターミナルでコマンドを実行したらタイムアウトしました",
        "全文検索インデックスを再構築する必要があります",
        "すべてのテストが合格しました。合計 {num} 件です。",
        "日本語の文章も検索できるようにしたいです",
        "サーバーの再起動は夜間に行います",
        "このスクリプトは毎朝バックアップを取ります",
        "コードレビューのコメントに返信しました",
        "東京の天気を教えてください",
        "ラーメンのおすすめのお店はどこですか?",
        "{ident} の使い方がよくわかりません",
        "TODO: {ident} のタイムアウトを直す",
        "検索",
    )
)
_KO: Final = (
    "이 테스트가 왜 실패하는지 확인해 주세요",
    "데이터베이스 마이그레이션이 완료되었습니다",
    "검색 결과가 업그레이드 전과 동일한지 확인했습니다",
    "파일 크기가 너무 커서 압축이 필요합니다",
    "세션 제목은 중복될 수 없습니다",
    "서버를 다시 시작한 후에도 오류가 계속 발생합니다",
    "{path} 파일에서 설정 값을 찾았습니다",
    "전체 텍스트 검색 인덱스를 다시 만들어야 합니다",
    "모든 테스트가 통과했습니다. 총 {num}개입니다.",
    "내일 오전 회의 자료를 정리해 주세요",
    "감사합니다, 덕분에 해결했어요!",
    "로그에 개인 정보가 남지 않도록 해 주세요",
    "새 브랜치를 만들고 풀 리퀘스트를 올렸습니다",
    "백업을 먼저 하고 업그레이드를 진행하겠습니다",
    "서울 날씨 어때요?",
    "한국어 문장도 검색할 수 있어야 합니다",
    "스크립트가 매일 새벽에 실행되도록 설정했습니다",
    "{ident} 설정을 기본값으로 바꿔 주세요",
    "TODO: {ident} 타임아웃 문제 수정",
    "검색",
)
_CJK_PHRASES: Final = {"zh": _ZH, "ja": _JA, "ko": _KO}
_CJK_SEPARATOR: Final = {"zh": "", "ja": "", "ko": " "}

# --------------------------------------------------------------------------------------
# Sources, models and tools.
# --------------------------------------------------------------------------------------

# fmt: off
_SOURCE_WEIGHTS: Final = (("cli", 55), ("telegram", 18), ("discord", 12), ("slack", 9),
                          ("whatsapp", 6))
_CHAT_TYPES: Final = {
    "telegram": ("dm", "dm", "group"),
    "discord": ("dm", "group", "thread"),
    "slack": ("dm", "channel", "channel"),
    "whatsapp": ("dm", "dm", "group"),
}
_END_REASONS: Final = {
    "cli": (("user_exit", 70), ("cli_close", 25), ("error", 5)),
    "gateway": (("session_reset", 45), ("idle_timeout", 45), ("user_exit", 10)),
}
# fmt: on


@dataclass(frozen=True)
class _Model:
    """One model the agent talks to, with its billing route and prices per 1M tokens."""

    name: str | None
    provider: str | None
    base_url: str | None
    price_in: float
    price_out: float
    reasons: bool
    call_prefix: str


# fmt: off
_MODELS: Final = (
    (_Model("anthropic/claude-sonnet-4", "openrouter", "https://openrouter.ai/api/v1",
            3.0, 15.0, True, "toolu_01"), 30),
    (_Model("anthropic/claude-opus-4.1", "anthropic", "https://api.anthropic.com",
            15.0, 75.0, True, "toolu_01"), 6),
    (_Model("openai/gpt-4.1", "openrouter", "https://openrouter.ai/api/v1",
            2.0, 8.0, False, "call_"), 12),
    (_Model("openai/gpt-5", "openai", "https://api.openai.com/v1",
            1.25, 10.0, True, "call_"), 10),
    (_Model("nousresearch/hermes-4-405b", "nous", "https://inference-api.nousresearch.com/v1",
            1.0, 3.0, True, "call_"), 14),
    (_Model("nousresearch/hermes-4-70b", "nous", "https://inference-api.nousresearch.com/v1",
            0.13, 0.4, False, "call_"), 8),
    (_Model("google/gemini-2.5-pro", "openrouter", "https://openrouter.ai/api/v1",
            1.25, 10.0, True, "call_"), 8),
    (_Model("qwen/qwen3-coder", "openrouter", "https://openrouter.ai/api/v1",
            0.2, 0.8, False, "call_"), 6),
    (_Model("local/llama-3.3-70b", "custom", "http://localhost:8080/v1",
            0.0, 0.0, False, "call_"), 4),
    (_Model(None, None, None, 0.0, 0.0, False, "call_"), 2),
)
# fmt: on
# fmt: off
_CLI_TOOLS: Final = (
    ("terminal", 40), ("read_file", 16), ("search_files", 10), ("patch", 8),
    ("write_file", 5), ("execute_code", 5), ("web_search", 4), ("web_extract", 3),
    ("todo", 3), ("browser_navigate", 2), ("session_search", 2), ("delegate_task", 1),
    ("memory", 1),
)
_GATEWAY_TOOLS: Final = (
    ("web_search", 22), ("web_extract", 14), ("terminal", 14), ("memory", 8), ("todo", 8),
    ("session_search", 6), ("read_file", 6), ("send_message", 5), ("cronjob", 5),
    ("browser_navigate", 4), ("vision_analyze", 3), ("skill_view", 3), ("execute_code", 2),
)
_TERMINAL_KINDS: Final = (
    ("cat", 14), ("rg", 12), ("pytest", 12), ("git_diff", 10), ("git_log", 8), ("ls", 10),
    ("git_status", 6), ("json", 8), ("traceback", 5), ("pip", 4), ("build", 5), ("docker", 3),
)
# fmt: on


_T = TypeVar("_T")


class _Weighted(Generic[_T]):
    """A fixed weighted choice that consumes exactly one `random()` per pick."""

    def __init__(self, pairs: Sequence[tuple[_T, float]]) -> None:
        self.items = [item for item, _ in pairs]
        self.cum: list[float] = []
        total = 0.0
        for _, weight in pairs:
            total += weight
            self.cum.append(total)
        self.total = total

    def pick(self, rng: random.Random) -> _T:
        """Return one item."""
        x = rng.random() * self.total
        return self.items[bisect.bisect_right(self.cum, x, 0, len(self.cum) - 1)]


# fmt: off
_W_SOURCES: Final = _Weighted(_SOURCE_WEIGHTS)
_W_MODELS: Final = _Weighted(_MODELS)
_W_CLI_TOOLS: Final = _Weighted(_CLI_TOOLS)
_W_GATEWAY_TOOLS: Final = _Weighted(_GATEWAY_TOOLS)
_W_TERMINAL: Final = _Weighted(_TERMINAL_KINDS)
_W_END: Final = {"cli": _Weighted(_END_REASONS["cli"]),
                 "gateway": _Weighted(_END_REASONS["gateway"])}
_W_CALLS: Final = _Weighted(((1, 72), (2, 20), (3, 8)))
_W_ROUNDS: Final = _Weighted(((1, 35), (2, 25), (3, 15), (4, 10), (5, 6), (6, 4), (8, 3),
                              (12, 2)))
_W_LANG: Final = _Weighted((("zh", 45), ("ja", 30), ("ko", 25)))
# fmt: on


def _idx(rng: random.Random, n: int) -> int:
    """Return an index below n using exactly one `random()` whatever n is."""
    return int(rng.random() * n)


def _one(rng: random.Random, items: Sequence[str]) -> str:
    """Return one item of a sequence."""
    return items[int(rng.random() * len(items))]


def _some(rng: random.Random, items: Sequence[str], k: int) -> list[str]:
    """Return k distinct items (all of them when there are fewer), one `random()` each."""
    left = list(items)
    return [left.pop(int(rng.random() * len(left))) for _ in range(min(k, len(left)))]


def _quantile(rng: random.Random, knots: Sequence[float]) -> float:
    """Sample a piecewise-linear inverse CDF given by evenly spaced quantiles."""
    x = rng.random() * (len(knots) - 1)
    i = int(x)
    return knots[i] + (knots[i + 1] - knots[i]) * (x - i)


def _tokens(text: str) -> int:
    """Estimate tokens: about four bytes of ASCII or two CJK characters per token."""
    return max(1, (len(text) + len(text.encode("utf-8"))) // 8)


def _dumps(value: object) -> str:
    """Serialise to JSON, keeping non-ASCII text as is."""
    return json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------------------
# Public data types.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Transcript:
    """One session row and its message rows, in insertion order."""

    session: Row
    messages: list[Row]

    def __repr__(self) -> str:
        """Summarise without content (message text is never printed)."""
        return f"Transcript(session={self.session['id']!r}, messages={len(self.messages)})"


@dataclass(frozen=True, repr=False)
class Corpus:
    """A generated store: session rows, then message rows in id order (parents first)."""

    sessions: list[Row]
    messages: list[Row]

    def __repr__(self) -> str:
        """Summarise without content (message text is never printed)."""
        return f"Corpus(sessions={len(self.sessions)}, messages={len(self.messages)})"

    @property
    def content_bytes(self) -> int:
        """Total UTF-8 size of `messages.content`, `tool_calls` and `reasoning`."""
        total = 0
        for m in self.messages:
            for key in ("content", "tool_calls", "reasoning"):
                value = m[key]
                if isinstance(value, str):
                    total += len(value.encode("utf-8"))
        return total


# --------------------------------------------------------------------------------------
# The generator.
# --------------------------------------------------------------------------------------


@dataclass
class _Peer:
    """A gateway conversation partner: who, and which chat."""

    user_id: str
    chat_id: str
    chat_type: str


_TOPIC_KEYS: Final = ("path", "path2", "ident", "ident2")
_SLOT_VOCAB: Final = {
    "cmd": _COMMANDS,
    "err": _ERRORS,
    "branch": _BRANCHES,
    "ver": _VERSIONS,
    "city": _CITIES,
    "city2": _CITIES,
    "url": _URLS,
    "word": _WORDS,
}


class _Slots(dict[str, str]):
    """Template values drawn lazily, so that a template pays only for the slots it uses."""

    def __init__(self, gen: _Generator, ctx: _Ctx | None) -> None:
        super().__init__()
        self.gen = gen
        self.ctx = ctx

    def __missing__(self, key: str) -> str:
        rng = self.gen.rng
        if key in _TOPIC_KEYS:  # the session's topic most of the time, else anything
            if self.ctx is not None and rng.random() < 0.6:
                values = self.ctx.topic
            else:
                values = (
                    _one(rng, _PATHS),
                    _one(rng, _PATHS),
                    _one(rng, _IDENTS),
                    _one(rng, _IDENTS),
                )
            self.update(zip(_TOPIC_KEYS, values, strict=True))
            return self[key]
        if key in _SLOT_VOCAB:
            value = _one(rng, _SLOT_VOCAB[key])
        elif key == "num":
            value = str(3 + _idx(rng, 400))
        elif key == "hex":
            value = self.gen._hex(6)
        elif key == "model":
            value = (self.ctx.model.name if self.ctx else None) or "openai/gpt-4.1"
        else:
            raise KeyError(key)
        self[key] = value
        return value


@dataclass
class _Ctx:
    """Everything that stays fixed within one session (and its compression children)."""

    source: str
    lang: str
    model: _Model
    peer: _Peer | None
    thread_id: str | None
    cwd: str | None
    repo_root: str | None
    branch: str | None
    tools: _Weighted[str]
    tool_turn_p: float
    topic: tuple[str, str, str, str]


_PROJECTS: Final = (
    ("/home/alex/code/hermes-agent", "/home/alex/code/hermes-agent"),
    ("/home/alex/work/my-app/packages/web", "/home/alex/work/my-app"),
    ("/home/mei/src/data-pipeline", "/home/mei/src/data-pipeline"),
    ("/home/minji/projects/infra/k8s", "/home/minji/projects/infra"),
    ("/srv/www/blog", None),
    ("/home/alex", None),
)


class _Generator:
    """Builds transcripts from one seeded `random.Random`."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.pool = _text_pool()
        self.titles: set[str] = set()
        self.ids: set[str] = set()
        self.recent: list[str] = []
        self.calls = 0  # tool calls made in the session being built
        self.sessions = 0  # sessions started (compression children not counted)
        self.user_messages = 0
        self.rewinds = 0
        self.compactions = 0
        self.splits = 0
        self.peers = {src: [self._peer(src) for _ in range(5)] for src in SOURCES[1:]}

    # ---- small helpers --------------------------------------------------------------

    def _hex(self, digits: int) -> str:
        return f"{self.rng.getrandbits(4 * digits):0{digits}x}"

    def _bytes(self, n: int) -> bytes:
        return self.rng.getrandbits(8 * n).to_bytes(n, "little")

    def _digits(self, n: int) -> str:
        return str(10 ** (n - 1) + self.rng.getrandbits(48) % (9 * 10 ** (n - 1)))

    def _peer(self, source: str) -> _Peer:
        rng = self.rng
        chat_type = _one(rng, _CHAT_TYPES[source])
        if source == "telegram":
            user = self._digits(10)
            chat = user if chat_type == "dm" else "-100" + self._digits(10)
        elif source == "discord":
            user = self._digits(18)
            chat = self._digits(19)
        elif source == "slack":
            user = "U07" + self._hex(8).upper()
            chat = ("D07" if chat_type == "dm" else "C07") + self._hex(8).upper()
        else:
            user = "49" + self._digits(11) + "@s.whatsapp.net"
            chat = user if chat_type == "dm" else "12036" + self._digits(13) + "@g.us"
        return _Peer(user, chat, chat_type)

    def _slots(self, ctx: _Ctx | None = None) -> _Slots:
        return _Slots(self, ctx)

    def _fill(self, template: str, slots: dict[str, str]) -> str:
        return template.format_map(slots) if "{" in template else template

    def _cjk(self, lang: str, n: int, slots: dict[str, str]) -> str:
        phrases = _CJK_PHRASES[lang]
        sep = _CJK_SEPARATOR[lang]
        end = "." if lang == "ko" else "\u3002"
        out = []
        for phrase in _some(self.rng, phrases, n):
            p = self._fill(phrase, slots)
            out.append(p if p[-1] in "\u3002\uff1f\uff01.?!" else p + end)
        return sep.join(out)

    def _code_block(self, lo: int, hi: int) -> str:
        _, code = self.pool.slice(self.rng.random(), lo + _idx(self.rng, hi - lo))
        return "```python\n" + code.rstrip() + "\n```"

    # ---- message texts --------------------------------------------------------------

    def _user_text(self, ctx: _Ctx) -> str:
        rng = self.rng
        slots = self._slots(ctx)
        if ctx.lang != "en" and rng.random() < 0.85:
            text = self._cjk(ctx.lang, 1 + _idx(rng, 3), slots)
            if rng.random() < 0.3:  # mixed CJK / Latin
                text += " " + self._fill(_one(rng, _CLI_PROMPTS), slots)
            return text
        prompts = _CLI_PROMPTS if ctx.source == "cli" else _GATEWAY_PROMPTS
        text = self._fill(_one(rng, prompts), slots)
        if rng.random() < _P_CJK_USER_IN_EN:
            lang = _W_LANG.pick(rng)
            text += " " + self._cjk(lang, 1, slots)
        elif ctx.source == "cli" and rng.random() < 0.06:
            text += "\n\n" + self._code_block(200, 1500)
        return text

    def _assistant_text(self, ctx: _Ctx) -> str:
        rng = self.rng
        slots = self._slots(ctx)
        parts: list[str] = []
        if ctx.lang != "en" and rng.random() < 0.8:
            parts.append(self._cjk(ctx.lang, 2 + _idx(rng, 4), slots))
        else:
            pool = _ASSISTANT_SENTENCES if ctx.source == "cli" else _CHAT_SENTENCES
            sentences = _some(rng, pool, 1 + _idx(rng, 10))
            while sentences:
                n = 1 + _idx(rng, 4)
                parts.append(" ".join(self._fill(x, slots) for x in sentences[:n]))
                del sentences[:n]
        if rng.random() < 0.3:
            parts.append(
                "\n".join(self._fill(x, slots) for x in _some(rng, _BULLETS, 2 + _idx(rng, 4)))
            )
        if ctx.source == "cli" and rng.random() < 0.25:
            parts.append(self._code_block(150, 1800))
        return "\n\n".join(parts)

    def _multimodal(self, ctx: _Ctx) -> str:
        rng = self.rng
        parts: list[dict[str, object]] = []
        if rng.random() < 0.8:
            parts.append({"type": "text", "text": self._user_text(ctx)})
        for _ in range(1 + (rng.random() < 0.2)):
            if rng.random() < 0.5:
                data = base64.b64encode(self._bytes(256 + _idx(rng, 1280))).decode("ascii")
                url = "data:image/png;base64," + data
            else:
                url = (
                    f"https://cdn.example.com/attachments/{self._digits(18)}/IMG_{self._hex(4)}.jpg"
                )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        return MULTIMODAL_PREFIX + _dumps(parts)

    # ---- tool calls and outputs -----------------------------------------------------

    def _size(self) -> int:
        return int(_quantile(self.rng, _TOOL_OUTPUT_CHARS))

    def _tool(self, name: str, ctx: _Ctx) -> tuple[dict[str, object], str]:
        """Return (arguments, output) of one call of the named tool."""
        return _TOOL_BUILDERS[name](self, ctx)

    def _terminal(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        kind = _W_TERMINAL.pick(rng)
        size = self._size()
        command, output, code = _TERMINAL_BUILDERS[kind](self, size, ctx)
        args: dict[str, object] = {"command": command}
        if rng.random() < 0.2:
            args["timeout"] = 300
        return args, _dumps({"output": output, "exit_code": code, "error": None})

    def _read_file(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        size = self._size()
        start, chunk = self.pool.file_slice(self.rng.random(), size * 7 // 8)
        name, lineno = self.pool.where(start)
        lines = chunk.split("\n")
        numbered = "\n".join(f"{n:>6}|{line}" for n, line in enumerate(lines, lineno))
        path = f"/usr/lib/python3.11/{name}"
        args: dict[str, object] = {"path": path, "offset": lineno, "limit": len(lines)}
        body = {
            "content": numbered,
            "total_lines": lineno + len(lines) + _idx(self.rng, 900),
            "truncated": self.rng.random() < 0.3,
        }
        return args, _dumps(body)

    def _grep(self, size: int) -> list[str]:
        """Return grep-style `path:line:text` matches of about `size` characters."""
        rng = self.rng
        pool = self.pool
        matches: list[str] = []
        drawn = 0
        wanted = 1 + size // 55  # ~55 characters a match; the draws never depend on the text
        while drawn < wanted:  # a few files, a run of scattered lines in each
            index = _idx(rng, len(pool.lines))
            name, lineno, _ = pool.line_at(index)
            f = bisect.bisect_right(pool.file_first_lines, index)
            stop = pool.file_first_lines[f] if f < len(pool.file_first_lines) else len(pool.lines)
            for _ in range(min(3 + _idx(rng, 30), wanted - drawn)):
                line = pool.lines[index].strip() if index < stop else ""
                if line:  # past the end of the file or blank: keep drawing, write nothing
                    matches.append(f"{name}:{lineno}:{line}")
                drawn += 1
                step = 1 + _idx(rng, 40)
                index += step
                lineno += step
        return matches

    def _search_files(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        pattern = _one(rng, _IDENTS) if rng.random() < 0.5 else ctx.topic[2]
        matches = self._grep(min(self._size(), 12000))
        args: dict[str, object] = {"pattern": pattern, "path": ".", "target": "content"}
        return args, _dumps({"total_count": len(matches), "matches": "\n".join(matches)})

    def _write_file(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        _, content = self.pool.slice(self.rng.random(), 300 + _idx(self.rng, 3500))
        path = ctx.topic[0]
        args: dict[str, object] = {"path": path, "content": content}
        lines = content.count("\n") + 1
        return args, _dumps(
            {
                "success": True,
                "path": path,
                "lines_written": lines,
                "bytes_written": len(content.encode("utf-8")),
                "lint": {"status": "ok", "checker": "ruff", "issues": []},
            }
        )

    def _patch(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        _, old = self.pool.slice(rng.random(), 80 + _idx(rng, 500))
        new = (
            old.replace("    ", "    # TODO: fix\n    ", 1)
            if rng.random() < 0.5
            else (old + "\n" + self._fill(_one(rng, _BULLETS), self._slots(ctx)).lstrip("- "))
        )
        path = ctx.topic[0]
        old_lines, new_lines = old.split("\n"), new.split("\n")
        at = 1 + _idx(rng, 400)
        diff = (
            f"--- a/{path}\n+++ b/{path}\n@@ -{at},{len(old_lines)} +{at},{len(new_lines)} @@\n"
            + "\n".join("-" + x for x in old_lines)
            + "\n"
            + "\n".join("+" + x for x in new_lines)
        )
        args: dict[str, object] = {"path": path, "old_string": old, "new_string": new}
        return args, _dumps({"success": True, "diff": diff, "files_modified": [path]})

    def _web_results(self, n: int, ctx: _Ctx) -> list[dict[str, str]]:
        rng = self.rng
        out = []
        for _ in range(n):
            start, text = self.pool.slice(rng.random(), 120 + _idx(rng, 260))
            name, _ = self.pool.where(start)
            title = f"{name} - {_one(rng, _IDENTS)} documentation"
            description = " ".join(text.split())
            if ctx.lang != "en" and rng.random() < 0.5:  # a page in the user's language
                slots = self._slots(ctx)
                title = self._cjk(ctx.lang, 1, slots)
                description = self._cjk(ctx.lang, 2 + _idx(rng, 3), slots)
            out.append({"title": title, "url": _one(rng, _URLS), "description": description})
        return out

    def _web_search(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        slots = self._slots(ctx)
        if ctx.lang != "en" and rng.random() < 0.5:
            query = self._cjk(ctx.lang, 1, slots)
        else:
            query = f"{slots['ident']} {_one(rng, ('error', 'docs', 'example', 'changelog'))}"
        return {"query": query}, _dumps(
            {"success": True, "data": {"web": self._web_results(3 + _idx(rng, 8), ctx)}}
        )

    def _web_extract(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        url = _one(rng, _URLS)
        start, text = self.pool.slice(rng.random(), self._size())
        name, _ = self.pool.where(start)
        page = {"url": url, "title": f"{name} | reference", "content": f"# {name}\n\n{text}"}
        return {"urls": [url]}, _dumps({"results": [page]})

    def _execute_code(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        _, code = self.pool.slice(rng.random(), 200 + _idx(rng, 1400))
        _, out = self.pool.slice(rng.random(), self._size() // 2)
        body = {
            "status": "success",
            "output": out,
            "tool_calls_made": _idx(rng, 4),
            "duration_seconds": round(0.05 + rng.random() * 9, 2),
        }
        return {"code": code}, _dumps(body)

    def _browser(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        url = _one(rng, _URLS)
        size = self._size()
        lines = [f'- document "{self._fill(_one(rng, _TITLES), self._slots(ctx))}"']
        for ref in range(1, 2 + size // 85):  # ~85 characters a line
            _, text = self.pool.slice(rng.random(), 30 + _idx(rng, 90))
            kind = _one(rng, ("heading", "link", "paragraph", "button", "textbox", "listitem"))
            lines.append(f'  - {kind} "{" ".join(text.split())}" [ref=e{ref}]')
        return {"url": url}, _dumps({"success": True, "url": url, "snapshot": "\n".join(lines)})

    def _todo(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        slots = self._slots(ctx)
        todos = [
            {
                "id": str(i + 1),
                "content": self._fill(_one(rng, _BULLETS), slots)[2:],
                "status": _one(rng, ("pending", "in_progress", "completed")),
            }
            for i in range(1 + _idx(rng, 5))
        ]
        return {"todos": todos}, _dumps({"todos": todos, "summary": {"total": len(todos)}})

    def _memory(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        entry = _one(rng, _MEMORY_LINES)
        args: dict[str, object] = {"action": "add", "target": "memory", "content": entry}
        entries = [x for x in _some(rng, _MEMORY_LINES, 1 + _idx(rng, 6)) if x != entry]
        entries.append(entry)
        return args, _dumps(
            {
                "success": True,
                "message": "Entry added.",
                "entries": entries,
                "usage": f"{len(entries) * 7}% of 2,200 chars",
            }
        )

    def _session_search(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        slots = self._slots(ctx)
        query = slots["ident"] if ctx.lang == "en" else self._cjk(ctx.lang, 1, slots)
        results = []
        for _ in range(1 + _idx(rng, 3)):
            when = time.gmtime(int(_EPOCH - 86_400 * (1 + rng.random() * 90)))
            results.append(
                {
                    "session_id": time.strftime("%Y%m%d_%H%M%S_", when) + self._hex(6),
                    "when": time.strftime("%Y-%m-%d", when),
                    "summary": self._assistant_text(ctx),
                }
            )
        return {"query": query}, _dumps({"success": True, "results": results})

    def _delegate(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        slots = self._slots(ctx)
        goal = self._fill(_one(self.rng, _CLI_PROMPTS), slots)
        result = {
            "status": "completed",
            "summary": self._assistant_text(ctx),
            "duration_seconds": round(20 + self.rng.random() * 400, 1),
        }
        return {"goal": goal}, _dumps({"results": [result]})

    def _send_message(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        target = f"{_one(self.rng, SOURCES[1:])}:{self._digits(10)}"
        text = self._assistant_text(ctx)[:400]
        result = {
            "success": True,
            "target": target,
            "message_id": self._digits(12),
            "delivered_chars": len(text),
            "note": "Message delivered to the home channel.",
        }
        return {"target": target, "message": text}, _dumps(result)

    def _cronjob(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        schedule = _one(self.rng, ("0 9 * * *", "*/30 * * * *", "0 3 * * 1", "every 2h"))
        args: dict[str, object] = {
            "action": "create",
            "schedule": schedule,
            "prompt": self._user_text(ctx),
        }
        job = {
            "job_id": self._hex(8),
            "schedule": schedule,
            "prompt": args["prompt"],
            "deliver": "origin",
            "next_run_at": "2025-06-13T09:00:00+00:00",
            "enabled": True,
        }
        return args, _dumps({"success": True, "job": job, "jobs_total": 1 + _idx(self.rng, 9)})

    def _vision(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        args: dict[str, object] = {
            "image_url": f"~/.hermes/cache/img_{self._hex(8)}.png",
            "question": "What does this screenshot show?",
        }
        return args, _dumps({"success": True, "analysis": self._assistant_text(ctx)})

    def _skill_view(self, ctx: _Ctx) -> tuple[dict[str, object], str]:
        rng = self.rng
        name = _one(rng, ("github-pr-workflow", "sqlite-maintenance", "daily-briefing"))
        _, body = self.pool.slice(rng.random(), self._size())
        return {"name": name}, _dumps(
            {"success": True, "name": name, "content": f"---\nname: {name}\n---\n\n{body}"}
        )

    # ---- terminal outputs: (command, output, exit code) ------------------------------

    def _t_cat(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        start, text = self.pool.file_slice(self.rng.random(), size)
        name, _ = self.pool.where(start)
        return f"cat /usr/lib/python3.11/{name}", text, 0

    def _t_rg(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        pattern = _one(self.rng, _IDENTS)
        return f"rg -n '{pattern}' .", "\n".join(self._grep(min(size, 12000))), 0

    def _t_pytest(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        passed = 20 + _idx(rng, 600)
        failed = _idx(rng, 4) if rng.random() < 0.5 else 0
        lines = [
            "============================= test session starts =============================",
            "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
            f"rootdir: {ctx.cwd or '/home/alex/code/hermes-agent'}",
            "plugins: xdist-3.6.1, benchmark-4.0.0, alembic-0.11.1",
            f"collected {passed + failed} items",
            "",
        ]
        pct = 0
        while pct < 100:
            pct = min(100, pct + 3 + _idx(rng, 20))
            dots = "." * (5 + _idx(rng, 40))
            lines.append(f"tests/test_{_one(rng, _WORDS)}.py {dots:<50} [{pct:>3}%]")
        out = "\n".join(lines)
        rule = "=" * 30
        if failed:
            test = f"test_{_one(rng, _WORDS)}_{_one(rng, _IDENTS)}"
            _, src = self.pool.slice(rng.random(), max(200, size - len(out)))
            error = _one(rng, _ERRORS)
            out += (
                f"\n\n{rule} FAILURES {rule}\n____ {test} ____\n\n{src}\n"
                f"E       {error}\n{rule} short test summary info {rule}\n"
                f"FAILED tests/test_{_one(rng, _WORDS)}.py::{test} - {error}"
            )
        summary = f"{failed} failed, {passed} passed" if failed else f"{passed} passed"
        out += f"\n{rule} {summary} in {rng.random() * 90 + 1:.2f}s {rule}"
        command = _one(rng, ("python -m pytest -q", "pytest tests/ -x", "make test"))
        return command, out, 1 if failed else 0

    def _t_git_diff(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        start, text = self.pool.file_slice(rng.random(), size)
        name, lineno = self.pool.where(start)
        lines = text.split("\n")
        k = _idx(rng, len(lines))
        body = "".join(" " + line + "\n" for line in lines[:k])
        body += f"-{lines[k]}\n+{lines[k]}  # TODO: fix\n"
        body += "".join(" " + line + "\n" for line in lines[k + 1 :])
        head = (
            f"diff --git a/{name} b/{name}\nindex {self._hex(7)}..{self._hex(7)} 100644\n"
            f"--- a/{name}\n+++ b/{name}\n@@ -{lineno},{len(lines)} +{lineno},"
            f"{len(lines) + 1} @@\n"
        )
        return "git diff", head + body, 0

    def _t_git_log(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        entries: list[str] = []
        total = 0
        day = 1 + _idx(rng, 28)
        while total < min(size, 8000):
            entry = (
                f"commit {self._hex(40)}\nAuthor: {_one(rng, _AUTHORS)}\n"
                f"Date:   Thu Jun {day:>2} {_idx(rng, 24):02d}:{_idx(rng, 60):02d}:"
                f"{_idx(rng, 60):02d} 2025 +0200\n\n    {_one(rng, _COMMITS)}\n"
            )
            entries.append(entry)
            total += len(entry)
        return "git log -n 20", "\n".join(entries), 0

    def _t_ls(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        lines = [
            f"total {8 + _idx(rng, 400)}",
            "drwxr-xr-x  12 alex staff     384 Jun 12 09:14 .",
            "drwxr-xr-x  40 alex staff    1280 Jun  3 18:40 ..",
        ]
        names = self.pool.names
        for _ in range(1 + min(size, 2500) // 60):  # ~60 characters a line
            is_dir = rng.random() < 0.3
            name = _one(rng, _LS_NAMES) if rng.random() < 0.5 else _one(rng, names)
            lines.append(
                f"{'drwxr-xr-x' if is_dir else '-rw-r--r--'} {1 + _idx(rng, 12):>3} alex "
                f"staff {_idx(rng, 90000):>7} Jun {1 + _idx(rng, 28):>2} "
                f"{_idx(rng, 24):02d}:{_idx(rng, 60):02d} {name}"
            )
        return f"ls -la {ctx.cwd or '~'}", "\n".join(lines), 0

    def _t_git_status(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        changed = "\n".join(f"\tmodified:   {_one(rng, _PATHS)}" for _ in range(1 + _idx(rng, 8)))
        out = (
            f"On branch {ctx.branch or 'main'}\nYour branch is ahead of 'origin/main' by "
            f"{1 + _idx(rng, 5)} commits.\n\nChanges not staged for commit:\n{changed}\n\n"
            "Untracked files:\n\tmy-app.config.ts.bak\n\tnotes/P2.2-plan.md\n"
        )
        return "git status", out, 0

    def _t_json(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        records = []
        for i in range(max(1, min(size, 12000) // 230)):
            records.append(
                {
                    "id": 1000 + i,
                    "name": _one(rng, _IDENTS),
                    "status": _one(rng, ("ok", "degraded", "failed", "pending")),
                    "updated_at": f"2025-06-{1 + _idx(rng, 28):02d}T{_idx(rng, 24):02d}:"
                    f"{_idx(rng, 60):02d}:00Z",
                    "tags": [_one(rng, _WORDS), _one(rng, _WORDS)],
                    "path": _one(rng, _PATHS),
                }
            )
        url = "https://api.example.com/v2/users.list?limit=100"
        return f"curl -s '{url}' | jq .", json.dumps({"items": records}, indent=2), 0

    def _t_traceback(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        frames = ["Traceback (most recent call last):"]
        for _ in range(2 + _idx(rng, 8)):
            name, lineno, line = self.pool.line_at(_idx(rng, len(self.pool.lines)))
            frames.append(
                f'  File "/usr/lib/python3.11/{name}", line {lineno}, in '
                f"{_one(rng, _WORDS)}_{_one(rng, ('run', 'load', 'send', 'query'))}"
            )
            frames.append(f"    {line.strip()}")
        frames.append(_one(rng, _ERRORS))
        return (
            f"python -m {_one(rng, ('hermes_store', 'app', 'scripts.export'))}",
            "\n".join(frames),
            1,
        )

    def _t_pip(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        pkgs = ("sqlalchemy", "alembic", "click", "pytest", "ruff", "mypy", "httpx", "rich")
        lines = ["Obtaining file:///home/alex/code/hermes-agent"]
        chosen = [pkgs[_idx(rng, len(pkgs))] for _ in range(2 + _idx(rng, 6))]
        for p in chosen:
            lines.append(f"Collecting {p}>=1.0")
            lines.append(
                f"  Downloading {p}-{1 + _idx(rng, 3)}.{_idx(rng, 20)}.{_idx(rng, 9)}"
                f"-py3-none-any.whl ({10 + _idx(rng, 900)} kB)"
            )
        lines.append("Successfully installed " + " ".join(chosen))
        return "pip install -e '.[dev]'", "\n".join(lines), 0

    def _t_build(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        lines = [
            "> my-app@0.4.1 build",
            "> next build",
            "",
            "   Creating an optimized build",
            " \u2713 Compiled successfully",
            "Route (app)   Size   First Load JS",
        ]
        for _ in range(3 + _idx(rng, 25)):
            lines.append(
                f"\u251c \u25cb /{_one(rng, _WORDS)}/{_one(rng, _IDENTS)}   "
                f"{_idx(rng, 900)} B   {80 + _idx(rng, 60)} kB"
            )
        return "npm run build", "\n".join(lines), 0

    def _t_docker(self, size: int, ctx: _Ctx) -> tuple[str, str, int]:
        rng = self.rng
        lines = ["CONTAINER ID   IMAGE                 STATUS          NAMES"]
        for _ in range(1 + _idx(rng, 8)):
            lines.append(
                f"{self._hex(12)}   {_one(rng, ('redis:7', 'postgres:16', 'nginx'))}"
                f"   Up {1 + _idx(rng, 40)} hours   {_one(rng, _IDENTS)}"
            )
        return "docker ps", "\n".join(lines), 0

    # ---- sessions -------------------------------------------------------------------

    def _context(self) -> _Ctx:
        rng = self.rng
        source = _W_SOURCES.pick(rng)
        model = _W_MODELS.pick(rng)
        lang = _W_LANG.pick(rng) if rng.random() < _P_CJK_SESSION else "en"
        if self.sessions % _CJK_EVERY == 1:
            lang = ("zh", "ja", "ko")[(self.sessions // _CJK_EVERY) % 3]
        self.sessions += 1
        topic = (_one(rng, _PATHS), _one(rng, _PATHS), _one(rng, _IDENTS), _one(rng, _IDENTS))
        if source == "cli":
            cwd, root = _PROJECTS[_idx(rng, len(_PROJECTS))]
            branch = _one(rng, _BRANCHES) if root else None
            return _Ctx(
                source, lang, model, None, None, cwd, root, branch, _W_CLI_TOOLS, 0.75, topic
            )
        peer = self.peers[source][_idx(rng, 5)]
        thread = None
        if peer.chat_type == "thread" or (peer.chat_type == "channel" and rng.random() < 0.5):
            if source == "discord":
                thread = self._digits(19)
            else:
                thread = f"17{self._digits(8)}.{self._digits(6)}"
        return _Ctx(
            source, lang, model, peer, thread, None, None, None, _W_GATEWAY_TOOLS, 0.45, topic
        )

    def _new_id(self, t: float) -> str:
        stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime(int(t)))
        while True:
            sid = f"{stamp}_{self._hex(6)}"
            if sid not in self.ids:
                self.ids.add(sid)
                return sid

    def _title(self, ctx: _Ctx, base: str | None) -> str | None:
        rng = self.rng
        if base is None:
            if rng.random() < 0.25:
                return None
            if ctx.lang != "en":
                base = self._fill(_one(rng, _CJK_PHRASES[ctx.lang]), self._slots(ctx))[:24]
            else:
                base = self._fill(_one(rng, _TITLES), self._slots(ctx))
        title, n = base, 2
        while title in self.titles:
            title = f"{base} #{n}"
            n += 1
        self.titles.add(title)
        return title

    def _system_prompt(self, ctx: _Ctx) -> str:
        rng = self.rng
        memory = "\n".join("- " + _one(rng, _MEMORY_LINES) for _ in range(2 + _idx(rng, 5)))
        where = (
            f"You are running in a terminal; cwd is {ctx.cwd}."
            if ctx.source == "cli"
            else f"You are talking to the user on {ctx.source}; keep replies short."
        )
        return f"{_SYSTEM_PROMPT_BASE}\n## Memory\n{memory}\n\n## Platform\n{where}\n"

    def run(self, n_messages: int) -> Iterator[Transcript]:
        """Yield transcripts until exactly n_messages message rows were produced."""
        rng = self.rng
        remaining = n_messages
        clock = _EPOCH
        while remaining > 0:
            clock += _quantile(rng, _SESSION_GAP_S)
            ctx = self._context()
            size = min(remaining, int(_quantile(rng, _SESSION_MESSAGES)))
            chunks = [size]
            if size > 160 and (not self.splits or rng.random() < _P_COMPRESSION_SPLIT):
                self.splits += 1
                chunks = []
                left = size
                while left > 0:
                    take = min(left, 80 + _idx(rng, 80))
                    if left - take < 10:
                        take = left
                    chunks.append(take)
                    left -= take
            parent: str | None = None
            delegated = False
            if self.recent and ctx.source == "cli" and rng.random() < _P_DELEGATION:
                parent = self.recent[_idx(rng, len(self.recent))]
                delegated = True
            root_title: str | None = None
            start = clock
            for i, chunk in enumerate(chunks):
                last_chunk = i == len(chunks) - 1
                is_final = last_chunk and chunk == remaining
                open_ = is_final or (last_chunk and rng.random() < _P_OPEN_SESSION)
                end = (
                    None
                    if open_
                    else (
                        "compression"
                        if not last_chunk
                        else ("delegation_complete" if delegated else None)
                    )
                )
                tr = self._session(
                    ctx, chunk, start, parent, i > 0, end, open_, root_title, delegated, i + 1
                )
                yield tr
                remaining -= chunk
                sid = str(tr.session["id"])
                parent = sid
                if i == 0 and isinstance(tr.session["title"], str):
                    root_title = tr.session["title"]
                ended = tr.session["ended_at"]
                start = (ended if isinstance(ended, float) else start) + 0.5 + rng.random() * 2
                self.recent.append(sid)
                if len(self.recent) > 20:
                    del self.recent[0]

    def _session(
        self,
        ctx: _Ctx,
        size: int,
        start: float,
        parent: str | None,
        continued: bool,
        end_reason: str | None,
        open_: bool,
        parent_title: str | None,
        delegated: bool,
        part: int,
    ) -> Transcript:
        rng = self.rng
        sid = self._new_id(start)
        rows, t, rewinds = self._messages(ctx, sid, size, start, continued)
        if delegated:
            title = None
        elif continued:
            title = self._title(ctx, f"{parent_title} #{part}") if parent_title else None
        else:
            title = self._title(ctx, None)
        if end_reason is None and not open_:
            kind = "cli" if ctx.source == "cli" else "gateway"
            end_reason = _W_END[kind].pick(rng)
        session = self._session_row(
            ctx,
            sid,
            rows,
            start,
            None if open_ else t + 1 + rng.random() * 30,
            end_reason,
            parent,
            title,
            rewinds,
        )
        return Transcript(session, rows)

    def _session_row(
        self,
        ctx: _Ctx,
        sid: str,
        rows: list[Row],
        start: float,
        ended: float | None,
        end_reason: str | None,
        parent: str | None,
        title: str | None,
        rewinds: int,
    ) -> Row:
        rng = self.rng
        system_prompt = self._system_prompt(ctx)
        context = _tokens(system_prompt)
        input_tokens = output_tokens = reasoning_tokens = api_calls = 0
        for m in rows:
            tok = m["token_count"]
            assert isinstance(tok, int)
            if m["role"] == "assistant":
                api_calls += 1
                input_tokens += min(context, 180_000)
                output_tokens += tok
                reasoning = m["reasoning"]
                if isinstance(reasoning, str):
                    reasoning_tokens += _tokens(reasoning)
            context += tok
        model = ctx.model
        cached = model.provider in ("anthropic", "openrouter", "openai")
        cache_read = input_tokens * (50 + _idx(rng, 40)) // 100 if cached else 0
        cache_write = input_tokens * _idx(rng, 10) // 100 if cached else 0
        cost = (input_tokens * model.price_in + output_tokens * model.price_out) / 1_000_000
        known = model.name is not None and model.provider != "custom"
        peer = ctx.peer
        session_key = None
        if peer is not None:
            session_key = f"agent:main:{ctx.source}:{peer.chat_type}:{peer.chat_id}"
            if ctx.thread_id:
                session_key += f":{ctx.thread_id}"
        config = (
            _dumps({"temperature": round(rng.random(), 2), "max_tokens": 8192})
            if rng.random() < 0.6
            else None
        )
        return {
            "id": sid,
            "source": ctx.source,
            "user_id": peer.user_id if peer else None,
            "session_key": session_key,
            "chat_id": peer.chat_id if peer else None,
            "chat_type": peer.chat_type if peer else None,
            "thread_id": ctx.thread_id,
            "model": model.name,
            "model_config": config,
            "system_prompt": system_prompt,
            "parent_session_id": parent,
            "started_at": round(start, 6),
            "ended_at": round(ended, 6) if ended is not None else None,
            "end_reason": end_reason,
            "message_count": len(rows),
            "tool_call_count": self.calls,
            "api_call_count": api_calls,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_tokens": cache_read,
            "cache_write_tokens": cache_write,
            "reasoning_tokens": reasoning_tokens,
            "cwd": ctx.cwd,
            "git_branch": ctx.branch,
            "git_repo_root": ctx.repo_root,
            "billing_provider": model.provider,
            "billing_base_url": model.base_url,
            "billing_mode": "api" if model.provider else None,
            "estimated_cost_usd": round(cost, 6) if known else None,
            "actual_cost_usd": round(cost, 6) if model.provider == "openrouter" else None,
            "cost_status": "estimated" if known else "unknown",
            "cost_source": "pricing_table" if known else None,
            "pricing_version": "2025-06-01" if known else None,
            "title": title,
            "rewind_count": rewinds,
            "archived": 1 if rng.random() < _P_ARCHIVED else 0,
        }

    def _row(
        self,
        ctx: _Ctx,
        sid: str,
        role: str,
        content: str | None,
        t: float,
        *,
        tool_call_id: str | None = None,
        tool_calls: str | None = None,
        tool_name: str | None = None,
        finish_reason: str | None = None,
        reasoning: str | None = None,
        observed: int = 0,
    ) -> Row:
        platform_id: str | None = None
        if ctx.peer is not None and role in ("user", "assistant") and tool_calls is None:
            platform_id = self._digits(12 if ctx.source != "discord" else 19)
        counted = content if content is not None else (tool_calls or "")
        return {
            "session_id": sid,
            "role": role,
            "content": content,
            "tool_call_id": tool_call_id,
            "tool_calls": tool_calls,
            "tool_name": tool_name,
            "timestamp": round(t, 6),
            "token_count": _tokens(counted),
            "finish_reason": finish_reason,
            "reasoning": reasoning,
            "platform_message_id": platform_id,
            "observed": observed,
            "active": 1,
            "compacted": 0,
        }

    def _summary(self, ctx: _Ctx) -> str:
        slots = self._slots(ctx)
        text = (
            "[CONTEXT COMPACTION - REFERENCE ONLY] Earlier turns were compacted into this "
            "summary. The user asked about {ident} in {path}; we ran the tests, fixed "
            "{ident2} and agreed on TODO: fix the remaining flaky case. Files touched: "
            "{path}, {path2}."
        ).format_map(slots)
        if ctx.lang != "en":
            text += " " + self._cjk(ctx.lang, 2, slots)
        return text + "\n\n" + self._assistant_text(ctx)

    def _messages(
        self, ctx: _Ctx, sid: str, size: int, start: float, continued: bool
    ) -> tuple[list[Row], float, int]:
        rng = self.rng
        rows: list[Row] = []
        t = start + 0.2 + rng.random()
        rewinds = 0
        compact_at = -1
        self.calls = 0
        if size >= 40 and (not self.compactions or rng.random() < _P_COMPACT_SESSION):
            compact_at = size * (20 + _idx(rng, 25)) // 100
        if continued:
            rows.append(self._row(ctx, sid, "user", self._summary(ctx), t))
        while len(rows) < size:
            first = len(rows)
            t = self._turn(ctx, sid, rows, size, t)
            if (
                len(rows) < size - 1
                and len(rows) - first >= 2
                and ((not self.rewinds and first > 0) or rng.random() < _P_REWIND_PER_TURN)
            ):
                for m in rows[first:]:
                    m["active"] = 0
                rewinds += 1
                self.rewinds += 1
            elif 0 <= compact_at <= len(rows) < size:
                self.compactions += 1
                for m in rows:
                    if m["active"] == 1:
                        m["active"] = 0
                        m["compacted"] = 1
                t += 0.5 + rng.random() * 5
                rows.append(self._row(ctx, sid, "user", self._summary(ctx), t))
                compact_at = -1
        return rows, t, rewinds

    def _turn(self, ctx: _Ctx, sid: str, rows: list[Row], size: int, t: float) -> float:
        """Append one user turn (and the agent's work on it); never exceed size rows."""
        rng = self.rng
        t += _quantile(rng, _USER_THINK_S)
        if ctx.peer is not None and ctx.peer.chat_type != "dm" and rng.random() < 0.2:
            rows.append(self._row(ctx, sid, "user", _one(rng, _OBSERVED_CHATTER), t, observed=1))
            t += 1 + rng.random() * 60
            if len(rows) >= size:
                return t
        if rng.random() < _P_SYSTEM_NOTE:
            note = self._fill(_one(rng, _SYSTEM_NOTES), self._slots(ctx))
            rows.append(self._row(ctx, sid, "system", note, t))
            t += 0.01 + rng.random()
            if len(rows) >= size:
                return t
        p_multi = 0.002 if ctx.source == "cli" else 0.02
        self.user_messages += 1
        multi = self.user_messages == 3 or rng.random() < p_multi
        text = self._multimodal(ctx) if multi else self._user_text(ctx)
        rows.append(self._row(ctx, sid, "user", text, t))
        rounds = _W_ROUNDS.pick(rng) if rng.random() < ctx.tool_turn_p else 0
        for _ in range(rounds):
            if len(rows) >= size:
                return t
            t += _quantile(rng, _MODEL_LATENCY_S)
            calls: list[dict[str, object]] = []
            outputs: list[tuple[str, str, str]] = []
            for _ in range(_W_CALLS.pick(rng)):
                name = ctx.tools.pick(rng)
                args, output = self._tool(name, ctx)
                digits = 22 if ctx.model.call_prefix == "toolu_01" else 24
                call_id = ctx.model.call_prefix + self._hex(digits)
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": _dumps(args)},
                    }
                )
                outputs.append((call_id, name, output))
            self.calls += len(calls)
            preface: str | None = None
            if rng.random() < 0.25:
                slots = self._slots(ctx)
                preface = (
                    self._cjk(ctx.lang, 1, slots)
                    if ctx.lang != "en"
                    else self._fill(_one(rng, _PREFACES), slots)
                )
            rows.append(
                self._row(
                    ctx,
                    sid,
                    "assistant",
                    preface,
                    t,
                    tool_calls=_dumps(calls),
                    finish_reason="tool_calls",
                    reasoning=self._reasoning(ctx),
                )
            )
            for call_id, name, output in outputs:
                if len(rows) >= size:
                    return t
                t += _quantile(rng, _TOOL_LATENCY_S)
                rows.append(
                    self._row(ctx, sid, "tool", output, t, tool_call_id=call_id, tool_name=name)
                )
        if len(rows) < size:
            t += _quantile(rng, _MODEL_LATENCY_S)
            finish = "length" if rng.random() < 0.03 else "stop"
            rows.append(
                self._row(
                    ctx,
                    sid,
                    "assistant",
                    self._assistant_text(ctx),
                    t,
                    finish_reason=finish,
                    reasoning=self._reasoning(ctx),
                )
            )
        return t

    def _reasoning(self, ctx: _Ctx) -> str | None:
        rng = self.rng
        if not ctx.model.reasons or rng.random() < 0.6:
            return None
        slots = self._slots(ctx)
        return " ".join(self._fill(x, slots) for x in _some(rng, _REASONING, 1 + _idx(rng, 4)))


_Builder: TypeAlias = Callable[[_Generator, _Ctx], tuple[dict[str, object], str]]
_TermBuilder: TypeAlias = Callable[[_Generator, int, _Ctx], tuple[str, str, int]]

_TOOL_BUILDERS: Final[dict[str, _Builder]] = {
    "terminal": _Generator._terminal,
    "read_file": _Generator._read_file,
    "search_files": _Generator._search_files,
    "write_file": _Generator._write_file,
    "patch": _Generator._patch,
    "web_search": _Generator._web_search,
    "web_extract": _Generator._web_extract,
    "execute_code": _Generator._execute_code,
    "browser_navigate": _Generator._browser,
    "todo": _Generator._todo,
    "memory": _Generator._memory,
    "session_search": _Generator._session_search,
    "delegate_task": _Generator._delegate,
    "send_message": _Generator._send_message,
    "cronjob": _Generator._cronjob,
    "vision_analyze": _Generator._vision,
    "skill_view": _Generator._skill_view,
}
_TERMINAL_BUILDERS: Final[dict[str, _TermBuilder]] = {
    "cat": _Generator._t_cat,
    "rg": _Generator._t_rg,
    "pytest": _Generator._t_pytest,
    "git_diff": _Generator._t_git_diff,
    "git_log": _Generator._t_git_log,
    "ls": _Generator._t_ls,
    "git_status": _Generator._t_git_status,
    "json": _Generator._t_json,
    "traceback": _Generator._t_traceback,
    "pip": _Generator._t_pip,
    "build": _Generator._t_build,
    "docker": _Generator._t_docker,
}

# --------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------


def iter_transcripts(n_messages: int, seed: int = 0) -> Iterator[Transcript]:
    """Yield sessions with their messages, exactly `n_messages` messages in all.

    Parents come before their compression or delegation children, so inserting the
    transcripts in order satisfies `parent_session_id`. Only one session is held at a
    time, which keeps memory flat for very large corpora.
    """
    if n_messages < 0:
        raise ValueError(f"n_messages must be >= 0, got {n_messages}")
    return _Generator(seed).run(n_messages)


def generate(n_messages: int, seed: int = 0) -> Corpus:
    """Generate a corpus of exactly `n_messages` messages, identical for the same seed.

    Same seed and size, same rows, on every run and machine with the same CPython version.
    The structure (sessions, ids, roles, tools, flags, timestamps) depends only on the seed
    and the size; the text cut from the standard library, and the token counts and costs
    derived from its length, also depend on the Python version.

    Whatever the seed, the first occasion of each rare feature is taken, so that even a
    few hundred messages hold a multimodal message (the 3rd user message), a rewound
    turn, CJK text (the 2nd session), and, once sessions are long enough, a compacted
    range (first session of 40+ messages) and a compression child (first of 160+).
    """
    sessions: list[Row] = []
    messages: list[Row] = []
    collecting = gc.isenabled()
    gc.disable()  # the rows make no cycles; rescanning the growing heap cost ~30 % here
    try:
        for transcript in iter_transcripts(n_messages, seed):
            sessions.append(transcript.session)
            messages.extend(transcript.messages)
    finally:
        if collecting:
            gc.enable()
    return Corpus(sessions, messages)


def _insert_sql(table: str, columns: Sequence[str]) -> str:
    """Return a parameterised INSERT for the given columns."""
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"


_SESSION_VALUES: Final = operator.itemgetter(*SESSION_COLUMNS)
_MESSAGE_VALUES: Final = operator.itemgetter(*MESSAGE_COLUMNS)
_SAVEPOINT: Final = "hermes_corpus_populate"


def populate(conn: sqlite3.Connection, corpus: Corpus | Iterable[Transcript]) -> None:
    """Insert a corpus into an existing store in one transaction, messages in id order.

    `corpus` is a `Corpus` or an iterable of `Transcript` (for example
    `iter_transcripts(1_000_000)`, streamed without holding it all in memory). The rows
    are written with parameterised `executemany` INSERTs inside a SAVEPOINT: it commits
    when the connection had no transaction open, and otherwise becomes part of the
    caller's transaction. On error everything written is rolled back. The store's own
    triggers (the FTS ones included) index the messages as they are inserted.
    """
    session_sql = _insert_sql("sessions", SESSION_COLUMNS)
    message_sql = _insert_sql("messages", MESSAGE_COLUMNS)
    conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        if isinstance(corpus, Corpus):
            conn.executemany(session_sql, map(_SESSION_VALUES, corpus.sessions))
            conn.executemany(message_sql, map(_MESSAGE_VALUES, corpus.messages))
        else:
            for transcript in corpus:
                conn.execute(session_sql, _SESSION_VALUES(transcript.session))
                conn.executemany(message_sql, map(_MESSAGE_VALUES, transcript.messages))
    except BaseException:
        conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
        conn.execute(f"RELEASE {_SAVEPOINT}")
        raise
    conn.execute(f"RELEASE {_SAVEPOINT}")

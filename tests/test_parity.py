"""The headline guarantee of revision 22: every search answers exactly as before the upgrade.

A legacy store at schema 21 is filled once per module with a realistic corpus (long tool
outputs, tool-call JSON, Chinese / Japanese / Korean chat, rewound and compacted rows, every
source) plus targeted rows so that every query class of `PARITY_QUERIES` has hits. Every
query is answered on the legacy (inline) store, then on upgraded copies, for both conversion
paths (verified in place, and `-x fts_convert=rebuild`), and after a 22 -> 21 -> 22 round
trip: same ids, same order, byte-identical snippets and context.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from legacy import ddl
from legacy.build import build_legacy_store
from migration_support import back_to_inline_21, clone, migration_log
from parity_queries import PARITY_QUERIES, UNENCODABLE_QUERIES

from hermes_store import migrate
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.search import search_messages
from hermes_store.sqlite import fts
from hermes_store.store import Store

CORPUS_MESSAGES = 2000
CORPUS_SEED = 0
INDEXES = ("messages_fts", "messages_fts_trigram")


def _affordable(query: dict[str, Any]) -> dict[str, Any]:
    """The parity queries, with the one pathological entry cut down to an affordable size.

    `"def " * 1000` is sanitised to 512 AND-ed copies of `def`; FTS5's snippet() is roughly
    quadratic in the number of phrases (about 26 s on this corpus, on either layout), so the
    same query class (many repeated terms, the 2048-character cut) runs with 40 repetitions.
    """
    if query["query"] == "def " * 1000:
        return {**query, "query": "def " * 40}
    return query


QUERIES = [_affordable(q) for q in PARITY_QUERIES]
#: Lone surrogates: hermes_store answers [] on both layouts (compared layout to layout).
ALL_QUERIES = QUERIES + UNENCODABLE_QUERIES

# Targeted rows: each gives hits to a query class the generated corpus may lack.
EXTRA_SESSIONS = [
    ("parity-wa", "whatsapp", None),
    ("parity-slack", "slack", "qwen-max"),
    ("parity-dc", "discord", "gpt-5"),
]
TERMINAL_CALL = (
    '[{"id": "call_parity", "type": "function", '
    '"function": {"name": "terminal", "arguments": "{\\"cmd\\": \\"pytest -q\\"}"}}]'
)


def _row(
    session: str,
    role: str,
    content: str | None,
    tool_name: str | None = None,
    tool_calls: str | None = None,
    *,
    active: int = 1,
    compacted: int = 0,
) -> dict[str, Any]:
    return {
        "session_id": session,
        "role": role,
        "content": content,
        "tool_name": tool_name,
        "tool_calls": tool_calls,
        "active": active,
        "compacted": compacted,
    }


EXTRA_MESSAGES = [
    _row("parity-wa", "user", "def test_eq(self):\n    self.assertEqual(x, y)\n    return self"),
    _row(
        "parity-wa",
        "tool",
        "release v1.2.3-rc1 built; sys.argv[1] is my-app.config.ts, "
        "chat-send P2.2 foo_bar os.path.join __init__",
        "terminal",
    ),
    _row("parity-wa", "assistant", None, None, TERMINAL_CALL),
    _row("parity-wa", "user", '{"role": "assistant", "content": "TODO: fix foo"}'),
    _row("parity-wa", "user", "great job 😀 emoji"),
    _row("parity-slack", "assistant", "数据库连接失败，请检查服务器配置。我会说中文。"),
    _row("parity-slack", "user", "数据-库 与 数_据 与 数x据 与 完成100%的 与 路径\\的 与 100x的"),
    _row(
        "parity-slack",
        "assistant",
        "terminal テスト結果を確認しました。ありがとうございます",
        "terminal",
        TERMINAL_CALL,
    ),
    _row("parity-slack", "user", "测试文件已经上传，Python 编程 入门"),
    _row("parity-slack", "user", "测试文件 错误信息 都在这里"),
    _row("parity-slack", "system", "system notice: 설정을 확인합니다 (system prompt reloaded)"),
    # Rewound (hidden from the FTS paths, still found by the LIKE scan) and compacted rows.
    _row("parity-dc", "assistant", "数据库连接 rewound: def rewound(): return error", active=0),
    _row(
        "parity-dc",
        "assistant",
        "数据库连接 compacted summary: def import error exception",
        active=0,
        compacted=1,
    ),
    _row("parity-dc", "user", "한국어 테스트 합니다 数据库 服务器 です"),
]


def add_targeted_rows(path: Path) -> None:
    """Insert the EXTRA_* rows with the legacy triggers firing (plain sqlite3, like the app)."""
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        start = conn.execute("SELECT max(timestamp) FROM messages").fetchone()[0] or 0.0
        for number, (sid, source, model) in enumerate(EXTRA_SESSIONS):
            conn.execute(
                "INSERT INTO sessions (id, source, model, started_at) VALUES (?, ?, ?, ?)",
                (sid, source, model, start + 10 + number),
            )
        for number, row in enumerate(EXTRA_MESSAGES):
            conn.execute(
                "INSERT INTO messages (session_id, role, content, tool_name, tool_calls, "
                "active, compacted, timestamp) VALUES (:session_id, :role, :content, "
                ":tool_name, :tool_calls, :active, :compacted, :timestamp)",
                {**row, "timestamp": start + 100 + number},
            )


def build_parity_store(path: Path, version: int = 21) -> Path:
    """A legacy store (at 21 unless said) with the corpus and the targeted rows."""
    build_legacy_store(path, version)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(CORPUS_MESSAGES, CORPUS_SEED))
    add_targeted_rows(path)
    return path


def run_queries(path: Path, queries: list[dict[str, Any]]) -> list[list[Any]]:
    """Answer every query through a SQLAlchemy connection of the project's engine."""
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            return [list(search_messages(conn, **query)) for query in queries]
    finally:
        engine.dispose()


def differences(
    queries: list[dict[str, Any]], expected: list[list[Any]], actual: list[list[Any]]
) -> list[str]:
    """One line per query whose answer changed (first differing hit shown)."""
    lines = []
    for query, before, after in zip(queries, expected, actual, strict=True):
        if before == after:
            continue
        first = next(
            (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
            min(len(before), len(after)),
        )
        lines.append(
            f"{query!r:.80}: {len(before)} -> {len(after)} hits, first difference at {first}: "
            f"{before[first : first + 1]!r:.300} != {after[first : first + 1]!r:.300}"
        )
    return lines


#: What a message and a session hold at schema 21: the digest covers exactly that, so that
#: columns added by later application versions (with their defaults) do not count as change.
DIGEST_COLUMNS = {
    "messages": "id, session_id, role, content, tool_call_id, tool_calls, tool_name, "
    "effect_disposition, timestamp, token_count, finish_reason, reasoning, reasoning_content, "
    "reasoning_details, codex_reasoning_items, codex_message_items, platform_message_id, "
    "observed, active, compacted",
    "sessions": "id, source, user_id, model, model_config, {prompt}, parent_session_id, "
    "started_at, ended_at, end_reason, message_count, tool_call_count, input_tokens, "
    "output_tokens, title, archived",
}
#: The system prompt wherever schema 25 put it: inline before, in system_prompts after.
PROMPT_AFTER_25 = (
    "COALESCE(system_prompt, "
    "(SELECT prompt FROM system_prompts WHERE hash = sessions.system_prompt_hash))"
)


def data_digest(path: Path) -> str:
    """SHA-256 over every message and session as schema 21 holds them, in key order."""
    digest = hashlib.sha256()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        prompt = PROMPT_AFTER_25 if "system_prompts" in tables else "system_prompt"
        for table, columns in DIGEST_COLUMNS.items():
            select = f"SELECT {columns.format(prompt=prompt)} FROM {table} ORDER BY id"
            for row in conn.execute(select):
                digest.update(repr(row).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def store_facts(path: Path) -> dict[str, Any]:
    """Layout, tables, triggers, schema_version and integrity of a store."""
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            names = {
                row[0]: row[1]
                for row in conn.exec_driver_sql("SELECT name, type FROM sqlite_master")
            }
            return {
                "layout": {name: fts.index_layout(conn, name) for name in INDEXES},
                "content_copies": sorted(n for n in names if n.endswith("_content")),
                "triggers": sorted(
                    n
                    for n, kind in names.items()
                    if kind == "trigger" and n.startswith("messages_fts")
                ),
                "schema_version": conn.exec_driver_sql(
                    "SELECT version FROM schema_version"
                ).scalar_one(),
                "problems": fts.integrity_check(conn).problems,
            }
    finally:
        engine.dispose()


def converted_by(messages: list[str]) -> dict[str, str]:
    """Which conversion path the revision logged for each index."""
    paths = {}
    for name in INDEXES:
        for message in messages:
            if not message.startswith(f"{name}: "):
                continue
            if "converted in place" in message:
                paths[name] = "in place"
            elif "re-created as external content" in message:
                paths[name] = "rebuild"
    return paths


# --------------------------------------------------------------------------------------------
# Fixtures: the legacy store and its answers, built once per module
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def legacy_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_parity_store(tmp_path_factory.mktemp("parity") / "legacy.db")


@pytest.fixture(scope="module")
def legacy_answers(legacy_store: Path) -> list[list[Any]]:
    return run_queries(legacy_store, ALL_QUERIES)


@pytest.fixture
def store_copy(legacy_store: Path, tmp_path: Path) -> Path:
    return clone(legacy_store, tmp_path / "state.db")


# --------------------------------------------------------------------------------------------
# The corpus and the queries are not vacuous
# --------------------------------------------------------------------------------------------


def test_the_legacy_store_holds_every_kind_of_row(legacy_store: Path) -> None:
    with contextlib.closing(sqlite3.connect(legacy_store)) as conn:

        def count(where: str) -> int:
            return int(conn.execute(f"SELECT count(*) FROM messages WHERE {where}").fetchone()[0])

        assert count("1") >= CORPUS_MESSAGES
        assert count("role = 'tool' AND length(content) > 4000") >= 10  # long tool outputs
        assert count("tool_calls LIKE '[{%\"function\"%'") >= 50  # tool-call JSON
        assert count("content GLOB '*数据库*'") >= 5  # Chinese
        assert count("content GLOB '*です*' OR content GLOB '*テスト*'") >= 5  # Japanese
        assert count("content GLOB '*합니다*'") >= 5  # Korean
        assert count("active = 0 AND compacted = 0") >= 10  # rewound
        assert count("active = 0 AND compacted = 1") >= 10  # compacted
        assert count("hex(substr(CAST(content AS BLOB), 1, 6)) = '006A736F6E3A'") >= 1  # multimodal
        sources = {row[0] for row in conn.execute("SELECT DISTINCT source FROM sessions")}
        assert sources >= {"cli", "telegram", "discord", "slack", "whatsapp"}
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(21,)]


def test_the_parity_queries_are_many_and_most_have_hits(
    legacy_answers: list[list[Any]],
) -> None:
    assert len(QUERIES) >= 60
    with_hits = [q for q, hits in zip(ALL_QUERIES, legacy_answers, strict=True) if hits]
    assert len(with_hits) >= 100, f"only {len(with_hits)} queries have hits"
    answered = {repr(q) for q in with_hits}
    # Every class has hits: words, phrases, prefixes, operators, NEAR, joined terms, column
    # lookalikes, CJK on the trigram and LIKE paths, filters, sort, paging, visibility.
    for query in (
        {"query": '"self.assertEqual(x, y)" def'},
        {"query": "pyth*"},
        {"query": "import NOT os"},
        {"query": "NEAR(def return)"},
        {"query": "v1.2.3-rc1"},
        {"query": "my-app.config.ts"},
        {"query": "role: assistant"},
        {"query": "数据库连接"},
        {"query": "中文。"},
        {"query": "数据-库"},
        {"query": "terminal テスト"},
        {"query": "测试文件 NOT 错误信息"},
        {"query": "100%的"},
        {"query": "数_据"},
        {"query": "路径\\的"},
        {"query": "합니다", "role_filter": ["system"]},
        {"query": "system", "role_filter": ["system"]},
        {"query": "def", "source_filter": ["telegram", "discord"]},
        {"query": "def", "limit": 5, "offset": 5},
        {"query": "数据库", "include_inactive": True},
        {"query": "😀 emoji"},
    ):
        assert repr(query) in answered, f"{query!r} has no hits"
    # Snippets are marked on the FTS paths and context windows are filled.
    hits = [hit for answer in legacy_answers for hit in answer]
    assert any(">>>" in (hit["snippet"] or "") for hit in hits)
    assert any(len(hit["context"]) == 3 for hit in hits)
    # The visibility filter matters: rewound rows only show up with include_inactive, while
    # compacted rows stay searchable.
    by_query = {repr(q): hits for q, hits in zip(ALL_QUERIES, legacy_answers, strict=True)}
    default = [hit["snippet"] for hit in by_query[repr({"query": "数据库"})]]
    inactive = [
        hit["snippet"] for hit in by_query[repr({"query": "数据库", "include_inactive": True})]
    ]
    assert any("rewound" in snippet for snippet in inactive)
    assert not any("rewound" in snippet for snippet in default)
    assert any("compacted summary" in snippet for snippet in default)


# --------------------------------------------------------------------------------------------
# Parity across the upgrade, both conversion paths
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "expected_path"),
    [({}, "in place"), ({"fts_convert": "rebuild"}, "rebuild")],
    ids=["in-place", "rebuild"],
)
def test_upgrade_keeps_every_search_answer(
    store_copy: Path,
    legacy_answers: list[list[Any]],
    x: dict[str, str],
    expected_path: str,
) -> None:
    digest = data_digest(store_copy)
    with migration_log() as log:
        assert migrate.upgrade(store_copy, x=x).after == (migrate.head_revision(),)
    assert converted_by(log) == dict.fromkeys(INDEXES, expected_path), log
    facts = store_facts(store_copy)
    assert facts["layout"] == dict.fromkeys(INDEXES, "external")
    assert facts["content_copies"] == []
    assert facts["problems"] == {}
    assert facts["triggers"] == sorted(ddl.FTS_TRIGGER_NAMES)  # what the legacy app checks
    assert facts["schema_version"] == 30
    assert data_digest(store_copy) == digest

    assert differences(ALL_QUERIES, legacy_answers, run_queries(store_copy, ALL_QUERIES)) == []


def test_the_store_api_answers_every_query_alike(
    store_copy: Path, legacy_answers: list[list[Any]]
) -> None:
    """Store.search runs on the pooled driver connection, with its statements and what it
    knows of the store cached: the same answers, on the first search and on the cache."""
    assert migrate.upgrade(store_copy).after == (migrate.head_revision(),)
    with Store.open(store_copy) as store:
        for _ in range(2):
            answers = [list(store.search(**query)) for query in ALL_QUERIES]
            assert differences(ALL_QUERIES, legacy_answers, answers) == []


@pytest.fixture(scope="module")
def legacy_store_30(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same rows in a store the schema-30 application left in the legacy layout."""
    return build_parity_store(tmp_path_factory.mktemp("parity-30") / "legacy.db", 30)


@pytest.mark.parametrize("x", [{}, {"fts_convert": "rebuild"}], ids=["in-place", "rebuild"])
def test_a_store_at_schema_30_keeps_every_search_answer(
    legacy_store_30: Path, tmp_path: Path, x: dict[str, str]
) -> None:
    store = clone(legacy_store_30, tmp_path / "state.db")
    before = run_queries(store, ALL_QUERIES)
    assert sum(map(len, before)) > 0
    digest = data_digest(store)

    result = migrate.upgrade(store, x=x)

    assert (result.schema_before, result.schema_after) == (30, 30)
    assert (result.layout_before, result.layout_after) == ("inline", "external")
    assert data_digest(store) == digest
    assert differences(ALL_QUERIES, before, run_queries(store, ALL_QUERIES)) == []


@pytest.mark.parametrize("first", ["in-place", "rebuild"])
def test_downgrade_and_upgrade_again_keeps_data_and_answers(
    store_copy: Path, legacy_answers: list[list[Any]], first: str
) -> None:
    digest = data_digest(store_copy)
    x = {"fts_convert": "rebuild"} if first == "rebuild" else {}
    migrate.upgrade(store_copy, x=x)
    assert data_digest(store_copy) == digest

    with migration_log() as log:
        back_to_inline_21(store_copy)
    assert any("converted back to inline in place" in m for m in log), log
    facts = store_facts(store_copy)
    assert facts["layout"] == dict.fromkeys(INDEXES, "inline")
    assert facts["content_copies"] == ["messages_fts_content", "messages_fts_trigram_content"]
    assert facts["schema_version"] == 21
    assert facts["problems"] == {}
    assert data_digest(store_copy) == digest
    assert differences(ALL_QUERIES, legacy_answers, run_queries(store_copy, ALL_QUERIES)) == []

    with migration_log() as log:
        assert migrate.upgrade(store_copy).before == ("21",)
    # The inline copies refilled by the downgrade verify exact: converted in place again.
    assert converted_by(log) == dict.fromkeys(INDEXES, "in place"), log
    facts = store_facts(store_copy)
    assert facts["layout"] == dict.fromkeys(INDEXES, "external")
    assert facts["schema_version"] == 30
    assert facts["problems"] == {}
    assert data_digest(store_copy) == digest
    assert differences(ALL_QUERIES, legacy_answers, run_queries(store_copy, ALL_QUERIES)) == []


def test_snippets_differ_between_queries_so_the_comparison_is_not_trivial(
    legacy_answers: list[list[Any]],
) -> None:
    """Guard against a vacuous comparison: snippets carry the matched terms of each query."""
    by_query = {repr(q): hits for q, hits in zip(ALL_QUERIES, legacy_answers, strict=True)}
    import_hits = by_query[repr({"query": "import"})]
    assert import_hits
    assert all(re.search(r">>>import<<<", hit["snippet"], re.IGNORECASE) for hit in import_hits)
    cjk_hits = by_query[repr({"query": "数据库"})]
    assert cjk_hits
    assert all(">>>数据库<<<" in hit["snippet"] for hit in cjk_hits)
    like_hits = by_query[repr({"query": "数_据"})]
    assert [hit["snippet"] for hit in like_hits] == [
        "数据-库 与 数_据 与 数x据 与 完成100%的 与 路径\\的 与 100x的"
    ]


# --------------------------------------------------------------------------------------------
# An absolute oracle: FTS5's own SQL on the legacy store, written from the contract
# --------------------------------------------------------------------------------------------

#: Queries whose sanitised form is plain (so the MATCH expression can be written here, from
#: the contract's sanitising rules, without the library): the kwargs, then the FTS5 table
#: and MATCH expression, or None for the LIKE scan (its token).
ORACLE_QUERIES: list[tuple[dict[str, Any], str | None, str]] = [
    ({"query": "def"}, "messages_fts", "def"),
    ({"query": "import"}, "messages_fts", "import"),
    ({"query": "return self"}, "messages_fts", "return self"),
    ({"query": '"import os"'}, "messages_fts", '"import os"'),
    ({"query": "pyth*"}, "messages_fts", "pyth*"),
    ({"query": "error OR exception"}, "messages_fts", "error OR exception"),
    ({"query": "import NOT os"}, "messages_fts", "import NOT os"),
    ({"query": "v1.2.3-rc1"}, "messages_fts", '"v1.2.3-rc1"'),
    ({"query": "TODO: fix"}, "messages_fts", "TODO  fix"),
    ({"query": "def", "role_filter": ["assistant"]}, "messages_fts", "def"),
    ({"query": "def", "source_filter": ["telegram", "discord"]}, "messages_fts", "def"),
    ({"query": "def", "exclude_sources": ["cli"]}, "messages_fts", "def"),
    ({"query": "def", "sort": "newest"}, "messages_fts", "def"),
    ({"query": "def", "limit": 5, "offset": 5}, "messages_fts", "def"),
    ({"query": "def", "include_inactive": True}, "messages_fts", "def"),
    ({"query": "error", "limit": -1}, "messages_fts", "error"),
    ({"query": "数据库连接"}, "messages_fts_trigram", '"数据库连接"'),
    ({"query": "数据库 OR 服务器"}, "messages_fts_trigram", '"数据库" OR "服务器"'),
    ({"query": "数据库", "sort": "oldest"}, "messages_fts_trigram", '"数据库"'),
    ({"query": "数据"}, None, "数据"),
    ({"query": "的", "exclude_sources": ["cli"], "role_filter": ["user"]}, None, "的"),
]
#: The hit's keys the oracle computes (context apart: see _oracle_contexts).
ORACLE_KEYS = (
    "id",
    "snippet",
    "session_id",
    "role",
    "timestamp",
    "tool_name",
    "source",
    "model",
    "session_started",
)


def _oracle(conn: sqlite3.Connection, query: dict[str, Any], table: str | None, match: str) -> Any:
    """The contract's statement for one query, run by SQLite itself."""
    where, params = [], []
    if table is None:  # the LIKE scan: no visibility filter, newest first, substr snippet
        pattern = "%" + match.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where.append(
            "(m.content LIKE ? ESCAPE '\\' OR m.tool_name LIKE ? ESCAPE '\\' "
            "OR m.tool_calls LIKE ? ESCAPE '\\')"
        )
        params += [pattern] * 3
        snippet = "substr(m.content, max(1, instr(m.content, ?) - 40), 120)"
        head_params: list[Any] = [match]
        source = "messages m"
        order = "m.timestamp DESC"
    else:
        where.append(f"{table} MATCH ?")
        params.append(match)
        snippet = f"snippet({table}, 0, '>>>', '<<<', '...', 40)"
        head_params = []
        source = f"{table} JOIN messages m ON m.id = {table}.rowid"
        if not query.get("include_inactive"):
            where.append("(m.active = 1 OR m.compacted = 1)")
        sort = str(query.get("sort") or "").strip().lower()
        rank = f"bm25({table})"
        order = {"newest": f"m.timestamp DESC, {rank}", "oldest": f"m.timestamp ASC, {rank}"}.get(
            sort, rank
        )
    for key, negate in (("source_filter", ""), ("exclude_sources", "NOT ")):
        if query.get(key) is not None:
            where.append(f"s.source {negate}IN ({', '.join('?' * len(query[key]))})")
            params += query[key]
    if query.get("role_filter"):
        where.append(f"m.role IN ({', '.join('?' * len(query['role_filter']))})")
        params += query["role_filter"]
    sql = (
        f"SELECT m.id, {snippet}, m.session_id, m.role, m.timestamp, m.tool_name, s.source, "
        f"s.model, s.started_at FROM {source} JOIN sessions s ON s.id = m.session_id "
        f"WHERE {' AND '.join(where)} ORDER BY {order} LIMIT ? OFFSET ?"
    )
    page = [query.get("limit", 20), query.get("offset", 0)]
    return conn.execute(sql, [*head_params, *params, *page]).fetchall()


def _oracle_contexts(conn: sqlite3.Connection, hit_id: int) -> list[dict[str, Any]] | None:
    """The hit's context as the contract states it (the message before, itself, the one
    after, by timestamp then id, content cut to 200 characters); None when one of them is
    multimodal (decoded by rules this oracle leaves to the layout comparisons)."""
    (session,) = conn.execute("SELECT session_id FROM messages WHERE id = ?", (hit_id,)).fetchone()
    rows = conn.execute(
        "SELECT id, role, content FROM messages WHERE session_id = ? ORDER BY timestamp, id",
        (session,),
    ).fetchall()
    at = [row[0] for row in rows].index(hit_id)
    window = rows[max(0, at - 1) : at + 2]
    if any(isinstance(c, str) and c.startswith("\x00") for _, _, c in window):
        return None
    return [
        {"role": role, "content": content[:200] if isinstance(content, str) else ""}
        for _, role, content in window
    ]


def test_the_answers_are_fts5s_own_sql_on_the_legacy_store(
    legacy_store: Path, legacy_answers: list[list[Any]]
) -> None:
    """Every comparison above is relative (an upgraded store against the library on the
    legacy one): a change of the contract that hits both layouts alike (a shorter snippet,
    another order) passes them all. This one is absolute: FTS5's snippet() and bm25(),
    the contract's filters, LIKE and substr(), run by SQLite on the legacy store."""
    by_query = {repr(q): hits for q, hits in zip(ALL_QUERIES, legacy_answers, strict=True)}
    compared = contexts = 0
    with contextlib.closing(sqlite3.connect(legacy_store)) as conn:
        for query, table, match in ORACLE_QUERIES:
            expected = _oracle(conn, query, table, match)
            assert expected, f"{query!r}: the oracle has no hits, nothing is compared"
            hits = by_query[repr(query)]
            assert [tuple(hit[key] for key in ORACLE_KEYS) for hit in hits] == expected, query
            compared += len(hits)
            for hit in hits:
                context = _oracle_contexts(conn, hit["id"])
                if context is not None:
                    assert hit["context"] == context, (query, hit["id"])
                    contexts += 1
    assert compared >= 200
    assert contexts >= 100


#: Answers written down: the targeted rows, whose text is known here. The legacy index
#: holds content, tool_name and tool_calls, joined by spaces (hence the trailing ones).
PINNED = {
    "v1.2.3-rc1": [
        "release >>>v1.2.3-rc1<<< built; sys.argv[1] is my-app.config.ts, chat-send P2.2 "
        "foo_bar os.path.join __init__ terminal "
    ],
    "terminal テスト": [
        ">>>terminal<<< >>>テスト<<<結果を確認しました。ありがとうございます >>>terminal<<< ..."
    ],
    '"self.assertEqual(x, y)" def': [
        ">>>def<<< test_eq(self):\n    >>>self.assertEqual(x, y<<<)\n    return self  "
    ],
    "测试文件 NOT 错误信息": [">>>测试文件<<<已经上传，Python 编程 入门  "],
}


@pytest.mark.parametrize("query", PINNED)
def test_pinned_answers(legacy_answers: list[list[Any]], query: str) -> None:
    by_query = {repr(q): hits for q, hits in zip(ALL_QUERIES, legacy_answers, strict=True)}
    assert [hit["snippet"] for hit in by_query[repr({"query": query})]] == PINNED[query]

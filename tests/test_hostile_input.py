"""Hostile input: whatever a user types or a message holds, search and both indexes stay exact.

The fuzz drives `search_messages` with arbitrary Unicode (NUL, lone surrogates, control
characters, very long strings, FTS5 operators, quotes, `*`, `NEAR(`, column filters) and
hostile filters, and judges each hit with an oracle written from the search contract
(docs/search.md), not from the implementation: a hit must satisfy the caller's
filters, and its message's *current* text, indexed alone in a fresh FTS5 table with the
same tokenizer, must match the query's expression (or, on the LIKE path, contain a token).
"""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import string
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reliability_support import INDEXES, fts_problems, rows
from sqlalchemy import Connection, Engine, event

from hermes_store import migrate
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.errors import QueryTooComplex
from hermes_store.search import (
    MAX_SEARCH_TERMS,
    contains_cjk,
    count_cjk,
    sanitize_query,
    search_messages,
)
from hermes_store.store import MULTIMODAL_PREFIX, NewMessage, Store

OPERATORS = {"AND", "OR", "NOT"}
#: Sources and roles that are SQL or FTS syntax: they must be bound, never interpolated.
HOSTILE_NAMES = (
    "it's",
    'say "hi"',
    "x' OR '1'='1",
    "'; DROP TABLE messages; --",
    "a%b_c\\",
    "源'",
    "messages_fts MATCH '*'",
)
SOURCES = ("cli", "telegram", *HOSTILE_NAMES)
ROLES = ("user", "assistant", "tool", *HOSTILE_NAMES[:3])
#: Words of the corpus, its CJK and FTS5 syntax: pieces the fuzz assembles queries from.
PIECES = (
    "error",
    "docker",
    "compose",
    "import",
    "json",
    "def",
    "test",
    "数据库",
    "数据",
    "测试",
    "中文",
    "AND",
    "OR",
    "NOT",
    "and",
    "NEAR(",
    "NEAR/2",
    ")",
    "(",
    '"',
    "'",
    "*",
    "^",
    ":",
    "content:",
    "{content}:",
    "-content:",
    "messages_fts:",
    "+",
    "-",
    ".",
    "_",
    "\\",
    "%",
    "\x00",
    "\x01",
    "\x1f",
    "\t",
    "\n",
    "\u200b",
    "\ufeff",
    "\U0001f600",
    "e\u0301",
    "\ud800",  # a lone surrogate
    " ",
    "  ",
)


# --------------------------------------------------------------------------------------
# The store under attack
# --------------------------------------------------------------------------------------


def hostile_rows(session_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Messages whose text is itself hostile, spread over the hostile sessions."""
    texts = [
        None,
        "before\x00after error 数据库 nul",
        "\x00json:" + json.dumps([{"type": "text", "text": "multimodal error 数据库"}]),
        "\x00json:{not json at all error",
        "\"quoted\" error 'single' NEAR(docker compose) content: x",
        "control\x01\x02\x1f characters error",
        "% _ \\ like metacharacters 数据",
        "e\u0301 combining error \U0001f600",
    ]
    tool_calls = [None, "{not json", '[{"function": {"name": "docker"}}]', "[]", "\x00"]
    messages = []
    for number, text in enumerate(texts * 3):
        messages.append(
            {
                "session_id": session_ids[number % len(session_ids)],
                "role": ROLES[number % len(ROLES)],
                "content": text,
                "tool_calls": tool_calls[number % len(tool_calls)],
                "tool_name": "docker" if number % 4 == 0 else None,
                "timestamp": 1_700_000_000.0 + number,
                "active": 0 if number % 5 == 4 else 1,
                "compacted": 1 if number % 10 == 9 else 0,
            }
        )
    return messages


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A head store: 400 corpus messages in sessions of hostile sources, plus hostile rows."""
    path = tmp_path_factory.mktemp("hostile") / "state.db"
    migrate.upgrade(str(path))
    data = corpus.generate(400, 11)
    for number, session in enumerate(data.sessions):
        session["source"] = SOURCES[number % len(SOURCES)]
    for number, message in enumerate(data.messages):
        if number % 7 == 3:
            message["role"] = ROLES[number % len(ROLES)]
        if number % 9 == 4:
            message["active"] = message["compacted"] = 0
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, data)
        session_ids = [str(s["id"]) for s in data.sessions]
        for message in hostile_rows(session_ids):
            columns = ", ".join(message)
            marks = ", ".join("?" for _ in message)
            conn.execute(
                f"INSERT INTO messages ({columns}) VALUES ({marks})", tuple(message.values())
            )
        conn.commit()
    assert fts_problems(path) == {}
    engine = create_store_engine(path, create=False)
    yield engine
    engine.dispose()


# --------------------------------------------------------------------------------------
# The oracle, from the contract
# --------------------------------------------------------------------------------------


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _like_contains(value: str | None, token: str) -> bool:
    """SQL LIKE '%token%' as the contract means it: ASCII case-insensitive containment."""
    return value is not None and token.translate(_ASCII_LOWER) in value.translate(_ASCII_LOWER)


class Oracle:
    """Decides whether one message matches a query, with its own scratch FTS5 tables."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE VIRTUAL TABLE word USING fts5(content)")
        self.db.execute("CREATE VIRTUAL TABLE tri USING fts5(content, tokenize='trigram')")

    def fts_match(self, table: str, text: str, expression: str) -> bool | None:
        """Does ``text`` alone match ``expression``? None when FTS5 rejects the expression
        (or it holds a lone surrogate, which cannot reach SQLite: nothing can match it)."""
        self.db.execute(f"DELETE FROM {table}")
        self.db.execute(f"INSERT INTO {table}(rowid, content) VALUES (1, ?)", (text,))
        try:
            found = self.db.execute(
                f"SELECT count(*) FROM {table} WHERE {table} MATCH ?", (expression,)
            ).fetchone()[0]
        except (sqlite3.Error, UnicodeEncodeError):
            return None
        return bool(found)

    def plan(self, query: str) -> tuple[str, str, list[str]]:
        """The contract's routing: ("word" | "trigram" | "like", expression, LIKE tokens)."""
        sanitized = sanitize_query(query)
        if not contains_cjk(sanitized):
            return "word", sanitized, []
        raw = sanitized.strip('"').strip()
        tokens = raw.split()
        terms = [t for t in tokens if t.upper() not in OPERATORS]
        like_tokens = terms or [raw]
        long_enough = count_cjk(raw) >= 3 and all(
            count_cjk(t) >= 3 for t in terms if contains_cjk(t)
        )
        if long_enough:
            expression = " ".join(
                t if t.upper() in OPERATORS else '"' + t.replace('"', '""') + '"' for t in tokens
            )
            if self.fts_match("tri", "", expression) is not None:  # else: the LIKE scan
                return "trigram", expression, like_tokens
        return "like", "", like_tokens

    def matches(self, query: str, message: dict[str, Any]) -> bool:
        """Does one message (as stored now) match the query on the route the contract picks?"""
        kind, expression, like_tokens = self.plan(query)
        # The indexed expression: COALESCE(x, '') of the three columns joined by spaces.
        text = " ".join(message[c] or "" for c in ("content", "tool_name", "tool_calls"))
        if kind == "word":
            return bool(self.fts_match("word", text, expression))
        if kind == "trigram":
            return bool(self.fts_match("tri", text, expression))
        return any(
            _like_contains(message[c], token)
            for token in like_tokens
            for c in ("content", "tool_name", "tool_calls")
        )


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle()


def message_rows(conn: Connection, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The hits' messages and sessions as stored now."""
    found: dict[int, dict[str, Any]] = {}
    for (id_,) in ((i,) for i in ids):
        row = conn.exec_driver_sql(
            "SELECT m.id, m.content, m.tool_name, m.tool_calls, m.role, m.active, m.compacted, "
            "s.source FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id = ?",
            (id_,),
        ).first()
        if row is not None:
            found[id_] = dict(row._mapping)
    return found


def assert_hits_match(
    conn: Connection,
    oracle: Oracle,
    query: str,
    hits: list[dict[str, Any]],
    *,
    source_filter: Sequence[str] | None = None,
    role_filter: Sequence[str] | None = None,
    include_inactive: bool = False,
) -> None:
    stored = message_rows(conn, [hit["id"] for hit in hits])
    # The LIKE scan ignores the visibility flags: a legacy quirk the contract keeps.
    like_path = oracle.plan(query)[0] == "like"
    for hit in hits:
        message = stored.get(hit["id"])
        assert message is not None, f"hit {hit['id']} is not a message"
        assert hit["role"] == message["role"]
        assert hit["source"] == message["source"]
        if source_filter is not None:
            assert message["source"] in source_filter
        if role_filter:
            assert message["role"] in role_filter
        if not include_inactive and not like_path:
            assert message["active"] == 1 or message["compacted"] == 1
        assert oracle.matches(query, message), (query, hit["id"], message["content"])


# --------------------------------------------------------------------------------------
# The fuzz
# --------------------------------------------------------------------------------------

any_text = st.text(
    alphabet=st.characters(exclude_categories=()),  # surrogates and controls included
    max_size=40,
)
pieces = st.lists(st.one_of(st.sampled_from(PIECES), any_text), max_size=12).map("".join)
#: Long inputs up to and past the 2048-character cap. Not long runs of one frequent
#: prefix term such as "a*a*a*...": FTS5 takes minutes on those (a known limit, in
#: docs/search.md, "Known limits").
long_strings = st.builds(
    lambda piece, times: piece * times,
    st.sampled_from(["error ", "数据库", "\x00", "x", "'\"", "\ud800"]),
    st.integers(500, 2500),
)
queries = st.one_of(pieces, any_text, long_strings)
names = st.one_of(st.sampled_from(SOURCES), any_text)
name_lists = st.one_of(st.none(), st.lists(names, max_size=3))


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    query=queries,
    source_filter=name_lists,
    role_filter=name_lists,
    include_inactive=st.booleans(),
    sort=st.sampled_from([None, "newest", " OLDEST ", "rank; DROP TABLE x"]),
    limit=st.integers(1, 40),
    offset=st.integers(0, 5),
)
@example(
    query="数据库\ud800",  # a lone surrogate on the trigram route
    source_filter=None,
    role_filter=None,
    include_inactive=False,
    sort=None,
    limit=1,
    offset=0,
)
@example(
    query="数据\x00zzz",  # LIKE would stop at the NUL and match texts ending in 数据
    source_filter=None,
    role_filter=None,
    include_inactive=False,
    sort=None,
    limit=40,
    offset=0,
)
@example(
    query="数\x00据",
    source_filter=None,
    role_filter=None,
    include_inactive=False,
    sort=None,
    limit=40,
    offset=0,
)
@example(
    query="error\x00",
    source_filter=None,
    role_filter=None,
    include_inactive=True,
    sort=None,
    limit=40,
    offset=0,
)
@example(
    query="\ud800 error",
    source_filter=["\ud800"],
    role_filter=None,
    include_inactive=False,
    sort=None,
    limit=40,
    offset=0,
)
@example(
    query='NEAR("docker" compose)',
    source_filter=None,
    role_filter=["x' OR '1'='1"],
    include_inactive=False,
    sort=None,
    limit=40,
    offset=0,
)
@example(
    query="content: error*",
    source_filter=["'; DROP TABLE messages; --"],
    role_filter=None,
    include_inactive=False,
    sort="newest",
    limit=40,
    offset=0,
)
def test_search_never_raises_and_never_returns_a_row_that_does_not_match(
    hostile_store: Engine,
    oracle: Oracle,
    query: str,
    source_filter: list[str] | None,
    role_filter: list[str] | None,
    include_inactive: bool,
    sort: str | None,
    limit: int,
    offset: int,
) -> None:
    with hostile_store.connect() as conn:
        try:
            hits = search_messages(
                conn,
                query,
                source_filter=source_filter,
                role_filter=role_filter,
                include_inactive=include_inactive,
                sort=sort,
                limit=limit,
                offset=offset,
            )
        except QueryTooComplex as exc:  # the one refusal: too many distinct terms, said so
            message = str(exc)
            assert f"at most {MAX_SEARCH_TERMS}" in message, message
            return
        assert len(hits) <= limit
        assert_hits_match(
            conn,
            oracle,
            query,
            [dict(hit) for hit in hits],
            source_filter=source_filter,
            role_filter=role_filter,
            include_inactive=include_inactive,
        )
        # Nothing was dropped or rewritten by a filter or a query.
        assert conn.exec_driver_sql("SELECT count(*) FROM messages").scalar() == 424


def bound_values(parameters: Any) -> list[Any]:
    """Every value bound to a statement, whatever shape the driver got them in."""
    if isinstance(parameters, dict):
        return list(parameters.values())
    if isinstance(parameters, list | tuple):
        return (
            [v for p in parameters for v in bound_values(p)]
            if parameters and isinstance(parameters[0], list | tuple | dict)
            else list(parameters)
        )
    return []


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_filters_are_bound_never_interpolated(hostile_store: Engine, name: str) -> None:
    """The filter value reaches SQLite as a parameter; results are exactly its rows."""
    statements: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    event.listen(hostile_store, "before_cursor_execute", capture)
    try:
        with hostile_store.connect() as conn:
            by_source = search_messages(conn, "error", source_filter=[name], limit=1000)
            by_role = search_messages(conn, "error", role_filter=[name], limit=1000)
            excluded = search_messages(conn, "error", exclude_sources=[name], limit=1000)
            everything = search_messages(conn, "error", limit=1000)
    finally:
        event.remove(hostile_store, "before_cursor_execute", capture)
    for statement, _parameters in statements:
        assert name not in statement, statement
    assert any(name in bound_values(p) for _, p in statements)
    expected_source = {
        id_
        for (id_,) in rows(
            Path(str(hostile_store.url.database)),
            "SELECT m.id FROM messages m JOIN sessions s ON s.id = m.session_id "
            "WHERE s.source = ? AND (m.active = 1 OR m.compacted = 1)",
            (name,),
        )
    }
    all_ids = {hit["id"] for hit in everything}
    assert {hit["id"] for hit in by_source} == all_ids & expected_source
    assert {hit["id"] for hit in excluded} == all_ids - expected_source
    if name in ROLES:  # messages of this role hold "error": the check below has hits
        assert by_role
    assert all(hit["role"] == name for hit in by_role)
    if name in SOURCES[2:5]:
        assert by_source, f"the corpus should have 'error' hits in source {name!r}"


# --------------------------------------------------------------------------------------
# Hostile message content keeps both indexes exact
# --------------------------------------------------------------------------------------


def assert_exact(path: Path) -> None:
    """Both FTS5 integrity checks (rank 1: index against the view) and the database's pass."""
    assert fts_problems(path) == {}


def found(path: Path, index: str, token: str) -> list[int]:
    return [
        r[0]
        for r in rows(
            path,
            f"SELECT rowid FROM {index} WHERE {index} MATCH ? ORDER BY rowid",
            (json.dumps(token),),
        )
    ]


HOSTILE_CONTENT: dict[str, Any] = {
    "null": None,
    # SQLite's trigram tokenizer stops at the first NUL; the word tokenizer reads past it.
    "nul": "before nulmarker\x00 aftermarker",
    "multimodal": [
        {"type": "text", "text": "multimodalmarker caption"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ],
    "bad-json-tool-calls": "badjsonmarker",
    "control": "ctrl\x01\x1b[31m controlmarker\x7f",
    "surrogate-free-emoji": "emoji \U0001f600 emojimarker",
}


@pytest.fixture
def head_store(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    migrate.upgrade(str(path))
    return path


def test_hostile_messages_keep_both_indexes_exact_through_the_store_api(head_store: Path) -> None:
    with Store.open(head_store) as store:
        store.create_session("h", "cli")
        ids = {}
        for name, content in HOSTILE_CONTENT.items():
            tool_calls = "{not json" if name in ("null", "bad-json-tool-calls") else None
            ids[name] = store.append_message(
                "h", NewMessage("assistant", content, tool_calls=tool_calls, tool_name="t1")
            )
        assert_exact(head_store)
        assert found(head_store, "messages_fts", "nulmarker") == [ids["nul"]]
        assert found(head_store, "messages_fts", "aftermarker") == [ids["nul"]]
        assert found(head_store, "messages_fts_trigram", "nulmarker") == [ids["nul"]]
        assert found(head_store, "messages_fts_trigram", "aftermarker") == []  # after a NUL
        assert found(head_store, "messages_fts", "multimodalmarker") == [ids["multimodal"]]
        assert found(head_store, "messages_fts", "controlmarker") == [ids["control"]]
        assert found(head_store, "messages_fts_trigram", "not json") == [
            ids["null"],
            ids["bad-json-tool-calls"],
        ]
        # Edit each one into another hostile value, flag them, then delete them.
        names = list(HOSTILE_CONTENT)
        for number, name in enumerate(names):
            store.edit_message(ids[name], HOSTILE_CONTENT[names[(number + 1) % len(names)]])
        assert_exact(head_store)
        store.set_message_flags(list(ids.values()), active=False, compacted=True)
        assert_exact(head_store)
        assert store.delete_session("h") == len(ids)
    assert_exact(head_store)
    for marker in ("nulmarker", "multimodalmarker", "controlmarker", "badjsonmarker"):
        for index in INDEXES:
            assert found(head_store, index, marker) == []


@pytest.mark.parametrize("revision", ["21", migrate.head_revision()])
def test_hostile_messages_written_by_the_legacy_application_keep_both_indexes_exact(
    tmp_path: Path, revision: str
) -> None:
    """Plain sqlite3, INSERT OR REPLACE included: what the legacy application does."""
    path = tmp_path / "state.db"
    migrate.upgrade(str(path), revision)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        if revision != "21":
            conn.execute("PRAGMA recursive_triggers=ON")  # as the engine sets it
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('h', 'cli', 1)")
        for number, content in enumerate(HOSTILE_CONTENT.values(), start=1):
            stored = (
                MULTIMODAL_PREFIX + json.dumps(content) if isinstance(content, list) else content
            )
            conn.execute(
                "INSERT INTO messages (id, session_id, role, content, tool_calls, timestamp) "
                "VALUES (?, 'h', 'user', ?, ?, ?)",
                (number, stored, "{not json" if number % 2 else "\x00[]", float(number)),
            )
        conn.commit()
        if revision != "21":
            conn.execute(
                "INSERT OR REPLACE INTO messages (id, session_id, role, content, timestamp) "
                "VALUES (2, 'h', 'user', ?, 9.0)",
                ("replaced\x00text",),
            )
        conn.execute("UPDATE messages SET content = NULL WHERE id = 3")
        conn.execute("UPDATE messages SET tool_calls = '{{{{' WHERE id = 4")
        conn.execute("DELETE FROM messages WHERE id = 5")
        conn.commit()
    assert_exact(path)


@pytest.mark.slow
def test_a_ten_megabyte_message_keeps_both_indexes_exact(head_store: Path) -> None:
    rng = random.Random(5)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(3000)]
    text = " ".join(rng.choices(words, k=1_500_000))[: 10 * 1024 * 1024]
    assert len(text.encode()) == 10 * 1024 * 1024
    with Store.open(head_store) as store:
        store.create_session("big", "cli")
        big = store.append_message("big", NewMessage("tool", text + " hugemarker"))
        store.append_message("big", NewMessage("user", "small neighbour hugemarker"))
        assert_exact(head_store)
        for index in INDEXES:
            assert len(found(head_store, index, "hugemarker")) == 2
        with store.engine.connect() as conn:
            hits = search_messages(conn, "hugemarker")
        assert {hit["id"] for hit in hits} >= {big}
        assert all(len(c["content"]) <= 200 for hit in hits for c in hit["context"])
        store.edit_message(big, "shrunk")
        assert_exact(head_store)
        assert store.delete_session("big") == 2
    assert_exact(head_store)

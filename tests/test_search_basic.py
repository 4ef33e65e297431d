"""search_messages against a small inline-layout store built with plain sqlite3 DDL."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, Engine, create_engine, func, select, text
from sqlalchemy.orm import Session

from hermes_store.errors import QueryTooComplex
from hermes_store.search import (
    MAX_SEARCH_TERMS,
    match_selectable,
    search_messages,
    without_repeats,
)

SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT,
    started_at REAL NOT NULL, ended_at REAL, title TEXT
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
    timestamp REAL NOT NULL,
    active INTEGER NOT NULL DEFAULT 1, compacted INTEGER NOT NULL DEFAULT 0
);
CREATE VIRTUAL TABLE messages_fts USING fts5(content);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
        || COALESCE(new.tool_calls, ''));
END;
"""
TRIGRAM_SCHEMA = """
CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(content, tokenize='trigram');
CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
        || COALESCE(new.tool_calls, ''));
END;
"""

SESSIONS = [
    ("s-cli", "cli", "claude-sonnet", 1000.0),
    ("s-tg", "telegram", "gpt-5", 2000.0),
    ("s-dc", "discord", None, 3000.0),
    ("s-cjk", "slack", "qwen", 4000.0),
    ("s-wa", "whatsapp", None, 5000.0),
]
TERMINAL_CALL = json.dumps(
    [{"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}]
)
MULTIMODAL = "\x00json:" + json.dumps(
    [{"type": "text", "text": "look at"}, {"type": "image_url"}, {"type": "text", "text": "this"}]
)
IMAGE_ONLY = "\x00json:" + json.dumps([{"type": "image_url", "image_url": {"url": "x"}}])

# (session, role, content, tool_calls, tool_name, timestamp, active, compacted)
MESSAGES: list[tuple[Any, ...]] = [
    ("s-cli", "user", "please deploy the service", None, None, 1001.0, 1, 0),  # 1
    ("s-cli", "assistant", "I will deploy it with the terminal", TERMINAL_CALL, None, 1002.0, 1, 0),
    ("s-cli", "tool", "deploy finished: exit 0", None, "terminal", 1003.0, 1, 0),  # 3
    ("s-cli", "assistant", "deploy done " + "x" * 300, None, None, 1004.0, 1, 0),  # 4
    ("s-tg", "user", "can you deploy chat-send to staging", None, None, 2001.0, 1, 0),  # 5
    ("s-tg", "assistant", "rewound deploy answer", None, None, 2002.0, 0, 0),  # 6 rewound
    ("s-tg", "assistant", "compacted deploy summary", None, None, 2003.0, 0, 1),  # 7 archived
    ("s-dc", "user", MULTIMODAL, None, None, 3001.0, 1, 0),  # 8
    ("s-dc", "assistant", "the deploy screenshot shows an error", None, None, 3002.0, 1, 0),
    ("s-dc", "user", IMAGE_ONLY, None, None, 3003.0, 1, 0),  # 10
    ("s-cjk", "user", "请帮我检查数据库连接的配置", None, None, 4001.0, 1, 0),  # 11
    ("s-cjk", "assistant", "数据库连接正常です。설정을 확인합니다", None, None, 4002.0, 1, 0),
    ("s-cjk", "assistant", "旧的数据说明", None, None, 4003.0, 0, 0),  # 13 rewound
    ("s-cjk", "user", "数_据 与 数x据 与 100%据", None, None, 4004.0, 1, 0),  # 14
    # ties on timestamp: context order falls back to id
    ("s-dc", "tool", "tie first", None, "terminal", 3010.0, 1, 0),  # 15
    ("s-dc", "assistant", "tie middle needle", None, None, 3010.0, 1, 0),  # 16
    ("s-dc", "user", "tie last", None, None, 3010.0, 1, 0),  # 17
    ("s-dc", "assistant", '\x00json:{"not": "a list"}', None, None, 3011.0, 1, 0),  # 18
    ("s-dc", "assistant", "\x00json:[broken", None, None, 3012.0, 1, 0),  # 19
    ("s-cjk", "user", "只有 数y据 在这里", None, None, 4005.0, 1, 0),  # 20
    ("s-wa", "user", '\x00json:[{"type": "text", "text": 7}, "zebra"]', None, None, 5001.0, 1, 0),
]
RESULT_KEYS = [
    "id",
    "session_id",
    "role",
    "snippet",
    "timestamp",
    "tool_name",
    "source",
    "model",
    "session_started",
    "context",
]


def build_store(path: Path, *, trigram: bool = True, fts: bool = True) -> None:
    """Write a small inline-layout store with the legacy FTS tables and insert triggers."""
    with sqlite3.connect(path) as db:
        schema = SCHEMA if fts else SCHEMA.split("CREATE VIRTUAL TABLE")[0]
        db.executescript(schema + (TRIGRAM_SCHEMA if trigram and fts else ""))
        db.executemany(
            "INSERT INTO sessions (id, source, model, started_at) VALUES (?, ?, ?, ?)", SESSIONS
        )
        db.executemany(
            "INSERT INTO messages (session_id, role, content, tool_calls, tool_name, timestamp,"
            " active, compacted) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            MESSAGES,
        )
    db.close()


def _engine(path: Path) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{path}")
    yield engine
    engine.dispose()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    build_store(tmp_path / "state.db")
    yield from _engine(tmp_path / "state.db")


@pytest.fixture
def conn(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as connection:
        yield connection


def ids(hits: list[Any]) -> list[int]:
    return [hit["id"] for hit in hits]


def test_word_hits_have_the_contract_keys_and_highlighted_snippets(conn: Connection) -> None:
    hits = search_messages(conn, "deploy")
    assert hits
    assert set(ids(hits)) == {1, 2, 3, 4, 5, 7, 9}
    for hit in hits:
        assert list(hit) == RESULT_KEYS
        assert ">>>deploy<<<" in str(hit["snippet"]).lower()
    first = next(hit for hit in hits if hit["id"] == 3)
    assert first["session_id"] == "s-cli"
    assert first["role"] == "tool"
    assert first["tool_name"] == "terminal"
    assert first["timestamp"] == 1003.0
    assert first["source"] == "cli"
    assert first["model"] == "claude-sonnet"
    assert first["session_started"] == 1000.0
    assert "content" not in first


def test_word_index_covers_tool_names_and_tool_calls(conn: Connection) -> None:
    assert set(ids(search_messages(conn, "terminal"))) == {2, 3, 15}
    assert ids(search_messages(conn, "call_1")) == [2]


def test_hyphenated_terms_match_as_phrases(conn: Connection) -> None:
    assert ids(search_messages(conn, "chat-send")) == [5]
    assert ids(search_messages(conn, "send-chat")) == []


def test_prefix_and_boolean_queries(conn: Connection) -> None:
    assert set(ids(search_messages(conn, "deplo*"))) == {1, 2, 3, 4, 5, 7, 9}
    assert set(ids(search_messages(conn, "deploy NOT terminal"))) == {1, 4, 5, 7, 9}
    assert set(ids(search_messages(conn, "staging OR screenshot"))) == {5, 9}


def test_source_and_role_filters(conn: Connection) -> None:
    assert set(ids(search_messages(conn, "deploy", source_filter=["telegram"]))) == {5, 7}
    assert set(ids(search_messages(conn, "deploy", exclude_sources=["cli"]))) == {5, 7, 9}
    assert set(ids(search_messages(conn, "deploy", role_filter=["user", "tool"]))) == {1, 3, 5}
    both = search_messages(
        conn, "deploy", source_filter=["cli", "discord"], exclude_sources=["cli"]
    )
    assert ids(both) == [9]


def test_empty_filter_lists(conn: Connection) -> None:
    everything = ids(search_messages(conn, "deploy"))
    assert search_messages(conn, "deploy", source_filter=[]) == []
    assert ids(search_messages(conn, "deploy", exclude_sources=[])) == everything
    assert ids(search_messages(conn, "deploy", role_filter=[])) == everything


def test_sort_by_timestamp_with_rank_as_tie_breaker(conn: Connection) -> None:
    newest = search_messages(conn, "deploy", sort="newest")
    oldest = search_messages(conn, "deploy", sort="  OLDEST ")
    assert [hit["timestamp"] for hit in newest] == sorted(
        (hit["timestamp"] for hit in newest), reverse=True
    )
    assert ids(oldest) == ids(newest)[::-1]
    assert ids(search_messages(conn, "deploy", sort="bogus")) == ids(
        search_messages(conn, "deploy")
    )


def test_limit_and_offset_page_through_the_same_order(conn: Connection) -> None:
    everything = ids(search_messages(conn, "deploy", limit=100))
    assert ids(search_messages(conn, "deploy", limit=2)) == everything[:2]
    assert ids(search_messages(conn, "deploy", limit=3, offset=2)) == everything[2:5]
    assert search_messages(conn, "deploy", limit=5, offset=50) == []
    assert search_messages(conn, "deploy", limit=0) == []


def test_rewound_rows_hidden_and_compacted_rows_visible(conn: Connection) -> None:
    visible = set(ids(search_messages(conn, "deploy")))
    assert 6 not in visible
    assert 7 in visible
    assert 6 in set(ids(search_messages(conn, "deploy", include_inactive=True)))


def test_cjk_three_or_more_characters_use_the_trigram_index(conn: Connection) -> None:
    hits = search_messages(conn, "数据库连接")
    assert set(ids(hits)) == {11, 12}
    assert all(">>>数据库连接<<<" in str(hit["snippet"]) for hit in hits)
    assert ids(search_messages(conn, "합니다")) == [12]
    assert ids(search_messages(conn, "数据库连接 AND 합니다")) == [12]


def test_cjk_one_or_two_characters_use_the_like_scan(conn: Connection) -> None:
    hits = search_messages(conn, "数据")
    # the LIKE scan keeps the legacy quirk: rewound row 13 is found too, newest first
    assert ids(hits) == [13, 12, 11]
    assert hits[0]["snippet"] == "旧的数据说明"
    assert ids(search_messages(conn, "です", role_filter=["assistant"])) == [12]
    assert search_messages(conn, "です", source_filter=["cli"]) == []


def test_short_cjk_token_sends_the_whole_query_to_the_like_scan(conn: Connection) -> None:
    # three CJK characters in all, but one token has only two: the trigram index can't answer
    assert ids(search_messages(conn, "数据库 OR です")) == [12, 11]


def _short_cjk_tokens(count: int) -> list[str]:
    """``count`` distinct two-character CJK tokens, "数据" among them."""
    tokens = ["数据"]
    code = 0x4E00
    while len(tokens) < count:
        token = chr(code) + chr(code + 1)
        code += 2
        if token not in tokens:
            tokens.append(token)
    return tokens


@pytest.mark.parametrize("count", [340, 682])
def test_hundreds_of_short_cjk_tokens_answer_like_one_or_of_them(
    conn: Connection, count: int
) -> None:
    """A flat OR per token was an expression deeper than SQLite's limit (1000) from 334 on."""
    tokens = _short_cjk_tokens(count)
    query = " ".join(tokens)
    assert len(query) <= 2048  # an accepted query: the contract keeps 2048 characters

    hits = search_messages(conn, query)

    # The same answer as the LIKE scan of the tokens that occur in this store.
    assert ids(hits) == ids(search_messages(conn, "数据")) == [13, 12, 11]
    assert ids(search_messages(conn, " ".join(["数据"] * 600))) == [13, 12, 11]


def test_like_scan_escapes_wildcards(conn: Connection) -> None:
    assert ids(search_messages(conn, "数_据")) == [14]  # "_" is literal: row 20's "数y据" is no hit
    assert ids(search_messages(conn, "%据")) == [14]
    assert ids(search_messages(conn, "x据")) == [14]


def test_like_snippet_is_a_window_around_the_first_token(conn: Connection) -> None:
    (hit,) = search_messages(conn, "配置")
    assert hit["snippet"] == "请帮我检查数据库连接的配置"
    assert hit["id"] == 11


def test_without_trigram_index_cjk_falls_back_to_like(tmp_path: Path) -> None:
    build_store(tmp_path / "old.db", trigram=False)
    for engine in _engine(tmp_path / "old.db"):
        with engine.connect() as connection:
            hits = search_messages(connection, "数据库连接")
        assert ids(hits) == [12, 11]
        assert hits[0]["snippet"] == "数据库连接正常です。설정을 확인합니다"


def test_trigram_syntax_error_falls_back_to_like(conn: Connection) -> None:
    hits = search_messages(conn, "数据库 NOT NOT 连接池")
    assert ids(hits) == [12, 11]
    assert hits[0]["snippet"] == "数据库连接正常です。설정을 확인합니다"


def test_without_fts_tables_search_finds_nothing(tmp_path: Path) -> None:
    build_store(tmp_path / "nofts.db", fts=False)
    for engine in _engine(tmp_path / "nofts.db"):
        with engine.connect() as connection:
            assert search_messages(connection, "deploy") == []
            assert search_messages(connection, "数据") == []


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   ",
        "AND",
        "***",
        "deploy AND AND service",
        "deploy OR OR",
        "-deploy",
        "NEAR(deploy",
        "deploy NEAR/x service",
        "\x01\x02",
        "deploy\x00",
        "\ud800deploy",
        "!@#$%&=",
        "a " * 5000,
    ],
)
def test_hostile_queries_return_a_list(conn: Connection, query: str) -> None:
    assert isinstance(search_messages(conn, query), list)


@pytest.mark.parametrize("query", ["deploy AND AND service", "-deploy", "\ud800deploy"])
def test_rejected_queries_return_nothing(conn: Connection, query: str) -> None:
    assert search_messages(conn, query) == []


def test_surrogates_in_filters_and_cjk_queries_return_nothing(conn: Connection) -> None:
    assert search_messages(conn, "deploy", source_filter=["\udcff"]) == []
    assert search_messages(conn, "数据库连接\ud800") == []
    assert search_messages(conn, "数据\ud800") == []


def test_context_is_the_neighbours_in_timestamp_then_id_order(conn: Connection) -> None:
    (hit,) = search_messages(conn, "needle")
    assert hit["id"] == 16
    assert hit["context"] == [
        {"role": "tool", "content": "tie first"},
        {"role": "assistant", "content": "tie middle needle"},
        {"role": "user", "content": "tie last"},
    ]


def test_context_at_session_edges_and_content_cut(conn: Connection) -> None:
    (first,) = search_messages(conn, "please")
    assert [entry["content"] for entry in first["context"]] == [
        "please deploy the service",
        "I will deploy it with the terminal",
    ]
    (last,) = search_messages(conn, "deploy done")
    assert len(last["context"]) == 2
    assert last["context"][1]["content"] == ("deploy done " + "x" * 300)[:200]


def test_context_decodes_multimodal_and_json_content(conn: Connection) -> None:
    (hit,) = search_messages(conn, "screenshot")
    assert hit["context"] == [
        {"role": "user", "content": "look at this"},
        {"role": "assistant", "content": "the deploy screenshot shows an error"},
        {"role": "user", "content": "[multimodal content]"},
    ]
    (tie,) = search_messages(conn, "last")
    assert tie["context"][2] == {"role": "assistant", "content": ""}  # a JSON object
    (broken,) = search_messages(conn, "broken")
    assert broken["context"][1] == {"role": "assistant", "content": "\x00json:[broken"}


def test_a_context_that_cannot_be_built_is_empty(conn: Connection) -> None:
    (hit,) = search_messages(conn, "zebra")  # a text part that is not a string
    assert hit["id"] == 21
    assert hit["source"] == "whatsapp"
    assert hit["context"] == []


def test_user_values_are_bound_never_interpolated() -> None:
    hostile = "'; DROP TABLE messages; --"
    for query in (hostile, f"数据库 {hostile}", f"的 {hostile}"):
        statement = match_selectable(query, source_filter=[hostile], role_filter=[hostile])
        assert statement is not None
        assert "DROP" not in str(statement.compile())


def test_accepts_an_orm_session(engine: Engine) -> None:
    with Session(engine) as session:
        assert ids(search_messages(session, "chat-send")) == [5]


def test_match_selectable_is_usable_as_a_subquery(conn: Connection) -> None:
    statement = match_selectable("deploy", source_filter=["cli"])
    assert statement is not None
    hits = statement.subquery()
    assert conn.execute(select(func.count()).select_from(hits)).scalar_one() == 4
    rows = conn.execute(select(hits.c.id, hits.c.rank, hits.c.snippet)).all()
    assert {row.id for row in rows} == {1, 2, 3, 4}
    assert all(row.rank < 0 and ">>>" in row.snippet for row in rows)
    assert match_selectable("  AND  ") is None


def test_match_selectable_routes_cjk(conn: Connection) -> None:
    trigram = match_selectable("数据库连接")
    like = match_selectable("数据库连接", trigram=False)
    assert trigram is not None
    assert like is not None
    assert {row.id for row in conn.execute(trigram)} == {11, 12}
    assert {row.id for row in conn.execute(like)} == {11, 12}
    assert all(row.rank is None for row in conn.execute(like))


#: Words of MESSAGES, on each route: random text alone seldom finds anything.
FOUND_WORDS = ("deploy", "terminal", "chat-send", "tie", "数据库连接", "数据", "합니다")
#: What the store says of a message's hit: the contract's fields, from the tables.
HIT_FACTS = text(
    "SELECT m.session_id, m.role, m.timestamp, m.tool_name, s.source, s.model, s.started_at "
    "FROM messages m JOIN sessions s ON s.id = m.session_id WHERE m.id = :id"
)
HIT_FACT_KEYS = ("session_id", "role", "timestamp", "tool_name", "source", "model")


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    query=st.one_of(
        st.text(max_size=60),
        st.sampled_from(FOUND_WORDS),
        st.tuples(st.sampled_from(FOUND_WORDS), st.text(max_size=20)).map(" OR ".join),
    ),
    sort=st.sampled_from([None, "newest", "oldest", "x"]),
)
def _search_answers_any_text(conn: Connection, query: str, sort: str | None) -> None:
    hits = search_messages(conn, query, sort=sort, include_inactive=True)
    ANSWERED.append(len(hits))
    for hit in hits:
        assert list(hit) == RESULT_KEYS
        facts = conn.execute(HIT_FACTS, {"id": hit["id"]}).one()
        assert tuple(hit[key] for key in HIT_FACT_KEYS) == tuple(facts[:6])
        assert hit["session_started"] == facts[6]
        assert 1 <= len(hit["context"]) <= 3  # the hit, and its neighbours in its session
        assert hit["role"] in [window["role"] for window in hit["context"]]


ANSWERED: list[int] = []


def test_search_never_raises_on_text_and_its_hits_are_the_stores_rows(conn: Connection) -> None:
    ANSWERED.clear()
    _search_answers_any_text(conn)
    # The hits of a good share of the queries were checked, not only empty answers.
    assert sum(1 for hits in ANSWERED if hits) >= len(ANSWERED) // 4, ANSWERED


def test_repeated_terms_are_searched_once(conn: Connection) -> None:
    """`the` 200 times cost FTS5 19 s at 50k messages; repeats add nothing to the hits."""
    for query in ("数据库", "deploy", "deploy service", "deploy OR 数据库"):
        single = ids(search_messages(conn, query, limit=100))
        # 100 times stays under the 2048 characters the contract keeps.
        repeated = (" OR " if " OR " in query else " ").join([query] * 100)
        assert ids(search_messages(conn, repeated, limit=100)) == single
    assert without_repeats("the THE a* a* OR the a*") == "the a*"
    assert without_repeats("a NOT a") == "a NOT a"  # NOT: left as written
    assert without_repeats("a AND AND a") == "a AND AND a"  # FTS5's syntax error stays


def test_too_many_distinct_terms_are_refused_with_a_clear_message(conn: Connection) -> None:
    words = [f"word{i}" for i in range(MAX_SEARCH_TERMS + 1)]
    assert search_messages(conn, " ".join(words[:MAX_SEARCH_TERMS])) == []
    with pytest.raises(QueryTooComplex, match=f"at most {MAX_SEARCH_TERMS} are searched"):
        search_messages(conn, " ".join(words))
    # A phrase counts its words; the LIKE route of short CJK tokens has no cap.
    with pytest.raises(QueryTooComplex):
        search_messages(conn, '"' + " ".join(words) + '"')

"""The search contract on PostgreSQL, against the same data on SQLite.

A SQLite store at head is filled with the parity corpus (hermes_store.demo.corpus plus the
targeted rows of test_parity); the same sessions and messages, same ids, are copied into
a PostgreSQL database at head. Every query of parity_queries.py is answered by both.
Rank order differs by design (ts_rank_cd against BM25), so hit sets are compared with the
whole result (no LIMIT); pages are compared where the order is the timestamp's.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parity_queries import PARITY_QUERIES, UNENCODABLE_QUERIES
from sqlalchemy import (
    Boolean,
    Engine,
    String,
    create_engine,
    delete,
    func,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import TSVECTOR
from sqlalchemy.engine import URL
from sqlalchemy.exc import ProgrammingError

from hermes_store import migrate
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.errors import QueryTooComplex
from hermes_store.models import Base
from hermes_store.postgresql import search as postgresql
from hermes_store.postgresql.reads import BY_TRIGRAM_INDEX
from hermes_store.postgresql.search import Binds, tsquery_of
from hermes_store.postgresql.substrings import ascii_caseless
from hermes_store.search import (
    TRIGRAM_INDEX,
    WORD_INDEX,
    sanitize_query,
    search_messages,
    search_store,
)
from hermes_store.search.query import (
    Route,
    escape_like,
    matches,
    parse_query,
    simplify,
    word_tokens,
)
from hermes_store.search.schema import SearchOptions

pytestmark = pytest.mark.postgresql

CORPUS_MESSAGES = 500
#: The parity the issue asks for: identical hit sets for at least this share of queries.
PARITY = 0.95
MARK = re.compile(r">>>(.*?)<<<", re.S)
COPIED = ("system_prompts", "sessions", "messages")


def _affordable(query: dict[str, Any]) -> dict[str, Any]:
    """test_parity's cut of its one pathological entry (FTS5's snippet is quadratic in it)."""
    return {**query, "query": "def " * 40} if query["query"] == "def " * 1000 else query


QUERIES = [_affordable(query) for query in PARITY_QUERIES]


@pytest.fixture(scope="module")
def stores(
    pg_database: URL, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Engine]]:
    """(SQLite engine, PostgreSQL engine) over the same data, in a database of this module."""
    from test_parity import add_targeted_rows

    path = tmp_path_factory.mktemp("search-pg") / "state.db"
    migrate.upgrade(str(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(CORPUS_MESSAGES, 0))
        conn.commit()
    add_targeted_rows(path)

    name = f"{pg_database.database}_search"
    admin = create_engine(pg_database, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = pg_database.set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(url)
    lite, server = create_store_engine(path), create_store_engine(url)
    with lite.connect() as source, server.begin() as target:
        for table_name in COPIED:
            table = Base.metadata.tables[table_name]
            rows = [dict(row) for row in source.execute(select(table)).mappings()]
            if rows:
                target.execute(insert(table), rows)
        target.execute(
            text("SELECT setval(pg_get_serial_sequence('messages', 'id'), max(id)) FROM messages")
        )
    with server.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE"))
    try:
        yield lite, server
    finally:
        lite.dispose()
        server.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _search(engine: Engine, **query: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(search_messages(conn, **query))


def _marked(hit: dict[str, Any]) -> set[str]:
    """The terms a snippet marks, as tokens (a phrase is marked whole)."""
    return {token for span in MARK.findall(hit["snippet"] or "") for token in word_tokens(span)}


def test_every_query_class_gives_the_same_hits_and_marks(stores: tuple[Engine, Engine]) -> None:
    lite, server = stores
    same_hits, same_marks, lines = 0, 0, []
    for query in QUERIES:
        whole = {**query, "limit": -1, "offset": 0}
        expected = {hit["id"]: hit for hit in _search(lite, **whole)}
        found = {hit["id"]: hit for hit in _search(server, **whole)}
        if expected.keys() != found.keys():
            lines.append(f"{query!r:.60}: {sorted(expected.keys() ^ found.keys())[:5]}")
            continue
        same_hits += 1
        if all(_marked(expected[i]) == _marked(found[i]) for i in expected):
            same_marks += 1
        else:
            lines.append(f"{query!r:.60}: marked terms differ")
        for i, hit in expected.items():  # snippet, context and fields byte for byte
            assert found[i] == hit, query
    assert same_hits >= PARITY * len(QUERIES), lines
    assert same_marks >= PARITY * same_hits, lines


@pytest.mark.parametrize(
    "query",
    [
        query
        for query in QUERIES
        if str(query.get("sort", "")).strip().lower() in ("newest", "oldest")
    ]
    + [{"query": "def", "sort": "newest", "limit": 5, "offset": 5}, {"query": "的", "limit": 3}],
)
def test_pages_in_timestamp_order_are_the_same(
    stores: tuple[Engine, Engine], query: dict[str, Any]
) -> None:
    lite, server = stores
    expected = [hit["id"] for hit in _search(lite, **query)]
    assert expected, query
    assert [hit["id"] for hit in _search(server, **query)] == expected


def test_rank_order_pages_hold_the_best_hits_by_ts_rank(stores: tuple[Engine, Engine]) -> None:
    _, server = stores
    first = [hit["id"] for hit in _search(server, query="def", limit=5)]
    second = [hit["id"] for hit in _search(server, query="def", limit=5, offset=5)]
    whole = [hit["id"] for hit in _search(server, query="def", limit=-1)]
    assert first + second == whole[:10]
    assert _search(server, query="def", limit=0) == []
    assert _search(server, query="def", offset=10_000) == []


def test_search_store_answers_as_search_messages(stores: tuple[Engine, Engine]) -> None:
    _, server = stores
    for query in ({"query": "error OR exception"}, {"query": "数据库"}, {"query": "的"}):
        assert list(search_store(server, **query)) == _search(server, **query)


def test_filters_apply_as_on_sqlite(stores: tuple[Engine, Engine]) -> None:
    _, server = stores
    hits = _search(server, query="def", source_filter=["cli", "slack"], role_filter=["user"])
    assert hits
    assert {hit["source"] for hit in hits} <= {"cli", "slack"}
    assert {hit["role"] for hit in hits} == {"user"}
    assert _search(server, query="def", source_filter=[]) == []
    assert "cli" not in {
        hit["source"] for hit in _search(server, query="def", exclude_sources=["cli"])
    }


def test_rewound_rows_are_hidden_except_from_the_like_scan(stores: tuple[Engine, Engine]) -> None:
    _, server = stores
    for query in ("rewound", "数据库连接"):
        hidden = {hit["snippet"] for hit in _search(server, query=query, limit=-1)}
        assert not any("rewound" in (snippet or "") for snippet in hidden), query
        shown = _search(server, query=query, include_inactive=True, limit=-1)
        assert any("rewound" in (hit["snippet"] or "") for hit in shown), query
    compacted = _search(server, query='"compacted summary"')
    assert any("compacted" in (hit["snippet"] or "") for hit in compacted)
    # The LIKE scan never filters on visibility (the legacy quirk, kept).
    like = _search(server, query="连接", limit=-1)
    assert any("rewound" in (hit["snippet"] or "") for hit in like)


def test_cjk_routes(stores: tuple[Engine, Engine]) -> None:
    _, server = stores
    trigram = _search(server, query="数据库 OR 服务器", limit=-1)
    assert trigram
    assert all(">>>" in hit["snippet"] for hit in trigram)
    assert all(hit["context"] for hit in trigram)
    like = _search(server, query="数_据", limit=-1)  # `_` is literal, not LIKE's wildcard
    assert like
    assert all("数_据" in (hit["snippet"] or "") for hit in like)
    assert like == _search(stores[0], query="数_据", limit=-1)


def test_rejected_queries_answer_nothing_and_leave_the_transaction_usable(
    stores: tuple[Engine, Engine],
) -> None:
    _, server = stores
    with server.connect() as conn:
        conn.execute(text("SELECT 1"))  # a transaction of the caller's, already begun
        # FTS5 syntax errors never reach the server; a private-use character is a token
        # to FTS5 but no letter to PostgreSQL: to_tsquery(':*') fails on the server.
        for query in ("sys.argv[1]", "!@#$%^&*()", "\ue000*", '""', "\ud800"):
            assert list(search_messages(conn, query)) == [], query
        assert conn.execute(text("SELECT 1")).scalar_one() == 1


def _plan(conn: Any, statement: Any, values: dict[str, Any]) -> str:
    compiled = statement.compile(dialect=conn.dialect)
    params = {**compiled.params, **values}
    return "\n".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN {compiled}", params))


def test_the_statements_can_use_the_expression_indexes(stores: tuple[Engine, Engine]) -> None:
    """The planner matches the statements' expressions to the two indexes (forced here: at
    2,000 messages a scan is cheaper, so it would not pick them by itself)."""
    _, server = stores
    options = SearchOptions("", include_inactive=True)
    word_route = Route(WORD_INDEX, sanitize_query('"import os"* OR def'), ())
    word = postgresql.word_statement(simplify(parse_query(word_route.match)), options)
    trigram_route = Route(TRIGRAM_INDEX, '"数据库" OR "服务器"', ("数据库", "服务器"))
    trigram = postgresql.trigram_statement(
        simplify(parse_query(trigram_route.match, trigram=True)),
        trigram_route,
        options,
    )
    with server.connect() as conn:
        # At 2,000 messages the planner would rather reach a few rows through the sessions'
        # index; without that way (no nested loop) the word path reads the words' index.
        for setting in ("enable_seqscan", "enable_indexscan", "enable_nestloop"):
            conn.execute(text(f"SET LOCAL {setting} = off"))
        assert "Bitmap Index Scan on messages_fts_words" in _plan(conn, *word)
        assert "Bitmap Index Scan on messages_fts_trigram" in _plan(conn, *trigram)


def test_the_ranked_trigram_statement_finds_its_matches_by_the_trigram_index(
    stores: tuple[Engine, Engine],
) -> None:
    """With its own planner settings (plain index scans allowed, for the context windows'
    neighbours), the ranked trigram statement still finds its matches by a bitmap scan of
    the trigram index, and reaches the neighbours through the sessions' index."""
    _, server = stores
    route = Route(TRIGRAM_INDEX, '"数据库"', ("数据库",))
    options = SearchOptions("数据库")
    statement = postgresql.trigram_statement(
        simplify(parse_query(route.match, trigram=True)), route, options
    )
    with server.connect() as conn:
        conn.execute(select(*BY_TRIGRAM_INDEX.by_index))
        plan = _plan(conn, *statement)
    assert "Bitmap Index Scan on messages_fts_trigram" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert "using idx_messages_session on messages n" in plan, plan


def test_results_follow_inserts_deletes_and_flag_updates(stores: tuple[Engine, Engine]) -> None:
    """The indexes are plain expression indexes: every write is seen by the next search."""
    _, server = stores
    messages = Base.metadata.tables["messages"]
    word = "zyxwvutsrq"
    with server.begin() as conn:
        session = conn.execute(select(Base.metadata.tables["sessions"].c.id)).scalars().first()
        ids = [
            conn.execute(
                insert(messages).returning(messages.c.id),
                {"session_id": session, "role": "user", "content": content, "timestamp": 9e9 + n},
            ).scalar_one()
            for n, content in enumerate([f"{word} Café", f"the {word}s 数据库测试", "\x00json:[]"])
        ]
    try:
        assert {hit["id"] for hit in _search(server, query=word)} == {ids[0]}
        assert {hit["id"] for hit in _search(server, query=f"{word}*")} == set(ids[:2])
        assert {hit["id"] for hit in _search(server, query="cafe")} >= {ids[0]}
        assert ids[1] in {hit["id"] for hit in _search(server, query="数据库测试")}
        with server.begin() as conn:
            conn.execute(update(messages).where(messages.c.id == ids[0]).values(active=0))
        assert _search(server, query=word) == []
        assert {hit["id"] for hit in _search(server, query=word, include_inactive=True)} == {ids[0]}
        with server.begin() as conn:
            conn.execute(update(messages).where(messages.c.id == ids[1]).values(content="gone"))
            conn.execute(delete(messages).where(messages.c.id == ids[0]))
        assert _search(server, query=f"{word}*", include_inactive=True) == []
        # A naive oracle: the tree evaluated over each visible message's indexed text.
        with server.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, hermes_search_document(content, tool_name, tool_calls)"
                    " FROM messages WHERE active = 1 OR compacted = 1"
                )
            ).all()
        for query in ("gone", "error OR exception", "import NOT os", "imp* ret*"):
            tree = parse_query(sanitize_query(query))
            expected = {i for i, document in rows if matches(tree, word_tokens(document))}
            assert {hit["id"] for hit in _search(server, query=query, limit=-1)} == expected, query
    finally:
        with server.begin() as conn:
            conn.execute(delete(messages).where(messages.c.id.in_(ids)))


#: CJK texts for tokens found before and after a NUL (FTS5's trigram tokenizer stops there).
_NUL_TEXTS = ("甲乙丙 一", "前\x00甲乙丙", "甲乙丙\x00丁戊己", "丁戊己 甲乙丙")


@pytest.mark.parametrize("sort", [None, "newest"])
def test_a_cjk_token_after_a_nul_is_not_found_as_on_sqlite(
    stores: tuple[Engine, Engine], sort: str | None
) -> None:
    """Ranked, the trigram index's condition finds a token anywhere and the newest matches
    are then tested before the NUL; by time, in one test: both answer as SQLite does."""
    messages = Base.metadata.tables["messages"]
    ids: dict[Engine, list[int]] = {}
    for engine in stores:
        with engine.begin() as conn:
            session = conn.execute(select(Base.metadata.tables["sessions"].c.id)).scalars().first()
            ids[engine] = [
                conn.execute(
                    insert(messages).returning(messages.c.id),
                    {
                        "session_id": session,
                        "role": "user",
                        "content": content,
                        "timestamp": 8e9 + n,
                    },
                ).scalar_one()
                for n, content in enumerate(_NUL_TEXTS)
            ]
    try:
        answers: dict[str, list[set[int]]] = {}
        for query in ("甲乙丙", "丁戊己", "甲乙丙 丁戊己", "甲乙丙 OR 丁戊己", "甲乙丙 NOT 丁戊己"):
            answers[query] = []
            for engine in stores:
                found = {hit["id"] for hit in _search(engine, query=query, sort=sort, limit=-1)}
                answers[query].append({ids[engine].index(i) for i in found if i in ids[engine]})
        assert all(lite == server for lite, server in answers.values()), answers
        # The rows reach both sides of the NUL: each one a test the NUL changes.
        assert answers["甲乙丙"][0] == {0, 2, 3}
        assert answers["甲乙丙 NOT 丁戊己"][0] == {0, 2}
    finally:
        for engine in stores:
            with engine.begin() as conn:
                conn.execute(delete(messages).where(messages.c.id.in_(ids[engine])))


def test_a_ranked_page_reaches_past_newest_matches_that_fail_the_nul_test(
    stores: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranked, the newest matches are tested before the NUL, newest first, until the window
    holds enough: with a window of 2 and the 3 newest matches failing (the token after a
    NUL), the page holds the 2 older ones that pass, ranked, as SQLite's does, each with
    the context window SQLite gives it (neighbours holding NULs, read with the hits)."""
    monkeypatch.setattr(postgresql, "RANK_WINDOW", 2)
    contents = ["庚辛壬 癸", "庚辛壬 庚辛壬", "前\x00庚辛壬", "后\x00庚辛壬 庚辛壬", "\x00庚辛壬"]
    lite, server = stores
    ids = {engine: _insert_messages(engine, contents) for engine in (lite, server)}
    try:
        hits = {engine: _search(engine, query="庚辛壬", limit=2) for engine in (lite, server)}
        pages = {engine: [hit["id"] for hit in hits[engine]] for engine in hits}
        assert pages[server] == [ids[server][1], ids[server][0]]
        assert sorted(pages[lite]) == ids[lite][:2]
        windows = {
            engine: {ids[engine].index(hit["id"]): hit["context"] for hit in hits[engine]}
            for engine in hits
        }
        assert windows[server] == windows[lite]
        assert "\x00" in windows[server][1][-1]["content"]  # the next row, read back whole
    finally:
        _delete_messages(ids)


def test_trigram_rank_puts_texts_the_query_covers_most_first(
    stores: tuple[Engine, Engine],
) -> None:
    """By rank, a trigram query's hits whose text is most made of its tokens come first;
    a token with case is found in any case, as on SQLite."""
    lite, server = stores
    contents = [
        "全文检索器 in a message with many more words around it than the others have",
        "全文检索器 全文检索器",
        "全文检索器 and a few words",
        "Qwertz全文检索器",
    ]
    ids = {engine: _insert_messages(engine, contents) for engine in (lite, server)}
    try:
        mine = ids[server]
        whole = [hit["id"] for hit in _search(server, query="全文检索器", limit=-1)]
        assert [i for i in whole if i in mine] == [mine[1], mine[3], mine[2], mine[0]]
        for query in ("QWERTZ全文检索器", "qwertz全文检索器"):
            for engine in (lite, server):
                assert [hit["id"] for hit in _search(engine, query=query)] == [ids[engine][3]]
    finally:
        _delete_messages(ids)


def _delete_messages(ids: dict[Engine, list[int]]) -> None:
    """Delete the messages _insert_messages wrote, on each engine."""
    messages = Base.metadata.tables["messages"]
    for engine, inserted in ids.items():
        with engine.begin() as conn:
            conn.execute(delete(messages).where(messages.c.id.in_(inserted)))


def _insert_messages(engine: Engine, contents: list[str]) -> list[int]:
    """New messages of the first session, one per text, in order; their ids."""
    messages = Base.metadata.tables["messages"]
    with engine.begin() as conn:
        session = conn.execute(select(Base.metadata.tables["sessions"].c.id)).scalars().first()
        return [
            conn.execute(
                insert(messages).returning(messages.c.id),
                {"session_id": session, "role": "user", "content": content, "timestamp": 9e9},
            ).scalar_one()
            for content in contents
        ]


def test_equal_timestamps_are_ranked_within_pages_in_time_order(
    stores: tuple[Engine, Engine],
) -> None:
    """Ordered by time, rank is computed for the page's timestamps only: pages still cut
    the same list as one whole answer, ties ordered by rank, then by id."""
    _, server = stores
    messages = Base.metadata.tables["messages"]
    contents = ["qwertz filler words here", "qwertz qwertz", "qwertz and more filler", "qwertz"]
    with server.begin() as conn:
        session = conn.execute(select(Base.metadata.tables["sessions"].c.id)).scalars().first()
        ids = [
            conn.execute(
                insert(messages).returning(messages.c.id),
                {"session_id": session, "role": "user", "content": content, "timestamp": 5.0},
            ).scalar_one()
            for content in contents
        ]
    try:
        for sort in ("newest", "oldest"):
            whole = [hit["id"] for hit in _search(server, query="qwertz", sort=sort, limit=-1)]
            assert sorted(whole) == ids
            assert whole[0] == ids[1]  # the most occurrences in the fewest words ranks first
            pages = [
                hit["id"]
                for offset in range(len(ids))
                for hit in _search(server, query="qwertz", sort=sort, limit=1, offset=offset)
            ]
            assert pages == whole
    finally:
        with server.begin() as conn:
            conn.execute(delete(messages).where(messages.c.id.in_(ids)))


def test_a_database_without_the_schema_is_an_error_not_an_empty_answer(pg_url: str) -> None:
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn, pytest.raises(ProgrammingError):
            search_messages(conn, "def")
    finally:
        engine.dispose()


QUERY_WORDS = [
    "def",
    "return",
    "self",
    "error",
    "import",
    "os",
    "test",
    "file",
    "Traceback",
    "café",
    "AND",
    "OR",
    "NOT",
    "and",
    "NEAR",
    "数据库",
    "数据",
    "的",
    "服务器",
    "テスト",
    "합니다",
    '"',
    "*",
    "(",
    ")",
    ":",
    "-",
    ".",
    "_",
    "^",
    "+",
    "\x00",
    "\ue000",
    "²",
    "ß",
    "Ω",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(QUERY_WORDS), min_size=1, max_size=6).flatmap(
        lambda words: st.sampled_from([" ", ""]).map(lambda sep: sep.join(words))
    )
)
def test_random_queries_never_raise_and_page_by_time_as_on_sqlite(
    stores: tuple[Engine, Engine], query: str
) -> None:
    lite, server = stores
    try:
        expected = [hit["id"] for hit in _search(lite, query=query, sort="newest")]
    except QueryTooComplex:
        return
    found = [hit["id"] for hit in _search(server, query=query, sort="newest")]
    if not any(char in query for char in "\ue000²ß"):  # the documented tokeniser differences
        assert found == expected


LIKE_ALPHABET = "aAbBzZéÉß数据的 %_\\.[]()*+?^$|{}-"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(LIKE_ALPHABET, min_size=1, max_size=6), st.text(LIKE_ALPHABET, max_size=12))
def test_the_like_scan_folds_case_as_sqlite_like_does(
    stores: tuple[Engine, Engine], token: str, text_: str
) -> None:
    lite, server = stores
    with lite.connect() as conn:
        expected = conn.exec_driver_sql(
            "SELECT ? LIKE ? ESCAPE '\\'", (text_, f"%{escape_like(token)}%")
        ).scalar_one()
    with server.connect() as conn:
        regex = conn.execute(text("SELECT :t ~ :r"), {"t": text_, "r": ascii_caseless(token)})
        plain = conn.execute(
            text("SELECT :t LIKE :p"), {"t": text_, "p": f"%{escape_like(token)}%"}
        )
        found = regex.scalar_one() if any(c.isascii() and c.isalpha() for c in token) else None
        if found is None:
            found = plain.scalar_one()
    assert bool(found) == bool(expected), (token, text_)


NEAR_DOCUMENTS = [
    "a b",
    "a x b",
    "a x y b",
    "b a",
    "b x y a",
    "c d a b",
    "a c d x b",
    "a",
    "b x c d",
]


@pytest.mark.parametrize(
    ("query", "exact"),
    [
        ("NEAR(a b, 1)", True),
        ("NEAR(a b, 0)", True),
        ('NEAR("c d" b, 1)', True),
        ("NEAR(a b)", True),
        ("NEAR(a* b, 1)", True),
        ("NEAR(a b c, 2)", False),
    ],
)
def test_near_groups_as_tsquery(stores: tuple[Engine, Engine], query: str, exact: bool) -> None:
    """Two phrases: exactly FTS5's NEAR (as the parser evaluates it); more: a superset."""
    _, server = stores
    tree = parse_query(query)
    with server.connect() as conn:
        for document in NEAR_DOCUMENTS:
            binds = Binds()
            match = func.hermes_search_words(literal(document, String), type_=TSVECTOR).op(
                "@@", return_type=Boolean
            )(tsquery_of(tree, binds))
            found = conn.execute(select(match), binds.values).scalar_one()
            expected = matches(tree, word_tokens(document))
            if exact:
                assert found == expected, document
            else:  # three phrases: the AND of them
                assert found or not expected, document


@pytest.mark.parametrize("query", UNENCODABLE_QUERIES)
def test_lone_surrogates_answer_nothing_as_on_sqlite(
    stores: tuple[Engine, Engine], query: dict[str, Any]
) -> None:
    lite, server = stores
    assert _search(server, **query) == _search(lite, **query) == []


def test_a_huge_message_is_stored_and_found_by_its_first_words(pg_url: str) -> None:
    """A tsvector holds at most 1 MB of distinct words; a message past that must still be
    written (never lost), its beginning searchable."""
    import random

    from hermes_store import migrate
    from hermes_store.store import NewMessage, Store

    migrate.upgrade(pg_url)
    rng = random.Random(7)
    words = " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) for _ in range(300_000)
    )
    with Store.open(pg_url) as store:
        store.create_session("s", "cli")
        message_id = store.append_message("s", NewMessage("tool", "zebrafirst " + words))
        assert [m.id for m in store.messages("s")] == [message_id]
        assert [hit["id"] for hit in store.search("zebrafirst")] == [message_id]


# -- the same answer for the same hostile input ----------------------------------------------


def _answer(engine: Engine, query: str, **options: Any) -> tuple[set[int], str | None]:
    """Every hit's id of a search, and its query_error."""
    with engine.connect() as conn:
        hits = search_messages(conn, query, limit=-1, **options)
    return {hit["id"] for hit in hits}, hits.query_error


@pytest.fixture
def nul_source(stores: tuple[Engine, Engine]) -> Iterator[int]:
    """A session whose source holds a NUL, and one message of it, in both stores."""
    sessions, messages = Base.metadata.tables["sessions"], Base.metadata.tables["messages"]
    session = {"id": "nul-source", "source": "te\x00st", "started_at": 1.0}
    message = {
        "id": 900_000,  # the same id on both
        "session_id": "nul-source",
        "role": "us\x00er",
        "content": "zebranul words",
        "timestamp": 2.0,
    }
    for engine in stores:
        with engine.begin() as conn:
            conn.execute(insert(sessions), session)
            conn.execute(insert(messages), message)
    try:
        yield 900_000
    finally:
        for engine in stores:
            with engine.begin() as conn:
                conn.execute(delete(messages).where(messages.c.session_id == "nul-source"))
                conn.execute(delete(sessions).where(sessions.c.id == "nul-source"))


@pytest.mark.parametrize(
    ("filters", "hits"),
    [
        ({"source_filter": ["cli\x00"]}, False),
        ({"source_filter": ["cli", "te\x00st"]}, True),
        ({"exclude_sources": ["cli\x00", "slack"]}, True),
        ({"exclude_sources": ["te\x00st"]}, True),
        ({"role_filter": ["user\x00"]}, False),
        ({"role_filter": ["us\x00er", "tool"]}, True),
    ],
)
@pytest.mark.parametrize("query", ["zebranul OR def", "数据库 OR zebranul", "的"])
def test_a_nul_in_a_filter_answers_as_on_sqlite(
    stores: tuple[Engine, Engine],
    nul_source: int,
    query: str,
    filters: dict[str, Any],
    hits: bool,
) -> None:
    lite, server = stores
    expected = _answer(lite, query, **filters)
    assert _answer(server, query, **filters) == expected
    assert bool(expected[0]) == hits


def test_a_filter_with_a_nul_finds_the_rows_that_hold_it(
    stores: tuple[Engine, Engine], nul_source: int
) -> None:
    for engine in stores:
        assert _answer(engine, "zebranul", source_filter=["te\x00st"]) == ({nul_source}, None)
        assert _answer(engine, "zebranul", role_filter=["us\x00er"]) == ({nul_source}, None)
        assert _answer(engine, "zebranul", source_filter=["test"]) == (set(), None)


@pytest.mark.parametrize("query", ["error \udcff", "error OR \udcff", "数据库 \ud800", "的 \udcff"])
def test_a_query_no_message_can_hold_answers_nothing_on_both(
    stores: tuple[Engine, Engine], query: str
) -> None:
    lite, server = stores
    assert _answer(lite, query.split()[0])[0]  # its first word alone has hits
    answer = _answer(server, query)
    assert answer == _answer(lite, query)
    assert answer[0] == set()
    assert answer[1] is not None
    assert "UTF-8" in answer[1]


@pytest.mark.parametrize("query", ["def AND NOT return", "-def", "what?", "def OR AND self"])
def test_a_query_fts5_rejects_says_why_as_on_sqlite(
    stores: tuple[Engine, Engine], query: str
) -> None:
    lite, server = stores
    expected = _answer(lite, query)
    assert expected[0] == set()
    assert expected[1] is not None
    assert expected[1].startswith("the query was not understood")
    assert _answer(server, query) == expected


#: Words both databases tokenise alike (none of the documented tokeniser differences).
HOSTILE_WORDS = [word for word in QUERY_WORDS if word not in ("\ue000", "²", "ß")] + [
    "\udcff",
    "\ud800",
    "\ufffe",
    "\x01",
    "\x1f",
    "\x7f",
    "\t",
    "'",
    "?",
    "#",
    "x' OR '1'='1",
    "json",
    "x" * 2100,
    " ".join(f"w{i}" for i in range(40)),
]
HOSTILE_VALUES = [
    "cli",
    "slack",
    "telegram",
    "user",
    "assistant",
    "tool",
    "",
    "cli\x00",
    "\x00",
    "\udcff",
    "\ufffe",
    "x' OR '1'='1",
]
_filter_values = st.none() | st.lists(st.sampled_from(HOSTILE_VALUES), max_size=3)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    query=st.lists(st.sampled_from(HOSTILE_WORDS), min_size=1, max_size=6).flatmap(
        lambda words: st.sampled_from([" ", "", '"']).map(lambda sep: sep.join(words))
    ),
    sources=_filter_values,
    excluded=_filter_values,
    roles=_filter_values,
    include_inactive=st.booleans(),
)
def test_hostile_queries_and_filters_answer_the_same_on_both(
    stores: tuple[Engine, Engine],
    query: str,
    sources: list[str] | None,
    excluded: list[str] | None,
    roles: list[str] | None,
    include_inactive: bool,
) -> None:
    """The same hits (all of them: rank order differs by design) and the same verdict on
    the query, whatever the query and the filters hold."""
    lite, server = stores
    options: dict[str, Any] = {
        "source_filter": sources,
        "exclude_sources": excluded,
        "role_filter": roles,
        "include_inactive": include_inactive,
    }
    try:
        expected = _answer(lite, query, **options)
    except QueryTooComplex:
        with pytest.raises(QueryTooComplex):
            _answer(server, query, **options)
        return
    assert _answer(server, query, **options) == expected


def test_the_hostile_vocabulary_has_hits_on_both(stores: tuple[Engine, Engine]) -> None:
    """The comparison above bites: its words find rows, under its filters too."""
    lite, server = stores
    for query, options in [
        ("def OR json", {}),
        ("数据库", {"source_filter": ["cli", "slack", "telegram"]}),
        ("的", {"role_filter": ["user", "assistant"]}),
        ("error", {"exclude_sources": ["x' OR '1'='1", "cli\x00"]}),
    ]:
        expected = _answer(lite, query, **options)
        assert expected[0], query
        assert _answer(server, query, **options) == expected

"""FTS5's snippet() in memory (hermes_store.search.fts5_snippets, PostgreSQL's snippets)
against FTS5's snippet() on a real SQLite store and the pure-Python reproduction.

Every example puts random documents in a SQLite store at head (its triggers fill its FTS5
indexes) and runs a random MATCH there; the in-memory table gets the same rows' indexed
text. The store's snippet and the in-memory one are equal on every row the store returns
(the same rows in the same table: even FTS5's corners that depend on the other rows are
the same), and the in-memory rows are the store's rows. The pure reproduction equals them
wherever it is defined to agree (tests/test_fts5_snippet.py: not on the rows whose
snippet depends on the other rows).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fts5_snippet import (
    SETTINGS,
    Item,
    Query,
    _positions,
    _trigram_tokens,
    depends_on_other_rows,
    documents,
    stale_near_members,
    trigram_documents,
    trigram_queries,
    word_occurrences,
    word_queries,
)

from hermes_store import migrate
from hermes_store.declarations import SQLITE, TRIGRAM_INDEX, WORD_INDEX
from hermes_store.postgresql import search as postgresql
from hermes_store.postgresql import snippets as postgresql_snippets
from hermes_store.search import fts5_snippets
from hermes_store.search.fts5_snippets import (
    SNIPPET_SQL,
    memory_indexes,
    memory_snippets,
)
from hermes_store.search.snippet import trigram_snippet, word_snippet
from hermes_store.store import NewMessage, Store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    """A SQLite store at head, one session; each example replaces its messages."""
    path = tmp_path_factory.mktemp("memory-snippets") / "state.db"
    migrate.upgrade(str(path))
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("INSERT INTO sessions(id, source, started_at) VALUES ('s', 'cli', 0)")
        yield db


def _indexed(doc: str) -> str:
    """A message's indexed text when only its content is set (the view's expression)."""
    return doc + "  "


def _store_snippets(
    db: sqlite3.Connection, index: str, docs: Sequence[str], match: str
) -> dict[int, str]:
    """FTS5's answer on the store: (id, snippet) of every row ``match`` selects."""
    db.execute("DELETE FROM messages")
    db.executemany(
        "INSERT INTO messages(id, session_id, role, content, timestamp)"
        " VALUES (?, 's', 'user', ?, ?)",
        [(i, doc, float(i)) for i, doc in enumerate(docs, 1)],
    )
    rows = db.execute(
        f"SELECT rowid, {SNIPPET_SQL.format(index)} FROM {index} WHERE {index} MATCH ?", (match,)
    ).fetchall()
    return dict(rows)


COMPARED: list[int] = []


def _compare(db: sqlite3.Connection, index: str, docs: Sequence[str], match: str) -> dict[int, str]:
    expected = _store_snippets(db, index, docs, match)
    got = memory_snippets(index, match, {i: _indexed(doc) for i, doc in enumerate(docs, 1)})
    assert got == expected, match
    COMPARED.append(len(expected))
    return expected


def test_the_in_memory_tables_are_the_stores_indexes() -> None:
    """Both tokenizers are in this sqlite3, declared from the layout's own declarations."""
    assert memory_indexes() == {index.name for index in SQLITE.indexes}
    assert memory_indexes() == {WORD_INDEX, TRIGRAM_INDEX}


@settings(SETTINGS, max_examples=120)
@given(
    data=st.data(),
    docs=st.lists(st.one_of(documents(), documents(90, min_words=30)), min_size=1, max_size=5),
)
def _word(db: sqlite3.Connection, data: st.DataObject, docs: list[str]) -> None:
    query: Query = data.draw(word_queries(docs))
    phrases, near, groups = query.compiled()
    for rowid, snippet in _compare(db, WORD_INDEX, docs, query.fts5()).items():
        text = _indexed(docs[rowid - 1])
        if depends_on_other_rows(
            groups, word_occurrences(text, phrases, near)
        ) or stale_near_members(text, phrases, near):
            continue
        assert word_snippet(text, phrases, near=near, groups=groups) == snippet, query.fts5()


def test_word_snippets_in_memory_equal_the_stores_and_the_pure_ones(
    store: sqlite3.Connection,
) -> None:
    COMPARED.clear()
    _word(store)
    assert sum(1 for rows in COMPARED if rows) >= 0.4 * len(COMPARED)


@settings(SETTINGS, max_examples=80)
@given(data=st.data(), docs=st.lists(trigram_documents(), min_size=1, max_size=4))
def _trigram(db: sqlite3.Connection, data: st.DataObject, docs: list[str]) -> None:
    subs, operators = data.draw(trigram_queries(docs))
    _, _, groups = Query(tuple(Item((((s, False),),)) for s in subs), operators).compiled()
    match = " ".join(
        part
        for op, s in zip(("", *operators), subs, strict=True)
        for part in ([op] if op else []) + ['"' + s.replace('"', '""') + '"']
    )
    for rowid, snippet in _compare(db, TRIGRAM_INDEX, docs, match).items():
        text = _indexed(docs[rowid - 1])
        grams = [token.text for token in _trigram_tokens(text)]
        occurs = [
            bool(_positions(grams, [(t.text, False) for t in _trigram_tokens(sub)])) for sub in subs
        ]
        if depends_on_other_rows(groups, occurs):
            continue
        assert trigram_snippet(text, subs, groups=groups) == snippet, match


def test_trigram_snippets_in_memory_equal_the_stores_and_the_pure_ones(
    store: sqlite3.Connection,
) -> None:
    COMPARED.clear()
    _trigram(store)
    assert sum(1 for rows in COMPARED if rows) >= 0.4 * len(COMPARED)


def test_batches_give_the_same_snippets(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = {i: f"line {i}: the error was here, then docker restarted " * 3 for i in range(1, 40)}
    whole = memory_snippets(WORD_INDEX, "error OR docker", texts)
    monkeypatch.setattr(fts5_snippets, "MEMORY_BATCH_CHARS", 200)
    assert memory_snippets(WORD_INDEX, "error OR docker", texts) == whole
    assert sorted(whole) == sorted(texts)


def test_the_table_is_empty_after_each_call() -> None:
    memory_snippets(WORD_INDEX, "error", {7: "an error"})
    assert memory_snippets(WORD_INDEX, "error", {8: "another error"}) == {8: "another >>>error<<<"}


def test_a_refused_match_gives_no_snippet_and_logs_no_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "confidentialword"
    with caplog.at_level(logging.DEBUG, logger="hermes_store"):
        assert memory_snippets(WORD_INDEX, f"{secret} AND", {1: f"a {secret} here"}) == {}
    assert caplog.records  # it said something
    assert secret not in caplog.text
    assert memory_snippets(WORD_INDEX, secret, {1: f"a {secret} here"}) == {
        1: f"a >>>{secret}<<< here"
    }


def test_threads_get_their_own_connection() -> None:
    answers: list[dict[int, str]] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            memory_snippets(TRIGRAM_INDEX, '"数据库"', {3: "连接数据库失败"})
        )
    )
    thread.start()
    thread.join()
    assert answers == [{3: "连接>>>数据库<<<失败"}]


# -- PostgreSQL's snippets: FTS5's in memory, the pure ones where FTS5 is missing ---------

#: Past the pure path's 64 KiB: FTS5 shows the later passage holding both terms.
LONG_MESSAGE = "error " + "filler words " * 8000 + " error docker"
PG_MESSAGES = [
    "please check the error in docker. Then restart it: docker compose up",
    "no match here at all",
    "数据库连接错误: the database error again " * 30,
    "Straße café naïve error über " + "filler words " * 4000 + " docker error",
    LONG_MESSAGE,
    "error " * 1500,  # past EXACT_INSTANCES: bounded on every path
]
PG_QUERIES = [
    "error",
    "docker OR café",
    '"docker compose"',
    "err*",
    "error NOT naïve",
    "数据库连接",
    "error OR docker",
]


@pytest.mark.postgresql
def test_postgresql_snippets_are_fts5s_in_memory_and_the_pure_ones_without_it(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.db"
    answers: dict[str, list[list[tuple[int, str]]]] = {}
    for url in (str(path), pg_url):
        migrate.upgrade(url)
        with Store.open(url) as store:
            store.create_session("s", "cli")
            for content in PG_MESSAGES:
                store.append_message("s", NewMessage("user", content))
            answers[url] = [
                sorted((hit["id"], hit["snippet"]) for hit in store.search(query, limit=-1))
                for query in PG_QUERIES
            ]
    assert answers[pg_url] == answers[str(path)]
    assert all(answers[pg_url])

    calls: list[str] = []
    real = postgresql_snippets.memory_snippets
    monkeypatch.setattr(
        postgresql_snippets,
        "memory_snippets",
        lambda index, match, texts: calls.append(index) or real(index, match, texts),
    )
    with Store.open(pg_url) as store:
        assert (
            sorted((h["id"], h["snippet"]) for h in store.search("error", limit=-1))
            == (answers[pg_url][0])
        )
        assert calls == [WORD_INDEX]  # the in-memory FTS5 made them
        monkeypatch.setattr(postgresql, "memory_indexes", frozenset)
        pure = [
            sorted((hit["id"], hit["snippet"]) for hit in store.search(query, limit=-1))
            for query in PG_QUERIES
        ]
    assert calls == [WORD_INDEX]  # not asked without FTS5
    # The pure path's limit is smaller (64 KiB): the 104 KB message gets a bounded snippet
    # there (its first instance's passage), FTS5's own here, as on SQLite.
    long_id = PG_MESSAGES.index(LONG_MESSAGE) + 1  # ids from 1, in this order
    assert pure[:-1] == answers[pg_url][:-1]
    assert [hit for hit in pure[-1] if hit[0] != long_id] == [
        hit for hit in answers[pg_url][-1] if hit[0] != long_id
    ]
    with_fts5 = dict(answers[pg_url][-1])[long_id]
    without = dict(pure[-1])[long_id]
    assert ">>>error<<< >>>docker<<<" in with_fts5
    assert without.startswith(">>>error<<< filler")
    assert without != with_fts5

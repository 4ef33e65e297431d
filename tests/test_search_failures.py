"""Search never reports a failure as "no matches" (SQLite).

A store whose FTS5 index was changed behind its back (a shadow table dropped or rewritten)
answers by the exact scan, flags the result as degraded and logs one warning. A message
whose text is not valid UTF-8 (a writer that stored bytes as TEXT) is found and returned,
its bad bytes shown as U+FFFD, and named by id: its text never reaches an error or a log.
A query FTS5 rejects answers no hits (the contract) and says why (``query_error``).

The exact answer each of these is held to is the healthy index's, on a copy of the same
store taken before the damage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.search import SearchResults, search_messages
from hermes_store.store import Store

CORPUS_MESSAGES = 600
CORPUS_SEED = 3
#: Damage to an index's shadow tables that FTS5 reports only when a query reads it, and
#: the query whose answer it used to empty (the word index, or the trigram one for CJK).
DAMAGE = {
    "version": ("UPDATE messages_fts_config SET v = 99 WHERE k = 'version'", "error"),
    "config": ("DROP TABLE messages_fts_config", "error"),
    "idx": ("DROP TABLE messages_fts_idx", "error"),
    "docsize": ("DROP TABLE messages_fts_docsize", "error"),
    "data": (
        "UPDATE messages_fts_data SET block = randomblob(length(block)) WHERE id > 10",
        "error",
    ),
    "trigram docsize": ("DROP TABLE messages_fts_trigram_docsize", "数据库"),
    "trigram version": (
        "UPDATE messages_fts_trigram_config SET v = 99 WHERE k = 'version'",
        "数据库",
    ),
}
#: What the bad rows below hold besides their words: it must never leave the result.
SECRET = "hunter2-secret-token"


@contextlib.contextmanager
def plain(path: Path) -> Iterator[sqlite3.Connection]:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        yield conn


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store created at head holding a corpus, its indexes healthy."""
    path = tmp_path_factory.mktemp("search-failures") / "template.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HERMES_HOME", str(path.parent / "home"))
        patch.delenv("HERMES_STORE_URL", raising=False)
        migrate.upgrade(str(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(CORPUS_MESSAGES, CORPUS_SEED))
        conn.commit()
    with plain(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(template, tmp_path / "state.db"))


def search(path: Path, query: str, how: str = "connection", **options: Any) -> SearchResults:
    """Every hit of a search, through a SQLAlchemy connection or the Store API."""
    options = {"limit": -1, **options}
    if how == "store":
        with Store.open(path) as opened:
            return opened.search(query, **options)
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            return search_messages(conn, query, **options)
    finally:
        engine.dispose()


def ids(hits: SearchResults) -> set[int]:
    return {hit["id"] for hit in hits}


def exact(template: Path, query: str, **options: Any) -> set[int]:
    """The healthy index's answer: what a damaged store must still give."""
    answer = search(template, query, **options)
    assert answer, query  # the comparisons below bite
    assert answer.degraded is None
    assert answer.query_error is None
    return ids(answer)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def invoke(*args: str | Path, expect: int = 0) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == expect, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stderr  # (the corpus's messages quote tracebacks)
    return result


# --------------------------------------------------------------------------------------------
# A damaged index: the exact scan answers, and says so
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["connection", "store"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_index_answers_by_the_exact_scan_and_says_so(
    template: Path, store: Path, damage: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    statement, query = DAMAGE[damage]
    expected = exact(template, query)
    with plain(store) as conn:
        conn.execute(statement)

    with caplog.at_level(logging.WARNING, logger="hermes_store.search"):
        hits = search(store, query, how)

    assert ids(hits) == expected
    assert hits.degraded is not None
    index = "messages_fts_trigram" if damage.startswith("trigram") else "messages_fts"
    assert f"the search index {index} is damaged" in hits.degraded
    assert "hermes-store check --repair" in hits.degraded
    assert warnings(caplog) == [f"search: {hits.degraded}"]
    assert hits.query_error is None


def test_a_damaged_index_pages_and_sorts_the_scanned_hits_as_the_contract_says(
    template: Path, store: Path
) -> None:
    expected = [hit["id"] for hit in search(template, "error", sort="newest", limit=-1)]
    assert len(expected) > 12
    with plain(store) as conn:
        conn.execute(DAMAGE["idx"][0])
    page = search(store, "error", sort="newest", limit=5, offset=7)
    timestamps = {hit["id"]: hit["timestamp"] for hit in search(template, "error", limit=-1)}
    assert [timestamps[hit["id"]] for hit in page] == [timestamps[i] for i in expected[7:12]]
    assert page.degraded is not None


def test_the_cli_says_on_stderr_that_a_damaged_index_was_scanned(
    template: Path, store: Path
) -> None:
    expected = exact(template, "error")
    with plain(store) as conn:
        conn.execute(DAMAGE["version"][0])
    result = invoke("search", "--db", store, "error", "--json", "--limit", "1000")
    assert {hit["id"] for hit in json.loads(result.stdout)} == expected
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("Warning: the search index messages_fts is damaged (SQLite: ")
    assert "found 99" in lines[0]


def test_a_query_fts5_rejects_on_a_damaged_index_is_still_not_understood(store: Path) -> None:
    with plain(store) as conn:
        conn.execute(DAMAGE["version"][0])
    hits = search(store, "docker AND NOT compose")
    assert list(hits) == []
    assert hits.query_error is not None
    assert "NOT" in hits.query_error


def test_an_interrupted_search_is_an_error_not_a_damaged_index(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only failures of the data make search scan: SQLite interrupting a statement (what
    a time bound does) is no damage, and no answer."""
    engine = create_store_engine(store, create=False)
    try:
        with engine.connect() as conn, caplog.at_level(logging.WARNING):
            conn.connection.driver_connection.set_progress_handler(lambda: 1, 50)
            with pytest.raises(Exception, match="interrupted"):
                search_messages(conn, "error")
    finally:
        engine.dispose()
    assert warnings(caplog) == []


# --------------------------------------------------------------------------------------------
# A message whose text is not valid UTF-8
# --------------------------------------------------------------------------------------------


def spoil(path: Path, word: str, among: set[int]) -> int:
    """Give one visible message of ``among`` that holds ``word`` (as a word, or for CJK as
    a substring) an invalid UTF-8 byte right after it, and a secret, written as a careless
    writer would: bytes stored as TEXT. Returns its id."""
    found = re.compile(re.escape(word) if not word.isascii() else rf"\b{re.escape(word)}\b")
    with plain(path) as conn:
        for message_id, content in conn.execute(
            "SELECT id, content FROM messages WHERE instr(content, char(0)) = 0 "
            "AND (active = 1 OR compacted = 1) ORDER BY id"
        ):
            match = found.search(content or "")
            if message_id in among and match and match.end() < 150:
                break
        else:
            raise AssertionError(f"no message to spoil for {word!r}")
        end = len(content[: match.end()].encode())
        spoilt = content.encode()[:end] + b"\xff" + content.encode()[end:]
        spoilt += f" {SECRET} ".encode() + b"\xc3\x28 end"
        conn.execute(
            "UPDATE messages SET content = CAST(? AS TEXT) WHERE id = ?", (spoilt, message_id)
        )
        with pytest.raises(sqlite3.OperationalError, match="Could not decode"):
            conn.execute("SELECT content FROM messages WHERE id = ?", (message_id,)).fetchall()
    return int(message_id)


def assert_nothing_shows_the_secret(hits: SearchResults, caplog: pytest.LogCaptureFixture) -> None:
    assert SECRET not in (hits.degraded or "")
    assert SECRET not in (hits.query_error or "")
    for record in caplog.records:
        shown = record.getMessage()
        if record.exc_info:
            shown += logging.Formatter().formatException(record.exc_info)
        assert SECRET not in shown, record.name


@pytest.mark.parametrize("how", ["connection", "store"])
@pytest.mark.parametrize(
    ("query", "damage"),
    [
        ("error", None),  # the word index
        ("error", "idx"),  # the word index damaged too: the scan
        ("数据库", None),  # the trigram index
        ("的", None),  # the LIKE scan (short CJK tokens)
        ("的 是 在 了 和 一", None),  # the LIKE scan, more tokens than SQL LIKE tests
    ],
)
def test_a_message_that_is_not_utf8_is_found_and_named_never_shown(
    template: Path,
    store: Path,
    query: str,
    damage: str | None,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    expected = exact(template, query)
    spoilt = spoil(store, query.split()[0], expected)
    if damage is not None:
        with plain(store) as conn:
            conn.execute(DAMAGE[damage][0])

    with caplog.at_level(logging.DEBUG):
        hits = search(store, query, how)

    assert ids(hits) == expected
    hit = next(hit for hit in hits if hit["id"] == spoilt)
    assert "\ufffd" in (hit["snippet"] or "")
    assert any("\ufffd" in entry["content"] for entry in hit["context"])
    assert all(other["context"] for other in hits)  # no hit lost its context to the bad row
    assert hits.degraded is not None
    assert f"message {spoilt} " in hits.degraded
    assert "not valid UTF-8" in hits.degraded
    if damage is not None:
        assert "the search index messages_fts is damaged" in hits.degraded
    assert warnings(caplog) == [f"search: {hits.degraded}"]
    assert_nothing_shows_the_secret(hits, caplog)


def test_the_cli_finds_a_message_that_is_not_utf8_and_names_it(template: Path, store: Path) -> None:
    expected = exact(template, "error", include_inactive=True)
    spoilt = spoil(store, "error", expected)
    result = invoke(
        "search", "--db", store, "error", "--json", "--limit", "1000", "--include-inactive"
    )
    assert {hit["id"] for hit in json.loads(result.stdout)} == expected
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("Warning: ")
    assert f"message {spoilt} " in lines[0]
    assert SECRET not in result.stderr
    text = invoke("search", "--db", store, SECRET.split("-")[0], "--limit", "5")
    assert f"#{spoilt} " in text.stdout  # and its words are searchable
    assert SECRET not in text.stderr


# --------------------------------------------------------------------------------------------
# A query FTS5 does not understand: no hits, and why
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("docker AND NOT compose", "NOT"),
        ("docker OR AND compose", "AND"),
        ("-docker", "`-`"),
        ("docker -compose", "`-`"),
        ("what?", "`?`"),
        ("C#", "`#`"),
        ("it's", "`'`"),
        ("a\x01b", "U+0001"),
    ],
)
def test_a_query_fts5_rejects_answers_nothing_and_says_why(
    store: Path, query: str, said: str
) -> None:
    assert search(store, "docker")  # the words themselves have hits
    hits = search(store, query)
    assert list(hits) == []
    assert hits.degraded is None
    assert hits.query_error is not None
    assert hits.query_error.startswith("the query was not understood")
    assert said in hits.query_error
    assert "\n" not in hits.query_error


def test_a_query_fts5_rejects_is_not_understood_whatever_the_filters(store: Path) -> None:
    """With no row to test (an empty source list) SQLite never hands FTS5 the query: it is
    still not understood, as on PostgreSQL."""
    for filters in ({"source_filter": []}, {"role_filter": ["nosuchrole"]}):
        hits = search(store, "docker AND NOT compose", **filters)
        assert list(hits) == []
        assert hits.query_error is not None, filters
        assert "NOT" in hits.query_error


@pytest.mark.parametrize("query", ["error \udcff", "\ud800", "def\udcff"])
def test_a_query_no_message_can_hold_answers_nothing_and_says_why(store: Path, query: str) -> None:
    assert search(store, "error")
    hits = search(store, query)
    assert list(hits) == []
    assert hits.query_error is not None
    assert "UTF-8" in hits.query_error


@pytest.mark.parametrize(
    "query",
    ["docker", "docker compose", '"docker compose"', "dock*", "docker NOT compose", "数据库"],
)
def test_a_query_fts5_understands_has_no_query_error(store: Path, query: str) -> None:
    hits = search(store, query)
    assert hits
    assert hits.query_error is None

"""The Hermes application's FTS "recovery" on an upgraded store: detected, survived, repaired.

Run on a Python whose SQLite lacks FTS5, the legacy application drops the six FTS triggers
and writes messages unindexed. At its next open with FTS5 it re-creates the triggers with
their INLINE-layout bodies (`DELETE FROM messages_fts WHERE rowid = old.id`), runs
`DELETE FROM` on both indexes and re-inserts every message. On external-content indexes
that damages them: on SQLite 3.40 each `DELETE FROM` fails with 'database disk image is
malformed' (FTS5 finds its totals going negative while deleting text that was never
indexed; the statement is rolled back), the `INSERT ... SELECT` that follows succeeds and
indexes every row a second time, and every later delete or update through the inline
triggers removes the wrong terms.

Checked here with plain sqlite3 doing what the application does: `check` names each wrong
object and its cause, `check --repair` restores the search mechanism from the FTS branch's
newest revision and leaves both indexes exact, and `search_messages` either answers exactly
(compared with a naive oracle over `messages`) or says that it is degraded, never raising.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import sqlite3
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from legacy import ddl
from legacy.build import build_legacy_store
from migration_support import clone
from sqlalchemy import Connection, Engine, event

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.revisions import FTS_EXTERNAL_REVISION
from hermes_store.search import SearchResults, search_messages
from hermes_store.sqlite import fts, maintenance

CORPUS_MESSAGES = 300
CORPUS_SEED = 11
WORD, TRIGRAM = fts.WORD_INDEX, fts.TRIGRAM_INDEX
INDEXES = (WORD, TRIGRAM)
#: The six triggers as the FTS branch's newest revision declares them (and their legacy bodies).
TRIGGERS = {obj.name: obj for obj in fts.head_objects() if obj.kind == "trigger"}
VIEW = next(obj for obj in fts.head_objects() if obj.kind == "view")
#: What a message contributes to both indexes.
INDEXED = fts.INDEXED_EXPRESSION
#: Words of the generated corpus, checked against the oracle before and after the damage.
CORPUS_WORDS = ("error", "docker", "test", "json", "file", "the")
CJK_MARKER = "索引恢复测试"
#: A CJK word of the corpus (three characters: the trigram index answers it).
CJK_WORD = "数据库"
UPDATE_MARKER = "updatedmarker"
CAUSES = {"dropped": fts.MISSING, "inline": fts.INLINE_BODY}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def plain(path: Path) -> Iterator[sqlite3.Connection]:
    """A stdlib sqlite3 connection in autocommit mode, as the legacy application would use."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        yield conn


def rows(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with plain(path) as conn:
        return conn.execute(statement, params).fetchall()


@contextlib.contextmanager
def engine_of(path: Path) -> Iterator[Engine]:
    engine = create_store_engine(path, create=False)
    try:
        yield engine
    finally:
        engine.dispose()


def invoke(*args: str | Path, expect: int = 0) -> Result:
    """Run the CLI in-process; stdout and stderr are kept apart."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == expect, (result.exit_code, result.output, result.exception)
    # click turns the expected failures into SystemExit; anything else is a bug.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stderr
    return result


def fts_integrity(path: Path) -> dict[str, str | None]:
    """Each index's FTS5 'integrity-check' with rank 1 (index versus the view): error or None."""
    found: dict[str, str | None] = {}
    with plain(path) as conn:
        for index in INDEXES:
            try:
                conn.execute(f"INSERT INTO {index}({index}, rank) VALUES ('integrity-check', 1)")
                found[index] = None
            except sqlite3.DatabaseError as exc:
                found[index] = str(exc)
    return found


EXACT = {WORD: None, TRIGRAM: None}


def messages_digest(path: Path) -> tuple[int, str]:
    """How many messages, and a SHA-256 of every row of `messages`."""
    table = rows(path, "SELECT * FROM messages ORDER BY id")
    return len(table), hashlib.sha256(repr(table).encode()).hexdigest()


def trigger_sql(path: Path, name: str) -> str | None:
    found = rows(path, "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (name,))
    return fts.normalise_sql(found[0][0]) if found else None


def search(path: Path, query: str, **filters: Any) -> SearchResults:
    """Every hit of search_messages, inactive messages included unless told otherwise."""
    options: dict[str, Any] = {"limit": 100_000, "include_inactive": True, **filters}
    with engine_of(path) as engine, engine.connect() as conn:
        return search_messages(conn, query, **options)


def _tokens(text: str) -> set[str]:
    """unicode61's tokens of a text, folded: runs of letters and digits, no diacritics."""
    decomposed = unicodedata.normalize("NFKD", text)
    folded = "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()
    return set(re.findall(r"[^\W_]+", folded))


def oracle(path: Path, query: str, *, include_inactive: bool = True) -> set[int]:
    """Naive answer over `messages`: a word as a whole token, a CJK query as a substring."""
    cjk = fts.TRIGRAM_INDEX if any(ord(c) > 0x2FFF for c in query) else None
    found = set()
    for message_id, text, active, compacted in rows(
        path, f"SELECT id, {INDEXED}, active, compacted FROM messages"
    ):
        if not (include_inactive or active == 1 or compacted == 1):
            continue
        if (query in text) if cjk else (query.casefold() in _tokens(text)):
            found.add(message_id)
    return found


def assert_exact_or_degraded(path: Path, query: str, *, degraded: bool | None = None) -> None:
    """The hits of `query` are the oracle's, whether or not the index answered them."""
    expected = oracle(path, query)
    assert expected, f"{query!r} has no hits: the comparison would hold whatever search did"
    hits = search(path, query)
    assert {hit["id"] for hit in hits} == expected, (query, hits.degraded)
    if degraded is not None:
        assert (hits.degraded is not None) == degraded, hits.degraded


@dataclass
class Recovery:
    """What the application's recovery wrote, and which of its statements SQLite refused."""

    #: Unique word -> id of the message written while the triggers were missing.
    markers: dict[str, int] = field(default_factory=dict)
    updated: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def application_recovery(path: Path, *, new: int = 40, updated: int = 15) -> Recovery:
    """Do, with plain sqlite3, what the legacy application does around an open without FTS5."""
    done = Recovery()
    with plain(path) as conn:
        # An open on a SQLite without FTS5: the triggers go, writes go on unindexed.
        for name in TRIGGERS:
            conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        session = conn.execute("SELECT id FROM sessions ORDER BY id LIMIT 1").fetchone()[0]
        for i in range(new):
            word = f"recoverymarker{i:03d}"
            cursor = conn.execute(
                "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                (session, "user", f"{word} written while the index was away", 2e9 + i),
            )
            assert cursor.lastrowid is not None
            done.markers[word] = cursor.lastrowid
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
            (session, "assistant", f"{CJK_MARKER}的消息", 2e9 + new),
        )
        done.updated = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM messages WHERE content IS NOT NULL ORDER BY id LIMIT ?", (updated,)
            )
        ]
        conn.executemany(
            f"UPDATE messages SET content = content || ' {UPDATE_MARKER}' WHERE id = ?",
            [(i,) for i in done.updated],
        )
        done.deleted = [
            r[0] for r in conn.execute("SELECT id FROM messages ORDER BY id LIMIT 3 OFFSET 100")
        ]
        conn.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in done.deleted])
        # The next open with FTS5: inline-layout triggers, then the indexes refilled.
        for obj in TRIGGERS.values():
            assert obj.legacy_sql is not None
            conn.execute(obj.legacy_sql)
        for index in INDEXES:
            for statement in (
                f"DELETE FROM {index}",
                f"INSERT INTO {index}(rowid, content) SELECT id, {INDEXED} FROM messages",
            ):
                try:
                    conn.execute(statement)
                except sqlite3.DatabaseError as exc:  # the application catches and goes on
                    done.refused[statement] = str(exc)
    return done


def write_and_delete(path: Path, word: str) -> int:
    """A new message, an edit of it and of an old one, and a delete: the triggers at work."""
    with plain(path) as conn:
        session = conn.execute("SELECT id FROM sessions ORDER BY id LIMIT 1").fetchone()[0]
        cursor = conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
            (session, "user", f"{word} first words", 3e9),
        )
        new_id = cursor.lastrowid
        assert new_id is not None
        conn.execute("UPDATE messages SET content = ? WHERE id = ?", (f"{word} edited", new_id))
        old = conn.execute("SELECT min(id) FROM messages WHERE content IS NOT NULL").fetchone()[0]
        conn.execute("UPDATE messages SET content = content || ' touched' WHERE id = ?", (old,))
        previous = "SELECT max(id) FROM messages WHERE id < ?"
        conn.execute(f"DELETE FROM messages WHERE id = ({previous})", (new_id,))
    return new_id


# --------------------------------------------------------------------------------------------
# Stores
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A legacy 21 store with a corpus, upgraded to the external layout (revision fts1)."""
    directory = tmp_path_factory.mktemp("recovery")
    path = directory / "template.db"
    build_legacy_store(path, 21)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(CORPUS_MESSAGES, CORPUS_SEED))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HERMES_HOME", str(directory / "home"))
        patch.delenv("HERMES_STORE_URL", raising=False)
        migrate.upgrade(str(path), FTS_EXTERNAL_REVISION)
    with plain(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Path:
    return clone(template, tmp_path / "state.db")


def test_the_upgraded_store_is_healthy_and_the_oracle_agrees_with_its_index(store: Path) -> None:
    with engine_of(store) as engine, engine.connect() as conn:
        mechanism = fts.check_mechanism(conn)
        assert mechanism.skipped is None
        assert mechanism.ok, mechanism.problems
        assert mechanism.expected == [WORD, TRIGRAM]
        assert maintenance.check_store(conn).ok
    assert fts_integrity(store) == EXACT
    for word in (*CORPUS_WORDS, CJK_WORD):
        assert oracle(store, word), word  # every word has hits: the comparisons below bite
        assert_exact_or_degraded(store, word, degraded=False)
    invoke("check", "--db", store)


# --------------------------------------------------------------------------------------------
# The whole recovery sequence
# --------------------------------------------------------------------------------------------


def test_recovery_is_named_search_stays_exact_and_repair_restores_everything(
    store: Path,
) -> None:
    # The loops below check every trigger the head declares: the legacy application's six.
    assert sorted(TRIGGERS) == sorted(ddl.FTS_TRIGGER_NAMES)
    done = application_recovery(store)
    assert fts_integrity(store) != EXACT
    assert done.markers
    # SQLite refuses the recovery's DELETE FROM of each index (3.40), and nothing else.
    assert sorted(done.refused) == sorted(f"DELETE FROM {index}" for index in INDEXES)
    for error in done.refused.values():
        assert "malformed" in error

    # check: exit 1, each inline trigger named with its cause, by the CLI and the library.
    result = invoke("check", "--db", store, expect=1)
    assert result.stderr.startswith("broken: ")
    assert len(result.stderr.strip().splitlines()) == 1
    for name in TRIGGERS:
        line = next(line for line in result.stdout.splitlines() if f"trigger {name} " in line)
        assert re.search(r"BROKEN +inline-layout body", line)
        assert f"trigger {name}" in result.stderr
    assert "the Hermes application's FTS recovery re-created it" in result.stderr
    data = json.loads(invoke("check", "--db", store, "--json", expect=1).stdout)
    assert data["ok"] is False
    assert {f"trigger {name}": fts.INLINE_BODY for name in TRIGGERS}.items() <= data[
        "problems"
    ].items()
    with engine_of(store) as engine, engine.connect() as conn:
        mechanism = fts.check_mechanism(conn)
        assert mechanism.problems == {f"trigger {name}": fts.INLINE_BODY for name in TRIGGERS}
        assert set(mechanism.damaged()) == set(INDEXES)
        assert not maintenance.check_store(conn).ok

    # search before the repair: exact (the scan), and flagged as degraded.
    for word in (*done.markers, UPDATE_MARKER, *CORPUS_WORDS, CJK_MARKER, CJK_WORD):
        assert_exact_or_degraded(store, word, degraded=True)
    for word, message_id in done.markers.items():
        assert [hit["id"] for hit in search(store, word)] == [message_id]

    # check --repair: every trigger restored, both indexes rebuilt, nothing lost.
    before = messages_digest(store)
    result = invoke("check", "--db", store, "--repair")
    for name in TRIGGERS:
        assert f"trigger {name}" in result.stdout
        assert trigger_sql(store, name) == fts.normalise_sql(TRIGGERS[name].sql)
    assert result.stdout.count("rebuilt from messages_fts_source") == 2
    assert messages_digest(store) == before
    assert fts_integrity(store) == EXACT
    invoke("check", "--db", store)
    for word, message_id in done.markers.items():
        hits = search(store, word)
        assert hits.degraded is None
        assert [hit["id"] for hit in hits] == [message_id]
    for word in (UPDATE_MARKER, *CORPUS_WORDS, CJK_MARKER, CJK_WORD):
        assert_exact_or_degraded(store, word, degraded=False)

    # The restored triggers keep the indexes exact through the next writes and deletes.
    new_id = write_and_delete(store, "afterrepairmarker")
    assert fts_integrity(store) == EXACT
    assert [hit["id"] for hit in search(store, "afterrepairmarker")] == [new_id]


def test_the_next_upgrade_heals_the_recovered_store(store: Path) -> None:
    """`alembic upgrade head` at head runs no revision; the deploy step still repairs."""
    done = application_recovery(store)
    before = messages_digest(store)

    result = migrate.upgrade(str(store), app_version=21)

    assert {f"trigger {name}" for name in TRIGGERS} <= set(result.healed)
    for name in TRIGGERS:
        assert trigger_sql(store, name) == fts.normalise_sql(TRIGGERS[name].sql)
    assert messages_digest(store) == before
    assert fts_integrity(store) == EXACT
    for word, message_id in done.markers.items():
        hits = search(store, word)
        assert hits.degraded is None
        assert [hit["id"] for hit in hits] == [message_id]
    # Healthy now: the next upgrade has nothing to heal.
    assert migrate.upgrade(str(store), app_version=21).healed == {}


def test_repair_deferred_restores_the_mechanism_and_refills_with_the_backfill(
    store: Path,
) -> None:
    done = application_recovery(store)
    result = invoke("check", "--db", store, "--repair", "--deferred")
    assert "deferred backfill" in result.stdout
    assert fts_integrity(store) == EXACT
    assert not rows(store, "SELECT key FROM state_meta WHERE key LIKE 'messages_fts%'")
    for name, obj in TRIGGERS.items():
        assert trigger_sql(store, name) == fts.normalise_sql(obj.sql)
    word, message_id = next(iter(done.markers.items()))
    assert [hit["id"] for hit in search(store, word)] == [message_id]


# --------------------------------------------------------------------------------------------
# One trigger at a time
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", sorted(CAUSES))
@pytest.mark.parametrize("name", list(TRIGGERS))
def test_each_trigger_dropped_or_inline_is_named_and_restored(
    store: Path, name: str, damage: str
) -> None:
    with plain(store) as conn:
        conn.execute(f"DROP TRIGGER {name}")
        if damage == "inline":
            legacy = TRIGGERS[name].legacy_sql
            assert legacy is not None
            conn.execute(legacy)
    written = write_and_delete(store, "whilebrokenmarker")

    result = invoke("check", "--db", store, expect=1)
    assert f"trigger {name} ({CAUSES[damage]})" in result.stderr
    data = json.loads(invoke("check", "--db", store, "--json", expect=1).stdout)
    assert data["problems"][f"trigger {name}"] == CAUSES[damage]
    others = {key for key in data["problems"] if key.startswith("trigger ")} - {f"trigger {name}"}
    assert not others

    result = invoke("check", "--db", store, "--repair")
    assert f"trigger {name}" in result.stdout
    assert trigger_sql(store, name) == fts.normalise_sql(TRIGGERS[name].sql)
    assert fts_integrity(store) == EXACT
    assert [hit["id"] for hit in search(store, "whilebrokenmarker")] == [written]

    written = write_and_delete(store, "afterrepairmarker")
    assert fts_integrity(store) == EXACT
    assert [hit["id"] for hit in search(store, "afterrepairmarker")] == [written]
    invoke("check", "--db", store)


# --------------------------------------------------------------------------------------------
# The view, the declarations, a malformed index
# --------------------------------------------------------------------------------------------


def test_a_missing_view_is_named_search_degrades_and_repair_restores_it(store: Path) -> None:
    with plain(store) as conn:
        conn.execute(f"DROP VIEW {VIEW.name}")
    result = invoke("check", "--db", store, expect=1)
    assert f"view {VIEW.name} (missing)" in result.stderr
    for word in CORPUS_WORDS:  # without the view FTS5 cannot read snippets: the scan answers
        assert_exact_or_degraded(store, word, degraded=True)

    result = invoke("check", "--db", store, "--repair")
    assert f"view {VIEW.name}" in result.stdout
    assert fts.normalise_sql(
        rows(store, "SELECT sql FROM sqlite_master WHERE name = ?", (VIEW.name,))[0][0]
    ) == fts.normalise_sql(VIEW.sql)
    assert fts_integrity(store) == EXACT
    for word in CORPUS_WORDS:
        assert_exact_or_degraded(store, word, degraded=False)


def test_a_declaration_that_differs_is_declared_again_and_refilled(store: Path) -> None:
    with plain(store) as conn:  # an inline trigram index where the external one belongs
        conn.execute(f"DROP TABLE {TRIGRAM}")
        conn.execute(f"CREATE VIRTUAL TABLE {TRIGRAM} USING fts5(content, tokenize='trigram')")
    result = invoke("check", "--db", store, expect=1)
    assert f"table {TRIGRAM} ({fts.DIFFERS})" in result.stderr
    invoke("check", "--db", store, "--repair")
    assert fts_integrity(store) == EXACT
    assert_exact_or_degraded(store, CJK_WORD, degraded=False)


MALFORMED = (
    "the search index messages_fts is damaged (SQLite: database disk image is malformed); "
    "results come from a slower scan of the messages; run `hermes-store check --repair`"
)


def truncate_index(path: Path, index: str) -> None:
    """Cut every block of an index's segments short: FTS5 then reports it malformed."""
    with plain(path) as conn:
        conn.execute(f"UPDATE {index}_data SET block = substr(block, 1, 7) WHERE id > 10")


def test_a_malformed_index_makes_search_degrade_instead_of_raising(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    truncate_index(store, WORD)
    with plain(store) as conn, pytest.raises(sqlite3.DatabaseError, match="malformed"):
        conn.execute(
            f"SELECT rowid FROM {WORD} WHERE {WORD} MATCH 'error' ORDER BY rank"
        ).fetchall()

    for word in CORPUS_WORDS:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hermes_store.search"):
            hits = search(store, word)
        assert hits.degraded == MALFORMED
        assert {hit["id"] for hit in hits} == oracle(store, word)
        # One WARNING per call, a fixed sentence: no message text, not even the query.
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage() for r in warnings] == [f"search: {MALFORMED}"]
    # sorted by time, paged, filtered: still the exact rows, in the contract's order
    newest = search(store, "error", sort="newest", include_inactive=False, limit=5, offset=2)
    expected = sorted(
        rows(
            store,
            "SELECT id, timestamp FROM messages WHERE (active = 1 OR compacted = 1) AND id IN "
            f"({','.join(map(str, oracle(store, 'error', include_inactive=False)))})",
        ),
        key=lambda row: -row[1],
    )
    assert [hit["timestamp"] for hit in newest] == [row[1] for row in expected[2:7]]
    assert newest.degraded is not None
    assert_exact_or_degraded(store, CJK_WORD, degraded=False)  # the trigram index is fine

    result = invoke("check", "--db", store, expect=1)
    assert result.stderr.startswith(f"broken: {WORD} (")
    invoke("check", "--db", store, "--repair")
    assert fts_integrity(store) == EXACT
    for word in CORPUS_WORDS:
        assert_exact_or_degraded(store, word, degraded=False)


def test_the_cli_search_says_once_on_stderr_that_it_is_degraded(store: Path) -> None:
    truncate_index(store, WORD)
    result = invoke("search", "--db", store, "error", "--json")
    hits = json.loads(result.stdout)
    visible = oracle(store, "error", include_inactive=False)
    assert {hit["id"] for hit in hits} <= visible
    assert len(hits) == min(20, len(visible))
    assert result.stderr.strip().splitlines() == [f"Warning: {MALFORMED}"]
    result = invoke("search", "--db", store, CJK_WORD)  # the trigram index is fine
    assert "Warning" not in result.stderr


# --------------------------------------------------------------------------------------------
# Detection is cheap, and follows schema changes
# --------------------------------------------------------------------------------------------


def test_a_search_pays_one_pragma_and_sees_the_next_schema_change(store: Path) -> None:
    with engine_of(store) as engine:
        statements: list[str] = []

        def seen(_conn: Connection, _cursor: Any, statement: str, *_rest: Any) -> None:
            statements.append(" ".join(statement.split()))

        event.listen(engine, "before_cursor_execute", seen)
        with engine.connect() as conn:
            assert search_messages(conn, "error").degraded is None
            conn.rollback()
            statements.clear()
            assert search_messages(conn, "error").degraded is None
            assert sum(s == "PRAGMA schema_version" for s in statements) == 1
            assert not any("sqlite_master WHERE type IN" in s for s in statements), statements
            conn.rollback()
            with plain(store) as other:  # the application's recovery, from another process
                other.execute("DROP TRIGGER messages_fts_delete")
                legacy = TRIGGERS["messages_fts_delete"].legacy_sql
                assert legacy is not None
                other.execute(legacy)
            hits = search_messages(conn, "error")
            assert hits.degraded is not None
            assert "trigger messages_fts_delete" in hits.degraded
            assert {hit["id"] for hit in search_messages(conn, "error", limit=1000)} == oracle(
                store, "error", include_inactive=False
            )


# --------------------------------------------------------------------------------------------
# Stores whose search mechanism is not this package's
# --------------------------------------------------------------------------------------------


def test_an_inline_legacy_store_is_not_reported(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    build_legacy_store(path, 21)
    with engine_of(path) as engine, engine.connect() as conn:
        mechanism = fts.check_mechanism(conn)
        assert mechanism.skipped is not None
        assert "inline" in mechanism.skipped
        assert mechanism.problems == {}
        assert maintenance.check_store(conn).ok
    invoke("check", "--db", path)


@pytest.mark.parametrize("sign", ["view", "state_meta"])
def test_the_applications_own_newer_layout_is_not_reported(tmp_path: Path, sign: str) -> None:
    path = tmp_path / "application.db"
    build_legacy_store(path, 21)
    with plain(path) as conn:
        if sign == "view":
            conn.execute(f"CREATE VIEW {fts.APPLICATION_VIEW} AS SELECT id, content FROM messages")
        else:
            conn.execute(
                "INSERT INTO state_meta (key, value) VALUES (?, '2')", (fts.APPLICATION_MARKER,)
            )
        for name in ("messages_fts_delete", "messages_fts_trigram_update"):
            conn.execute(f"DROP TRIGGER {name}")  # its triggers are its own business
    with engine_of(path) as engine, engine.connect() as conn:
        mechanism = fts.check_mechanism(conn)
        assert mechanism.skipped is not None
        assert "application" in mechanism.skipped
        assert mechanism.problems == {}
    invoke("check", "--db", path)


def drop_trigram_index(path: Path) -> None:
    with plain(path) as conn:
        conn.execute(f"DROP TABLE {TRIGRAM}")
        for name, obj in TRIGGERS.items():
            if obj.index == TRIGRAM:
                conn.execute(f"DROP TRIGGER {name}")


def test_no_trigram_index_is_fine_on_a_sqlite_without_the_tokenizer(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_trigram_index(store)
    monkeypatch.setattr(fts, "has_trigram", lambda _conn: False)
    with engine_of(store) as engine, engine.connect() as conn:
        mechanism = fts.check_mechanism(conn)
        assert mechanism.ok
        assert mechanism.expected == [WORD]
    invoke("check", "--db", store)
    with plain(store) as conn:  # and the word index's triggers are still checked
        conn.execute("DROP TRIGGER messages_fts_update")
    result = invoke("check", "--db", store, expect=1)
    assert "trigger messages_fts_update (missing)" in result.stderr


def test_a_missing_trigram_index_is_created_where_the_tokenizer_exists(store: Path) -> None:
    drop_trigram_index(store)
    data = json.loads(invoke("check", "--db", store, "--json", expect=1).stdout)
    assert data["problems"] == {
        f"table {TRIGRAM}": fts.MISSING,
        **{f"trigger {n}": fts.MISSING for n, o in TRIGGERS.items() if o.index == TRIGRAM},
    }
    invoke("check", "--db", store, "--repair")
    assert fts_integrity(store) == EXACT
    assert_exact_or_degraded(store, CJK_WORD, degraded=False)

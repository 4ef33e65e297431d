"""The in-place conversion's write lock does not grow with the store.

The legacy indexes are verified under a read snapshot before the upgrade takes the write
lock, while the application keeps writing: a change log (triggers on `messages`) records
every id written since, and the conversion's own transaction re-checks only those. The two
text copies are set aside (renamed) in that transaction and freed afterwards in short
steps, which a kill -9 interrupts harmlessly: the next upgrade, `optimize` or
`optimize-storage` goes on, and search is exact all along.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store
from migration_support import clone, conversion_revision, migration_log
from sqlalchemy import Connection, text
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine, joined_transaction
from hermes_store.migrate import adoption
from hermes_store.search import search_messages
from hermes_store.sqlite import backfill, fts
from hermes_store.sqlite import migration as sqlite_migration
from hermes_store.sqlite.engine import flush_to_disk

WORD, TRIGRAM = fts.INDEXES
CHANGE_LOG = "hermes_store_conversion_changes"


def sql(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement with plain sqlite3, committed (as the legacy application writes)."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn, conn:
        return conn.execute(statement, params).fetchall()


def names(path: Path) -> set[str]:
    return {row[0] for row in sql(path, "SELECT name FROM sqlite_master")}


def fts_checks(path: Path) -> dict[str, str | None]:
    """FTS5 'integrity-check' with rank 1 (index versus the view) of both indexes."""
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            return {index: fts.check_index(conn, index) for index in fts.INDEXES}
    finally:
        engine.dispose()


def hits(path: Path, query: str) -> list[int]:
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            found = search_messages(conn, query, limit=100_000, include_inactive=True)
            return sorted(hit["id"] for hit in found)
    finally:
        engine.dispose()


def upgrade_with_writes_between(
    store: Path, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], None]
) -> tuple[dict[str, str], dict[str, str]]:
    """Upgrade ``store``, running ``meanwhile`` (the application writing, say) after the
    verification under the snapshot and before the conversion's write lock. Returns the
    verdicts recorded and, per index, the line the revision logged about it."""
    real = sqlite_migration.verify_ahead
    verdicts: dict[str, str] = {}

    def verify_then_write(conn: Any) -> dict[str, str]:
        verdicts.update(real(conn))
        if conn.in_transaction():
            conn.commit()
        meanwhile()
        return verdicts

    monkeypatch.setattr(sqlite_migration, "verify_ahead", verify_then_write)
    with migration_log() as messages:
        migrate.upgrade(str(store))
    logged = {i: next(m for m in messages if m.startswith(f"{i}: ")) for i in fts.INDEXES}
    return verdicts, logged


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("conversion-lock") / "legacy.db"
    build_legacy_store(path, 21)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(2000, 11))
    return path


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Path:
    path = clone(template, tmp_path / "state.db")
    sql(path, "PRAGMA journal_mode=WAL")
    return path


def test_the_conversion_sets_the_copies_aside_and_the_upgrade_frees_them(store: Path) -> None:
    result = migrate.upgrade(str(store))
    assert result.layout_after == "external"
    gone = {
        f"{index}{suffix}" for index in fts.INDEXES for suffix in ("_content", "_content_retired")
    }
    assert not gone & names(store)
    assert CHANGE_LOG not in names(store)
    assert not [n for n in names(store) if n.startswith(CHANGE_LOG)]  # nor its triggers
    assert not sql(store, "SELECT key FROM state_meta WHERE key LIKE 'hermes_store.conversion%'")
    assert fts_checks(store) == {WORD: None, TRIGRAM: None}
    # measured and reported (`upgrade --json`)
    assert result.as_dict()["longest_write_lock_s"] == result.longest_write_lock_s > 0


def _write_lock_held(path: Path) -> bool:
    """Whether another connection holds the store's write lock now."""
    with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return True
        conn.execute("ROLLBACK")
        return False


def test_adoption_builds_the_reference_schema_before_the_write_lock(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adopting an unversioned store compares it with its version's schema, which the
    revisions build in memory (CPU-bound): that happens before the upgrade takes the write
    lock, so the agent is not kept from writing meanwhile."""
    original = migrate.reference_schema
    original.cache_clear()
    built_under_lock: list[bool] = []

    def watched(revision: str) -> dict[str, Any]:
        misses = original.cache_info().misses
        schema = original(revision)
        if original.cache_info().misses > misses:  # built now, not taken from the cache
            built_under_lock.append(_write_lock_held(store))
        return schema

    monkeypatch.setattr(adoption, "reference_schema", watched)
    result = migrate.upgrade(str(store))
    assert result.adopted == "21"
    assert built_under_lock == [False]


def _clock_that_jumps(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Give migrate a perf_counter that the returned function moves 60 s ahead."""
    jump = [0.0]
    real_clock = time.perf_counter

    class Clock:  # the time module, with a perf_counter that jumps
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def perf_counter(self) -> float:
            return real_clock() + jump[0]

    def leap() -> None:
        jump[0] += 60.0

    monkeypatch.setattr(sqlite_migration, "time", Clock())
    return leap


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (adoption, "_add_missing"),  # (connection, reference), inside the adoption
        (SQLiteDialect_pysqlite, "do_commit"),  # (dialect, dbapi_connection)
        (sqlite_migration, "facts"),  # (connection), which begins its own transaction
        (backfill, "pending"),  # (connection), inside the upgrade's last one
    ],
    ids=[
        "inside the adoption",
        "inside every COMMIT",
        "reading the versions",
        "reading what is left to fill",
    ],
)
def test_the_longest_write_lock_counts_every_write_transaction(
    store: Path, monkeypatch: pytest.MonkeyPatch, owner: object, name: str
) -> None:
    """`longest_write_lock_s` covers every write transaction of the upgrade (the adoption's
    and the reads on its connection, which begin IMMEDIATE, too), each until its COMMIT has
    returned (a COMMIT holds the lock while it syncs: seconds when the file system has much
    to write). A clock that jumps 60 s inside any of them shows up in it."""
    leap = _clock_that_jumps(monkeypatch)
    real = getattr(owner, name)

    def wrapped(*args: Any) -> Any:
        if isinstance(args[0], Connection):  # jump inside the transaction the call runs in
            with joined_transaction(args[0]):
                leap()
                return real(*args)
        leap()
        return real(*args)

    monkeypatch.setattr(owner, name, wrapped)
    result = migrate.upgrade(str(store))
    assert result.adopted == "21"
    assert result.layout_after == "external"
    assert 60.0 <= result.longest_write_lock_s < 120.0


def _fsynced(monkeypatch: pytest.MonkeyPatch, store: Path | None = None) -> list[tuple[str, bool]]:
    """Each file os.fsync is called on from now on (its real path), and whether another
    connection held ``store``'s write lock at the time (False without a ``store``)."""
    real_fsync = os.fsync
    synced: list[tuple[str, bool]] = []

    def fsync(fd: int) -> None:
        locked = store is not None and _write_lock_held(store)
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), locked))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_the_upgrade_flushes_the_store_to_disk_before_taking_the_write_lock(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first commit into a new WAL syncs, and on a journaling file system waits for the
    store's unwritten pages (seconds for a store just copied or restored): the upgrade
    writes them out before its first BEGIN IMMEDIATE, not inside the lock."""
    synced = _fsynced(monkeypatch, store)
    migrate.upgrade(str(store))
    assert (str(store), False) in synced


def test_flush_to_disk_skips_what_is_not_there_and_follows_no_side_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = _fsynced(monkeypatch)
    store = tmp_path / "state.db"
    flush_to_disk(store)  # no store yet: nothing to do, no error
    assert not synced
    sql(store, "CREATE TABLE t (x)")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"")
    (tmp_path / "state.db-wal").symlink_to(elsewhere)
    flush_to_disk(store)  # the linked -wal is left to SQLite's own refusal
    assert [name for name, _ in synced] == [str(store)]


def test_flush_to_disk_syncs_a_linked_store_and_never_waits_on_a_fifo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "real.db"
    sql(real, "CREATE TABLE t (x)")
    link = tmp_path / "link.db"
    link.symlink_to(real)
    os.mkfifo(tmp_path / "real.db-wal")  # a blocking open of it would wait for a writer
    synced = _fsynced(monkeypatch)
    done = threading.Event()
    flusher = threading.Thread(target=lambda: (flush_to_disk(link), done.set()), daemon=True)
    flusher.start()
    assert done.wait(10), "flush_to_disk is stuck opening a FIFO"
    assert [name for name, _ in synced] == [str(real)]  # the FIFO is not a file to sync


def test_the_upgrade_of_a_store_named_by_a_linked_url_flushes_its_target(
    tmp_path: Path, template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = clone(template, tmp_path / "real.db")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "state.db").symlink_to(real)
    synced = _fsynced(monkeypatch)
    migrate.upgrade(f"sqlite:///{tmp_path / 'links' / 'state.db'}")
    assert str(real) in {name for name, _ in synced}


def test_writes_after_the_snapshot_are_rechecked_in_the_lock(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the verification and the conversion the application appends and edits a
    message (found in place), then writes one while its update trigger is missing: that
    drift appears after the snapshot and must send the index down the rebuild path."""
    appended: list[int] = []

    def write() -> None:
        sql(store, "UPDATE messages SET content = 'zqxedited words' WHERE id = 5")
        session = sql(store, "SELECT session_id FROM messages WHERE id = 5")[0][0]
        cursor = sql(
            store,
            "INSERT INTO messages (session_id, role, content, timestamp) "
            "VALUES (?, 'user', 'zqxappended', 9e9) RETURNING id",
            (session,),
        )
        appended.append(cursor[0][0])
        sql(store, "DROP TRIGGER messages_fts_update")  # the word index misses this edit
        sql(store, "UPDATE messages SET content = 'zqxdrifted' WHERE id = 7")

    verdicts, logged = upgrade_with_writes_between(store, monkeypatch, write)
    assert verdicts == {WORD: "exact", TRIGRAM: "exact"}
    word, trigram = logged[WORD], logged[TRIGRAM]
    assert "changed since its verification" in word, word
    assert "converted in place" in trigram, trigram
    assert fts_checks(store) == {WORD: None, TRIGRAM: None}
    assert hits(store, "zqxedited") == [5]
    assert hits(store, "zqxappended") == appended
    assert hits(store, "zqxdrifted") == [7]


def test_a_verdict_without_its_change_log_is_not_trusted(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verdict left behind without the log that makes it safe: full verification."""
    module = conversion_revision()
    monkeypatch.setattr(sqlite_migration, "verify_ahead", lambda _conn: {})
    sql(
        store,
        "INSERT INTO state_meta (key, value) VALUES (?, 'exact')",
        (module.VERIFIED_KEY.format(name=WORD),),
    )
    sql(store, f"DELETE FROM {WORD} WHERE rowid = 3")  # drifted, and nothing logged it
    with migration_log() as messages:
        migrate.upgrade(str(store))
    word = next(m for m in messages if m.startswith(f"{WORD}: "))
    assert "re-created as external content" in word, word
    assert fts_checks(store) == {WORD: None, TRIGRAM: None}


def test_a_failed_upgrade_leaves_no_change_log(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("boom")

    # A revision after the verification fails (22, the first of the application's steps).
    monkeypatch.setattr(migrate.script_directory().get_revision("22").module, "upgrade", fail)
    with pytest.raises(RuntimeError, match="boom"):
        migrate.upgrade(str(store))
    assert not [n for n in names(store) if n.startswith(CHANGE_LOG)]


#: Upgrades the store and kills itself (SIGKILL) inside the N-th step that frees the copies.
KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from hermes_store import migrate
    from hermes_store.sqlite import backfill

    db, at = sys.argv[1], int(sys.argv[2])
    real = backfill.retire_step
    steps = []

    def step(conn, name, rows):
        steps.append(name)
        if len(steps) == at:
            conn.exec_driver_sql(f"DELETE FROM {name} WHERE rowid IN "
                                 f"(SELECT rowid FROM {name} LIMIT 1)")
            os.kill(os.getpid(), signal.SIGKILL)  # inside the step's transaction
        return real(conn, name, rows)

    backfill.retire_step = step
    migrate.upgrade(db)
    sys.exit(3)
    """
)


@pytest.mark.slow
def test_kill_9_while_the_copies_are_freed_then_resume(store: Path, tmp_path: Path) -> None:
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    expected = {query: hits_of_legacy(store, query) for query in ("error", "数据库", "python")}
    rows = sql(store, "SELECT count(*) FROM messages")[0][0]
    for at in (1, 3, 6):  # the first step, a middle one, a late one
        process = subprocess.run(
            [sys.executable, str(script), str(store), str(at)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert process.returncode == -signal.SIGKILL, (at, process.returncode, process.stderr)
        assert sql(store, "PRAGMA integrity_check") == [("ok",)]
        assert any(n.endswith("_content_retired") for n in names(store)), at
        assert fts_checks(store) == {WORD: None, TRIGRAM: None}
        for query, ids in expected.items():  # exact all along
            assert hits(store, query) == ids, (at, query)
    result = CliRunner().invoke(main, ["optimize", "--db", str(store), "--no-vacuum"])
    assert result.exit_code == 0, result.output
    assert not [n for n in names(store) if n.endswith("_retired")]
    assert sql(store, "SELECT count(*) FROM messages")[0][0] == rows
    assert fts_checks(store) == {WORD: None, TRIGRAM: None}


def hits_of_legacy(path: Path, query: str) -> list[int]:
    """What a legacy inline store answers (before the upgrade), as search_messages does."""
    copy = clone(path, path.with_name(f"reference-{abs(hash(query))}.db"))
    migrate.upgrade(str(copy), x={"fts_convert": "rebuild"})
    return hits(copy, query)


@pytest.mark.parametrize("command", [["optimize", "--no-vacuum"], ["optimize-storage"]])
def test_maintenance_removes_the_change_log_of_a_killed_upgrade(
    store: Path, command: list[str]
) -> None:
    """kill -9 between the verification and the conversion leaves the log (its triggers
    keep logging the agent's writes): `optimize` and `optimize-storage` remove it, as the
    next upgrade does."""
    engine = create_store_engine(store, create=False)
    try:
        with engine.begin() as conn:
            conversion_revision().start_change_log(conn)
    finally:
        engine.dispose()
    sql(store, "UPDATE messages SET content = 'x' WHERE id = 1")  # logged
    assert sql(store, f"SELECT id FROM {CHANGE_LOG}") == [(1,)]
    current = CliRunner().invoke(main, ["current", "--db", str(store), "--json"])
    assert "upgrade change log" in json.loads(current.stdout)["backfill"]  # operators see it
    result = CliRunner().invoke(main, [*command, "--db", str(store)])
    assert result.exit_code == 0, result.output
    assert not [n for n in names(store) if n.startswith(CHANGE_LOG)]


def test_a_write_straight_to_the_legacy_index_after_the_snapshot_is_rechecked(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The application's FTS recovery (or anything else) may write the FTS table itself,
    not `messages`: the copies' own triggers log those ids too."""

    def drift() -> None:
        sql(store, f"DELETE FROM {WORD} WHERE rowid = 9")  # the index alone loses a row

    word = upgrade_with_writes_between(store, monkeypatch, drift)[1][WORD]
    assert "changed since its verification" in word, word
    assert fts_checks(store) == {WORD: None, TRIGRAM: None}


def test_a_verdict_of_another_log_is_not_trusted(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another upgrade replaced the change log after this one's snapshot: the writes made
    in between were logged in the log it dropped, so the verdict is not used."""
    module = conversion_revision()

    def drift_then_replace_the_log() -> None:
        sql(store, f"DELETE FROM {WORD} WHERE rowid = 9")  # logged in the first log ...
        engine = create_store_engine(store, create=False)
        try:
            with engine.begin() as other:  # ... which another upgrade replaces
                kept = other.execute(
                    text("SELECT key, value FROM state_meta WHERE key LIKE :k"),
                    {"k": module.VERIFIED_KEY.format(name="%")},
                ).all()
                module.start_change_log(other)  # (drops the verdicts: put them back)
                for key, value in kept:
                    other.execute(
                        text("INSERT INTO state_meta (key, value) VALUES (:k, :v)"),
                        {"k": key, "v": value},
                    )
        finally:
            engine.dispose()

    word = upgrade_with_writes_between(store, monkeypatch, drift_then_replace_the_log)[1][WORD]
    assert "re-created as external content" in word, word  # verified in full: drifted
    assert fts_checks(store) == {WORD: None, TRIGRAM: None}

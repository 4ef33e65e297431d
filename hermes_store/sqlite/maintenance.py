"""Keeping a store small and healthy: counts, optimize (merge + checkpoint + VACUUM), check
and repair."""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from hermes_store.declared import Declared, app_version, declared_objects
from hermes_store.engine import BEGIN_OPTION, db_path, translate_error
from hermes_store.errors import Interrupted, NotEnoughFreeSpace, StoreError
from hermes_store.maintenance import (
    CheckResult,
    IndexBuild,
    RepairResult,
    StoreStats,
    store_counts,
)
from hermes_store.sqlite import backfill, compaction
from hermes_store.sqlite.backfill import pending, rows_left
from hermes_store.sqlite.backup import backup_from, default_backup_path
from hermes_store.sqlite.engine import sqlite_errors
from hermes_store.sqlite.fts import (
    DIFFERS,
    INDEXES,
    MISSING,
    check_mechanism,
    index_layout,
    integrity_check,
    normalise_sql,
    repair_index,
    restore_mechanism,
    staged_indexes,
)
from hermes_store.sqlite.optimize import OptimizeResult as OptimizeResult
from hermes_store.sqlite.optimize import optimize as optimize
from hermes_store.sqlite.optimize import timed
from hermes_store.sqlite.optimize import truncate_wal as truncate_wal
from hermes_store.sqlite.readonly import require_writable

log = logging.getLogger(__name__)

#: A callback given one line per phase, for a person.
Progress = Callable[[str], None]

#: The one error of a command refused for lack of space, under the name it had here.
NotEnoughSpace = NotEnoughFreeSpace


def store_stats(conn: Connection, path: Path | None) -> StoreStats:
    """Sessions, messages, sessions per source and the size on disk (the file, its WAL)."""
    stats = store_counts(conn)
    stats.sizes = {"file bytes": 0, "WAL bytes": 0}
    if path is not None and path.exists():
        stats.sizes["file bytes"] = path.stat().st_size
        wal = path.with_name(path.name + "-wal")
        stats.sizes["WAL bytes"] = wal.stat().st_size if wal.exists() else 0
    return stats


def stats_of(engine: Engine) -> StoreStats:
    """:func:`store_stats` of the store an engine opens."""
    with engine.connect() as conn:
        return store_stats(conn, db_path(str(engine.url)))


def check_store(conn: Connection, *, quick: bool = False, snapshot: bool = True) -> CheckResult:
    """`PRAGMA integrity_check` (or quick_check), the indexes and triggers the revisions
    declare, the search mechanism, every FTS5 index, and text that is not UTF-8.

    Every index and trigger the store's Alembic revisions declare (:mod:`declared`) and the
    search mechanism (view, declarations, triggers of an external-layout store, compared
    with the FTS branch's newest revision) are checked; each wrong object is a problem
    named ``"<kind> <name>"`` (for example ``"trigger messages_fts_delete"``), listed
    before the index problems it causes. Messages holding text that is not UTF-8 are named
    by id and column under ``"messages text"``. Indexes a deferred backfill has not filled
    yet are skipped,
    with the reason. The FTS5 checks run on a private copy in the temporary directory
    (``snapshot=True``, when it fits), so the agent's writes never wait for them; otherwise
    each holds the write lock for its run. A lock held past the busy timeout or a read-only
    store raises StoreBusy / StoreReadOnly (from :func:`fts.check_index`) instead of
    reporting the indexes as broken.
    """
    reading = not conn.in_transaction()
    skip = {}
    # A compaction's current index is the head's own, complete: it is checked as usual.
    rebuilding = set(compaction.compacting(conn))
    for item in pending(conn):
        if item.index != item.logical and item.logical in rebuilding:
            continue
        left = f"{rows_left(conn, item)} rows not indexed yet"
        if item.index == item.logical:
            skip[item.index] = (
                f"deferred backfill pending ({left}); finish it with `hermes-store "
                "optimize-storage`"
            )
        else:
            skip[item.logical] = (
                f"rebuilt as {item.index}, {left}: `hermes-store optimize-storage` finishes "
                "it and swaps it in; the legacy index serves the application meanwhile"
            )
    for index, table in staged_indexes(conn).items():
        if index in rebuilding:
            continue
        skip.setdefault(
            index,
            f"rebuilt as {table}, not swapped in yet: `hermes-store optimize-storage` swaps "
            "it in; the legacy index serves the application meanwhile",
        )
    if reading and conn.in_transaction():
        conn.rollback()  # end the read: the FTS checks are writers from their BEGIN
    where = Path(tempfile.gettempdir()) if snapshot else None
    with _no_row_text():
        result = integrity_check(conn, quick=quick, skip=skip, snapshot=where)
        mechanism = check_mechanism(conn)
        declared = {obj.label: why for obj, why in check_declared(conn).items()}
        undecodable = undecodable_messages(conn)
    if reading and conn.in_transaction():
        conn.rollback()
    if mechanism.skipped is not None:
        log.debug("check: %s", mechanism.skipped)
    database = {k: v for k, v in result.problems.items() if k == "database"}
    indexes = {k: v for k, v in result.problems.items() if k != "database"}
    rows = {UNDECODABLE: undecodable_problem(undecodable)} if undecodable else {}
    result.problems = {**database, **declared, **mechanism.problems, **indexes, **rows}
    return result


# -- every index and trigger the store's revisions declare ----------------------------------


def declared_version(conn: Connection) -> int | None:
    """The application schema version whose indexes and triggers the store must have: the
    newest its Alembic revisions include. None for a store not under Alembic (its schema is
    the application's own until `hermes-store upgrade` adopts it)."""
    found = conn.execute(
        text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'")
    ).first()
    if found is None:
        return None
    heads = [str(row[0]) for row in conn.execute(text("SELECT version_num FROM alembic_version"))]
    return app_version(heads)


def check_declared(conn: Connection) -> dict[Declared, str]:
    """Each index and trigger the store's revisions declare that is missing (MISSING) or
    defined otherwise (DIFFERS); the search mechanism's are :func:`fts.check_mechanism`'s."""
    version = declared_version(conn)
    if version is None:
        log.debug("check: not under Alembic; its indexes and triggers are the application's")
        return {}
    found = {
        str(name): (str(kind), None if sql is None else str(sql))
        for kind, name, sql in conn.execute(
            text("SELECT type, name, sql FROM sqlite_master WHERE type IN ('index', 'trigger')")
        )
    }
    wrong: dict[Declared, str] = {}
    for obj in declared_objects(version):
        kind, sql = found.get(obj.name, (None, None))
        if kind is None:
            wrong[obj] = MISSING
        elif kind != obj.kind or sql is None or normalise_sql(sql) != normalise_sql(obj.sql):
            wrong[obj] = DIFFERS
    return wrong


def restore_declared(
    conn: Connection, wrong: dict[Declared, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Create each wrong index and trigger again from its revision's DDL, in the caller's
    transaction; (label -> what was wrong) for those restored, (label -> why not) for those
    the store's rows refuse (a unique index its rows violate: the rest goes on)."""
    restored: dict[str, str] = {}
    refused: dict[str, str] = {}
    for obj, why in wrong.items():
        savepoint = conn.begin_nested()
        try:
            conn.exec_driver_sql(f'DROP {obj.kind.upper()} IF EXISTS "{obj.name}"')
            conn.exec_driver_sql(obj.sql)
        except DBAPIError as exc:
            savepoint.rollback()
            translated = translate_error(exc)
            if translated is not None:
                raise translated from exc
            refused[obj.label] = (
                f"not created again: the rows of {obj.table} refuse it "
                f"({without_row_text(str(exc.orig))}); correct them and run "
                "`hermes-store check --repair` again"
            )
            continue
        savepoint.commit()
        restored[obj.label] = why
        log.info("repair: re-created %s (it was: %s)", obj.label, why)
    return restored, refused


# -- rows whose text is not UTF-8 ------------------------------------------------------------

#: The check item of messages whose text cannot be read as UTF-8.
UNDECODABLE = "messages text"
#: How many ids the problem names (then: "and N more").
NAMED_IDS = 20
_DECODE_ERROR = re.compile(r"(Could not decode to UTF-8 column '[^']*') with text .*", re.S)


def undecodable_messages(conn: Connection) -> dict[int, list[str]]:
    """Message id -> its columns holding TEXT that is not valid UTF-8 (a writer that stored
    bytes as TEXT). Read as bytes, so that no text is ever decoded, or quoted in an error."""
    columns = [str(row[1]) for row in conn.exec_driver_sql("PRAGMA table_info(messages)")]
    if "id" not in columns:
        return {}
    values = ", ".join(
        f'CASE WHEN typeof("{name}") = \'text\' THEN CAST("{name}" AS BLOB) END' for name in columns
    )
    found: dict[int, list[str]] = {}
    for message_id, *texts in conn.exec_driver_sql(f"SELECT id, {values} FROM messages"):
        for name, value in zip(columns, texts, strict=True):
            if value is None:
                continue
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                found.setdefault(int(message_id), []).append(name)
    return found


def undecodable_problem(found: dict[int, list[str]]) -> str:
    """What `check` says of messages whose text is not UTF-8: their ids and columns only."""
    named = [f"{i} ({', '.join(columns)})" for i, columns in sorted(found.items())[:NAMED_IDS]]
    more = f" and {len(found) - NAMED_IDS} more" if len(found) > NAMED_IDS else ""
    return (
        f"{len(found)} with text that is not UTF-8, ids {', '.join(named)}{more} (a writer "
        "stored bytes as TEXT; the application cannot read them). --repair leaves them as "
        "they are: rewrite or delete them"
    )


def without_row_text(detail: str) -> str:
    """A driver's message without the row text it may quote (sqlite3's decode error does)."""
    return _DECODE_ERROR.sub(r"\1", detail)


@contextlib.contextmanager
def _no_row_text() -> Iterator[None]:
    """Re-raise a driver error that quotes a row's text as a StoreError that does not."""
    try:
        yield
    except DBAPIError as exc:
        detail = str(exc.orig)
        if _DECODE_ERROR.search(detail) is None:
            raise
        raise StoreError(
            f"SQLite returned text that is not UTF-8 ({without_row_text(detail)}); run "
            "`hermes-store check` to name the rows"
        ) from None


def repair(
    engine: Engine,
    *,
    backup_to: Path | None = None,
    deferred: bool = False,
    quick: bool = False,
    progress: Callable[[backfill.BackfillProgress], None] | None = None,
) -> RepairResult:
    """Check the store; restore what its revisions declare; rebuild every broken index;
    check again.

    Before anything is written, a consistent backup goes to ``backup_to`` (default
    ``<store>.repair-<UTC time>.bak`` next to it). Then, in one write transaction: every
    index and trigger the store's revisions declare that is missing or different is
    created again from its revision's DDL (one its rows refuse is named in
    ``not_repaired``); the search mechanism of an external-layout store is restored from
    the FTS branch's newest revision (the view, a wrong declaration, every missing or wrong
    trigger), and every index it fed, or whose check fails, is dropped whole (also when
    FTS5 can no longer open it), declared again from that revision and rebuilt from the
    view. Then any other broken index is re-created from its own declaration and filled
    again (an inline one re-indexed from `messages`), in one write transaction per index.
    A failure rolls back the transaction in progress: each one leaves the store as it was
    or repaired, and a second run goes on from there. ``deferred=True`` (external layout
    only, for large stores) instead leaves the indexes to refill empty in the same
    transaction and fills them with the resumable backfill; so are indexes whose deferred
    backfill was pending. Damage that the database's own integrity_check reports is not
    repaired: nothing is written then; nor are messages whose text is not UTF-8 (they are
    the owner's: named in ``not_repaired``, left as they are).
    """
    path = db_path(str(engine.url))
    require_writable(path)
    with engine.connect() as conn:
        before = check_store(conn, quick=quick)
    result = RepairResult(before=before, after=before)
    broken = [name for name in INDEXES if name in before.problems]
    if "database" in before.problems:
        result.refused = (
            "the database itself fails PRAGMA integrity_check; --repair only rebuilds the FTS "
            "indexes, so nothing was written. Restore a backup (or try sqlite3 `.recover`)"
        )
        return result
    if UNDECODABLE in before.problems:
        result.not_repaired[UNDECODABLE] = (
            "left as they are: their text is the owner's (rewrite or delete those messages)"
        )
    if not set(before.problems) - {UNDECODABLE}:
        return result
    writer = engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
    locks: list[float] = [0.0]
    with sqlite_errors(path), _no_row_text():
        if path is not None:
            result.backup = _repair_backup(engine, backup_to or default_backup_path(path, "repair"))
        with writer.connect() as conn:
            with conn.begin(), timed(locks):
                restored, refused = restore_declared(conn, check_declared(conn))
                result.not_repaired.update(refused)
                waiting = {item.index for item in pending(conn)}
                restore = restore_mechanism(conn, rebuild=not deferred, exclude=waiting)
                result.restored = {**restored, **restore.restored}
                result.repaired.update(restore.rebuilt)
                refill = list(restore.to_refill)
                # Not this package's layout: each broken index is rebuilt on its own.
                others = broken if restore.skipped is not None else []
                if deferred:
                    for name in others:
                        if index_layout(conn, name) != "external":
                            raise StoreError(
                                f"{name} uses the inline layout: --deferred needs the "
                                "external-content layout; run without --deferred, or upgrade"
                            )
                        refill.append(name)
                for name in refill:
                    backfill.start(conn, name)
                    result.repaired[name] = (
                        "declared again, emptied and refilled by the deferred backfill"
                    )
            for name in others:
                if name not in result.repaired:
                    with conn.begin(), timed(locks):
                        result.repaired[name] = repair_index(conn, name)
            for name, how in result.repaired.items():
                log.info("repair: %s %s", name, how)
        result.longest_write_lock_s = max(locks)
        if refill:
            backfill.run(engine, progress=progress)
        with engine.connect() as conn:
            result.after = check_store(conn, quick=quick)
    return result


def _repair_backup(engine: Engine, dest: Path) -> Path:
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        return backup_from(driver, dest).path
    finally:
        raw.close()


# -- the backend's maintenance bodies (see hermes_store/sqlite/backend.py) --------------------


def check_of(engine: Engine, *, quick: bool = False) -> CheckResult:
    """:func:`check_store` of the store an engine opens."""
    with engine.connect() as conn:
        return check_store(conn, quick=quick)


def repair_of(
    engine: Engine,
    *,
    quick: bool = False,
    backup_to: Path | None = None,
    deferred: bool = False,
    progress: Callable[[backfill.BackfillProgress], None] | None = None,
) -> RepairResult:
    """:func:`repair`, an interruption told as what it kept (an Interrupted)."""
    try:
        return repair(
            engine,
            backup_to=backup_to.expanduser().absolute() if backup_to else None,
            deferred=deferred,
            quick=quick,
            progress=progress,
        )
    except KeyboardInterrupt as exc:
        raise Interrupted(
            "interrupted: finished chunks are kept and search stays complete; finish with "
            "`hermes-store optimize-storage`"
            if deferred
            else "interrupted: the rebuild in progress was rolled back; run again"
        ) from exc


def finish_deferred(
    engine: Engine,
    *,
    chunk_rows: int = backfill.DEFAULT_CHUNK_ROWS,
    max_lock_ms: float = backfill.DEFAULT_MAX_LOCK_MS,
    duty: float = backfill.DEFAULT_DUTY,
    progress: Callable[[backfill.BackfillProgress], None] | None = None,
) -> IndexBuild:
    """Run a pending deferred index build to its end, in short paced transactions."""
    from hermes_store.sqlite.storage import backfill_status

    with engine.connect() as conn:
        if not backfill_status(conn):
            return IndexBuild(pending=False)
    path = db_path(str(engine.url))
    require_writable(path)
    with sqlite_errors(path):
        report = backfill.run(
            engine, chunk_rows=chunk_rows, max_lock_ms=max_lock_ms, duty=duty, progress=progress
        )
    return IndexBuild(
        rows_done=report.rows_done,
        chunks=report.chunks,
        lock_seconds=report.lock_seconds,
        longest_lock_s=report.longest_lock,
        paused_seconds=report.paused_seconds,
        checkpoint_seconds=report.checkpoint_seconds,
    )

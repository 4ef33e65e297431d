"""Migrating a SQLite store: the file's part of the upgrade workflow around Alembic.

A SQLite store is a file the agent writes while the upgrade runs. So the file is classified
read-only first; refused upgrades (no room, read-only, an older target) write nothing; one
connection then takes the write lock at each BEGIN, the backup is copied through it, the
store adopted or restamped on it, the search indexes verified under a read snapshot before
the conversion's lock, and what the conversion set aside is freed in short steps after.
The neutral workflow (:mod:`hermes_store.migrate.workflow`) calls these through
:class:`hermes_store.sqlite.backend.SQLiteBackend`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, event
from sqlalchemy.exc import DBAPIError

from hermes_store.declarations import SQLITE
from hermes_store.engine import BEGIN_OPTION, ENV_URL, create_store_engine, joined_transaction
from hermes_store.errors import DiskFull, StoreNotFound
from hermes_store.migrate.adoption import adopt, inspect_file, read_only, restamp_misstamped
from hermes_store.migrate.plan import applied_revisions, pending_revisions
from hermes_store.migrate.state import (
    Admit,
    Prepared,
    Request,
    Session,
    StoreState,
    Target,
    deleting_data_refused,
    settle,
)
from hermes_store.progress import Phase, Report, quiet
from hermes_store.revisions import (
    FTS_EXTERNAL_REVISION,
    fts_head_revision,
    head_revision,
    is_app_version,
)
from hermes_store.sqlite import backfill, changelog, fts, space
from hermes_store.sqlite.backup import backup_from
from hermes_store.sqlite.backup import check_target as check_backup_target
from hermes_store.sqlite.engine import flush_to_disk, side_files, sqlite_errors
from hermes_store.sqlite.optimize import truncate_wal
from hermes_store.sqlite.readonly import require_writable
from hermes_store.sqlite.storage import FTS_SHADOWS, backfill_status, btree_bytes, human_bytes

log = logging.getLogger(__name__)


def missing(path: Path | None) -> list[Path]:
    """The store file and its parent directories that do not exist yet (deepest first)."""
    missing: list[Path] = []
    current = path
    while current is not None and not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    return missing


@contextlib.contextmanager
def removed_on_failure(created: list[Path]) -> Iterator[None]:
    """Remove what this command created (the new store, its side files, its directories)
    when it fails: a failed command leaves nothing behind."""
    try:
        yield
    except BaseException:
        if created:
            for leftover in (created[0], *side_files(created[0])):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
            for directory in created[1:]:
                with contextlib.suppress(OSError):
                    directory.rmdir()
        raise


def prepare_store(
    connection: Connection,
    state: StoreState,
    *,
    backup_to: str | os.PathLike[str] | None = None,
    overwrite_backup: bool = False,
    report: Report = quiet,
) -> Prepared:
    """Back up, then restamp or adopt the store, on the connection the revisions will use.

    The backup is taken first, before anything writes; a new store has nothing to copy.
    """
    taken = None
    if backup_to is not None and state.kind != "new":
        report(Phase("backup", f"backing up the store to {backup_to} (one consistent read)"))
        driver = connection.connection.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        taken = backup_from(driver, backup_to, overwrite=overwrite_backup)
    elif backup_to is not None:
        log.info("backup: the store is new, nothing to back up; %s not written", backup_to)
    restamped = adopted = None
    if state.misstamped:
        report(Phase("adopt", "recording the versions an earlier hermes-store misstamped"))
        restamped = restamp_misstamped(connection)
    elif state.kind == "legacy":
        report(
            Phase(
                "adopt",
                f"adopting legacy schema {state.legacy_version}: adding what its version "
                "lacks, stamping its revision",
            )
        )
        adopted = adopt(connection, state.legacy_version)
    return Prepared(taken, adopted, bool(restamped))


def facts(connection: Connection) -> tuple[tuple[str, ...], int | None, str]:
    """(revisions, schema_version, search layout) of the store, read in one transaction."""
    with joined_transaction(connection):
        heads = tuple(sorted(MigrationContext.configure(connection).get_current_heads()))
        try:
            schema = connection.exec_driver_sql("SELECT version FROM schema_version").scalar()
        except DBAPIError:  # a new store: no table yet
            schema = None
        return heads, schema, fts.layout(connection)


def conversion_note(x: Mapping[str, str], verdicts: Mapping[str, str]) -> str:
    """How the search conversion will go, for a person watching it."""
    exact = SQLITE.change_log.exact
    if x.get("fts_convert") != "rebuild" and all(v == exact for v in verdicts.values()):
        return "moving the search indexes to external content in place (nothing re-indexed)"
    if x.get("fts_backfill") == "deferred":
        return (
            "moving the search indexes to external content (the fill is left to optimize-storage)"
        )
    return (
        "re-indexing every message into external-content indexes (one FTS5 'rebuild' "
        "statement per index: no count until it ends)"
    )


@contextlib.contextmanager
def timed_transactions(conn: Connection, durations: list[float]) -> Iterator[None]:
    """Append the duration of every transaction on ``conn`` (each a writer from its BEGIN
    IMMEDIATE: the time it held the write lock, or waited for it) to ``durations``.

    A transaction ends when its COMMIT (or ROLLBACK) has returned: the COMMIT's syncs hold
    the lock too. SQLAlchemy's ``commit`` event fires before it, so the end is taken in the
    dialect's ``do_commit`` / ``do_rollback`` of this connection's (private) engine. The
    figure is an upper bound: it starts before BEGIN IMMEDIATE (a wait for the agent's lock
    counts), and the COMMIT call also runs SQLite's automatic WAL checkpoint, after the
    lock is released.
    """
    began: list[float] = []

    def begin(_conn: Connection) -> None:
        began.append(time.perf_counter())

    mine = conn.connection  # what do_commit is given; not the engine's other connections

    def ended(dbapi_connection: Any) -> None:
        if began and dbapi_connection is mine:
            durations.append(time.perf_counter() - began.pop())

    dialect: Any = conn.dialect
    commit, rollback = dialect.do_commit, dialect.do_rollback

    def do_commit(dbapi_connection: Any) -> None:
        try:
            commit(dbapi_connection)
        finally:
            ended(dbapi_connection)

    def do_rollback(dbapi_connection: Any) -> None:
        try:
            rollback(dbapi_connection)
        finally:
            ended(dbapi_connection)

    hooks = {"do_commit": do_commit, "do_rollback": do_rollback}
    saved = {name: vars(dialect)[name] for name in hooks if name in vars(dialect)}
    event.listen(conn, "begin", begin)
    for name, hook in hooks.items():
        setattr(dialect, name, hook)
    try:
        yield
    finally:
        event.remove(conn, "begin", begin)
        for name in hooks:
            delattr(dialect, name)  # the class's own again, or what was set before
        for name, value in saved.items():
            setattr(dialect, name, value)


def _converting(request: Request) -> bool:
    """Whether this upgrade runs the search conversion in place (verified ahead)."""
    ends = ("head", "heads", head_revision(), fts_head_revision())
    return (
        request.upgrading
        and request.x.get("fts_convert") != "rebuild"
        and any(target in ends for target in request.targets)
    )


@contextlib.contextmanager
def migration_connection(request: Request, admit: Admit, report: Report) -> Iterator[Session]:
    """Classify the store once (read-only), then hold one connection that takes the write
    lock at each BEGIN, with the backup taken and the store adopted or restamped on it.

    Before anything is written: a store that does not exist is refused unless the request
    creates one (then what was created is removed if the command fails); a backup target
    that cannot be used, a read-only store, and an upgrade the disk has no room for (see
    :func:`check_upgrade_space`) are refused; ``admit`` has the workflow's say.
    """
    path = request.target.path
    created = missing(path) if request.upgrading else []
    if created and not request.create:
        raise StoreNotFound(
            f"{path}: no such store; nothing was created. Check the path (--db, "
            f"{ENV_URL}), or pass --create to start a new, empty store there"
        )
    if not request.upgrading and path is not None and not path.exists():
        raise StoreNotFound(f"{path}: no such store; nothing to {request.verb}")
    if request.backup_to is not None:
        check_backup_target(request.backup_to, path, overwrite=request.overwrite_backup)
    report(Phase("classify", "reading the store (read-only)"))
    state = inspect_file(path)
    admit(state, lambda how: _refuse_deleting_data(path, how))
    with removed_on_failure(created):
        require_writable(path)
        if request.upgrading:
            report(Phase("classify", "checking the free space the upgrade needs (read-only)"))
            check_upgrade_space(state, request.targets, request.x, backup_to=request.backup_to)
        if path is not None:  # the first commit's sync then has nothing of the store to wait for
            report(Phase("classify", "writing out what the page cache holds of the store"))
            flush_to_disk(path)
        engine = create_store_engine(request.target.url)
        try:
            with sqlite_errors(path), engine.connect() as conn:
                conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
                locks = [0.0]
                with timed_transactions(conn, locks):
                    prepared = prepare_store(
                        conn,
                        state,
                        backup_to=request.backup_to,
                        overwrite_backup=request.overwrite_backup,
                        report=report,
                    )
                    yield Session(conn, state, prepared, locks)
        finally:
            engine.dispose()


@contextlib.contextmanager
def around_revisions(
    conn: Connection, request: Request, report: Report
) -> Iterator[dict[str, str]]:
    """Verify the inline indexes ahead of the conversion (when it runs in place), and
    remove the change log if the revisions fail. Yields notes on the steps, by revision."""
    with change_log_removed_on_failure(conn):
        verdicts = verified_ahead(conn, report) if _converting(request) else {}
        yield {FTS_EXTERNAL_REVISION: conversion_note(request.x, verdicts)}


def after_revisions(
    conn: Connection, request: Request, report: Report
) -> tuple[dict[str, str], dict[str, int]]:
    """What every upgrade does after its revisions (see :func:`finish_upgrade`); then the
    rows a deferred backfill still has to fill, by index."""
    healed = finish_upgrade(conn, report) if request.upgrading else {}
    with joined_transaction(conn):
        pending = {item.index: backfill.rows_left(conn, item) for item in backfill.pending(conn)}
    return healed, pending


def prepare_given(conn: Connection) -> None:
    """A caller's own connection (tests): adopt or restamp its store before the revisions."""
    from hermes_store.migrate.adoption import state_of

    prepare_store(conn, state_of(conn))


def free_set_aside(conn: Connection, report: Report = quiet) -> None:
    """Free what the conversion set aside, in short steps; a full disk (each freed page is
    written zeroed with secure_delete) leaves the rest for later instead of failing an
    upgrade that is done."""
    try:
        backfill.drop_retired(conn, progress=report)
    except DiskFull as exc:
        log.warning(
            "%s; the copies the conversion set aside are left in the store: run "
            "`hermes-store optimize` once space is freed",
            str(exc).split(";")[0],
        )


def finish_upgrade(conn: Connection, report: Report = quiet) -> dict[str, str]:
    """What every upgrade does after its revisions, `alembic upgrade` and `hermes-store
    upgrade` alike: restore a damaged search mechanism, then free the copies the
    conversion set aside, in short steps (not in its lock; a kill here leaves them to the
    next upgrade, optimize or optimize-storage). Returns what was healed."""
    settle(conn)
    report(Phase("heal", "checking the search mechanism"))
    with joined_transaction(conn):
        healed = heal_search(conn)
    free_set_aside(conn, report)
    return healed


def verified_ahead(conn: Connection, report: Report) -> dict[str, str]:
    """:func:`verify_ahead`, reported as a phase."""
    report(Phase("verify", "verifying the search indexes against the messages (a read)"))
    return verify_ahead(conn)


def verify_ahead(conn: Connection) -> dict[str, str]:
    """Verify a store's inline indexes under a read snapshot, before the conversion's lock.

    The conversion reuses an inline index in place only when every row of its copy equals
    its message: a scan of the whole store. Done inside the upgrade's write transaction it
    would keep the agent from writing for that long. Here it runs in three steps: a short
    write transaction installs the FTS revision's change log (triggers on `messages`), a
    read transaction verifies (the agent keeps writing; each message it writes, edits or
    deletes leaves its id in the log), and a short write records the verdicts. In its write
    transaction the revision then re-checks only the logged ids. Returns index -> verdict
    ('exact' or why not); {} when there is nothing to convert.
    """
    with joined_transaction(conn):
        heads = MigrationContext.configure(conn).get_current_heads()
        inline = [index for index in fts.INDEXES if fts.index_layout(conn, index) == "inline"]
        if FTS_EXTERNAL_REVISION in heads or not inline or fts.is_application_layout(conn):
            return {}
        changelog.start_change_log(conn)
    verdicts: dict[str, str] = {}
    with conn.engine.connect() as reader, reader.begin():  # a snapshot; no lock is held
        # The log this snapshot runs against (another upgrade may have replaced ours since).
        log_id = changelog.current_log_id(reader)
        for index in inline:
            verdicts[index] = changelog.verify_inline(reader, index) or SQLITE.change_log.exact
    with joined_transaction(conn):
        for index, verdict in verdicts.items():
            changelog.record_verdict(conn, index, log_id, verdict)
    log.info(
        "search indexes verified under a read snapshot: %s",
        ", ".join(f"{index} {verdict}" for index, verdict in verdicts.items()),
    )
    return verdicts


@contextlib.contextmanager
def change_log_removed_on_failure(conn: Connection) -> Iterator[None]:
    """An upgrade that fails leaves no change log behind (its triggers would go on
    logging every write of the agent); the conversion itself removes it when it runs."""
    try:
        yield
    except BaseException:
        try:
            if conn.in_transaction():
                conn.rollback()
            # A full disk: the WAL still takes the space of what was rolled back; truncated,
            # it gives that space to the few pages the removal writes.
            driver: Any = conn.connection.driver_connection
            truncate_wal(driver)
            backfill.remove_stale_change_log(conn)
        except Exception:  # the original error is the one to report
            log.warning(
                "the upgrade's change log (table %s and its triggers) could not be removed; "
                "the next upgrade removes it",
                SQLITE.change_log.table,
            )
        raise


def check_upgrade_space(
    state: StoreState,
    targets: Sequence[str],
    x: Mapping[str, str],
    *,
    backup_to: str | os.PathLike[str] | None = None,
) -> None:
    """Refuse, before anything is written, an upgrade the disk has no room for.

    Raises NotEnoughFreeSpace (a DiskFull) saying what is needed and what is free on which
    file system. The need is what the pending steps write (:mod:`hermes_store.sqlite.space`): the
    search conversion's write-ahead log next to the store and its savepoint journal in
    SQLite's temporary directory (in place, from the two inline copies' size; rebuilt when
    `fts_convert=rebuild` asks for it, from the inline indexes' size), the application's
    schema steps, and the backup. Nothing is checked when no step is pending (at head),
    for a new store, or without dbstat (which measures the tables). A legacy index that
    verification then finds drifted is rebuilt, which needs more: if that does not fit,
    the revision fails as DiskFull and is rolled back.
    """
    path = state.path
    if path is None or state.kind == "new":
        return
    pending = pending_revisions(state, targets)
    if not pending:
        return
    relational = any(is_app_version(revision) for revision in pending)
    conversion = None
    if FTS_EXTERNAL_REVISION in pending:
        conversion = "rebuild" if x.get("fts_convert") == "rebuild" else "in-place"
    with read_only(path) as conn:
        tables = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master")}
        inline = [index for index in fts.INDEXES if f"{index}_content" in tables]
        copies = [f"{index}_content" for index in inline]
        shadows = [index + suffix for index in inline for suffix in FTS_SHADOWS]
        # Only what the pending steps rewrite is measured: dbstat reads every page of it.
        wanted = copies if conversion == "in-place" else []
        if conversion == "rebuild":
            wanted = [*copies, *(name for name in shadows if name in tables)]
        measured = btree_bytes(conn, [*wanted, *(["sessions"] if relational else [])])
        if measured is None:
            log.info("space check skipped: this SQLite has no dbstat to measure the store")
            return
        wal = temp = 0
        if conversion == "in-place" and inline:
            wal, temp = space.in_place_conversion(
                [measured[name] for name in copies], space.cache_bytes(conn), space.page_size(conn)
            )
        elif conversion == "rebuild" and inline:
            index_bytes = sum(measured[name] for name in wanted)
            wal, temp = space.rebuild_conversion(index_bytes, space.cache_bytes(conn))
        schema_steps = 0
        if relational and "messages" in tables:
            messages = int(conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0])
            schema_steps = space.relational_steps(messages, measured.get("sessions", 0))
        temp_dir = space.sqlite_temp_dir(conn)
    needs = [
        space.Need(path.parent, schema_steps, "the application's schema steps"),
        space.Need(path.parent, wal, f"the {conversion} search conversion's write-ahead log"),
    ]
    if temp_dir is not None:
        needs.append(space.Need(temp_dir, temp, "SQLite's temporary files"))
    if backup_to is not None:
        wal_file = path.with_name(path.name + "-wal")
        size = path.stat().st_size + (wal_file.stat().st_size if wal_file.exists() else 0)
        target = Path(backup_to).expanduser().resolve().parent
        needs.append(space.Need(target, size, "the backup"))
    space.require_free(
        needs,
        task="this upgrade",
        store=path,
        advice="Free some space (SQLITE_TMPDIR can point SQLite's temporary files at "
        "another file system) and run the upgrade again",
    )


def heal_search(conn: Connection) -> dict[str, str]:
    """Restore a damaged search mechanism (see `hermes-store check`); what was done.

    An upgrade at head runs no revision, so this is what repairs, on the next deploy, a
    store whose triggers the Hermes application's FTS recovery replaced: the triggers, view
    and declarations come back from the FTS branch's newest revision and the indexes they
    fed are rebuilt exactly from the view. Costs one schema read when nothing is wrong.
    """
    if not fts.check_mechanism(conn).problems:
        return {}
    waiting = {item.index for item in backfill.pending(conn)}
    restored = fts.restore_mechanism(conn, exclude=waiting)
    for index in restored.to_refill:
        backfill.start(conn, index)
    healed = dict(restored.restored)
    healed.update({index: f"index {how}" for index, how in restored.rebuilt.items()})
    log.warning("search mechanism restored: %s", ", ".join(sorted(healed)))
    return healed


_DOING = {
    "classify": "before anything was written",
    "backup": "while taking the backup: its partial copy was removed, the store not written",
    "adopt": "while adopting the legacy store: that transaction was rolled back",
    "verify": "while verifying the search indexes (a read): nothing was converted",
    "revision": "while running the revisions: the one in progress was rolled back whole",
    "heal": "while checking the search mechanism: that transaction was rolled back",
    "free": "while freeing what the search conversion set aside: the revisions are all done",
}


def interruption(
    request: Request, phase: Phase | None, before: StoreState | None, *, created: bool
) -> str:
    """What an interrupted upgrade or downgrade tells the operator, read from the store
    afterwards: what was in flight and what became of it, where the store is, what is left
    and the command that finishes it (``finish``, or made from the store as it was left)."""
    kind = phase.kind if phase is not None else "classify"
    doing = _DOING.get(kind, f"while {phase.label if phase else kind}")
    path = request.target.path
    finish = request.finish
    try:
        after = inspect_file(path) if path is not None and path.exists() else None
        names, rows, size, change_log = (
            _left_over(request.target.url) if after else ([], 0, None, False)
        )
    except Exception as exc:  # report what is known, not a guess
        log.debug("the store could not be read after the interrupt: %s", exc)
        return (
            f"interrupted {doing}; the store could not be read afterwards: see where it is "
            "with `hermes-store current`"
        )
    if not isinstance(finish, str):
        finish = finish(after)
    if phase is not None and kind == "revision" and phase.item is not None:
        undoing = phase.label.startswith("undoing")
        done = phase.item in applied_revisions(after.heads) if after else False
        verb = "the downgrade of revision" if undoing else "revision"
        doing = (
            f"during {verb} {phase.item}, which was rolled back whole"
            if done == undoing
            else f"after {verb} {phase.item} was done"
        )
    if after is None or after.kind == "new":
        where = "no store was created" if created else "the store is empty"
    else:
        where = f"the store is at {after.where()}"
        if before is not None and before.where() != after.where():
            where += f" (it was at {before.where()})"
    words = [f"interrupted {doing}; {where}"]
    optimize = "hermes-store optimize" + (f" --db {path}" if path is not None else "")
    if rows or names:
        amount = f"{rows:,} rows" + (f" ({human_bytes(size)})" if size else "")
        words.append(
            f"{amount} of {', '.join(names)} are left to free: `{optimize}` frees them in "
            f"short steps (so does `{finish}`)"
        )
    if change_log:
        words.append(f"the upgrade's change log is left: `{optimize}` removes it")
    if kind != "free" or not names:
        words.append(f"run `{finish}` to finish" if kind != "free" else "nothing else is left")
    return "; ".join(words)


def _left_over(resolved: str) -> tuple[list[str], int, int | None, bool]:
    """What an interrupted upgrade can leave (read-only): the tables still to free, their
    rows and bytes (None without dbstat), and whether its change log is still there."""
    engine = create_store_engine(resolved, create=False, wal=False)
    try:
        with engine.connect() as conn:
            names = fts.retired_indexes(conn)
            rows = sum(backfill.retired_rows(conn, name) for name in names)
            tables = [table for name in names for table in backfill.retired_tables(conn, name)]
            driver: Any = conn.connection.driver_connection
            sizes = btree_bytes(driver, tables) if tables else {}
            size = None if sizes is None else sum(sizes.values())
            return names, rows, size, backfill.has_change_log(conn)
    finally:
        engine.dispose()


def _refuse_deleting_data(path: Path | None, how: str) -> None:
    """Refuse a downgrade to base of a store that holds conversations (read-only look)."""
    if path is None or not path.exists():
        return
    held: dict[str, int] = {}
    with read_only(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        for table in ("sessions", "messages"):
            if table in tables:
                held[table] = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    if any(held.values()):
        raise deleting_data_refused(held, how)


def describe(conn: Connection) -> dict[str, Any]:
    """`current` on SQLite: revision, legacy schema, search layout and backfill state."""
    from hermes_store.migrate.workflow import current_revision

    return {
        "revision": current_revision(conn),
        "legacy_schema": conn.exec_driver_sql("SELECT version FROM schema_version").scalar(),
        "head": head_revision(),
        "fts_layout": fts.layout(conn),
        "fts_indexes": {name: fts.index_layout(conn, name) for name in fts.INDEXES},
        "backfill": backfill_status(conn),
    }


@contextlib.contextmanager
def store_connection(target: Target, *, write: bool) -> Iterator[Connection]:
    """A connection to an existing store (nothing created); ``write``: one that takes the
    write lock at each BEGIN."""
    engine = create_store_engine(target.url, create=False)
    try:
        with sqlite_errors(target.path), engine.connect() as conn:
            if write:
                conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            yield conn
    finally:
        engine.dispose()

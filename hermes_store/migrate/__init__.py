"""Programmatic upgrade / current, and adoption of stores that were never under Alembic."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import re
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext, MigrationStep
from alembic.script import Script, ScriptDirectory
from alembic.script.revision import RangeNotAncestorError, RevisionError
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from alembic import command
from alembic import context as alembic_context
from hermes_store.engine import (
    BEGIN_OPTION,
    ENV_URL,
    check_side_files,
    connect_read_only,
    create_store_engine,
    db_path,
    flush_to_disk,
    is_server,
    joined_transaction,
    require_writable,
    resolve_url,
    side_files,
    sqlite_errors,
    translate_error,
    writable_problem,
)
from hermes_store.errors import (
    DiskFull,
    Interrupted,
    NotADatabase,
    SchemaTooNew,
    SchemaTooOld,
    StoreError,
    StoreNotFound,
    StoreReadOnly,
    UnknownRevision,
    UnknownSchema,
)
from hermes_store.postgresql import migration as server
from hermes_store.progress import Phase, Report, Tracker, quiet
from hermes_store.revisions import (
    APP_VERSIONS,
    FIRST_APP_VERSION,
    FTS_EXTERNAL_REVISION,
    LAST_APP_VERSION,
    fts_conversion,
    fts_head_revision,
    head_revision,
    is_app_version,
    require_script_location,
    script_directory,
)
from hermes_store.sqlite import backfill, fts, space
from hermes_store.sqlite.backup import BackupResult, backup, backup_from
from hermes_store.sqlite.backup import check_target as check_backup_target
from hermes_store.sqlite.maintenance import truncate_wal
from hermes_store.sqlite.storage import FTS_SHADOWS, btree_bytes, human_bytes

log = logging.getLogger(__name__)

FIRST_LEGACY = FIRST_APP_VERSION
LAST_LEGACY = LAST_APP_VERSION
SQLITE_MAGIC = b"SQLite format 3\x00"
#: Tables a store must have, with the columns that identify it as a Hermes session store.
CORE_COLUMNS = {
    "sessions": {"id", "source", "started_at"},
    "messages": {"id", "session_id", "role", "content", "timestamp"},
}
#: ``-x`` arguments the bare `alembic` command takes besides ``db``.
BACKUP_X = "backup"
BACKUP_OVERWRITE_X = "backup_overwrite"
APP_VERSION_X = "app_version"
#: Objects adoption leaves alone: search is converted by the revisions themselves.
_NOT_ADOPTED_PREFIXES = ("messages_fts", "sqlite_")
#: The revision id an earlier hermes-store gave its external-content conversion, which
#: also wrote `schema_version = 22`: the application's 22 is another change.
_MISSTAMPED_REVISION = "22"


@dataclass(frozen=True)
class StoreState:
    """What a database file holds before any migration touches it."""

    path: Path | None
    kind: str  # "new" (missing or empty), "legacy" (no alembic_version) or "alembic"
    #: The application schema the relational tables really have (`schema_version`, except
    #: for a store misstamped by an earlier hermes-store, see ``misstamped``).
    legacy_version: int | None = None
    revisions: tuple[str, ...] = ()
    tables: frozenset[str] = field(default_factory=frozenset)
    #: Upgraded by an earlier hermes-store whose search revision claimed schema 22 and
    #: revision "22": its relational schema is 21 and its search layout external.
    misstamped: bool = False

    @property
    def revision(self) -> str | None:
        """The Alembic revision(s), comma-separated, or None when unversioned."""
        return ", ".join(self.revisions) or None


def alembic_config(
    url: str | None = None,
    *,
    connection: Connection | None = None,
    x: Mapping[str, str] | None = None,
) -> Config:
    """An Alembic config for this project's revisions, without reading alembic.ini's URL.

    ``x`` are the options revisions read with ``context.get_x_argument`` (fts_convert,
    fts_backfill, hermes_home); the upgrade workflow itself takes no ``-x`` detour.
    """
    cfg = Config()
    cfg.set_main_option("script_location", str(require_script_location()))
    x_args = dict(x or {})
    if url is not None:
        x_args["db"] = url
    cfg.cmd_opts = argparse.Namespace(x=[f"{k}={v}" for k, v in x_args.items()])
    cfg.attributes["configure_logging"] = False
    if connection is not None:
        cfg.attributes["connection"] = connection
        cfg.attributes["prepared"] = True
    return cfg


def inspect_file(path: Path | None, script: ScriptDirectory | None = None) -> StoreState:
    """Classify a database file WITHOUT writing to it; refuse what cannot be adopted.

    Raises NotADatabase, SchemaTooOld, SchemaTooNew or UnknownSchema with a message that
    says what was found and what to do.
    """
    if path is None:
        return StoreState(path=None, kind="new")
    if path.is_dir():
        raise NotADatabase(f"{path} is a directory, not a database file; pass the file's path")
    check_side_files(path)
    if not path.exists() or path.stat().st_size == 0:
        return StoreState(path=path, kind="new")
    try:
        with path.open("rb") as handle:
            magic = handle.read(len(SQLITE_MAGIC))
    except PermissionError as exc:
        raise StoreError(f"{path}: cannot read the file ({exc.strerror}); check its owner") from exc
    if magic != SQLITE_MAGIC:
        raise NotADatabase(
            f"{path} is not a SQLite database (its header is not 'SQLite format 3'); "
            "check --db / HERMES_STORE_URL points at state.db"
        )
    with _read_only(path) as conn:
        try:
            tables = frozenset(
                row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            )
        except sqlite3.DatabaseError as exc:
            translated = translate_error(exc, path)
            if isinstance(translated, DiskFull):  # no room for the -shm a WAL store needs
                raise translated from exc
            problem = writable_problem(path) if "unable to open" in str(exc) else None
            if problem is not None:
                raise StoreReadOnly(
                    f"{path}: the store is read-only and SQLite cannot open it: {problem} (a "
                    f"WAL store needs {path.name}-shm even to be read); nothing was changed. "
                    "Copy the store to a writable place to use it"
                ) from exc
            raise NotADatabase(f"{path}: SQLite cannot read this file ({exc})") from exc
        if "alembic_version" in tables:
            revisions = _alembic_revisions(conn)
            known = {rev.revision for rev in (script or script_directory()).walk_revisions()}
            unknown = [revision for revision in revisions if revision not in known]
            if unknown:
                raise SchemaTooNew(
                    f"{path} is at revision {unknown[0]!r}, which this hermes-store does not "
                    "know: it was written by a newer hermes-store (upgrade the package) or by "
                    "another application; nothing was changed"
                )
            version = _legacy_version(conn, path, tables)
            misstamped = _is_misstamped(conn, revisions, version)
            if misstamped:
                version = _MISSTAMPED_REAL_VERSION
            return StoreState(path, "alembic", version, revisions, tables, misstamped)
        if not tables - {"sqlite_sequence"}:
            return StoreState(path=path, kind="new", tables=tables)
        version = _legacy_version(conn, path, tables)
        if version is None:
            raise UnknownSchema(
                f"{path} has tables ({', '.join(sorted(tables)[:6])}...) but no schema_version: "
                "it is not a Hermes session store; point --db at state.db"
            )
        if version < FIRST_LEGACY:
            raise SchemaTooOld(
                f"{path} is at legacy schema {version}; hermes-store adopts {FIRST_LEGACY} to "
                f"{LAST_LEGACY}. Open it once with the Hermes agent (which upgrades it to "
                f"{LAST_LEGACY}), then run the upgrade again"
            )
        if version > LAST_LEGACY:
            raise SchemaTooNew(
                f"{path} is at legacy schema {version}, newer than {LAST_LEGACY}, the last one "
                "hermes-store adopts; it was written by a newer Hermes agent. Upgrade hermes-store "
                "(nothing was changed)"
            )
        _check_core_tables(conn, path, version, tables)
        return StoreState(path=path, kind="legacy", legacy_version=version, tables=tables)


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    conn = connect_read_only(path)
    try:
        yield conn
    finally:
        conn.close()


def _alembic_revisions(conn: sqlite3.Connection) -> tuple[str, ...]:
    rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    return tuple(sorted(str(row[0]) for row in rows))


#: What a misstamped store's relational tables really are.
_MISSTAMPED_REAL_VERSION = 21


def _is_misstamped(conn: Any, revisions: tuple[str, ...], version: int | None) -> bool:
    """True for a store an earlier hermes-store stamped "22" without the application's 22.

    The application's 22 puts `task` in the key of `session_model_usage`; that earlier
    revision changed only the search layout. ``conn`` is a sqlite3 or SQLAlchemy connection.
    """
    if revisions != (_MISSTAMPED_REVISION,) or version != int(_MISSTAMPED_REVISION):
        return False
    pragma = "PRAGMA table_info(session_model_usage)"
    rows = conn.exec_driver_sql(pragma) if isinstance(conn, Connection) else conn.execute(pragma)
    key = {row[1] for row in rows if row[5]}
    return bool(key) and "task" not in key


def _legacy_version(conn: sqlite3.Connection, path: Path, tables: frozenset[str]) -> int | None:
    if "schema_version" not in tables:
        return None
    rows = conn.execute("SELECT version FROM schema_version").fetchall()
    if len(rows) != 1 or not isinstance(rows[0][0], int):
        raise UnknownSchema(
            f"{path}: schema_version should hold exactly one integer row, found {rows[:3]!r}; "
            "the store was edited by hand or is damaged: restore it from a backup"
        )
    return int(rows[0][0])


def _check_core_tables(
    conn: sqlite3.Connection, path: Path, version: int, tables: frozenset[str]
) -> None:
    for table, required in CORE_COLUMNS.items():
        if table not in tables:
            raise UnknownSchema(
                f"{path} says legacy schema {version} but has no {table!r} table; "
                "it is not a Hermes session store or it is damaged"
            )
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        missing = required - columns
        if missing:
            raise UnknownSchema(
                f"{path}: table {table!r} lacks {', '.join(sorted(missing))}; "
                "this is not a schema hermes-store recognises"
            )


@functools.lru_cache(maxsize=8)
def reference_schema(revision: str) -> dict[str, dict[str, Any]]:
    """Tables, columns and indexes of a store created fresh at ``revision`` (in memory)."""
    script = script_directory()
    engine = create_engine("sqlite://", poolclass=StaticPool)
    steps = list(script.iterate_revisions(revision, "base"))
    # Revisions read their -x options from Alembic's environment: give them one (an empty
    # HERMES_HOME, nothing to backfill) unless `alembic` itself is running this upgrade.
    with (
        tempfile.TemporaryDirectory() as home,
        _environment(alembic_config(x={"hermes_home": home}), script),
        engine.begin() as conn,
    ):
        context = MigrationContext.configure(conn)
        with Operations.context(context):
            for step in reversed(steps):
                step.module.upgrade()
        return _describe(conn)


#: sqlite_master types adoption completes on a table, and where `_describe` files them.
_KINDS = {"index": "indexes", "trigger": "triggers"}


def _environment(config: Config, script: ScriptDirectory) -> contextlib.AbstractContextManager[Any]:
    """An Alembic environment for running revision code, unless one is already active.

    Entering a second one would remove the active one's `alembic.context` on exit.
    """
    try:
        alembic_context.get_x_argument()
    except (NameError, AttributeError):  # no environment (never was, or ended)
        return EnvironmentContext(config, script)
    return contextlib.nullcontext()


def _describe(conn: Connection) -> dict[str, dict[str, Any]]:
    tables: dict[str, dict[str, Any]] = {}
    rows = conn.execute(
        text("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL")
    ).all()
    for kind, name, _table, sql in rows:
        if kind == "table" and not name.startswith(_NOT_ADOPTED_PREFIXES):
            columns = {row[1]: row for row in conn.exec_driver_sql(f"PRAGMA table_info('{name}')")}
            tables[name] = {"sql": sql, "columns": columns, "indexes": {}, "triggers": {}}
    for kind, name, table, sql in rows:
        # The search triggers belong to the FTS branch, not to adoption.
        if kind in _KINDS and table in tables and not name.startswith(_NOT_ADOPTED_PREFIXES):
            tables[table][_KINDS[kind]][name] = sql
    return tables


def adopt(connection: Connection, version: int | None = None) -> str | None:
    """Bring an unversioned legacy store to the full schema of its version and stamp it.

    Returns the stamped revision, or None when the store is new or already versioned.
    Adds only what is missing (columns, tables, indexes of its version: the columns the
    application adds without a version bump above all); rewrites no data. Runs in the
    caller's transaction, or in one of its own.
    """
    # The schema of the version the caller found, built before the transaction takes the
    # write lock: running the revisions in memory is CPU work (0.1 s, more on a busy
    # machine) the agent need not wait for. Re-checked against the store under the lock.
    expected = (
        reference_schema(str(version))
        if version is not None and FIRST_LEGACY <= version <= LAST_LEGACY
        else None
    )
    with joined_transaction(connection):
        tables = {
            row[0]
            for row in connection.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))
        }
        if "alembic_version" in tables or "schema_version" not in tables:
            return None
        # Read again under the write lock: the application may have moved it since.
        found = int(connection.execute(text("SELECT version FROM schema_version")).scalar_one())
        if version is not None and found != version:
            raise StoreError(
                f"the store moved from schema {version} to {found} while the upgrade started "
                "(the agent upgraded it); nothing was changed: run the upgrade again"
            )
        if found > LAST_LEGACY:
            raise SchemaTooNew(f"legacy schema {found} is newer than {LAST_LEGACY}")
        if found < FIRST_LEGACY:
            raise SchemaTooOld(f"legacy schema {found} is older than {FIRST_LEGACY}")
        revision = str(found)
        added = _add_missing(
            connection, expected if expected is not None else reference_schema(revision)
        )
        MigrationContext.configure(connection).stamp(script_directory(), revision)
    log.info(
        "adopted legacy store at schema %s%s; stamped revision %s",
        revision,
        f" (added {', '.join(added)})" if added else "",
        revision,
    )
    return revision


def restamp_misstamped(connection: Connection) -> bool:
    """Give a store misstamped "22" by an earlier hermes-store the versions it really has.

    Its relational schema is 21 and its search indexes external: `schema_version` goes back
    to 21, `alembic_version` to revisions 21 and fts1, and the layout marker is recorded.
    The chain then carries it up like any other store. Returns False when not misstamped.
    """
    with joined_transaction(connection):
        if not _state_of(connection).misstamped:
            return False
        connection.execute(
            text("UPDATE schema_version SET version = :v"), {"v": _MISSTAMPED_REAL_VERSION}
        )
        connection.execute(text("DELETE FROM alembic_version"))
        connection.execute(
            text("INSERT INTO alembic_version (version_num) VALUES (:a), (:b)"),
            {"a": str(_MISSTAMPED_REAL_VERSION), "b": FTS_EXTERNAL_REVISION},
        )
        if fts.layout(connection) == "external":
            fts.set_layout_marker(connection, "external")
    log.info(
        "this store was stamped 22 by an earlier hermes-store without the application's "
        "schema 22: schema_version set back to 21, revisions 21 and %s recorded",
        FTS_EXTERNAL_REVISION,
    )
    return True


def _add_missing(connection: Connection, reference: dict[str, dict[str, Any]]) -> list[str]:
    actual = _describe(connection)
    added: list[str] = []
    for table, spec in reference.items():
        if table not in actual:
            connection.exec_driver_sql(spec["sql"])
            added.append(f"table {table}")
            actual_indexes: set[str] = set()  # indexes and triggers the table has
        else:
            have = actual[table]["columns"]
            for name, (_, _, col_type, notnull, default, pk) in spec["columns"].items():
                if name in have:
                    continue
                if pk:
                    raise UnknownSchema(
                        f"table {table!r} lacks its key column {name!r}: not a schema "
                        "hermes-store recognises"
                    )
                ddl = f"ALTER TABLE {table} ADD COLUMN {name} {col_type}"
                if notnull:
                    ddl += " NOT NULL"
                if default is not None:
                    ddl += f" DEFAULT {default}"
                connection.exec_driver_sql(ddl)
                added.append(f"{table}.{name}")
            actual_indexes = set(actual[table]["indexes"]) | set(actual[table]["triggers"])
        for kind, group in _KINDS.items():
            for name, sql in spec[group].items():
                if name not in actual_indexes:
                    connection.exec_driver_sql(sql)
                    added.append(f"{kind} {name}")
    return added


@dataclass(frozen=True)
class UpgradeResult:
    """What one upgrade did: revisions, application schema and search layout before and after."""

    path: Path | None
    before: tuple[str, ...]
    after: tuple[str, ...]
    schema_before: int | None
    schema_after: int | None
    #: The application version the relational schema was asked to stop at (None: newest).
    app_version: int | None
    layout_before: str
    layout_after: str
    backup: BackupResult | None = None
    adopted: str | None = None
    restamped: bool = False
    #: Indexes a deferred backfill still has to fill (`hermes-store optimize-storage`).
    pending_backfill: tuple[str, ...] = ()
    #: Search objects restored and indexes rebuilt because they were damaged -> why.
    healed: dict[str, str] = field(default_factory=dict)
    #: The longest write transaction of the revisions and the steps after them, in seconds:
    #: how long the agent could not write at most.
    longest_write_lock_s: float = 0.0

    @property
    def from_revision(self) -> str | None:
        """The revision(s) before, comma-separated; None for an unversioned or new store."""
        return ", ".join(self.before) or None

    @property
    def to_revision(self) -> str | None:
        """The revision(s) after, comma-separated."""
        return ", ".join(self.after) or None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form, for `hermes-store upgrade --json`."""
        return {
            "from": self.from_revision,
            "to": self.to_revision,
            "schema_before": self.schema_before,
            "schema_after": self.schema_after,
            "app_version": self.app_version,
            "layout_before": self.layout_before,
            "layout_after": self.layout_after,
            "backup": str(self.backup.path) if self.backup else None,
            "adopted": self.adopted,
            "legacy_schema": int(self.adopted) if self.adopted else None,
            "restamped": self.restamped,
            "pending_backfill": list(self.pending_backfill),
            "healed": self.healed,
            "longest_write_lock_s": self.longest_write_lock_s,
        }


def parse_app_version(value: object) -> int:
    """An application schema version this package supports, or a StoreError saying which are."""
    try:
        version = int(str(value).strip())
    except ValueError:
        version = -1
    if version not in APP_VERSIONS:
        raise StoreError(
            f"--app-version {value}: hermes-store supports the application's schema "
            f"{FIRST_APP_VERSION} to {LAST_APP_VERSION}; give the version the agent you run "
            "writes (the `schema_version` it creates)"
        )
    return version


def _targets(revision: str | None, app_version: int | None) -> list[str]:
    """The Alembic targets one upgrade runs, in order."""
    if revision is not None and app_version is not None:
        raise StoreError("give either a target revision or an application version, not both")
    if revision is not None:
        return [revision]
    # The relational steps first, then the search layout: an upgrade that fails midway
    # leaves the relational schema at a version the application knows, the layout untouched.
    if app_version is not None and app_version < LAST_APP_VERSION:
        # The relational schema stops at the agent's version; the search layout goes on.
        return [str(app_version), fts_head_revision()]
    return [str(LAST_APP_VERSION), "head"]


def _refuse_going_back(state: StoreState, app_version: int | None) -> None:
    if app_version is None or state.legacy_version is None:
        return
    if state.legacy_version > app_version:
        raise StoreError(
            f"{state.path} is at the application's schema {state.legacy_version}, newer than "
            f"--app-version {app_version}: an upgrade never moves a schema back; nothing was "
            "changed. Run the agent that matches the store, or downgrade with "
            f"`alembic downgrade {app_version}`"
        )


def _refuse_older_revision(state: StoreState, revision: str) -> None:
    """An upgrade to a revision the store is already past is a downgrade: refuse it."""
    if state.kind == "new" or revision in ("head", "heads") or revision[:1] in "+-":
        return
    script = script_directory()
    current = state.revisions or (
        (str(state.legacy_version),) if state.legacy_version is not None else ()
    )
    try:
        wanted = {rev.revision for rev in script.get_revisions(revision) if rev is not None}
        below = {rev.revision for rev in script.iterate_revisions(current, "base")}
    except Exception as exc:  # unknown revision: Alembic itself says so, below
        log.debug("revision check skipped: %s", exc)
        return
    if wanted <= set(current):
        return  # already there: nothing to do, said as such
    past = sorted(wanted & below - set(current))
    if past:
        raise StoreError(
            f"{state.path} is at revision {', '.join(current)}, already past {revision}: an "
            "upgrade never goes back; nothing was changed. To go back, run "
            f"`hermes-store downgrade {revision}`"
        )


def _missing(path: Path | None) -> list[Path]:
    """The store file and its parent directories that do not exist yet (deepest first)."""
    missing: list[Path] = []
    current = path
    while current is not None and not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    return missing


@contextlib.contextmanager
def _removed_on_failure(created: list[Path]) -> Iterator[None]:
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


@dataclass(frozen=True)
class Prepared:
    """What the workflow did before any revision ran."""

    backup: BackupResult | None = None
    adopted: str | None = None
    restamped: bool = False


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


def _facts(connection: Connection) -> tuple[tuple[str, ...], int | None, str]:
    """(revisions, schema_version, search layout) of the store, read in one transaction."""
    with joined_transaction(connection):
        heads = tuple(sorted(MigrationContext.configure(connection).get_current_heads()))
        try:
            schema = connection.exec_driver_sql("SELECT version FROM schema_version").scalar()
        except DBAPIError:  # a new store: no table yet
            schema = None
        return heads, schema, fts.layout(connection)


def upgrade(
    url: str | None = None,
    revision: str | None = None,
    *,
    app_version: int | None = None,
    x: Mapping[str, str] | None = None,
    backup_to: str | os.PathLike[str] | None = None,
    overwrite_backup: bool = False,
    create: bool = True,
    progress: Report | None = None,
) -> UpgradeResult:
    """Upgrade a store (adopting a legacy one) and say what was done.

    A store that does not exist is created (``create=False`` refuses it instead, with
    nothing created); when the upgrade of a store it created fails, the file and the
    directories made for it are removed. ``revision`` below the store's own is refused
    (that is a downgrade). A ``backup_to`` that cannot be used is refused before anything
    is opened.

    The relational schema goes to ``app_version`` (default: the newest the package
    supports) and the search layout to the FTS branch's head; ``revision`` names one
    Alembic target instead. The file is classified once, read-only, before anything is
    written; then, on one connection that holds the write lock, the backup (``backup_to``)
    is taken, the store adopted or restamped, and each revision run in its own transaction.
    A full disk, a read-only store or a lock held past the busy timeout raise DiskFull,
    StoreReadOnly or StoreBusy; the revision in progress is rolled back whole.

    ``progress`` is told each phase as it starts (and how far the counted ones got).
    Interrupted (Ctrl-C), it raises Interrupted, whose message says what was done, what
    is left and the command that finishes it.
    """
    x_args = dict(x or {})
    if app_version is None and x_args.get(APP_VERSION_X):
        app_version = parse_app_version(x_args.pop(APP_VERSION_X))
    elif app_version is not None:
        app_version = parse_app_version(app_version)
    if revision is not None:
        check_revision(revision)
    targets = _targets(revision, app_version)
    resolved = resolve_url(url, create_home=False)
    if is_server(resolved):
        if backup_to is not None:
            raise StoreError(
                "--backup copies a SQLite file; on PostgreSQL take a backup with pg_dump "
                "before the upgrade. Nothing was changed"
            )
        return _upgrade_on_server(resolved, targets, x_args, app_version, progress or quiet)
    path = db_path(resolved)
    created = _missing(path)
    if created and not create:
        raise StoreNotFound(
            f"{path}: no such store; nothing was created. Check the path (--db, "
            f"{ENV_URL}), or pass --create to start a new, empty store there"
        )
    if backup_to is not None:
        check_backup_target(backup_to, path, overwrite=overwrite_backup)
    tracker = Tracker(progress)
    state = None
    try:
        tracker(Phase("classify", "reading the store (read-only)"))
        state = inspect_file(path)
        return _upgrade_file(
            resolved,
            state,
            created,
            targets,
            x_args,
            app_version,
            revision,
            tracker,
            backup_to=backup_to,
            overwrite_backup=overwrite_backup,
        )
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):
            raise
        finish = _upgrade_command(path, revision, app_version, x_args)
        story = _interruption(resolved, tracker.last, state, finish, created=bool(created))
        raise Interrupted(story) from exc


def _conversion_note(x: Mapping[str, str], verdicts: Mapping[str, str]) -> str:
    """How the search conversion will go, for a person watching it."""
    exact = fts_conversion().EXACT
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


def _upgrade_command(
    path: Path | None, revision: str | None, app_version: int | None, x: Mapping[str, str]
) -> str:
    """The `hermes-store upgrade` command line that goes on with an upgrade."""
    words = ["hermes-store upgrade"]
    if path is not None:
        words.append(f"--db {path}")
    if revision is not None:
        words.append(f"--revision {revision}")
    if app_version is not None:
        words.append(f"--app-version {app_version}")
    if x.get("fts_convert") == "rebuild":
        words.append("--rebuild-fts")
    if x.get("fts_backfill") == "deferred":
        words.append("--deferred-fts")
    return " ".join(words)


def _upgrade_file(
    resolved: str,
    state: StoreState,
    created: list[Path],
    targets: list[str],
    x_args: dict[str, str],
    app_version: int | None,
    revision: str | None,
    report: Report,
    *,
    backup_to: str | os.PathLike[str] | None,
    overwrite_backup: bool,
) -> UpgradeResult:
    """The upgrade of a SQLite store classified as ``state`` (see :func:`upgrade`)."""
    locks: list[float] = [0.0]
    with (
        _removed_on_failure(created),
        _writer(
            resolved,
            app_version,
            backup_to,
            overwrite_backup,
            revision=revision,
            space_for=(targets, x_args),
            locks=locks,
            state=state,
            report=report,
        ) as (conn, state, prepared),
    ):
        _, schema_before, layout_before = _facts(conn)
        cfg = alembic_config(resolved, connection=conn, x=x_args)
        converting = x_args.get("fts_convert") != "rebuild" and any(
            target in ("head", "heads", fts_head_revision()) for target in targets
        )
        with _change_log_removed_on_failure(conn):
            verdicts = _verified_ahead(conn, report) if converting else {}
            notes = {FTS_EXTERNAL_REVISION: _conversion_note(x_args, verdicts)}
            for target in targets:
                _settle(conn)
                _run_to(cfg, target, report, notes)
            healed = _finish_upgrade(conn, report)
        after, schema_after, layout_after = _facts(conn)
        with joined_transaction(conn):
            pending = tuple(item.index for item in backfill.pending(conn))
    return UpgradeResult(
        path=state.path,
        before=state.revisions,
        after=after,
        schema_before=state.legacy_version if state.kind != "new" else schema_before,
        schema_after=schema_after,
        app_version=app_version,
        layout_before=layout_before,
        layout_after=layout_after,
        backup=prepared.backup,
        adopted=prepared.adopted,
        restamped=prepared.restamped,
        pending_backfill=pending,
        healed=healed,
        longest_write_lock_s=round(max(locks), 3),
    )


def _upgrade_on_server(
    url: str,
    targets: Sequence[str],
    x_args: Mapping[str, str],
    app_version: int | None,
    report: Report = quiet,
) -> UpgradeResult:
    """`upgrade` on PostgreSQL: each target through env.py, which holds the upgrade lock."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            before, schema_before, layout_before = server.facts(conn)
        for target in targets:
            _run_to(alembic_config(url, x=x_args), target, report)
        with engine.connect() as conn:
            after, schema_after, layout_after = server.facts(conn)
    finally:
        engine.dispose()
    return UpgradeResult(
        path=None,
        before=before,
        after=after,
        schema_before=schema_before,
        schema_after=schema_after,
        app_version=app_version,
        layout_before=layout_before,
        layout_after=layout_after,
    )


@contextlib.contextmanager
def _timed_transactions(conn: Connection, durations: list[float]) -> Iterator[None]:
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


@contextlib.contextmanager
def _writer(
    resolved: str,
    app_version: int | None,
    backup_to: str | os.PathLike[str] | None,
    overwrite_backup: bool,
    *,
    existing: bool = False,
    revision: str | None = None,
    space_for: tuple[Sequence[str], Mapping[str, str]] | None = None,
    locks: list[float] | None = None,
    state: StoreState | None = None,
    report: Report = quiet,
) -> Iterator[tuple[Connection, StoreState, Prepared]]:
    """Classify the store once (read-only), then hold one connection that takes the write
    lock at each BEGIN, with the backup taken and the store adopted or restamped on it.

    ``existing=True`` refuses a store that does not exist yet instead of creating it.
    ``space_for`` (the targets and ``-x`` options of an upgrade) refuses, before anything
    is written, an upgrade the disk has no room for (see :func:`check_upgrade_space`).
    ``locks`` receives the duration of each write transaction on that connection, from the
    adoption or restamp to the end of the block. ``state``: the classification the caller
    already made.
    """
    path = db_path(resolved)
    if state is None:
        report(Phase("classify", "reading the store (read-only)"))
        state = inspect_file(path)
    if existing and state.kind == "new":
        raise StoreNotFound(f"{path}: nothing to downgrade, the store does not exist")
    _refuse_going_back(state, app_version)
    if revision is not None:
        _refuse_older_revision(state, revision)
    require_writable(path)
    if space_for is not None:
        report(Phase("classify", "checking the free space the upgrade needs (read-only)"))
        check_upgrade_space(state, *space_for, backup_to=backup_to)
    if path is not None:  # the first commit's sync then has nothing of the store to wait for
        report(Phase("classify", "writing out what the page cache holds of the store"))
        flush_to_disk(path)
    engine = create_store_engine(resolved)
    try:
        with sqlite_errors(path), engine.connect() as conn:
            conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            with (
                _timed_transactions(conn, locks) if locks is not None else contextlib.nullcontext()
            ):
                prepared = prepare_store(
                    conn,
                    state,
                    backup_to=backup_to,
                    overwrite_backup=overwrite_backup,
                    report=report,
                )
                yield conn, state, prepared
    finally:
        engine.dispose()


def _free_set_aside(conn: Connection, report: Report = quiet) -> None:
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


def _finish_upgrade(conn: Connection, report: Report = quiet) -> dict[str, str]:
    """What every upgrade does after its revisions, `alembic upgrade` and `hermes-store
    upgrade` alike: restore a damaged search mechanism, then free the copies the
    conversion set aside, in short steps (not in its lock; a kill here leaves them to the
    next upgrade, optimize or optimize-storage). Returns what was healed."""
    _settle(conn)
    report(Phase("heal", "checking the search mechanism"))
    with joined_transaction(conn):
        healed = _heal_search(conn)
    _free_set_aside(conn, report)
    return healed


def _verified_ahead(conn: Connection, report: Report) -> dict[str, str]:
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
    module = fts_conversion()
    with joined_transaction(conn):
        heads = MigrationContext.configure(conn).get_current_heads()
        inline = [index for index in fts.INDEXES if fts.index_layout(conn, index) == "inline"]
        if FTS_EXTERNAL_REVISION in heads or not inline or fts.is_application_layout(conn):
            return {}
        module.start_change_log(conn)
    verdicts: dict[str, str] = {}
    with conn.engine.connect() as reader, reader.begin():  # a snapshot; no lock is held
        # The log this snapshot runs against (another upgrade may have replaced ours since).
        log_id = module.current_log_id(reader)
        for index in inline:
            verdicts[index] = module.verify_inline(reader, index) or module.EXACT
    with joined_transaction(conn):
        for index, verdict in verdicts.items():
            conn.execute(
                text("INSERT OR REPLACE INTO state_meta (key, value) VALUES (:key, :value)"),
                {"key": module.VERIFIED_KEY.format(name=index), "value": f"{log_id} {verdict}"},
            )
    log.info(
        "search indexes verified under a read snapshot: %s",
        ", ".join(f"{index} {verdict}" for index, verdict in verdicts.items()),
    )
    return verdicts


@contextlib.contextmanager
def _change_log_removed_on_failure(conn: Connection) -> Iterator[None]:
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
                fts_conversion().CHANGE_LOG,
            )
        raise


def _pending_revisions(state: StoreState, targets: Sequence[str]) -> set[str] | None:
    """The revisions an upgrade of a store in ``state`` to ``targets`` would run (adoption
    stamps a legacy store at its version first); None when that cannot be told (a relative
    or unknown target: Alembic says what is wrong with it)."""
    if state.misstamped:
        current: tuple[str, ...] = (str(_MISSTAMPED_REAL_VERSION), FTS_EXTERNAL_REVISION)
    elif state.revisions:
        current = state.revisions
    elif state.legacy_version is not None:
        current = (str(state.legacy_version),)
    else:
        current = ()
    script = script_directory()
    try:
        applied = {rev.revision for rev in script.iterate_revisions(current, "base")}
        wanted = {
            rev.revision
            for target in targets
            for rev in script.iterate_revisions(target, "base")
            if rev is not None
        }
    except Exception as exc:  # Alembic raises several kinds, and says which when it runs
        log.debug("space check skipped: %s", exc)
        return None
    return wanted - applied


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
    pending = _pending_revisions(state, targets)
    if not pending:
        return
    relational = any(is_app_version(revision) for revision in pending)
    conversion = None
    if FTS_EXTERNAL_REVISION in pending:
        conversion = "rebuild" if x.get("fts_convert") == "rebuild" else "in-place"
    with _read_only(path) as conn:
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


def _heal_search(conn: Connection) -> dict[str, str]:
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


#: `-x` option (and `downgrade(..., delete_data=True)`) that lets a downgrade to base delete
#: the conversations it holds.
DELETE_DATA_X = "i_know_this_deletes_data"


#: A downgrade target relative to the store's revisions: ``-N``, or ``BRANCH@-N``.
_RELATIVE = re.compile(r"(?:(?P<branch>[^@]+)@)?-(?P<steps>\d+)")
#: Any target Alembic reads as relative (``-N``, ``+N``, ``REV-N``, ``BRANCH@REV+N``).
_ANY_RELATIVE = re.compile(r"(?:(?P<branch>.+?)@)?(?P<symbol>\w+)?[+-]\d+")


def _unknown_revision(name: str) -> UnknownRevision:
    head = head_revision()
    return UnknownRevision(
        f"unknown revision {name!r}: this hermes-store has no revision or branch of that "
        f"name; `hermes-store history` lists them ({FIRST_APP_VERSION}..{LAST_APP_VERSION} "
        f"are the application's schema versions, {FTS_EXTERNAL_REVISION} the search layout, "
        f"{head} the newest). Nothing was changed"
    )


def check_revision(target: str) -> None:
    """Refuse a revision name this package does not have, in one line that points to
    `hermes-store history` (UnknownRevision); ``head``, ``base``, ``-1``, ``fts@-1`` pass."""
    script = script_directory()
    name = target.strip()
    if not name:  # Alembic asserts on an empty name instead of refusing it
        raise _unknown_revision(target)
    relative = _ANY_RELATIVE.fullmatch(name)
    if relative is not None:
        labels = {label for rev in script.walk_revisions() for label in rev.branch_labels}
        if relative["branch"] is not None and relative["branch"] not in labels:
            raise _unknown_revision(relative["branch"])
        names = [] if relative["symbol"] in (None, "head", "heads") else [relative["symbol"]]
    else:
        names = [name]
    for part in names:
        try:
            script.get_revisions(part)
        except (RevisionError, CommandError):
            raise _unknown_revision(part) from None


def upgrade_order() -> tuple[str, ...]:
    """Every revision, in the order `hermes-store upgrade` applies them to a new store: the
    application's chain to its newest version, then the search layout, then the merge."""
    script = script_directory()
    order: list[str] = []
    for target in (str(LAST_APP_VERSION), "heads"):
        for rev in reversed(list(script.iterate_revisions(target, "base"))):
            if rev is not None and rev.revision not in order:
                order.append(rev.revision)
    return tuple(order)


def _applied(heads: Sequence[str]) -> set[str]:
    """The revisions a store at ``heads`` has: they and everything below them."""
    script = script_directory()
    applied: set[str] = set()
    todo = list(heads)
    while todo:
        name = todo.pop()
        if name not in applied:
            applied.add(name)
            down = _revision(script, name).down_revision
            todo.extend([down] if isinstance(down, str) else down or ())
    return applied


def _heads_of(applied: set[str]) -> tuple[str, ...]:
    script = script_directory()
    return tuple(
        sorted(name for name in applied if not set(_revision(script, name).nextrev) & applied)
    )


def _revision(script: ScriptDirectory, name: str) -> Script:
    found = script.get_revision(name)
    assert found is not None
    return found


@dataclass(frozen=True)
class DowngradePlan:
    """What one downgrade undoes, resolved against the store's revisions before it runs."""

    target: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    #: The revisions undone, in the order their downgrades run (newest first).
    undone: tuple[str, ...]

    def describe(self) -> list[dict[str, str]]:
        """Per revision undone: what it does, and what undoing it gives up (its docstring's
        paragraph about the downgrade, which each revision states)."""
        script = script_directory()
        described = []
        for name in self.undone:
            rev = _revision(script, name)
            if rev.is_merge_point:
                undoing = "Nothing to undo: it only joins the two branches."
            else:
                paragraphs = [" ".join(p.split()) for p in rev.longdoc.split("\n\n")]
                said = [p for p in paragraphs if p.startswith("Downgrade")]
                undoing = said[0] if said else "its docstring does not say what undoing it loses"
            described.append({"revision": name, "does": rev.doc.strip(), "undoing": undoing})
        return described

    def steps(self) -> list[MigrationStep]:
        """Alembic's steps for the revisions undone, in order."""
        script = script_directory()
        return [
            MigrationStep.downgrade_from_script(script.revision_map, _revision(script, name))
            for name in self.undone
        ]


def plan_downgrade(heads: Sequence[str], target: str) -> DowngradePlan:
    """Resolve a downgrade target against a store at ``heads`` (nothing is read or run).

    ``-N`` undoes N steps. One step is the newest revision of the store that changes it, in
    :func:`upgrade_order` (the application's schema versions, then the search layout): from
    the merge head that is fts1, with the merge above it, which changes nothing and is
    never a step of its own. ``BRANCH@-N`` takes the steps on that branch only (``fts@-1``).
    Every other target (``base``, a revision id, an application version, ``fts@17``) means
    what it means to Alembic: every revision of the store that depends on it is undone.
    Raises UnknownRevision (a name this package lacks) or StoreError (nothing to undo).
    """
    check_revision(target)
    script = script_directory()
    before = tuple(sorted(heads))
    applied = _applied(before)
    relative = _RELATIVE.fullmatch(target.strip())
    if relative is not None:
        undone = _walk_back(applied, int(relative["steps"]), relative["branch"], target)
    else:
        try:
            found = script.iterate_revisions(before, target, select_for_downgrade=True)
            undone = tuple(rev.revision for rev in found if rev is not None)
        except RangeNotAncestorError:
            raise StoreError(
                f"the store is at {', '.join(before) or 'base'}, which is not above {target}: "
                f"there is nothing to undo (`hermes-store upgrade --revision {target}` goes "
                "forward). Nothing was changed"
            ) from None
        except RevisionError as exc:
            raise StoreError(
                f"downgrade {target}: {exc}; name the revision to go back to (`hermes-store "
                "history`), or give -N steps. Nothing was changed"
            ) from None
    return DowngradePlan(target, before, _heads_of(applied - set(undone)), undone)


def _walk_back(applied: set[str], steps: int, branch: str | None, target: str) -> tuple[str, ...]:
    """The revisions ``steps`` steps back from ``applied`` undo (see :func:`plan_downgrade`)."""
    script = script_directory()
    order = upgrade_order()
    left = set(applied)
    undone: list[str] = []
    for done in range(steps):
        candidates = [
            name
            for name in order
            if name in left
            and not _revision(script, name).is_merge_point
            and (branch is None or branch in _revision(script, name).branch_labels)
        ]
        if not candidates:
            where = f" on branch {branch}" if branch else ""
            raise StoreError(
                f"downgrade {target}: the store has {done} step(s) to undo{where}, not "
                f"{steps} (`hermes-store history` lists them; `downgrade base` undoes every "
                "one). Nothing was changed"
            )
        newest = candidates[-1]
        # What depends on it goes first: the merge above it, newest first.
        above = [name for name in reversed(order) if name in left and newest in _applied([name])]
        for name in above:
            left.discard(name)
            undone.append(name)
    return tuple(undone)


def _announced(
    steps: Iterable[MigrationStep], report: Report, notes: Mapping[str, str]
) -> Iterator[MigrationStep]:
    """Alembic's steps, each reported just before it runs (Alembic pulls the next step from
    this iterator right before it begins that step's transaction); ``notes`` says more
    about some of them (how the search conversion will go)."""
    for step in steps:
        rev = getattr(step, "revision", None)
        name = getattr(rev, "revision", None) or str(step)
        doc = notes.get(name) or (getattr(rev, "doc", "") or "").strip()
        verb = "revision" if step.is_upgrade else "undoing revision"
        report(Phase("revision", f"{verb} {name}: {doc}".rstrip(": "), item=name))
        yield step


def _run_steps(
    config: Config,
    plan: Callable[[tuple[str, ...]], Iterable[MigrationStep]],
    destination: str,
    report: Report,
    notes: Mapping[str, str] | None = None,
) -> None:
    """Run Alembic through env.py with ``plan`` as its step planner (what `command.upgrade`
    and `command.downgrade` do with theirs), each step announced to ``report``."""
    script = script_directory()

    def steps(heads: Any, _context: Any) -> Iterator[MigrationStep]:
        return _announced(plan(tuple(sorted(heads))), report, notes or {})

    config.attributes["planned"] = True  # env.py then keeps these steps as they are
    with EnvironmentContext(config, script, fn=steps, destination_rev=destination):
        script.run_env()


def _run_to(
    config: Config, target: str, report: Report, notes: Mapping[str, str] | None = None
) -> None:
    """`alembic upgrade TARGET` on the config's connection, each step announced."""
    _run_steps(config, lambda heads: _steps_to([target], heads), target, report, notes)


def _steps_to(targets: Sequence[str], heads: tuple[str, ...]) -> list[MigrationStep]:
    """Alembic's own steps to each target in turn, from ``heads``: the relational chain to
    its version before the search layout (see :func:`_targets`), whichever command runs."""
    script = script_directory()
    steps: list[MigrationStep] = []
    for target in targets:
        # Alembic's planner, given the heads as `command.upgrade` gives them (a tuple,
        # though its annotation says str).
        planned = script._upgrade_revs(target, heads)  # type: ignore[arg-type]
        steps.extend(planned)
        done = {step.revision.revision for step in planned}
        heads = _heads_of(_applied(heads) | done)
    return steps


def _plan_runner(plan: DowngradePlan) -> Callable[[tuple[str, ...]], list[MigrationStep]]:
    """The planned steps, refused when the store is no longer where the plan was made."""

    def steps(heads: tuple[str, ...]) -> list[MigrationStep]:
        if heads != plan.before:
            raise StoreError(
                f"the store moved from {', '.join(plan.before) or 'base'} to "
                f"{', '.join(heads) or 'base'} while the downgrade started; nothing was "
                "changed: run it again"
            )
        return plan.steps()

    return steps


def _effective_heads(state: StoreState) -> tuple[str, ...]:
    """The revisions a store is at, an unversioned one at its legacy version's."""
    if state.misstamped:
        return tuple(sorted((str(_MISSTAMPED_REAL_VERSION), FTS_EXTERNAL_REVISION)))
    if state.revisions:
        return state.revisions
    return (str(state.legacy_version),) if state.legacy_version is not None else ()


def plan_store_downgrade(url: str | None, revision: str) -> DowngradePlan:
    """What ``downgrade(url, revision)`` would undo, read from the store without writing."""
    resolved = resolve_url(url, create_home=False)
    if is_server(resolved):
        engine = create_store_engine(resolved, create=False)
        try:
            with engine.connect() as conn:
                heads, _version, _layout = server.facts(conn)
        finally:
            engine.dispose()
        return plan_downgrade(heads, revision)
    path = db_path(resolved)
    if path is not None and not path.exists():
        raise StoreNotFound(f"{path}: no such store; nothing to downgrade")
    return plan_downgrade(_effective_heads(inspect_file(path)), revision)


def downgrade(
    url: str | None = None,
    revision: str = "-1",
    *,
    x: Mapping[str, str] | None = None,
    backup_to: str | os.PathLike[str] | None = None,
    overwrite_backup: bool = False,
    delete_data: bool = False,
    expect: DowngradePlan | None = None,
    progress: Report | None = None,
) -> tuple[str | None, str | None]:
    """Undo revisions of a store (see :func:`plan_downgrade` for what REVISION means);
    return (from, to) revisions.

    Going to base drops every table: on a store that holds sessions or messages it is
    refused (StoreError, nothing changed) unless ``delete_data``. ``backup_to`` is checked
    before anything is opened and written before the first revision runs. ``expect`` (the
    plan a person confirmed) refuses the downgrade, nothing changed, when the store has
    moved since. Interrupted, it raises Interrupted saying where the store was left.
    """
    tracker = Tracker(progress)
    resolved = resolve_url(url, create_home=False)
    how = f"`hermes-store downgrade {revision} --yes --i-know-this-deletes-data`"
    if is_server(resolved):
        if backup_to is not None:
            raise StoreError(
                "--backup copies a SQLite file; on PostgreSQL take a backup with pg_dump "
                "first. Nothing was changed"
            )
        on_server = _confirmed(plan_store_downgrade(resolved, revision), expect)
        return _downgrade_on_server(resolved, on_server, x, delete_data, how, tracker)
    path = db_path(resolved)
    if path is not None and not path.exists():
        raise StoreNotFound(f"{path}: no such store; nothing to downgrade")
    if backup_to is not None:
        check_backup_target(backup_to, path, overwrite=overwrite_backup)
    state: StoreState | None = None
    plan: DowngradePlan | None = None
    try:
        tracker(Phase("classify", "reading the store (read-only)"))
        state = inspect_file(path)
        if state.kind == "new":
            raise StoreNotFound(f"{path}: nothing to downgrade, the store is empty")
        plan = _confirmed(plan_downgrade(_effective_heads(state), revision), expect)
        if not plan.after and not delete_data:
            _refuse_deleting_data(path, how)
        with _writer(
            resolved, None, backup_to, overwrite_backup, existing=True, state=state, report=tracker
        ) as (conn, _, _):
            before = current_revision(conn)
            cfg = alembic_config(resolved, connection=conn, x=x)
            _run_steps(cfg, _plan_runner(plan), revision, tracker)
            _settle(conn)
            return before, current_revision(conn)
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):
            raise
        finish = functools.partial(_downgrade_command, path, revision, plan)
        raise Interrupted(_interruption(resolved, tracker.last, state, finish)) from exc


def _downgrade_on_server(
    url: str,
    plan: DowngradePlan,
    x: Mapping[str, str] | None,
    delete_data: bool,
    how: str,
    report: Report,
) -> tuple[str | None, str | None]:
    """`downgrade` on PostgreSQL: the planned steps through env.py, under its lock."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            before = current_revision(conn)
            if not plan.after and not delete_data:
                server.refuse_deleting_data(conn, how)
        # Checked above: env.py need not refuse it again.
        x_args = {**(x or {}), DELETE_DATA_X: "true"}
        _run_steps(alembic_config(url, x=x_args), _plan_runner(plan), plan.target, report)
        with engine.connect() as conn:
            return before, current_revision(conn)
    finally:
        engine.dispose()


def _downgrade_command(
    path: Path | None, revision: str, plan: DowngradePlan | None, after: StoreState | None
) -> str:
    """The `hermes-store downgrade` command line that finishes an interrupted one: the same
    target, or for -N the steps of the plan still to undo."""
    target = revision
    relative = _RELATIVE.fullmatch(revision.strip())
    if relative is not None and plan is not None and after is not None:
        applied = _applied(_effective_heads(after))
        script = script_directory()
        left = [
            name
            for name in plan.undone
            if name in applied and not _revision(script, name).is_merge_point
        ]
        target = f"{relative['branch']}@-{len(left)}" if relative["branch"] else f"-{len(left)}"
    return f"hermes-store downgrade {target}" + (f" --db {path}" if path is not None else "")


def _confirmed(plan: DowngradePlan, expect: DowngradePlan | None) -> DowngradePlan:
    if expect is not None and plan != expect:
        raise StoreError(
            f"the store moved since the downgrade was confirmed (it is at "
            f"{', '.join(plan.before) or 'base'}, not {', '.join(expect.before) or 'base'}); "
            "nothing was changed: run it again to see what it would undo"
        )
    return plan


#: What was happening when an upgrade or a downgrade was interrupted, by phase kind.
_DOING = {
    "classify": "before anything was written",
    "backup": "while taking the backup: its partial copy was removed, the store not written",
    "adopt": "while adopting the legacy store: that transaction was rolled back",
    "verify": "while verifying the search indexes (a read): nothing was converted",
    "revision": "while running the revisions: the one in progress was rolled back whole",
    "heal": "while checking the search mechanism: that transaction was rolled back",
    "free": "while freeing what the search conversion set aside: the revisions are all done",
}


def _interruption(
    resolved: str,
    phase: Phase | None,
    before: StoreState | None,
    finish: str | Callable[[StoreState | None], str],
    *,
    created: bool = False,
) -> str:
    """What an interrupted upgrade or downgrade tells the operator, read from the store
    afterwards: what was in flight and what became of it, where the store is, what is left
    and the command that finishes it (``finish``, or made from the store as it was left)."""
    kind = phase.kind if phase is not None else "classify"
    doing = _DOING.get(kind, f"while {phase.label if phase else kind}")
    path = db_path(resolved)
    try:
        after = inspect_file(path) if path is not None and path.exists() else None
        names, rows, size, change_log = _left_over(resolved) if after else ([], 0, None, False)
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
        applied = phase.item in _applied(_effective_heads(after)) if after else False
        verb = "the downgrade of revision" if undoing else "revision"
        doing = (
            f"during {verb} {phase.item}, which was rolled back whole"
            if applied == undoing
            else f"after {verb} {phase.item} was done"
        )
    if after is None or after.kind == "new":
        where = "no store was created" if created else "the store is empty"
    else:
        where = f"the store is at {_where(after)}"
        if before is not None and _where(before) != _where(after):
            where += f" (it was at {_where(before)})"
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


def _where(state: StoreState) -> str:
    if state.kind == "legacy":
        return f"legacy schema {state.legacy_version} (unversioned)"
    return f"revision {state.revision}" if state.revision else "no revision (empty)"


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
    with _read_only(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        for table in ("sessions", "messages"):
            if table in tables:
                held[table] = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    if any(held.values()):
        raise server.deleting_data_refused(held, how)


def schema_differences(conn: Connection, revision: str) -> list[str]:
    """How the store on ``conn`` differs from what ``revision`` declares (empty: it matches).

    Compared: `schema_version` with the application version the revision includes, the
    tables and their columns with a store created at that version, and the search layout
    (external content once the revision includes the FTS branch, inline before).
    """
    script = script_directory()
    wanted = tuple(rev.revision for rev in script.get_revisions(revision) if rev is not None)
    if not wanted:
        return []  # base: nothing is declared
    included = {rev.revision for rev in script.iterate_revisions(wanted, "base")}
    version = max(int(rev) for rev in included if rev.isdigit())
    problems: list[str] = []
    with joined_transaction(conn):
        try:
            found = conn.exec_driver_sql("SELECT version FROM schema_version").scalar()
        except DBAPIError:
            found = None
        if found != version:
            problems.append(f"schema_version is {found}, revision {revision} means {version}")
        actual = _describe(conn)
        layout = fts.layout(conn)
    reference = reference_schema(str(version))
    for table, spec in reference.items():
        if table not in actual:
            problems.append(f"table {table} is missing")
            continue
        missing = sorted(set(spec["columns"]) - set(actual[table]["columns"]))
        extra = sorted(set(actual[table]["columns"]) - set(spec["columns"]))
        if missing:
            problems.append(f"{table} lacks {', '.join(missing)}")
        if extra:
            problems.append(f"{table} has {', '.join(extra)}, which {version} does not")
    for table in sorted(set(actual) - set(reference) - {"alembic_version"}):
        problems.append(f"table {table} is not in schema {version}")
    expected = "external" if FTS_EXTERNAL_REVISION in included else "inline"
    if layout != expected:
        problems.append(f"the search layout is {layout}, revision {revision} means {expected}")
    return problems


def _more(rest: list[str]) -> str:
    return f" (and {len(rest)} more differences)" if rest else ""


def stamp(url: str | None, revision: str) -> tuple[str | None, str | None]:
    """Record ``revision`` in alembic_version without running anything; return (from, to).

    Refused (StoreError, nothing changed) unless the store really has the schema that
    revision declares (see :func:`schema_differences`): a stamp that lies would make the
    next upgrade skip or repeat steps.
    """
    check_revision(revision)
    resolved = resolve_url(url, create_home=False)
    path = db_path(resolved)
    engine = create_store_engine(resolved, create=False)
    try:
        with sqlite_errors(path), engine.connect() as conn:
            conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            problems = schema_differences(conn, revision)
            if problems:
                raise StoreError(
                    f"stamp {revision} refused, the store does not have that schema: "
                    f"{'; '.join(problems[:4])}{_more(problems[4:])}. Nothing was changed. "
                    "`hermes-store upgrade` adopts an unversioned store by itself"
                )
            before = current_revision(conn)
            cfg = alembic_config(resolved, connection=conn)
            command.stamp(cfg, revision, purge=True)
            _settle(conn)
            return before, current_revision(conn)
    finally:
        engine.dispose()


def run_env(
    config: Config,
    run: Callable[..., None],
    *,
    x: Mapping[str, str],
    runs_revisions: bool,
    destination: str | None,
) -> None:
    """What env.py does online: find the connection, prepare the store once, run ``run``.

    ``runs_revisions`` is False for commands that run none (current, check, history);
    ``destination`` is the revision they run to (the head's id for 'head', None for
    'base'). Called with a connection that the library already prepared
    (``config.attributes["prepared"]``), it only runs.
    """
    connection = config.attributes.get("connection")
    if isinstance(connection, Engine):  # pytest-alembic passes its `alembic_engine`
        with connection.connect() as conn:
            conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            run(conn)
        return
    if connection is not None:
        if connection.dialect.name != "sqlite":
            if runs_revisions:
                server.refuse_foreign_database(connection)
        elif runs_revisions and not config.attributes.get("prepared"):
            prepare_store(connection, _state_of(connection))
        run(connection)
        return
    resolved = resolve_url(x.get("db") or None, create_home=runs_revisions)
    verb, raw = _alembic_command(config)
    if config.attributes.get("planned"):  # the library's own steps (see _run_steps)
        verb = raw = None
    if is_server(resolved):
        _run_env_on_server(
            resolved,
            run,
            x=x,
            runs_revisions=runs_revisions,
            destination=destination,
            verb=verb,
            raw=raw,
            planned=bool(config.attributes.get("planned")),
        )
        return
    path = db_path(resolved)
    if not runs_revisions:  # reading: never create or adopt anything
        engine = create_store_engine(resolved, create=False)
        try:
            with sqlite_errors(path), engine.connect() as conn:
                run(conn)
        finally:
            engine.dispose()
        return
    finish = f"alembic -x db={path} {verb or 'upgrade'} {raw or destination or 'base'}"
    tracker = Tracker()
    state = None
    try:
        tracker(Phase("classify", "reading the store (read-only)"))
        state = inspect_file(path)
        _run_env_on_file(
            resolved, state, run, x=x, destination=destination, verb=verb, raw=raw, report=tracker
        )
    except KeyboardInterrupt as exc:  # `alembic` shows a CommandError in one line
        raise StoreError(_interruption(resolved, tracker.last, state, finish)) from exc


def _alembic_command(config: Config) -> tuple[str | None, str | None]:
    """The verb (``upgrade``, ``downgrade``, ``stamp``...) and the revision argument as typed
    when the `alembic` command line runs (Alembic's own resolved argument drops a branch
    label: ``fts@-1`` reads ``-1``); (None, None) when called from code."""
    cmd = getattr(config.cmd_opts, "cmd", None)
    verb = getattr(cmd[0], "__name__", None) if isinstance(cmd, tuple) and cmd else None
    raw = getattr(config.cmd_opts, "revision", None)
    return verb, raw if isinstance(raw, str) else None


def _run_env_on_file(
    resolved: str,
    state: StoreState,
    run: Callable[..., None],
    *,
    x: Mapping[str, str],
    destination: str | None,
    verb: str | None,
    raw: str | None,
    report: Report,
) -> None:
    """env.py on a SQLite file: the upgrade's workflow around Alembic's own command."""
    path = db_path(resolved)
    if raw is not None or destination is not None:
        check_revision(raw or destination or "")
    app_version = parse_app_version(x[APP_VERSION_X]) if x.get(APP_VERSION_X) else None
    if app_version is not None and destination != head_revision():
        raise StoreError(
            f"-x {APP_VERSION_X}=N says where to stop: run `alembic -x {APP_VERSION_X}=N "
            "upgrade head`, not another target"
        )
    overrides: dict[str, Any] = {}
    upgrading = verb not in ("downgrade", "stamp")
    if upgrading and destination == head_revision():
        # The steps `hermes-store upgrade` runs, in its order (Alembic's own order would
        # convert the search layout before the application's steps, and revision 23 then
        # records another flag): the same store either way.
        targets = _targets(None, app_version)
        overrides["fn"] = lambda rev, _context: _steps_to(targets, tuple(sorted(rev)))
    to_base = destination is None
    if verb == "downgrade" and raw is not None:
        # The same steps as `hermes-store downgrade` (see plan_downgrade): `-1` from the
        # merge head is one step, not Alembic's "Ambiguous walk".
        plan = plan_downgrade(_effective_heads(state), raw)
        runner = _plan_runner(plan)
        overrides["fn"] = lambda heads, _context: runner(tuple(sorted(heads)))
        to_base = not plan.after
    overwrite = x.get(BACKUP_OVERWRITE_X, "").lower() in ("1", "true", "yes")
    if x.get(BACKUP_X):
        check_backup_target(x[BACKUP_X], path, overwrite=overwrite)
    if to_base and x.get(DELETE_DATA_X, "").lower() not in ("1", "true", "yes"):
        _refuse_deleting_data(path, f"`alembic -x {DELETE_DATA_X}=true downgrade base`")
    if app_version is not None and app_version < LAST_APP_VERSION:
        planned: Sequence[str] = _targets(None, app_version)
    else:
        planned = destination.split(",") if destination else ()
    with (
        _writer(
            resolved,
            app_version,
            x.get(BACKUP_X) or None,
            overwrite,
            space_for=(planned, x) if upgrading else None,
            state=state,
            report=report,
        ) as (conn, _, _),
        _change_log_removed_on_failure(conn),
    ):
        if destination in (head_revision(), fts_head_revision()) and x.get("fts_convert") != (
            "rebuild"
        ):
            _verified_ahead(conn, report)
        report(Phase("revision", "running the revisions"))
        run(conn, **overrides)
        if upgrading:  # the same store as `hermes-store upgrade` leaves
            _finish_upgrade(conn, report)


def _run_env_on_server(
    url: str,
    run: Callable[..., None],
    *,
    x: Mapping[str, str],
    runs_revisions: bool,
    destination: str | None,
    verb: str | None = None,
    raw: str | None = None,
    planned: bool = False,
) -> None:
    """env.py on PostgreSQL: the same targets and steps, none of a file's workflow
    (``planned``: the library chose the steps already)."""
    for option in (BACKUP_X, "fts_backfill"):
        if x.get(option):
            raise StoreError(
                f"-x {option} is for SQLite stores; on PostgreSQL back up with pg_dump, and "
                "the search indexes are built by the upgrade itself"
            )
    if runs_revisions and (raw is not None or destination is not None):
        check_revision(raw or destination or "")
    app_version = parse_app_version(x[APP_VERSION_X]) if x.get(APP_VERSION_X) else None
    deletes_data_ok = x.get(DELETE_DATA_X, "").lower() in ("1", "true", "yes")
    how = f"`alembic -x {DELETE_DATA_X}=true downgrade base`"
    overrides: dict[str, Any] = {}
    if verb == "downgrade" and raw is not None:
        target = raw

        def downgrade_steps(heads: Any, context: Any) -> list[MigrationStep]:
            plan = plan_downgrade(tuple(sorted(heads)), target)
            if not plan.after and not deletes_data_ok:
                server.refuse_deleting_data(context.connection, how)
            return plan.steps()

        overrides["fn"] = downgrade_steps
    elif verb != "stamp" and destination == head_revision() and not planned:
        targets = _targets(None, app_version)
        overrides["fn"] = lambda rev, _context: _steps_to(targets, tuple(sorted(rev)))
    server.run_revisions(
        url,
        run,
        runs_revisions=runs_revisions,
        deletes_data_ok=deletes_data_ok,
        destination=destination,
        how=how,
        lock_timeout=server.lock_timeout_ms(x),
        **overrides,
    )


def _state_of(connection: Connection) -> StoreState:
    """Classify the store behind a caller's connection (tests, pytest-alembic)."""
    with joined_transaction(connection):
        tables = frozenset(
            str(row[0])
            for row in connection.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))
        )
        if "alembic_version" in tables:
            rows = connection.execute(text("SELECT version_num FROM alembic_version"))
            revisions = tuple(sorted(str(row[0]) for row in rows))
            version = connection.execute(text("SELECT version FROM schema_version")).scalar()
            if _is_misstamped(connection, revisions, version):
                return StoreState(
                    None, "alembic", _MISSTAMPED_REAL_VERSION, revisions, tables, misstamped=True
                )
            return StoreState(None, "alembic", version, revisions, tables)
        if "schema_version" in tables:
            version = connection.execute(text("SELECT version FROM schema_version")).scalar()
            return StoreState(None, "legacy", version, (), tables)
        return StoreState(None, "new", tables=tables)


def _settle(conn: Connection) -> None:
    """End the read transaction Alembic's version lookup may leave open on ``conn``.

    Each revision commits its own transaction; a transaction still open between commands
    holds only reads (or, after a no-op target, would swallow the next command's revisions
    into it), so it is committed.
    """
    if conn.in_transaction():
        conn.commit()


def current_revision(conn: Connection) -> str | None:
    """The Alembic revision(s) a connection's store is at, comma-separated (None: unversioned)."""
    with joined_transaction(conn):
        heads = MigrationContext.configure(conn).get_current_heads()
    return ", ".join(sorted(heads)) or None


def env_url(x_args: Mapping[str, str]) -> str:
    """The URL env.py uses: ``-x db=...``, else $HERMES_STORE_URL, else the legacy default."""
    return resolve_url(x_args.get("db") or None, create_home=False)


__all__ = [
    "BackupResult",
    "Prepared",
    "StoreState",
    "UpgradeResult",
    "adopt",
    "alembic_config",
    "backup",
    "current_revision",
    "downgrade",
    "head_revision",
    "inspect_file",
    "parse_app_version",
    "prepare_store",
    "restamp_misstamped",
    "run_env",
    "schema_differences",
    "script_directory",
    "stamp",
    "upgrade",
]

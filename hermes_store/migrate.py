"""Programmatic upgrade / current, and adoption of stores that were never under Alembic."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from alembic import command
from alembic import context as alembic_context
from hermes_store import backfill, fts, server, space
from hermes_store.backup import BackupResult, backup, backup_from
from hermes_store.backup import check_target as check_backup_target
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
    NotADatabase,
    SchemaTooNew,
    SchemaTooOld,
    StoreError,
    StoreNotFound,
    StoreReadOnly,
    UnknownSchema,
)
from hermes_store.maintenance import truncate_wal
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
from hermes_store.storage import FTS_SHADOWS, btree_bytes

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
) -> Prepared:
    """Back up, then restamp or adopt the store, on the connection the revisions will use.

    The backup is taken first, before anything writes; a new store has nothing to copy.
    """
    taken = None
    if backup_to is not None and state.kind != "new":
        driver = connection.connection.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        taken = backup_from(driver, backup_to, overwrite=overwrite_backup)
    elif backup_to is not None:
        log.info("backup: the store is new, nothing to back up; %s not written", backup_to)
    restamped = adopted = None
    if state.misstamped:
        restamped = restamp_misstamped(connection)
    elif state.kind == "legacy":
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
    """
    x_args = dict(x or {})
    if app_version is None and x_args.get(APP_VERSION_X):
        app_version = parse_app_version(x_args.pop(APP_VERSION_X))
    elif app_version is not None:
        app_version = parse_app_version(app_version)
    targets = _targets(revision, app_version)
    resolved = resolve_url(url, create_home=False)
    if is_server(resolved):
        if backup_to is not None:
            raise StoreError(
                "--backup copies a SQLite file; on PostgreSQL take a backup with pg_dump "
                "before the upgrade. Nothing was changed"
            )
        return _upgrade_on_server(resolved, targets, x_args, app_version)
    path = db_path(resolved)
    created = _missing(path)
    if created and not create:
        raise StoreNotFound(
            f"{path}: no such store; nothing was created. Check the path (--db, "
            f"{ENV_URL}), or pass --create to start a new, empty store there"
        )
    if backup_to is not None:
        check_backup_target(backup_to, path, overwrite=overwrite_backup)
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
        ) as (conn, state, prepared),
    ):
        _, schema_before, layout_before = _facts(conn)
        cfg = alembic_config(resolved, connection=conn, x=x_args)
        converting = x_args.get("fts_convert") != "rebuild" and any(
            target in ("head", "heads", fts_head_revision()) for target in targets
        )
        with _change_log_removed_on_failure(conn):
            if converting:
                verify_ahead(conn)
            for target in targets:
                _settle(conn)
                command.upgrade(cfg, target)
            _settle(conn)
            with joined_transaction(conn):
                healed = _heal_search(conn)
            # The copies an in-place conversion set aside, freed in short steps (not in its
            # lock; a kill here leaves them to the next upgrade, optimize or optimize-storage).
            _free_set_aside(conn)
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
    url: str, targets: Sequence[str], x_args: Mapping[str, str], app_version: int | None
) -> UpgradeResult:
    """`upgrade` on PostgreSQL: each target through env.py, which holds the upgrade lock."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            before, schema_before, layout_before = server.facts(conn)
        for target in targets:
            command.upgrade(alembic_config(url, x=x_args), target)
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
) -> Iterator[tuple[Connection, StoreState, Prepared]]:
    """Classify the store once (read-only), then hold one connection that takes the write
    lock at each BEGIN, with the backup taken and the store adopted or restamped on it.

    ``existing=True`` refuses a store that does not exist yet instead of creating it.
    ``space_for`` (the targets and ``-x`` options of an upgrade) refuses, before anything
    is written, an upgrade the disk has no room for (see :func:`check_upgrade_space`).
    ``locks`` receives the duration of each write transaction on that connection, from the
    adoption or restamp to the end of the block.
    """
    path = db_path(resolved)
    state = inspect_file(path)
    if existing and state.kind == "new":
        raise StoreNotFound(f"{path}: nothing to downgrade, the store does not exist")
    _refuse_going_back(state, app_version)
    if revision is not None:
        _refuse_older_revision(state, revision)
    require_writable(path)
    if space_for is not None:
        check_upgrade_space(state, *space_for, backup_to=backup_to)
    if path is not None:  # the first commit's sync then has nothing of the store to wait for
        flush_to_disk(path)
    engine = create_store_engine(resolved)
    try:
        with sqlite_errors(path), engine.connect() as conn:
            conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            with (
                _timed_transactions(conn, locks) if locks is not None else contextlib.nullcontext()
            ):
                prepared = prepare_store(
                    conn, state, backup_to=backup_to, overwrite_backup=overwrite_backup
                )
                yield conn, state, prepared
    finally:
        engine.dispose()


def _free_set_aside(conn: Connection) -> None:
    """Free what the conversion set aside, in short steps; a full disk (each freed page is
    written zeroed with secure_delete) leaves the rest for later instead of failing an
    upgrade that is done."""
    try:
        backfill.drop_retired(conn)
    except DiskFull as exc:
        log.warning(
            "%s; the copies the conversion set aside are left in the store: run "
            "`hermes-store optimize` once space is freed",
            str(exc).split(";")[0],
        )


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
    file system. The need is what the pending steps write (:mod:`hermes_store.space`): the
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


def downgrade(
    url: str | None = None,
    revision: str = "-1",
    *,
    x: Mapping[str, str] | None = None,
    backup_to: str | os.PathLike[str] | None = None,
    overwrite_backup: bool = False,
    delete_data: bool = False,
) -> tuple[str | None, str | None]:
    """Run ``alembic downgrade`` on a store; return (from, to) revisions.

    Going to ``base`` drops every table: on a store that holds sessions or messages it is
    refused (StoreError, nothing changed) unless ``delete_data``. ``backup_to`` is checked
    before anything is opened and written before the first revision runs.
    """
    resolved = resolve_url(url, create_home=False)
    if is_server(resolved):
        if backup_to is not None:
            raise StoreError(
                "--backup copies a SQLite file; on PostgreSQL take a backup with pg_dump "
                "first. Nothing was changed"
            )
        engine = create_store_engine(resolved, create=False)
        try:
            with engine.connect() as conn:
                before = current_revision(conn)
                if revision == "base" and not delete_data:
                    server.refuse_deleting_data(
                        conn, "`hermes-store downgrade base --yes --i-know-this-deletes-data`"
                    )
            # Checked above: env.py need not refuse it again.
            x_args = {**(x or {}), DELETE_DATA_X: "true"}
            command.downgrade(alembic_config(resolved, x=x_args), revision)
            with engine.connect() as conn:
                return before, current_revision(conn)
        finally:
            engine.dispose()
    path = db_path(resolved)
    if path is not None and not path.exists():
        raise StoreNotFound(f"{path}: no such store; nothing to downgrade")
    if backup_to is not None:
        check_backup_target(backup_to, path, overwrite=overwrite_backup)
    if revision == "base" and not delete_data:
        _refuse_deleting_data(
            path, "`hermes-store downgrade base --yes --i-know-this-deletes-data`"
        )
    with _writer(resolved, None, backup_to, overwrite_backup, existing=True) as (conn, _, _):
        before = current_revision(conn)
        command.downgrade(alembic_config(resolved, connection=conn, x=x), revision)
        _settle(conn)
        return before, current_revision(conn)


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
    resolved = resolve_url(url, create_home=False)
    path = db_path(resolved)
    engine = create_store_engine(resolved, create=False)
    try:
        with sqlite_errors(path), engine.connect() as conn:
            conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            # An unknown revision name raises Alembic's CommandError, which says so.
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
    if is_server(resolved):
        _run_env_on_server(
            resolved, run, x=x, runs_revisions=runs_revisions, destination=destination
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
    app_version = parse_app_version(x[APP_VERSION_X]) if x.get(APP_VERSION_X) else None
    if app_version is not None and destination != head_revision():
        raise StoreError(
            f"-x {APP_VERSION_X}=N says where to stop: run `alembic -x {APP_VERSION_X}=N "
            "upgrade head`, not another target"
        )
    overrides: dict[str, Any] = {}
    if app_version is not None and app_version < LAST_APP_VERSION:
        # Alembic's own step planner (what `alembic upgrade` uses), over both targets.
        targets = tuple(_targets(None, app_version))
        # It resolves a tuple of revisions as several targets; its annotation says str.
        overrides["fn"] = lambda rev, _context: script_directory()._upgrade_revs(
            targets,  # type: ignore[arg-type]
            rev,
        )
    overwrite = x.get(BACKUP_OVERWRITE_X, "").lower() in ("1", "true", "yes")
    if x.get(BACKUP_X):
        check_backup_target(x[BACKUP_X], path, overwrite=overwrite)
    if destination is None and x.get(DELETE_DATA_X, "").lower() not in ("1", "true", "yes"):
        _refuse_deleting_data(path, f"`alembic -x {DELETE_DATA_X}=true downgrade base`")
    if app_version is not None and app_version < LAST_APP_VERSION:
        planned: Sequence[str] = _targets(None, app_version)
    else:
        planned = destination.split(",") if destination else ()
    with (
        _writer(
            resolved, app_version, x.get(BACKUP_X) or None, overwrite, space_for=(planned, x)
        ) as (conn, _, _),
        _change_log_removed_on_failure(conn),
    ):
        if destination in (head_revision(), fts_head_revision()) and x.get("fts_convert") != (
            "rebuild"
        ):
            verify_ahead(conn)
        run(conn, **overrides)


def _run_env_on_server(
    url: str,
    run: Callable[..., None],
    *,
    x: Mapping[str, str],
    runs_revisions: bool,
    destination: str | None,
) -> None:
    """env.py on PostgreSQL: the same targets, none of a file's workflow (see server)."""
    for option in (BACKUP_X, "fts_backfill"):
        if x.get(option):
            raise StoreError(
                f"-x {option} is for SQLite stores; on PostgreSQL back up with pg_dump, and "
                "the search indexes are built by the upgrade itself"
            )
    app_version = parse_app_version(x[APP_VERSION_X]) if x.get(APP_VERSION_X) else None
    overrides: dict[str, Any] = {}
    if app_version is not None and app_version < LAST_APP_VERSION:
        targets = tuple(_targets(None, app_version))
        overrides["fn"] = lambda rev, _context: script_directory()._upgrade_revs(
            targets,  # type: ignore[arg-type]
            rev,
        )
    server.run_revisions(
        url,
        run,
        runs_revisions=runs_revisions,
        deletes_data_ok=x.get(DELETE_DATA_X, "").lower() in ("1", "true", "yes"),
        destination=destination,
        how=f"`alembic -x {DELETE_DATA_X}=true downgrade base`",
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

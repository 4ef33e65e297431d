"""Programmatic upgrade / current, and adoption of stores that were never under Alembic."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import StaticPool

from alembic import command
from hermes_store.backup import BackupResult, backup, backup_from
from hermes_store.engine import (
    BEGIN_OPTION,
    check_side_files,
    create_store_engine,
    db_path,
    require_writable,
    resolve_url,
    sqlite_errors,
    writable_problem,
)
from hermes_store.errors import (
    NotADatabase,
    SchemaTooNew,
    SchemaTooOld,
    StoreError,
    StoreNotFound,
    StoreReadOnly,
    UnknownSchema,
)

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCRIPT_LOCATION = PROJECT_ROOT / "alembic"
FIRST_LEGACY = 17
LAST_LEGACY = 21
SQLITE_MAGIC = b"SQLite format 3\x00"
#: Tables a store must have, with the columns that identify it as a Hermes session store.
CORE_COLUMNS = {
    "sessions": {"id", "source", "started_at"},
    "messages": {"id", "session_id", "role", "content", "timestamp"},
}
#: ``-x`` arguments that ask env.py for a backup before any revision runs.
BACKUP_X = "backup"
BACKUP_OVERWRITE_X = "backup_overwrite"
#: Objects adoption leaves alone: search is converted by the revisions themselves.
_NOT_ADOPTED_PREFIXES = ("messages_fts", "sqlite_")


@dataclass(frozen=True)
class StoreState:
    """What a database file holds before any migration touches it."""

    path: Path | None
    kind: str  # "new" (missing or empty), "legacy" (no alembic_version) or "alembic"
    legacy_version: int | None = None
    revision: str | None = None
    tables: frozenset[str] = field(default_factory=frozenset)


def alembic_config(
    url: str | None = None,
    *,
    connection: Connection | None = None,
    x: Mapping[str, str] | None = None,
) -> Config:
    """An Alembic config for this project's revisions, without reading alembic.ini's URL."""
    if not (SCRIPT_LOCATION / "env.py").is_file():
        raise StoreError(
            f"the Alembic revisions were not found at {SCRIPT_LOCATION}; install hermes-store "
            "from its source tree (`pip install -e .`)"
        )
    ini = PROJECT_ROOT / "alembic.ini"
    cfg = Config(str(ini) if ini.is_file() else None)
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    x_args = dict(x or {})
    if url is not None:
        x_args["db"] = url
    cfg.cmd_opts = argparse.Namespace(x=[f"{k}={v}" for k, v in x_args.items()])
    cfg.attributes["configure_logging"] = False
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def script_directory() -> ScriptDirectory:
    """The revision scripts of this package."""
    return ScriptDirectory.from_config(alembic_config())


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
            problem = writable_problem(path) if "unable to open" in str(exc) else None
            if problem is not None:
                raise StoreReadOnly(
                    f"{path}: the store is read-only and SQLite cannot open it: {problem} (a "
                    f"WAL store needs {path.name}-shm even to be read); nothing was changed. "
                    "Copy the store to a writable place to use it"
                ) from exc
            raise NotADatabase(f"{path}: SQLite cannot read this file ({exc})") from exc
        if "alembic_version" in tables:
            revision = _alembic_revision(conn)
            known = {rev.revision for rev in (script or script_directory()).walk_revisions()}
            if revision is not None and revision not in known:
                raise SchemaTooNew(
                    f"{path} is at revision {revision!r}, which this hermes-store does not know: "
                    "it was written by a newer hermes-store (upgrade the package) or by another "
                    "application"
                )
            return StoreState(
                path, "alembic", _legacy_version(conn, path, tables), revision, tables
            )
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
                "hermes-store adopts; it was written by a newer Hermes agent. Upgrade hermes-store"
            )
        _check_core_tables(conn, path, version, tables)
        return StoreState(path=path, kind="legacy", legacy_version=version, tables=tables)


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    try:
        yield conn
    finally:
        conn.close()


def _alembic_revision(conn: sqlite3.Connection) -> str | None:
    rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    return str(rows[0][0]) if rows else None


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
    with engine.begin() as conn:
        context = MigrationContext.configure(conn)
        with Operations.context(context):
            for step in reversed(steps):
                step.module.upgrade()
        return _describe(conn)


def _describe(conn: Connection) -> dict[str, dict[str, Any]]:
    tables: dict[str, dict[str, Any]] = {}
    rows = conn.execute(
        text("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL")
    ).all()
    for kind, name, _table, sql in rows:
        if kind == "table" and not name.startswith(_NOT_ADOPTED_PREFIXES):
            columns = {row[1]: row for row in conn.exec_driver_sql(f"PRAGMA table_info('{name}')")}
            tables[name] = {"sql": sql, "columns": columns, "indexes": {}}
    for kind, name, table, sql in rows:
        if kind == "index" and table in tables:
            tables[table]["indexes"][name] = sql
    return tables


def adopt(connection: Connection, script: ScriptDirectory) -> str | None:
    """Bring an unversioned legacy store to the full schema of its version and stamp it.

    Returns the stamped revision, or None when the store is new or already versioned.
    Adds only what is missing (columns, tables, indexes of its version: the legacy
    "drift set" above all); rewrites no data. Runs in one transaction.
    """
    with connection.begin():
        tables = {
            row[0]
            for row in connection.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))
        }
        if "alembic_version" in tables or "schema_version" not in tables:
            return None
        version = int(connection.execute(text("SELECT version FROM schema_version")).scalar_one())
        if version > LAST_LEGACY:
            raise SchemaTooNew(f"legacy schema {version} is newer than {LAST_LEGACY}")
        if version < FIRST_LEGACY:
            raise SchemaTooOld(f"legacy schema {version} is older than {FIRST_LEGACY}")
        revision = str(version)
        added = _add_missing(connection, reference_schema(revision))
        MigrationContext.configure(connection).stamp(script, revision)
    log.info(
        "adopted legacy store at schema %s%s; stamped revision %s",
        revision,
        f" (added {', '.join(added)})" if added else "",
        revision,
    )
    return revision


def _add_missing(connection: Connection, reference: dict[str, dict[str, Any]]) -> list[str]:
    actual = _describe(connection)
    added: list[str] = []
    for table, spec in reference.items():
        if table not in actual:
            connection.exec_driver_sql(spec["sql"])
            added.append(f"table {table}")
            actual_indexes: set[str] = set()
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
            actual_indexes = set(actual[table]["indexes"])
        for index, sql in spec["indexes"].items():
            if index not in actual_indexes:
                connection.exec_driver_sql(sql)
                added.append(f"index {index}")
    return added


def prepare(url: str | None = None) -> tuple[str, StoreState]:
    """Resolve the URL and classify the file before anything writes to it."""
    resolved = resolve_url(url)
    return resolved, inspect_file(db_path(resolved))


def _with_backup(
    x: Mapping[str, str] | None, backup_to: str | os.PathLike[str] | None, overwrite: bool
) -> dict[str, str]:
    """The -x arguments, with the backup request env.py acts on before any revision."""
    x_args = dict(x or {})
    if backup_to is not None:
        x_args[BACKUP_X] = str(Path(backup_to).expanduser().absolute())
        if overwrite:
            x_args[BACKUP_OVERWRITE_X] = "true"
    return x_args


def upgrade(
    url: str | None = None,
    revision: str = "head",
    *,
    x: Mapping[str, str] | None = None,
    backup_to: str | os.PathLike[str] | None = None,
    overwrite_backup: bool = False,
) -> tuple[str | None, str | None]:
    """Run ``alembic upgrade`` on a store (adopting a legacy one); return (from, to) revisions.

    With ``backup_to`` a consistent copy of the store is written there first (see
    :func:`hermes_store.backup.backup_from`), before adoption or any revision touches it.
    A full disk, a read-only store or a lock held past the busy timeout raise DiskFull,
    StoreReadOnly or StoreBusy; the revision in progress is rolled back whole.
    """
    resolved, _state = prepare(url)
    path = db_path(resolved)
    require_writable(path)
    x_args = _with_backup(x, backup_to, overwrite_backup)
    return _run(command.upgrade, resolved, path, revision, x_args)


def downgrade(
    url: str | None = None,
    revision: str = "-1",
    *,
    x: Mapping[str, str] | None = None,
    backup_to: str | os.PathLike[str] | None = None,
    overwrite_backup: bool = False,
) -> tuple[str | None, str | None]:
    """Run ``alembic downgrade`` on a store; return (from, to) revisions."""
    resolved, state = prepare(url)
    if state.kind == "new":
        raise StoreNotFound(f"{state.path}: nothing to downgrade, the store does not exist")
    path = db_path(resolved)
    require_writable(path)
    x_args = _with_backup(x, backup_to, overwrite_backup)
    return _run(command.downgrade, resolved, path, revision, x_args)


def _run(
    alembic_command: Callable[[Config, str], None],
    resolved: str,
    path: Path | None,
    revision: str,
    x_args: Mapping[str, str],
) -> tuple[str | None, str | None]:
    """Run an Alembic command on one connection that takes the write lock at BEGIN."""
    with sqlite_errors(path):
        engine = create_store_engine(resolved)
        try:
            with engine.connect() as conn:
                conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
                before = current_revision(conn)
                alembic_command(alembic_config(resolved, connection=conn, x=x_args), revision)
                return before, current_revision(conn)
        finally:
            engine.dispose()


def backup_before_revisions(connection: Connection, x_args: Mapping[str, str]) -> None:
    """Take the backup ``-x backup=PATH`` asks for, on the connection revisions will use.

    A store without any table yet (new or empty) has nothing to back up: no file is
    written. ``-x backup_overwrite=true`` replaces an existing file at PATH.
    """
    dest = x_args.get(BACKUP_X)
    if not dest:
        return
    count = "SELECT count(*) FROM sqlite_master WHERE name != 'sqlite_sequence'"
    if connection.in_transaction():
        tables = connection.exec_driver_sql(count).scalar()
    else:
        with connection.begin():
            tables = connection.exec_driver_sql(count).scalar()
    if not tables:
        log.info("backup: the store is new, nothing to back up; %s not written", dest)
        return
    overwrite = x_args.get(BACKUP_OVERWRITE_X, "").lower() in ("1", "true", "yes")
    driver = connection.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    backup_from(driver, dest, overwrite=overwrite)


def current_revision(conn: Connection) -> str | None:
    """The Alembic revision a connection's store is at (None when unversioned)."""
    with contextlib.ExitStack() as stack:
        if not conn.in_transaction():
            stack.enter_context(conn.begin())
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    """The newest revision this package knows."""
    head = script_directory().get_current_head()
    assert head is not None
    return head


def env_url(x_args: Mapping[str, str]) -> str:
    """The URL env.py uses: ``-x db=...``, else $HERMES_STORE_URL, else the legacy default."""
    return resolve_url(x_args.get("db") or None)


__all__ = [
    "BackupResult",
    "StoreState",
    "adopt",
    "alembic_config",
    "backup",
    "backup_before_revisions",
    "current_revision",
    "downgrade",
    "head_revision",
    "inspect_file",
    "prepare",
    "upgrade",
]

"""Stores that were never under Alembic: classify a file, adopt a legacy store, restamp one.

The Hermes agent writes its own schema versions without Alembic. Adoption compares such a
store with a store created fresh at its version (the revisions run in memory), adds only
what is missing and stamps the matching revision; the chain then carries it up like any
other. These stores are SQLite files: a PostgreSQL database is only ever made by the
revisions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from alembic import context as alembic_context
from hermes_store.engine import joined_transaction, translate_error
from hermes_store.errors import (
    DiskFull,
    NotADatabase,
    SchemaTooNew,
    SchemaTooOld,
    StoreError,
    StoreReadOnly,
    UnknownSchema,
)
from hermes_store.migrate.plan import alembic_config
from hermes_store.migrate.state import (
    FIRST_LEGACY,
    LAST_LEGACY,
    MISSTAMPED_REAL_VERSION,
    MISSTAMPED_REVISION,
    StoreState,
)
from hermes_store.revisions import FTS_EXTERNAL_REVISION, script_directory
from hermes_store.sqlite import fts
from hermes_store.sqlite.engine import check_side_files
from hermes_store.sqlite.readonly import connect_read_only, writable_problem

log = logging.getLogger(__name__)

SQLITE_MAGIC = b"SQLite format 3\x00"
#: Tables a store must have, with the columns that identify it as a Hermes session store.
CORE_COLUMNS = {
    "sessions": {"id", "source", "started_at"},
    "messages": {"id", "session_id", "role", "content", "timestamp"},
}
#: ``-x`` arguments the bare `alembic` command takes besides ``db``.
#: Objects adoption leaves alone: search is converted by the revisions themselves.
_NOT_ADOPTED_PREFIXES = ("messages_fts", "sqlite_")


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
    with read_only(path) as conn:
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
                version = MISSTAMPED_REAL_VERSION
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
def read_only(path: Path) -> Iterator[sqlite3.Connection]:
    conn = connect_read_only(path)
    try:
        yield conn
    finally:
        conn.close()


def _alembic_revisions(conn: sqlite3.Connection) -> tuple[str, ...]:
    rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    return tuple(sorted(str(row[0]) for row in rows))


def _is_misstamped(conn: Any, revisions: tuple[str, ...], version: int | None) -> bool:
    """True for a store an earlier hermes-store stamped "22" without the application's 22.

    The application's 22 puts `task` in the key of `session_model_usage`; that earlier
    revision changed only the search layout. ``conn`` is a sqlite3 or SQLAlchemy connection.
    """
    if revisions != (MISSTAMPED_REVISION,) or version != int(MISSTAMPED_REVISION):
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
        if not state_of(connection).misstamped:
            return False
        connection.execute(
            text("UPDATE schema_version SET version = :v"), {"v": MISSTAMPED_REAL_VERSION}
        )
        connection.execute(text("DELETE FROM alembic_version"))
        connection.execute(
            text("INSERT INTO alembic_version (version_num) VALUES (:a), (:b)"),
            {"a": str(MISSTAMPED_REAL_VERSION), "b": FTS_EXTERNAL_REVISION},
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


def state_of(connection: Connection) -> StoreState:
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
                    None, "alembic", MISSTAMPED_REAL_VERSION, revisions, tables, misstamped=True
                )
            return StoreState(None, "alembic", version, revisions, tables)
        if "schema_version" in tables:
            version = connection.execute(text("SELECT version FROM schema_version")).scalar()
            return StoreState(None, "legacy", version, (), tables)
        return StoreState(None, "new", tables=tables)


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

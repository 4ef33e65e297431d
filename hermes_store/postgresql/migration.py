"""A store on PostgreSQL: running the revisions there, and what the server says about it.

The Alembic chain is the same on both databases (revisions branch on the dialect where
the DDL must differ). What differs is the workflow around it: a PostgreSQL database is
never a legacy Hermes store, so there is nothing to classify, adopt, back up by copying
a file or convert; an upgrade takes a session-level advisory lock so that two deploys
never run revisions at once, and refuses a database that holds tables it does not know.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, inspect, text

from hermes_store.engine import create_store_engine, display_url
from hermes_store.errors import StoreBusy, StoreError
from hermes_store.migrate.state import (
    Admit,
    Request,
    Session,
    StoreState,
    Target,
    deleting_data_refused,
)
from hermes_store.models import Base
from hermes_store.progress import Report
from hermes_store.revisions import head_revision
from hermes_store.sqlite import fts

#: pg_advisory_lock key held while revisions run ("hermes" in ASCII, then 1).
UPGRADE_LOCK_KEY = 0x6865726D657301
#: How long a revision waits for a lock before it gives up (``-x lock_timeout_ms=N``). While
#: a revision waits for a table lock, PostgreSQL queues every later writer of that table
#: behind it: a short wait that fails in one line keeps the agent writing.
MIGRATION_LOCK_TIMEOUT_MS = 3000
LOCK_TIMEOUT_X = "lock_timeout_ms"
#: Tables a hermes-store database may hold beside the models' own.
ALEMBIC_TABLE = "alembic_version"


def foreign_tables(conn: Connection) -> list[str]:
    """Tables of the database's current schema that hermes-store does not own."""
    owned = set(Base.metadata.tables) | {ALEMBIC_TABLE}
    return sorted(set(inspect(conn).get_table_names()) - owned)


def refuse_foreign_database(conn: Connection) -> None:
    """Refuse to run revisions in a database whose tables are someone else's."""
    names = inspect(conn).get_table_names()
    if conn.in_transaction():
        conn.commit()  # only read; the caller's revisions begin their own transactions
    if not names or ALEMBIC_TABLE in names:
        return
    others = foreign_tables(conn)
    raise StoreError(
        f"{display_url(str(conn.engine.url))} already holds tables and was never upgraded "
        f"by hermes-store ({', '.join((others or sorted(names))[:5])}"
        f"{', ...' if len(others or names) > 5 else ''}); nothing was changed. Point the URL "
        "at an empty database (`createdb NAME`)"
    )


def lock_timeout_ms(x: Mapping[str, str]) -> int:
    """The migrations' lock timeout: ``-x lock_timeout_ms=N``, else the default (3 s)."""
    raw = str(x.get(LOCK_TIMEOUT_X, "")).strip()
    if not raw:
        return MIGRATION_LOCK_TIMEOUT_MS
    if not raw.isdigit() or int(raw) == 0:
        raise StoreError(
            f"-x {LOCK_TIMEOUT_X}={raw!r}: expected a whole number of milliseconds above 0 "
            "(0 would let a revision queue the agent's writes behind it without limit)"
        )
    return int(raw)


@contextlib.contextmanager
def upgrade_lock(conn: Connection, *, timeout_ms: int) -> Iterator[None]:
    """Hold the database's upgrade lock (session-level, so across each revision's commit),
    and make every lock the revisions wait for give up after ``timeout_ms``."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        got = conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": UPGRADE_LOCK_KEY})
        if got.scalar():
            break
        conn.rollback()
        if time.monotonic() >= deadline:
            raise StoreBusy(
                "another hermes-store upgrade is running on this database; nothing was "
                "changed. Run the command again when it has finished"
            )
        time.sleep(0.1)
    conn.execute(text(f"SET lock_timeout = {int(timeout_ms)}"))
    conn.commit()  # the lock outlives the transaction; each revision runs in its own
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            if conn.in_transaction():
                conn.rollback()
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": UPGRADE_LOCK_KEY})
            conn.execute(text("RESET lock_timeout"))
            conn.commit()


def held_rows(conn: Connection) -> dict[str, int]:
    """Sessions and messages the database holds (0 for a table that is not there)."""
    names = set(inspect(conn).get_table_names())
    counts: dict[str, int] = {
        table: int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
        for table in ("sessions", "messages")
        if table in names
    }
    if conn.in_transaction():
        conn.rollback()
    return counts


def refuse_deleting_data(conn: Connection, how: str) -> None:
    """Refuse a downgrade to base of a database that holds conversations."""
    held = held_rows(conn)
    if any(held.values()):
        raise deleting_data_refused(held, how, " (pg_dump)")


@contextlib.contextmanager
def migration_connection(request: Request, admit: Admit, report: Report) -> Iterator[Session]:
    """Connect, take the upgrade lock, refuse a database someone else owns, classify it and
    let the workflow ``admit`` it; then the revisions run on this connection."""
    timeout = lock_timeout_ms(request.x)
    engine = create_store_engine(request.target.url, create=request.upgrading)
    try:
        with engine.connect() as conn, upgrade_lock(conn, timeout_ms=timeout):
            refuse_foreign_database(conn)
            state = _state(conn)
            admit(state, lambda how: refuse_deleting_data(conn, how))
            # Each revision runs in a transaction of its own (Alembic begins it), and fts1
            # builds its indexes outside any (CONCURRENTLY).
            if conn.in_transaction():
                conn.commit()
            yield Session(conn, state)
    finally:
        engine.dispose()


@contextlib.contextmanager
def around_revisions(
    conn: Connection, request: Request, report: Report
) -> Iterator[dict[str, str]]:
    """A revision that cannot get a lock within the lock timeout fails as StoreBusy, one
    line; its transaction is rolled back (the revisions before it stay applied)."""
    timeout = lock_timeout_ms(request.x)
    try:
        yield {}
    except StoreBusy as exc:  # the engine's translation of lock_not_available
        raise StoreBusy(
            f"a revision waited {timeout / 1000:g} s for a lock another "
            "session holds (a long transaction on the store's tables) and "
            "gave up, so that the agent's writes were not queued behind it; "
            "that revision was rolled back. Retry when the store is quieter, "
            f"or wait longer with -x {LOCK_TIMEOUT_X}=N"
        ) from exc


def _state(conn: Connection) -> StoreState:
    """The classification of a database: never a legacy store (the revisions made it)."""
    revisions, version, _layout = facts(conn)
    kind = "alembic" if revisions else "new"
    return StoreState(None, kind, version, revisions)


def classify(url: str) -> StoreState:
    """Where the database is, read without writing."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            return _state(conn)
    finally:
        engine.dispose()


def describe(conn: Connection) -> dict[str, Any]:
    """`current` on PostgreSQL: the revision fields, and each search index's state."""
    from hermes_store.postgresql.check import search_index_states

    revisions, version, layout = facts(conn)
    states = search_index_states(conn)
    return {
        "database": display_url(conn.engine.url.render_as_string(hide_password=False)),
        "revision": ", ".join(revisions) or None,
        "legacy_schema": version,
        "head": head_revision(),
        "fts_layout": layout,
        "fts_indexes": {
            name: layout if state != "missing" else "missing" for name, state in states.items()
        },
        "search_indexes": states,
        "backfill": {},
    }


def facts(conn: Connection) -> tuple[tuple[str, ...], int | None, str]:
    """Alembic revisions, application schema version and search layout of the database."""
    names = set(inspect(conn).get_table_names())
    revisions: tuple[str, ...] = ()
    version: int | None = None
    layout = "missing"
    if ALEMBIC_TABLE in names:
        rows = conn.execute(text(f"SELECT version_num FROM {ALEMBIC_TABLE}"))
        revisions = tuple(sorted(str(row[0]) for row in rows))
    if "schema_version" in names:
        found = conn.execute(text("SELECT max(version) FROM schema_version")).scalar()
        version = int(found) if found is not None else None
    if "state_meta" in names:
        marker = conn.execute(
            text("SELECT value FROM state_meta WHERE key = :key"), {"key": fts.LAYOUT_MARKER}
        ).scalar()
        layout = str(marker) if marker else layout
    if conn.in_transaction():
        conn.rollback()
    return revisions, version, layout


@dataclass(frozen=True)
class Relation:
    """One table or index and the bytes the server gives it."""

    name: str
    kind: str  # "table" or "index"
    table: str
    bytes: int


def relations(conn: Connection) -> list[Relation]:
    """Every table of the models (heap + TOAST) and index on them, with its size."""
    rows = conn.execute(
        text(
            """
            SELECT c.relname, 'table', c.relname,
                   pg_table_size(c.oid)
            FROM pg_class c
            WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
            UNION ALL
            SELECT i.relname, 'index', t.relname, pg_relation_size(i.oid)
            FROM pg_index x
            JOIN pg_class i ON i.oid = x.indexrelid
            JOIN pg_class t ON t.oid = x.indrelid
            WHERE t.relnamespace = current_schema()::regnamespace AND t.relkind = 'r'
            ORDER BY 1
            """
        )
    ).all()
    return [
        Relation(str(name), str(kind), str(table), int(size)) for name, kind, table, size in rows
    ]


@contextlib.contextmanager
def store_connection(target: Target) -> Iterator[Connection]:
    """A connection to the database (nothing created)."""
    engine = create_store_engine(target.url, create=False)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()

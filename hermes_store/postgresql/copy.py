"""A copy's endpoints on PostgreSQL: a source database read in one read-only snapshot, a
target database written.

The copy's algorithm (``hermes_store.copy``) reaches these through the PostgreSQL backend:
the transaction mode that makes a whole run read one snapshot, what identifies a database
beyond its URL, the messages' id sequence, the server's diagnostics of a refused batch, and
the VACUUM (ANALYZE) that leaves the planner statistics and the GIN indexes merged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from hermes_store.backend import CopyUpkeep
from hermes_store.engine import create_store_engine
from hermes_store.postgresql import migration, upkeep

#: The port a URL without one names.
DEFAULT_PORT = 5432


def open_source(url: str) -> Engine:
    """The source database; it is only read because each run reads it through
    :func:`snapshot` (a read-only transaction)."""
    return create_store_engine(url, create=False)


def snapshot(conn: Connection) -> Connection:
    """Transactions in REPEATABLE READ, read-only: every statement of one reads one snapshot."""
    return conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)


def same_database(a: str, b: str) -> bool:
    """Whether two URLs name one database of one server (host, port, database name)."""
    ua, ub = make_url(a), make_url(b)
    return (ua.host or "localhost", ua.port or DEFAULT_PORT, ua.database) == (
        ub.host or "localhost",
        ub.port or DEFAULT_PORT,
        ub.database,
    )


def fingerprint(conn: Connection) -> dict[str, Any]:
    """The cluster's system identifier and the database's oid: a database dropped and made
    again under the same name, or another server at the same address, differs."""
    oid = conn.execute(
        text("SELECT oid FROM pg_database WHERE datname = current_database()")
    ).scalar_one()
    system: str | None = None
    try:
        with conn.begin_nested():
            found = conn.execute(text("SELECT system_identifier FROM pg_control_system()"))
            system = str(found.scalar_one())
    except DBAPIError:  # not granted to this role: the oid alone then
        system = None
    return {"system": system, "database_oid": int(oid)}


def refuse_foreign_target(conn: Connection) -> None:
    """Refuse a database without revisions that holds tables hermes-store does not own."""
    if migration.foreign_tables(conn):
        migration.refuse_foreign_database(conn)


def high_water(conn: Connection) -> int:
    """The highest message id handed out: the id sequence's last value, or max(id)."""
    top = int(conn.execute(text("SELECT coalesce(max(id), 0) FROM messages")).scalar_one())
    row = conn.execute(
        text("SELECT pg_sequence_last_value(pg_get_serial_sequence('messages', 'id')::regclass)")
    ).scalar()
    return max(top, int(row or 0))


def raise_ids(conn: Connection, value: int) -> None:
    """Set the messages' id sequence to ``value`` when it is lower."""
    conn.execute(
        text(
            "SELECT setval(pg_get_serial_sequence('messages', 'id'), :value) "
            "WHERE :value > coalesce(pg_sequence_last_value("
            "pg_get_serial_sequence('messages', 'id')::regclass), 0)"
        ),
        {"value": value},
    )


def refusal_reason(error: BaseException | None) -> str:
    """The SQLSTATE and the constraint, column or type the server names; an integrity
    error's primary message (it names the constraint, never a value)."""
    diag = getattr(error, "diag", None)
    sqlstate = getattr(error, "sqlstate", None)
    if diag is None:
        return type(error).__name__
    named = diag.constraint_name or diag.column_name or diag.datatype_name
    reason = f"PostgreSQL error {sqlstate}" + (f" on {named}" if named else "")
    if isinstance(sqlstate, str) and sqlstate.startswith("23") and diag.message_primary:
        reason = str(diag.message_primary)
    return reason


def finish_target(
    conn: Connection,
    tables: Sequence[str],
    progress: Callable[[str, int, int], None] | None = None,
) -> CopyUpkeep:
    """VACUUM (ANALYZE) of each table the copy filled, whatever it wrote: the planner's
    statistics of the new rows and the GIN indexes' pending lists merged before the
    agent's first query (autovacuum, when it is on at all, would come round only later).
    Run on a connection of its own in autocommit, as VACUUM must be (``conn`` keeps its
    transactions); a table the server refuses (a lock held past the busy timeout) is
    named, and `optimize` does it later."""
    with conn.engine.connect() as own:
        auto = own.execution_options(isolation_level="AUTOCOMMIT")
        done, refused = upkeep.vacuum_analyze(auto, tables, progress)
    return CopyUpkeep("VACUUM (ANALYZE)", done, refused)

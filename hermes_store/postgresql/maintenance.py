"""Keeping a PostgreSQL store healthy: counts, and optimize (`VACUUM (ANALYZE)`).

The counterpart of :mod:`hermes_store.sqlite.maintenance` for a database server: there is no
file to shrink, no WAL to checkpoint and no FTS5 segment to merge. What `optimize` means
there is a plain VACUUM of the store's tables (dead row versions made reusable, the
visibility map and the GIN indexes' pending lists brought up to date) with ANALYZE (the
planner's statistics, which the search's expression indexes depend on). It never takes
VACUUM FULL's exclusive lock: the agent keeps writing while it runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

from hermes_store.maintenance import StoreStats, View, human_bytes, store_counts
from hermes_store.models import Base
from hermes_store.postgresql.migration import ALEMBIC_TABLE, relations


def server_stats(conn: Connection) -> StoreStats:
    """Sessions, messages, sessions per source and the database's size."""
    stats = store_counts(conn)
    size = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    if conn.in_transaction():
        conn.rollback()
    stats.sizes = {"database bytes": int(size)}
    return stats


def stats_of(engine: Engine) -> StoreStats:
    """:func:`server_stats` of the store an engine opens."""
    with engine.connect() as conn:
        return server_stats(conn)


@dataclass
class ServerOptimizeResult:
    """What `VACUUM (ANALYZE)` did: the tables it ran on and the store's bytes around it."""

    bytes_before: int
    bytes_after: int
    tables: list[str]
    vacuumed: bool = True
    analyzed: bool = True

    @property
    def reclaimed(self) -> int:
        """Bytes the store's tables and indexes shrank by (VACUUM only returns empty pages
        at the end of a table, so this is often 0: freed space is reused instead)."""
        return self.bytes_before - self.bytes_after

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "reclaimed": self.reclaimed}

    def view(self) -> View:
        """The tables vacuumed and what the store's bytes did."""
        return [
            f"VACUUM (ANALYZE) of {len(self.tables)} tables: "
            f"{human_bytes(self.bytes_before)} -> {human_bytes(self.bytes_after)} "
            f"(reclaimed {human_bytes(self.reclaimed)}); dead rows made reusable and the "
            "planner's statistics refreshed"
        ]


def store_bytes(conn: Connection) -> int:
    """The store's tables (heap and TOAST) and indexes together."""
    total = sum(relation.bytes for relation in relations(conn))
    if conn.in_transaction():
        conn.rollback()
    return total


def store_tables(conn: Connection) -> list[str]:
    """The models' tables (and alembic_version) present in the current schema."""
    rows = conn.execute(
        text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    ).scalars()
    present = {str(name) for name in rows}
    if conn.in_transaction():
        conn.rollback()
    owned = [table.name for table in Base.metadata.sorted_tables] + [ALEMBIC_TABLE]
    return [name for name in owned if name in present]


def optimize_server(engine: Engine) -> ServerOptimizeResult:
    """VACUUM (ANALYZE) each of the store's tables, outside any transaction (as VACUUM
    requires), one table at a time."""
    with engine.connect() as conn:
        before = store_bytes(conn)
        tables = store_tables(conn)
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in tables:
            auto.execute(text(f'VACUUM (ANALYZE) "{table}"'))
    with engine.connect() as conn:
        after = store_bytes(conn)
    return ServerOptimizeResult(before, after, tables)


__all__ = [
    "ServerOptimizeResult",
    "optimize_server",
    "server_stats",
    "stats_of",
    "store_bytes",
    "store_tables",
]

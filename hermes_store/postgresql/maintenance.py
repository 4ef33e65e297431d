"""Keeping a PostgreSQL store healthy: counts, and optimize (GIN pending lists cleaned,
then `VACUUM (ANALYZE)`).

The counterpart of :mod:`hermes_store.sqlite.maintenance` for a database server: there is no
file to shrink, no WAL to checkpoint and no FTS5 segment to merge. What `optimize` means
there is ``gin_clean_pending_list`` on each GIN index of the store (the entries that wait in
its pending list, which every search reads whole, moved into the index proper; the pages
it removed are reported), then a plain VACUUM of the store's tables (dead row versions made
reusable, the visibility map brought up to date) with ANALYZE (the planner's statistics,
which the search's expression indexes depend on). It never takes VACUUM FULL's exclusive
lock: the agent keeps writing while it runs. See docs/operations.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, text

from hermes_store.maintenance import StoreStats, View, human_bytes, store_counts
from hermes_store.models import Base
from hermes_store.postgresql import upkeep
from hermes_store.postgresql.migration import ALEMBIC_TABLE, relations
from hermes_store.progress import Phase, Report


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
    """What optimize did: the pending pages it cleaned from each GIN index (and the rows
    they held, when pgstattuple can tell), the tables VACUUM (ANALYZE) ran on and the
    store's bytes around it."""

    bytes_before: int
    bytes_after: int
    tables: list[str]
    vacuumed: bool = True
    analyzed: bool = True
    #: GIN index -> pages gin_clean_pending_list removed from its pending list.
    pending_pages_cleaned: dict[str, int] = field(default_factory=dict)
    #: GIN index -> rows whose entries those pages held (None: pgstattuple not readable).
    pending_rows_cleaned: dict[str, int] | None = None
    #: Index or table -> why the server refused to clean or vacuum it.
    refused: dict[str, str] = field(default_factory=dict)
    #: What an option asked for that this database does by itself (``--compact``).
    notes: list[str] = field(default_factory=list)

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
        lines: View = [
            f"VACUUM (ANALYZE) of {len(self.tables)} tables: "
            f"{human_bytes(self.bytes_before)} -> {human_bytes(self.bytes_after)} "
            f"(reclaimed {human_bytes(self.reclaimed)}); dead rows made reusable and the "
            "planner's statistics refreshed"
        ]
        if self.pending_pages_cleaned:
            pages = sum(self.pending_pages_cleaned.values())
            each = ", ".join(f"{n} {p:,}" for n, p in self.pending_pages_cleaned.items())
            rows = self.pending_rows_cleaned
            held = f", {sum(rows.values()):,} rows" if rows is not None else ""
            lines.append(
                f"GIN pending lists cleaned: {pages:,} pages{held} moved into the indexes ({each})"
            )
        for name, reason in self.refused.items():
            lines.append(f"not done on {name}: {reason}")
        return lines + self.notes


#: What `optimize --compact` says on PostgreSQL.
NOTHING_TO_COMPACT = (
    "--compact: nothing to rebuild on PostgreSQL: VACUUM makes the GIN indexes' dead "
    "entries reusable, as it did above"
)


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


def optimize_server(engine: Engine, report: Report | None = None) -> ServerOptimizeResult:
    """Clean each GIN index's pending list, then VACUUM (ANALYZE) each of the store's
    tables, outside any transaction (as VACUUM requires), one table at a time; ``report``
    is told each step as it starts."""
    with engine.connect() as conn:
        before = store_bytes(conn)
        tables = store_tables(conn)
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        indexes = [name for name, _table in upkeep.gin_indexes(auto, tables)]
        if report is not None:
            report(Phase("merge", "GIN pending lists cleaned", 0, len(indexes), "indexes"))
        pages, rows, refused = upkeep.clean_pending_lists(auto, indexes)

        def tell(table: str, done: int, total: int) -> None:
            if report is not None and done < total:
                label = f"VACUUM (ANALYZE) {table}"
                report(Phase("vacuum", label, done, total, "tables", item=table))

        done, not_vacuumed = upkeep.vacuum_analyze(auto, tables, tell)
    with engine.connect() as conn:
        after = store_bytes(conn)
    return ServerOptimizeResult(
        before,
        after,
        done,
        vacuumed=not not_vacuumed,
        analyzed=not not_vacuumed,
        pending_pages_cleaned=pages,
        pending_rows_cleaned=rows,
        refused={**refused, **not_vacuumed},
    )


__all__ = [
    "NOTHING_TO_COMPACT",
    "ServerOptimizeResult",
    "optimize_server",
    "server_stats",
    "stats_of",
    "store_bytes",
    "store_tables",
]

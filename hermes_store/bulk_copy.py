"""Copying a store's rows into another database at head: the demo's stand-in for a copy
command.

`hermes-store demo --db URL` builds its corpus in SQLite, then needs the same rows in the
server database to compare the searches on both. This module does that with plain
batched Core inserts of the models' tables, and nothing more (no resumption, no progress,
no verification): :func:`copy_rows` is the one entry point, so that a real copy command
can take its place.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, Table, select, text

from hermes_store.engine import create_store_engine, is_server
from hermes_store.models import Base, StateMeta, schema_version

#: Rows per INSERT batch.
BATCH_ROWS = 2000


def _batches(conn: Connection, table: Table) -> Iterator[Sequence[dict[str, Any]]]:
    order = list(table.primary_key.columns) or list(table.columns)
    result = conn.execution_options(stream_results=True).execute(select(table).order_by(*order))
    for part in result.mappings().partitions(BATCH_ROWS):
        yield [dict(row) for row in part]


def copy_rows(source_url: str, target_url: str) -> dict[str, int]:
    """Copy every row of the models' tables from ``source_url`` into ``target_url``, a
    store at the same head revision holding no conversations yet; return rows per table.

    The target keeps its own `schema_version`, and its own `state_meta` values where both
    have a key (its search layout above all). Runs in one transaction on the target.
    """
    source = create_store_engine(source_url, create=False)
    target = create_store_engine(target_url, create=False)
    copied: dict[str, int] = {}
    try:
        with source.connect() as src, target.begin() as dst:
            kept_keys = set(dst.execute(select(StateMeta.__table__.c.key)).scalars())
            for table in Base.metadata.sorted_tables:
                if table.name == schema_version.name:
                    continue
                copied[table.name] = 0
                for batch in _batches(src, table):
                    if table.name == StateMeta.__tablename__:
                        batch = [row for row in batch if row["key"] not in kept_keys]
                    if batch:
                        dst.execute(table.insert(), batch)
                        copied[table.name] += len(batch)
            if is_server(target_url):
                _advance_sequences(dst)
    finally:
        source.dispose()
        target.dispose()
    return copied


def _advance_sequences(conn: Connection) -> None:
    """Let the next id a sequence hands out follow the copied ones."""
    for table in Base.metadata.sorted_tables:
        for column in table.primary_key.columns:
            sequence = conn.execute(
                text("SELECT pg_get_serial_sequence(:table, :column)"),
                {"table": table.name, "column": column.name},
            ).scalar()
            if sequence is not None:
                conn.execute(
                    text(
                        f'SELECT setval(:seq, coalesce((SELECT max("{column.name}") FROM '
                        f'"{table.name}"), 0) + 1, false)'
                    ),
                    {"seq": sequence},
                )


__all__ = ["BATCH_ROWS", "copy_rows"]

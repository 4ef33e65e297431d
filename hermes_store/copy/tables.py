"""The tables a copy reads and writes, their keys, and how each side is read.

Both sides of a copy read the models' tables (without those the target's own upgrade fills,
and without the ``state_meta`` keys each database keeps of its own), one snapshot per side,
ordering keys by code point: the collation and the snapshot are the backend's (SQLite's
BINARY and read transaction; PostgreSQL's "C" and REPEATABLE READ, read-only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
    String,
    Table,
    and_,
    func,
    inspect,
    select,
    text,
)

from hermes_store.backend import backend_of
from hermes_store.models import Base
from hermes_store.sqlite import fts

__all__ = [
    "MARKER_PREFIX",
    "REVISION_TABLES",
    "copied_table",
    "copied_tables",
    "count_rows",
    "is_own_key",
    "key_columns",
    "key_positions",
    "ordered_key",
    "own_filter",
    "read_only",
    "read_snapshot",
    "revisions",
    "self_references",
    "shown_key",
    "unique_columns",
    "written_by_key",
]

#: state_meta keys of the copy's own bookkeeping.
MARKER_PREFIX = "hermes_store.copy."
#: state_meta keys that describe one database's own search index: each side keeps the
#: value its own upgrade (or backfill) wrote; they are shown side by side, never copied.
OWN_KEYS = frozenset({fts.LAYOUT_MARKER, "fts_optimize_available", fts.APPLICATION_MARKER})
OWN_PREFIXES = ("hermes_store.", "messages_fts")
#: Tables the target's own upgrade fills (no primary key to page by): compared, not copied.
REVISION_TABLES = frozenset({"schema_version"})
#: Alembic's version table, where both databases keep their revisions.
ALEMBIC_TABLE = "alembic_version"


def read_only(conn: Connection) -> Connection:
    """``conn`` with its transactions reading one snapshot, read-only (as its backend
    does it: PostgreSQL's REPEATABLE READ; a SQLite read transaction is one already)."""
    return backend_of(conn).copy_snapshot(conn)


@contextlib.contextmanager
def read_snapshot(engine: Engine) -> Iterator[Connection]:
    """One read transaction: every statement in it reads the same snapshot."""
    with engine.connect() as conn:
        conn = read_only(conn)
        with conn.begin():
            yield conn


def revisions(conn: Connection) -> tuple[str, ...]:
    """The database's Alembic revisions (none when it has no version table)."""
    names = set(inspect(conn).get_table_names())
    if ALEMBIC_TABLE not in names:
        return ()
    rows = conn.execute(text(f"SELECT version_num FROM {ALEMBIC_TABLE}"))
    return tuple(sorted(str(row[0]) for row in rows))


def copied_tables() -> list[Table]:
    """The models' tables in foreign-key order, without those the revisions fill."""
    return [t for t in Base.metadata.sorted_tables if t.name not in REVISION_TABLES]


def copied_table(name: str) -> Table:
    """The copied table called ``name``."""
    return next(table for table in copied_tables() if table.name == name)


def count_rows(conn: Connection, table: Table) -> int:
    """The rows of ``table`` a copy compares (state_meta without each side's own keys)."""
    query = select(func.count()).select_from(table)
    where = own_filter(table)
    if where is not None:
        query = query.where(where)
    return int(conn.execute(query).scalar_one())


def is_own_key(key: str) -> bool:
    """A state_meta key that belongs to one database's own index or to this copy."""
    return key in OWN_KEYS or key.startswith(OWN_PREFIXES)


def own_filter(table: Table) -> Any:
    """WHERE clause that leaves out the state_meta keys each side keeps of its own."""
    if table.name != "state_meta":
        return None
    key = table.c.key
    conditions: list[ColumnElement[bool]] = [key.notin_(sorted(OWN_KEYS))]
    conditions += [~key.startswith(prefix, autoescape=True) for prefix in OWN_PREFIXES]
    return and_(*conditions)


def key_columns(table: Table) -> list[Column[Any]]:
    return list(table.primary_key.columns)


def ordered_key(table: Table, conn: Connection) -> list[ColumnElement[Any]]:
    """The key columns as ORDER BY / comparison expressions in code point order (the
    collation ``conn``'s backend orders text by code point with)."""
    collation = backend_of(conn).code_point_collation
    return [
        column.collate(collation) if isinstance(column.type, String) else column
        for column in key_columns(table)
    ]


def shown_key(table: Table, key: Sequence[Any]) -> str:
    """A row's key for a message: ``id 17``, ``id '2025...'``, ``(a, b) ('x', 'y')``."""
    names = [column.name for column in key_columns(table)]
    if len(names) == 1:
        return f"{names[0]} {key[0]!r}"
    return f"({', '.join(names)}) {tuple(key)!r}"


def key_positions(table: Table) -> list[int]:
    names = [column.name for column in table.columns]
    return [names.index(column.name) for column in key_columns(table)]


def self_references(table: Table) -> list[Column[Any]]:
    """The columns of ``table`` that reference its own key (sessions.parent_session_id)."""
    return [fk.parent for fk in table.foreign_keys if fk.column.table is table]


def unique_columns(table: Table) -> list[Column[Any]]:
    """Columns of unique indexes other than the key (sessions.title)."""
    return [
        column
        for index in table.indexes
        if index.unique
        for column in index.columns
        if isinstance(column, Column)
    ]


def written_by_key(table: Table) -> bool:
    """Whether the rows to write are kept key by key (the table is small, and its rows must
    go in an order of their own: parents first, or unique values freed first)."""
    return bool(self_references(table) or unique_columns(table))

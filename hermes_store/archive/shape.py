"""The tables and columns a run moves: those the hot store has.

The hot store may be at any application version this package covers (revisions
``(N, fts head)``, or the head itself), the archive is always at head. A run reflects
the hot store's tables once and moves, reads and checksums only the models' columns the
hot store has, in both stores (:class:`Shape`): a table the hot store lacks holds no rows
of any batch, a column it lacks gets its default (or NULL) in the archive. While a run
uses a shape (:func:`using`), :func:`table` gives the archive modules each table as the
shape has it; outside one, the models' whole table.

A restore refuses a session whose archived rows hold, in a column the hot store lacks, a
value other than that column's default (:func:`lost_values`): the hot store could not
keep it. Columns the archive's triggers derive from the others (``messages.display_order``)
are not held to that: the hot store's application does without them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, MetaData, Table, inspect, null, select

from hermes_store.copy.tables import copied_table, copied_tables

__all__ = [
    "Shape",
    "column",
    "enter",
    "has",
    "leave",
    "lost_values",
    "moved_columns",
    "narrowed",
    "reflect",
    "table",
    "using",
]

#: Columns the archive's triggers fill from the row's other values: nothing is lost when a
#: hot store without them takes the row back.
DERIVED_COLUMNS = frozenset({("messages", "display_order")})


@dataclass
class Shape:
    """The models' tables restricted to the hot store's columns (absent tables left out)."""

    tables: dict[str, Table] = field(default_factory=dict)

    def missing(self, name: str) -> list[str]:
        """The models' columns of ``name`` the hot store lacks."""
        have = self.tables.get(name)
        return [c.name for c in copied_table(name).columns if have is None or c.name not in have.c]


_SHAPE: ContextVar[Shape | None] = ContextVar("hermes_store_archive_shape", default=None)


def reflect(conn: Connection) -> Shape:
    """The shape of the store of ``conn`` (the hot store)."""
    inspector = inspect(conn)
    present = set(inspector.get_table_names())
    metadata = MetaData()
    shape = Shape()
    for model in copied_tables():
        if model.name not in present:
            continue
        have = {column["name"] for column in inspector.get_columns(model.name)}
        columns = [
            Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in model.columns
            if c.name in have
        ]
        shape.tables[model.name] = Table(model.name, metadata, *columns)
    return shape


@contextlib.contextmanager
def using(shape: Shape | None) -> Iterator[None]:
    """Let :func:`table` give the tables as ``shape`` has them until the block ends."""
    token = _SHAPE.set(shape)
    try:
        yield
    finally:
        _SHAPE.reset(token)


def enter(shape: Shape | None) -> Token[Shape | None]:
    """:func:`using` for a run's ``try`` block: call :func:`leave` in its ``finally``."""
    return _SHAPE.set(shape)


def leave(token: Token[Shape | None]) -> None:
    _SHAPE.reset(token)


def moved_columns() -> dict[str, list[str]] | None:
    """The columns the run moves, by table (None outside a run): a batch's marker keeps
    them, so that the run that finishes it sums the same columns."""
    shape = _SHAPE.get()
    if shape is None:
        return None
    return {name: [c.name for c in found.columns] for name, found in shape.tables.items()}


def narrowed(shape: Shape | None, columns: dict[str, list[str]] | None) -> Shape | None:
    """``shape`` cut to the columns a batch's marker names (what its checksums are over):
    a batch in flight is finished over the columns it was read with, though the hot store
    was upgraded since."""
    if shape is None or columns is None:
        return shape
    metadata = MetaData()
    cut = Shape()
    for name, found in shape.tables.items():
        if name not in columns:
            continue
        kept = [
            Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in found.columns
            if c.name in columns[name]
        ]
        cut.tables[name] = Table(name, metadata, *kept)
    return cut


def has(name: str) -> bool:
    """Whether the hot store has the table ``name``."""
    shape = _SHAPE.get()
    return shape is None or name in shape.tables


def table(name: str) -> Table:
    """The table ``name`` with the columns the run moves (see :func:`has` first)."""
    shape = _SHAPE.get()
    if shape is None:
        return copied_table(name)
    return shape.tables[name]


def column(found: Table, name: str) -> ColumnElement[Any]:
    """``found``'s column ``name``, or NULL under that name where the store lacks it."""
    if name in found.c:
        got: ColumnElement[Any] = found.c[name]
        return got
    return null().label(name)


def _default(model: Column[Any]) -> Any:
    """The value a row gets in ``model``'s column when it is not given."""
    given = model.server_default
    if given is None:
        return None
    text = str(getattr(given, "arg", given)).strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def lost_values(
    conn: Connection,
    shape: Shape,
    owned: Sequence[str],
    ids: Sequence[str],
    *,
    read: Shape | None = None,
) -> str:
    """Where a row of the sessions ``ids`` in the store of ``conn`` (the archive; or a
    store of the shape ``read``) holds a value ``shape`` has no column (or table) for,
    other than the column's default: "table.column (session 'id')"; "" when there is
    none."""
    from hermes_store.archive.rows import owned_condition, session_of

    for name in owned:
        have = copied_table(name) if read is None else read.tables.get(name)
        if have is None:
            continue
        kept = shape.tables.get(name)
        missing = [
            c.name
            for c in have.columns
            if (kept is None or c.name not in kept.c) and (name, c.name) not in DERIVED_COLUMNS
        ]
        if not missing:
            continue
        model = copied_table(name)
        query = select(*have.columns).where(owned_condition(have, ids))
        for row in conn.execute(query):
            if kept is None:
                sid = session_of(name, row, ids)
                return f"{name}, a table the hot store lacks (session {sid!r})"
            for col in missing:
                value = getattr(row, col)
                default = _default(model.c[col])
                if value is None and default is None:
                    continue
                if value is not None and default is not None and value == default:
                    continue
                return f"{name}.{col} (session {session_of(name, row, ids)!r})"
    return ""

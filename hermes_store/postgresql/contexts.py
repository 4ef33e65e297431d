"""The context windows of a page's hits on PostgreSQL (hermes_store.search.context): the
rows around each hit, read in one statement for a chunk of hits, or as a column of the
statement that reads the hits (context_column)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, any_, bindparam, case, func, select
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by, array
from sqlalchemy.engine import Connection

from hermes_store.models import from_server_text, to_server_text
from hermes_store.search.context import (
    CONTENT_JSON_PREFIX,
    CONTEXT_CHARS,
    neighbours,
    windows_of,
)
from hermes_store.search.schema import MESSAGES


def _cut(content: Any) -> ColumnElement[Any]:
    """A context row's content: a NUL is stored as U+FFFE here and a character of its codes
    as three (hermes_store.models.to_server_text), so the characters that hold the first
    CONTEXT_CHARS; content stored as JSON whole."""
    return case(
        (
            func.left(content, len(CONTENT_JSON_PREFIX)) == to_server_text(CONTENT_JSON_PREFIX),
            content,
        ),
        else_=func.substr(content, 1, 3 * CONTEXT_CHARS),
    )


#: The context windows' rows (hermes_store.search.context.windows_of). The hits' ids are
#: one array (``= ANY``): one text of the statement whatever their number, so no IN list
#: is written out for each search.
CONTEXT_WINDOWS = windows_of(
    _cut, lambda hit_id: hit_id == any_(bindparam("ids", type_=ARRAY(BigInteger)))
)

#: The column context_column adds to a statement's rows.
CONTEXT_COLUMN = "context_window"
_window_row = MESSAGES.alias("w")


def context_column(hit: Any) -> ColumnElement[Any]:
    """The context window of the hit ``hit`` (columns ``id``, ``session_id``,
    ``timestamp``), as CONTEXT_WINDOWS gives it, in one column of the hit's row: an array
    of (role, content) arrays in (timestamp, id) order. A statement that reads the page's
    hits then reads their windows too, with no statement after it."""
    previous, following = neighbours(hit)
    pair = array([_window_row.c.role, _cut(_window_row.c.content)])
    rows = func.array_agg(aggregate_order_by(pair, _window_row.c.timestamp, _window_row.c.id))
    return (
        select(rows)
        .where(_window_row.c.id.in_([hit.id, previous, following]))
        .scalar_subquery()
        .label(CONTEXT_COLUMN)
    )


def column_rows(windows: Iterable[tuple[int, Any]]) -> Iterator[tuple[Any, ...]]:
    """CONTEXT_WINDOWS' rows from context_column's values (hit id, value), content as the
    data layer gives it."""
    for hit_id, pairs in windows:
        for role, content in pairs or ():
            yield hit_id, role, _as_given(content)


def _as_given(content: Any) -> Any:
    """Stored content as the data layer gives it (NUL as NUL)."""
    return from_server_text(content) if isinstance(content, str) else content


def context_rows(conn: Connection, chunk: list[int]) -> list[tuple[Any, ...]]:
    """CONTEXT_WINDOWS' rows for a chunk of hits, content as the data layer gives it."""
    return [
        (hit_id, role, _as_given(content))
        for hit_id, role, content in conn.execute(CONTEXT_WINDOWS, {"ids": chunk})
    ]

"""Snippets of bounded cost on SQLite: FTS5's own where that is cheap, bounded past it.

Snippets are FTS5's own up to SNIPPET_EXACT_BYTES and snippet.EXACT_INSTANCES (the search
statement makes those that are cheap whatever the text, :func:`bounded_snippets` the others
after it); past them, bounded (:mod:`hermes_store.search.snippet`). The rules, the limit
and the snippet() call are the search package's (:mod:`hermes_store.search.fts5_snippets`),
shared with PostgreSQL.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, LargeBinary, bindparam, func, select

from hermes_store.prepared import Prepared
from hermes_store.search.fts5_snippets import (
    SNIPPET_EXACT_BYTES,
    SNIPPET_SQL,
    cheap_bytes,
    snippets_of,
)
from hermes_store.search.query import Route
from hermes_store.search.schema import M
from hermes_store.sqlite.search_state import Runner

__all__ = [
    "SNIPPET_EXACT_BYTES",
    "SNIPPET_SQL",
    "TEXT_COLUMNS",
    "bounded_snippets",
    "cheap_bytes",
    "snippets_of",
]

TEXT_COLUMNS = (M.c.content, M.c.tool_name, M.c.tool_calls)


def _indexed_text() -> ColumnElement[Any]:
    """What the index holds of a message (the view `messages_fts_source`'s expression)."""
    return (
        func.coalesce(M.c.content, "")
        .concat(" ")
        .concat(func.coalesce(M.c.tool_name, ""))
        .concat(" ")
        .concat(func.coalesce(M.c.tool_calls, ""))
    )


@functools.cache
def _prepared_texts() -> Prepared:
    """The indexed text of the hits ``ids``, as bytes (a text need not be valid UTF-8)."""
    return Prepared.of(
        select(M.c.id, _indexed_text().cast(LargeBinary)).where(
            M.c.id.in_(bindparam("ids", expanding=True))
        )
    )


def bounded_snippets(on: Runner, route: Route, table: str, rows: list[dict[str, Any]]) -> None:
    """Fill in the snippets the search statement left out (longer texts), of the rows read
    from the index table ``table``."""
    pending = [row["id"] for row in rows if row["snippet"] is None]
    if not pending:
        return
    texts: dict[int, Any] = dict(
        on.rows(*_prepared_texts().bind({"ids": pending}))  # type: ignore[arg-type]
    )

    def fts5_snippets(ids: list[int]) -> Iterable[Sequence[Any]]:
        # `+rowid`: one MATCH over the index, the ids a filter on it; FTS5 given the ids
        # as constraints would evaluate the query again for each (a prefix expanded anew).
        return on.rows(
            f"SELECT rowid, {SNIPPET_SQL.format(table)} FROM {table} "
            f"WHERE {table} MATCH ? AND +rowid IN ({', '.join('?' * len(ids))})",
            [route.match, *ids],
        )

    snippets = snippets_of(route, texts, fts5_snippets, made_bytes=cheap_bytes(route))
    for row in rows:
        if row["id"] in snippets:
            row["snippet"] = snippets[row["id"]]

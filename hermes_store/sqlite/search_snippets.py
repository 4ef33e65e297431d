"""Snippets of bounded cost on SQLite: FTS5's own where that is cheap, bounded past it.

Snippets are FTS5's own up to SNIPPET_EXACT_BYTES and snippet.EXACT_INSTANCES (the search
statement makes those that are cheap whatever the text, :func:`bounded_snippets` the others
after it); past them, bounded (:mod:`hermes_store.search.snippet`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, LargeBinary, bindparam, func, select

from hermes_store.prepared import Prepared
from hermes_store.search import snippet as fts5_snippet
from hermes_store.search.query import (
    MAX_SEARCH_TERMS,
    TRIGRAM_INDEX,
    Highlight,
    QuerySyntaxError,
    Route,
    highlight_of,
    parse_query,
)
from hermes_store.search.schema import M
from hermes_store.sqlite.search_state import Runner

#: A hit's snippet is FTS5's own snippet() when its indexed text is at most this many bytes
#: and holds at most fts5_snippet.EXACT_INSTANCES instances of the query's phrases (FTS5's
#: time grows with their square); otherwise a bounded one (fts5_snippet.bounded_*).
#: docs/search.md, "Bounds", says where the two differ.
SNIPPET_EXACT_BYTES = 256 * 1024
#: The contract's snippet() call, for an FTS5 table's name.
SNIPPET_SQL = "snippet({}, 0, '>>>', '<<<', '...', 40)"

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


def _marks(route: Route) -> Highlight | None:
    """What the route's snippets mark (None when the parser cannot tell: FTS5 decides)."""
    try:
        return highlight_of(parse_query(route.match, trigram=route.index == TRIGRAM_INDEX))
    except QuerySyntaxError:
        return None


def cheap_bytes(route: Route) -> int:
    """The indexed texts whose FTS5 snippet the search statement computes: those too short
    to hold more than EXACT_INSTANCES instances of the query's phrases (at most one per
    phrase a token; a word token and its separator take two bytes, a trigram one)."""
    marks = _marks(route)
    phrases = max(len(marks.phrases) if marks else MAX_SEARCH_TERMS, 1)
    bytes_per_token = 1 if route.index == TRIGRAM_INDEX else 2
    return fts5_snippet.EXACT_INSTANCES * bytes_per_token // phrases - 1


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

    snippets = snippets_of(route, texts, fts5_snippets)
    for row in rows:
        if row["id"] in snippets:
            row["snippet"] = snippets[row["id"]]


def snippets_of(
    route: Route,
    texts: Mapping[int, object],
    fts5_snippets: Callable[[list[int]], Iterable[Sequence[Any]]],
) -> dict[int, str]:
    """The snippets of the texts (id -> indexed text, as bytes) longer than cheap_bytes:
    FTS5's own where it stays cheap (SNIPPET_EXACT_BYTES, EXACT_INSTANCES), asked of
    ``fts5_snippets`` (ids -> (id, snippet) rows); the others bounded."""
    marks = _marks(route)
    trigram = route.index == TRIGRAM_INDEX
    phrases: list[Any] = []
    if marks is not None:
        phrases = [phrase[0][0] for phrase in marks.phrases] if trigram else list(marks.phrases)
    cheap = cheap_bytes(route)
    exact: list[int] = []
    snippets: dict[int, str] = {}
    for hit_id, data in texts.items():
        if not isinstance(data, bytes) or len(data) <= cheap:
            continue  # a NULL text's snippet, or one FTS5 made
        text = data.decode("utf-8", "replace")
        if marks is None or (
            len(data) <= SNIPPET_EXACT_BYTES
            and fts5_snippet.exact_is_bounded(text, phrases, trigram=trigram)
        ):
            exact.append(hit_id)
        elif trigram:
            snippets[hit_id] = fts5_snippet.bounded_trigram_snippet(
                text, phrases, groups=marks.groups
            )
        else:
            snippets[hit_id] = fts5_snippet.bounded_word_snippet(
                text, phrases, near=marks.near, groups=marks.groups
            )
    if exact:
        snippets.update((int(row[0]), row[1]) for row in fts5_snippets(exact))
    return snippets

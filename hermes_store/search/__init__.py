"""The message-search contract (docs/search.md): sanitising, routing, filters, context.

The package: ``query`` (sanitising, routing, the query tree: both databases), ``schema``
(tables, the options and filters, result columns), ``context`` (context rows, result types,
the hit), ``pipeline`` (the steps of one search, the same on every database), ``snippet``
(FTS5's snippet in Python, and its ``tokenizer_tables``). Each database's statements are its
backend's: hermes_store/sqlite/search.py (and ``pending``, rows a deferred backfill has not
indexed yet) and hermes_store/postgresql/search.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from hermes_store.backend import backend_of
from hermes_store.prepared import Connections
from hermes_store.search.context import ContextMessage, SearchHit, SearchResults, context_text
from hermes_store.search.pipeline import search
from hermes_store.search.query import (
    MAX_QUERY_CHARS,
    MAX_SEARCH_TERMS,
    TRIGRAM_INDEX,
    WORD_INDEX,
    contains_cjk,
    count_cjk,
    sanitize_query,
    without_repeats,
)
from hermes_store.search.schema import SearchOptions
from hermes_store.sqlite.search import accept_search_objects, match_selectable

__all__ = [
    "MAX_QUERY_CHARS",
    "MAX_SEARCH_TERMS",
    "TRIGRAM_INDEX",
    "WORD_INDEX",
    "ContextMessage",
    "SearchHit",
    "SearchOptions",
    "SearchResults",
    "accept_search_objects",
    "contains_cjk",
    "context_text",
    "count_cjk",
    "match_selectable",
    "sanitize_query",
    "search_messages",
    "search_store",
    "without_repeats",
]


def search_messages(
    conn: Connection | Session,
    query: str,
    source_filter: Sequence[str] | None = None,
    exclude_sources: Sequence[str] | None = None,
    role_filter: Sequence[str] | None = None,
    limit: int = 20,
    offset: int = 0,
    sort: str | None = None,
    include_inactive: bool = False,
) -> SearchResults:
    """Search message text exactly as the legacy application did (docs/search.md).

    Never answers wrongly without saying so: when the index a query needs is damaged, the
    hits come from an exact scan of `messages`, one WARNING is logged and the result's
    ``degraded`` says why; text that is not valid UTF-8 is shown with U+FFFD and its
    messages are named there. A query FTS5 rejects, or one holding text no database can
    store, has no hits, and ``query_error`` says why (see :class:`SearchResults`).
    """
    connection = conn.connection() if isinstance(conn, Session) else conn
    options = SearchOptions(
        query, source_filter, exclude_sources, role_filter, limit, offset, sort, include_inactive
    )
    return search(backend_of(connection).search_statements(connection), options)


def search_store(
    engine: Engine | Connections,
    query: str,
    source_filter: Sequence[str] | None = None,
    exclude_sources: Sequence[str] | None = None,
    role_filter: Sequence[str] | None = None,
    limit: int = 20,
    offset: int = 0,
    sort: str | None = None,
    include_inactive: bool = False,
) -> SearchResults:
    """:func:`search_messages` in a read transaction of its own, on a connection of ``engine``
    (an engine's pool, or a store's own connections).

    On SQLite the usual search runs on the driver connection (hermes_store.prepared), like
    the Store's other methods: a SQLAlchemy ``Connection`` costs as much as the SQL of a
    cheap query; the first search after a schema change runs on one. On PostgreSQL it reads
    one snapshot (REPEATABLE READ).
    """
    options = SearchOptions(
        query, source_filter, exclude_sources, role_filter, limit, offset, sort, include_inactive
    )
    with backend_of(engine.engine).search_transaction(engine) as statements:
        return search(statements, options)

"""The message-search contract (docs/search.md): sanitising, routing, filters, context.

The package: ``query`` (sanitising, routing, the query tree: both databases), ``schema``
(tables, filters, result columns), ``context`` (context rows, result types), ``sqlite`` and
``postgresql`` (each database's statements), ``pending`` (rows a deferred backfill has not
indexed yet, SQLite).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from hermes_store.errors import UnsupportedLayout
from hermes_store.postgresql import search as postgresql
from hermes_store.prepared import Connections, driver
from hermes_store.search.context import (
    ContextMessage,
    SearchHit,
    SearchResults,
    _contexts,
)
from hermes_store.search.context import (
    _context_text as _context_text,  # benchmarks/raw.py renders context as search does
)
from hermes_store.search.query import (
    MAX_QUERY_CHARS,
    MAX_SEARCH_TERMS,
    TRIGRAM_INDEX,
    UNSTORABLE_QUERY,
    WORD_INDEX,
    _check_bounded,
    _normalise_sort,
    _Route,
    _route,
    contains_cjk,
    count_cjk,
    not_understood,
    sanitize_query,
    storable,
    without_repeats,
)
from hermes_store.search.schema import _Filters
from hermes_store.sqlite.search import (
    _degraded,
    _fetch_hits,
    _NeedsConnection,
    _OnConnection,
    _OnDriver,
    _reading_leniently,
    _rejected,
    _replacing_text,
    _Runner,
    _share_state,
    _State,
    _state,
    _undecodable,
    _Unreadable,
    _unreadable,
    accept_search_objects,
    match_selectable,
)

__all__ = [
    "MAX_QUERY_CHARS",
    "MAX_SEARCH_TERMS",
    "TRIGRAM_INDEX",
    "WORD_INDEX",
    "ContextMessage",
    "SearchHit",
    "SearchResults",
    "accept_search_objects",
    "contains_cjk",
    "count_cjk",
    "match_selectable",
    "sanitize_query",
    "search_messages",
    "search_store",
    "without_repeats",
]

log = logging.getLogger(__name__)


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
    filters = _Filters(include_inactive, source_filter, exclude_sources, role_filter)
    if connection.dialect.name == "postgresql":
        return _search_on_server(connection, query, filters, sort, (limit, offset))
    return _search(
        _OnConnection(connection),
        query,
        filters,
        sort,
        (limit, offset),
    )


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

    The usual search runs on the driver connection (hermes_store.prepared), like the
    Store's other methods: a SQLAlchemy ``Connection`` costs as much as the SQL of a cheap
    query. A search that needs one (the first after a schema change, a damaged index, a
    deferred backfill in progress) runs again through ``search_messages``.
    """
    filters = _Filters(include_inactive, source_filter, exclude_sources, role_filter)
    if engine.engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="REPEATABLE READ")  # one snapshot
            return _search_on_server(conn, query, filters, sort, (limit, offset))
    with driver(engine) as db:
        db.run("BEGIN")
        try:
            return _search(_OnDriver(db), query, filters, sort, (limit, offset))
        except _NeedsConnection:
            pass
        finally:
            db.connection.rollback()
    with engine.connect() as conn:
        results = _search(_OnConnection(conn), query, filters, sort, (limit, offset))
        _share_state(conn.info, db.info)
    return results


def _sanitized(query: str) -> str:
    """The query as the contract sends it to an index; empty when there is nothing to search
    (an empty or all-whitespace query, or nothing left after sanitising)."""
    if not query or not query.strip():
        return ""
    return without_repeats(sanitize_query(query))


def _search_on_server(
    conn: Connection, query: str, filters: _Filters, sort: str | None, page: tuple[int, int]
) -> SearchResults:
    """search_messages' answer on PostgreSQL (hermes_store.postgresql.search)."""
    sanitized = _sanitized(query)
    if not sanitized:
        return SearchResults()
    if not storable(sanitized):
        return SearchResults(query_error=UNSTORABLE_QUERY)
    route = _route(sanitized, trigram=True)  # both indexes exist at head (revision fts1)
    _check_bounded(route)
    return postgresql.search(conn, route, filters, _normalise_sort(sort), page)


def _search(
    on: _Runner, query: str, filters: _Filters, sort: str | None, page: tuple[int, int]
) -> SearchResults:
    """search_messages' answer, its statements run by ``on``."""
    sanitized = _sanitized(query)
    if not sanitized:
        return SearchResults()
    if not storable(sanitized):
        return SearchResults(query_error=UNSTORABLE_QUERY)
    state = _state(on)
    if state.application:
        raise UnsupportedLayout(
            "this store's search indexes are in the Hermes application's own layout "
            "(it moved them itself), which hermes-store does not search: use the agent's "
            "search; `check`, `storage` and `optimize` work on it"
        )
    tables, damaged = state.tables, state.damaged
    if WORD_INDEX not in tables and WORD_INDEX not in damaged:
        log.debug("search: no %s table; no results", WORD_INDEX)  # FTS5 unavailable
        return SearchResults()
    route = _route(sanitized, trigram=TRIGRAM_INDEX in tables)
    _check_bounded(route)
    order = _normalise_sort(sort)
    degraded = None
    if route.index is not None and route.index in damaged:
        degraded = _degraded(route.index, damaged[route.index])
    try:
        results = _answer(on, route, filters, order, page, state, degraded)
    except _Unreadable:
        results = None
    if results is None:  # read again: the index, else the scan; invalid UTF-8 as U+FFFD
        with _replacing_text(on.driver) as replacing:
            try:
                results = _answer(on, route, filters, order, page, state, degraded)
            except _Unreadable as exc:  # nothing else reads `messages`: no answer
                raise exc.error from None
            named = _undecodable(on, [hit["id"] for hit in results]) if replacing.replaced else None
        if named:
            results.degraded = f"{results.degraded}; {named}" if results.degraded else named
    if results.degraded:
        log.warning("search: %s", results.degraded)
    return results


def _answer(
    on: _Runner,
    route: _Route,
    filters: _Filters,
    sort: str | None,
    page: tuple[int, int],
    state: _State,
    degraded: str | None,
) -> SearchResults:
    """The hits of a routed query, with their context. Raises _Unreadable (to be read again,
    leniently) when the index or a row could not be read; once reading leniently, an index
    that still cannot be read is replaced by the exact scan."""
    try:
        rows = _fetch_hits(on, route, filters, sort, page, state, scan=bool(degraded))
    except _Unreadable as exc:
        if route.index is None or degraded or not _reading_leniently(on.driver):
            raise
        degraded = _degraded(route.index, exc.why)
        rows = _fetch_hits(on, route, filters, sort, page, state, scan=True)
    if rows == [] and route.index is not None and _rejected(route.index, route.match):
        rows = None  # SQLite never asked FTS5: the filters alone left no row to test
    if rows is None and route.index == TRIGRAM_INDEX:  # trigram rejected it: LIKE scan
        route = _Route(None, "", route.like_tokens)
        rows = _fetch_hits(on, route, filters, sort, page, state)
    if rows is None:  # the word index rejected the query text (FTS5 syntax error)
        return SearchResults(degraded=degraded, query_error=not_understood(route.match))
    if not rows:
        return SearchResults(degraded=degraded)
    log.debug("search: %d hit(s) from %s", len(rows), route.index or "LIKE scan")
    try:
        contexts = _contexts(on, [row["id"] for row in rows])
    except (DBAPIError, sqlite3.Error) as exc:
        unreadable = _unreadable(exc)
        if unreadable is not None and not _reading_leniently(on.driver):
            raise unreadable from None  # read again, leniently
        log.debug("search: context lookup failed (%s)", type(exc).__name__)
        contexts = {}
    except Exception as exc:  # the contract: a failed context lookup leaves every hit with []
        log.debug("search: context lookup failed (%s)", type(exc).__name__)
        contexts = {}
    hits: list[SearchHit] = [
        {
            "id": row["id"],
            "session_id": row["session_id"],
            "role": row["role"],
            "snippet": row["snippet"],
            "timestamp": row["timestamp"],
            "tool_name": row["tool_name"],
            "source": row["source"],
            "model": row["model"],
            "session_started": row["session_started"],
            "context": contexts.get(row["id"], []),
        }
        for row in rows
    ]
    return SearchResults(hits, degraded=degraded)

"""The search statements on SQLite: FTS5 MATCH on the word and trigram indexes, the LIKE scan.

:class:`SQLiteSearch` is SQLite's part of the one search pipeline
(:mod:`hermes_store.search.pipeline`), reached through the SQLite backend's search section.
Snippets: :mod:`hermes_store.sqlite.search_snippets`; what search knows of a database and
where its statements run: :mod:`hermes_store.sqlite.search_state`; what it cannot read at
first: :mod:`hermes_store.sqlite.search_reading`; a deferred backfill's rows:
:mod:`hermes_store.sqlite.pending`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
    LargeBinary,
    Select,
    String,
    and_,
    bindparam,
    case,
    column,
    func,
    literal_column,
    null,
    or_,
    select,
    table,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from hermes_store.errors import UnsupportedLayout
from hermes_store.prepared import Connections, Prepared, driver
from hermes_store.search.context import (
    CONTEXT_CHARS,
    ContextMessage,
    SearchResults,
    contexts_of,
    windows_of,
)
from hermes_store.search.pipeline import Found, Plan
from hermes_store.search.query import (
    ASCII_LOWER,
    TRIGRAM_INDEX,
    WORD_INDEX,
    Route,
    escape_like,
    not_understood,
    reduced,
    route_query,
    sanitize_query,
)
from hermes_store.search.schema import (
    RESULT_COLUMNS,
    RESULT_KEYS,
    Filters,
    M,
    S,
    SearchOptions,
    filter_criteria,
)
from hermes_store.sqlite.pending import merge_pending, pending_hits, pending_ranges, scan_hits
from hermes_store.sqlite.search_reading import (
    Unreadable,
    as_unreadable,
    reading_leniently,
    rejected,
    replacing_text,
    undecodable,
)
from hermes_store.sqlite.search_snippets import (
    SNIPPET_EXACT_BYTES,
    SNIPPET_SQL,
    TEXT_COLUMNS,
    bounded_snippets,
    cheap_bytes,
)
from hermes_store.sqlite.search_state import (
    OnConnection,
    OnDriver,
    Runner,
    State,
    accept_search_objects,
    degraded,
    known_state,
    learn_state,
    share_state,
)

__all__ = [
    "SNIPPET_EXACT_BYTES",
    "SQLiteSearch",
    "accept_search_objects",
    "match_selectable",
    "read_transaction",
    "search_statements",
]

log = logging.getLogger(__name__)

#: Each index in the table of its own name: the tables a store at head has.
_OWN_TABLES = {WORD_INDEX: WORD_INDEX, TRIGRAM_INDEX: TRIGRAM_INDEX}

#: Up to this many tokens (NUL-free) the LIKE scan runs SQL LIKE conditions, one per
#: token, as the legacy application does; beyond, one Python function tests them all at
#: once (see _like_any_registered). At 50k messages one LIKE token costs about 45 ms, the
#: function about 280 ms whatever the number of tokens.
SQL_LIKE_TOKENS = 4
#: How the LIKE scan tests more than SQL_LIKE_TOKENS tokens without a Python function.
_JSON_PATTERNS = "json_each"


@dataclass(frozen=True)
class _Shape:
    """What the SQL of a search statement depends on (never the values it runs with).

    Statements are built and compiled once per shape (:func:`_prepared`), then run with
    their values as parameters.
    """

    #: The FTS5 table the route reads (from index_tables), or None: the LIKE scan.
    table: str | None
    #: Filters.given: visibility, source, excluded source, role terms.
    filters: tuple[bool, bool, bool, bool]
    #: Select FTS5's rank (pending rows are merged by it); ordering by it needs no column.
    rank: bool = False
    #: The contract's ORDER BY and LIMIT/OFFSET, and the result columns; False: id, rank
    #: and snippet only (match_selectable).
    page: bool = True
    sort: str | None = None
    #: LIKE scan: tokens with a NUL (compared whole), tokens as SQL LIKE conditions, and
    #: how the others are tested at once (a registered function's name, or _JSON_PATTERNS).
    needles: int = 0
    patterns: int = 0
    pattern_set: str | None = None
    #: The registered function gets the texts as bytes (text that is not UTF-8 is read).
    blobs: bool = False


def _statement(shape: _Shape) -> Select[*tuple[Any, ...]]:
    """The search statement of a shape, its values left as named parameters."""
    if shape.table is not None:
        index = table(shape.table, column("rowid", Integer), column("rank", Float))
        snippet: ColumnElement[Any] = literal_column(SNIPPET_SQL.format(shape.table), String)
        if shape.page:  # FTS5's snippet where it is cheap whatever the text; the others after
            size: ColumnElement[Any] = sum(
                (func.coalesce(func.length(c.cast(LargeBinary)), 0) for c in TEXT_COLUMNS),
                literal_column("2"),  # the separators
            )
            snippet = case((size <= bindparam("snippet_bytes", type_=Integer), snippet))
        columns: list[Any] = [M.c.id]
        if shape.rank:
            columns.append(index.c.rank.label("rank"))
        statement = (
            select(*columns, snippet.label("snippet"))
            .select_from(index.join(M, M.c.id == index.c.rowid).join(S, S.c.id == M.c.session_id))
            .where(
                literal_column(shape.table).op("MATCH")(bindparam("match", type_=String)),
                *filter_criteria(shape.filters),
            )
        )
    else:
        statement = _like_statement(shape)
    if not shape.page:
        return statement
    rank: ColumnElement[Any] = literal_column("rank")
    order: list[ColumnElement[Any]]
    if shape.table is None:
        order = [M.c.timestamp.desc()]
    elif shape.sort == "newest":
        order = [M.c.timestamp.desc(), rank]
    elif shape.sort == "oldest":
        order = [M.c.timestamp.asc(), rank]
    else:
        order = [rank]
    return (
        statement.add_columns(*RESULT_COLUMNS)
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
        .offset(bindparam("offset", type_=Integer))
    )


def _like_statement(shape: _Shape) -> Select[*tuple[Any, ...]]:
    """The LIKE scan: one condition per token, OR-joined. Compatibility quirk kept from the
    legacy application: this path ignores the active/compacted visibility filter."""
    texts = (M.c.content, M.c.tool_name, M.c.tool_calls)
    conditions: list[ColumnElement[bool]] = []
    for i in range(shape.needles):
        # LIKE stops reading its pattern at a NUL: '%ab\x00c%' would match every text
        # ending in "ab". Compare the whole token instead, ASCII case folded like LIKE.
        needle = func.lower(bindparam(f"needle_{i}", type_=String))
        conditions.append(or_(*(func.instr(func.lower(c), needle) > 0 for c in texts)))
    for i in range(shape.patterns):
        pattern = bindparam(f"pattern_{i}", type_=String)
        conditions.append(or_(*(c.like(pattern, escape="\\") for c in texts)))
    if shape.pattern_set == _JSON_PATTERNS:
        # One row per pattern from a JSON array, not one OR per token: SQLite parses a
        # chain of n ORs n deep and refuses an expression deeper than 1000 (334 short CJK
        # tokens did), and one parameter whatever the number of tokens.
        each = func.json_each(bindparam("patterns", type_=String))
        pattern_row = each.table_valued("value").alias("pattern")
        conditions.append(
            select(literal_column("1"))
            .select_from(pattern_row)
            .where(or_(*(c.like(pattern_row.c.value, escape="\\") for c in texts)))
            .exists()
        )
    elif shape.pattern_set is not None:  # the tokens in one Python function, once per row
        arguments = [text.cast(LargeBinary) for text in texts] if shape.blobs else texts
        conditions.append(getattr(func, shape.pattern_set)(*arguments) == 1)
    first = bindparam("first_token", type_=String)
    start: ColumnElement[Any] = func.max(
        literal_column("1"), func.instr(M.c.content, first) - literal_column("40")
    )
    snippet = func.substr(M.c.content, start, literal_column("120"), type_=String)
    columns: list[Any] = [M.c.id]
    if shape.rank:
        columns.append(null().label("rank"))
    return (
        select(*columns, snippet.label("snippet"))
        .select_from(M.join(S, S.c.id == M.c.session_id))
        .where(or_(*conditions), *filter_criteria(shape.filters))
    )


@functools.lru_cache(maxsize=256)
def _prepared(shape: _Shape) -> Prepared:
    """A shape's statement, compiled once."""
    return Prepared.of(_statement(shape))


def _shape_and_values(
    route: Route,
    filters: Filters,
    tables: Mapping[str, str],
    *,
    rank: bool = False,
    page: bool = True,
    sort: str | None = None,
    like_function: str | None = None,
    blobs: bool = False,
) -> tuple[_Shape, dict[str, Any]]:
    """The shape of a route's statement and the values of its parameters."""
    values = filters.values()
    if route.index is not None:
        values["match"] = route.match
        if page:
            values["snippet_bytes"] = cheap_bytes(route)
        given = filters.given(visibility=True)
        return _Shape(tables[route.index], given, rank, page, sort), values
    tokens = reduced(route.like_tokens)
    needles = [token for token in tokens if "\x00" in token]
    patterns = [f"%{escape_like(token)}%" for token in tokens if "\x00" not in token]
    values.update({f"needle_{i}": token for i, token in enumerate(needles)})
    values["first_token"] = route.like_tokens[0]
    pattern_set = None
    if len(patterns) > SQL_LIKE_TOKENS:
        pattern_set = like_function or _JSON_PATTERNS
        values["patterns"] = json.dumps(patterns)
        patterns = []
    values.update({f"pattern_{i}": pattern for i, pattern in enumerate(patterns)})
    given = filters.given(visibility=False)
    shape = _Shape(
        None,
        given,
        rank,
        page,
        None,
        len(needles),
        len(patterns),
        pattern_set,
        blobs=blobs and like_function is not None and pattern_set == like_function,
    )
    return shape, values


def match_selectable(
    query: str,
    *,
    include_inactive: bool = False,
    source_filter: Sequence[str] | None = None,
    exclude_sources: Sequence[str] | None = None,
    role_filter: Sequence[str] | None = None,
    trigram: bool = True,
) -> Select[*tuple[Any, ...]] | None:
    """Select ``id``, ``rank``, ``snippet`` of matching messages, as search_messages routes them."""
    sanitized = sanitize_query(query)
    if not sanitized:
        return None
    filters = Filters(
        include_inactive=include_inactive,
        source_filter=source_filter,
        exclude_sources=exclude_sources,
        role_filter=role_filter,
    )
    route = route_query(sanitized, trigram=trigram)
    shape, values = _shape_and_values(route, filters, _OWN_TABLES, rank=True, page=False)
    return _statement(shape).params(**values)


_LIKE_ANY = "hermes_like_any"


@contextlib.contextmanager
def _like_any_registered(raw: sqlite3.Connection, route: Route) -> Iterator[str | None]:
    """For the LIKE route with more than SQL_LIKE_TOKENS tokens, register (for this
    statement) a function that tests all of them at once; yield its name, or None when the
    driver cannot (SQL LIKE over a JSON array of the patterns then).

    SQL LIKE tries every token on every row: 340 short CJK tokens took 14 s at 50k
    messages. One regular expression of the tokens skips, in C, every position whose
    character starts no token (0.3 s there). Same answer: LIKE's ASCII-only case folding,
    and the text up to its first NUL, where LIKE stops reading it.
    """
    tokens = [token for token in reduced(route.like_tokens) if "\x00" not in token]
    if (
        route.index is not None
        or len(tokens) <= SQL_LIKE_TOKENS
        or not hasattr(raw, "create_function")
    ):
        yield None
        return
    pattern = re.compile("|".join(re.escape(token.translate(ASCII_LOWER)) for token in tokens))

    def like_any(*values: object) -> int:
        for value in values:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if isinstance(value, str) and pattern.search(
                value.split("\0", 1)[0].translate(ASCII_LOWER)
            ):
                return 1
        return 0

    raw.create_function(_LIKE_ANY, 3, like_any, deterministic=True)
    try:
        yield _LIKE_ANY
    finally:
        raw.create_function(_LIKE_ANY, 3, None)


def _fetch_hits(
    on: Runner, route: Route, options: SearchOptions, state: State, *, scan: bool = False
) -> list[dict[str, Any]] | None:
    """Run one route; None when FTS5 rejected the query text (the caller decides what next).

    ``scan=True`` answers an FTS route without its index, by an exact scan of `messages`.
    Raises Unreadable when the index or a row could not be read: that is no answer. The
    snippets the statement leaves out are made here, in the same read: an index that cannot
    make them is one that cannot be read.
    """
    filters, sort, page = options.filters, options.order, options.page
    limit, offset = page
    bounds = None
    if route.index is not None and not scan:
        bounds = pending_ranges(on, state).get(route.index)
    if bounds is not None:  # fetch the first pages whole, merge, then cut the page
        # A negative LIMIT is SQLite's "no limit" (and a negative OFFSET counts as 0).
        limit, offset = (-1 if limit < 0 else limit + max(offset, 0)), 0
    try:
        if scan:
            if route.index is not None and rejected(route.index, route.match):
                return None
            return scan_hits(on, route, filters, sort, page)
        with _like_any_registered(on.driver, route) as like_function:
            shape, values = _shape_and_values(
                route,
                filters,
                state.tables,
                rank=bounds is not None,
                sort=sort,
                like_function=like_function,
                blobs=reading_leniently(on.driver),
            )
            values.update(limit=limit, offset=offset)
            keys = ("id", *(("rank",) if shape.rank else ()), "snippet", *RESULT_KEYS)
            sql, params = _prepared(shape).bind(values)
            rows = [dict(zip(keys, row, strict=True)) for row in on.rows(sql, params)]
            if shape.table is not None:
                bounded_snippets(on, route, shape.table, rows)
        if bounds is not None:
            extra = pending_hits(on, route, filters, bounds)
            rows = merge_pending(rows, extra, sort, *page)
    except UnicodeEncodeError:  # a filter with a lone surrogate: nothing stored can match it
        log.debug("search: a filter is not encodable as UTF-8; no results")
        return []
    except (DBAPIError, sqlite3.Error) as exc:
        unreadable = as_unreadable(exc)
        if unreadable is None:
            raise
        if route.index is not None and rejected(route.index, route.match):
            log.debug("search: %s rejected the query", route.index)
            return None
        raise unreadable from None
    return rows


# -- SQLite's part of the search pipeline ---------------------------------------------------


#: The context windows' rows (hermes_store.search.context.windows_of): SQLite's substr()
#: stops at a NUL, so a text with one in its first CONTEXT_CHARS characters (JSON content
#: starts with one) is read whole; one shorter than that, too. Plain text is cut in SQL (a
#: 10 MB tool output costs no copy).
def _context_content(content: Any) -> Any:
    cut = func.substr(content, 1, CONTEXT_CHARS)
    plain_and_long = and_(func.typeof(content) == "text", func.length(cut) == CONTEXT_CHARS)
    return case((plain_and_long, cut), else_=content)


_CONTEXT_WINDOWS = Prepared.of(windows_of(_context_content))


class SQLiteSearch:
    """The search statements on one SQLite connection (hermes_store.search.pipeline)."""

    def __init__(self, on: Runner, learn: Callable[[], State]) -> None:
        self.on = on
        self._learn = learn

    @functools.cached_property
    def state(self) -> State:
        """What search knows of the database, learnt on first use (after sanitising)."""
        return self._learn()

    def plan(self, sanitized: str) -> Plan | SearchResults:
        state = self.state
        if state.application:
            raise UnsupportedLayout(
                "this store's search indexes are in the Hermes application's own layout "
                "(it moved them itself), which hermes-store does not search: use the agent's "
                "search; `check`, `storage` and `optimize` work on it"
            )
        if WORD_INDEX not in state.tables and WORD_INDEX not in state.damaged:
            log.debug("search: no %s table; no results", WORD_INDEX)  # FTS5 unavailable
            return SearchResults()
        route = route_query(sanitized, trigram=TRIGRAM_INDEX in state.tables)
        if route.index is not None and route.index in state.damaged:
            return Plan(route, degraded(route.index, state.damaged[route.index]))
        return Plan(route)

    def hits(self, plan: Plan, options: SearchOptions) -> Found:
        """The page's rows; once reading leniently, an index that still cannot be read is
        replaced by the exact scan."""
        route, why = plan.route, plan.degraded
        try:
            rows = _fetch_hits(self.on, route, options, self.state, scan=bool(why))
        except Unreadable as exc:
            if route.index is None or why or not reading_leniently(self.on.driver):
                raise
            why = degraded(route.index, exc.why)
            rows = _fetch_hits(self.on, route, options, self.state, scan=True)
        if rows == [] and route.index is not None and rejected(route.index, route.match):
            rows = None  # SQLite never asked FTS5: the filters alone left no row to test
        if rows is None and route.index == TRIGRAM_INDEX:  # trigram rejected it: LIKE scan
            route = Route(None, "", route.like_tokens)
            rows = _fetch_hits(self.on, route, options, self.state)
        if rows is None:  # the word index rejected the query text (FTS5 syntax error)
            return Found([], route, degraded=why, query_error=not_understood(route.match))
        return Found(rows, route, from_index=route.index is not None and not why, degraded=why)

    def snippets(self, found: Found) -> None:
        """Nothing left: the statement made them (FTS5's snippet(), and the bounded ones in
        the same read, so that an index that cannot make them is scanned instead)."""

    def contexts(self, hit_ids: Sequence[int]) -> dict[int, list[ContextMessage]]:
        try:
            return contexts_of(
                lambda chunk: self.on.rows(*_CONTEXT_WINDOWS.bind({"ids": chunk})), hit_ids
            )
        except (DBAPIError, sqlite3.Error) as exc:
            unreadable = as_unreadable(exc)
            if unreadable is not None and not reading_leniently(self.on.driver):
                raise unreadable from None  # read again, leniently
            log.debug("search: context lookup failed (%s)", type(exc).__name__)
        except Exception as exc:  # the contract: a failed context lookup leaves every hit with []
            log.debug("search: context lookup failed (%s)", type(exc).__name__)
        return {}

    def read(self, answer: Callable[[], SearchResults]) -> SearchResults:
        """``answer``; if the index or a row could not be read, again: the index, else the
        scan, with invalid UTF-8 as U+FFFD and its messages named in ``degraded``."""
        try:
            return answer()
        except Unreadable:
            pass
        with replacing_text(self.on.driver) as replacing:
            try:
                results = answer()
            except Unreadable as exc:  # nothing else reads `messages`: no answer
                raise exc.error from None
            ids = [hit["id"] for hit in results]
            named = undecodable(self.on, ids) if replacing.replaced else None
        if named:
            results.degraded = f"{results.degraded}; {named}" if results.degraded else named
        return results


def search_statements(conn: Connection) -> SQLiteSearch:
    """The search statements on an open Connection (search_messages)."""
    return SQLiteSearch(OnConnection(conn), functools.partial(learn_state, conn))


@contextlib.contextmanager
def read_transaction(source: Engine | Connections) -> Iterator[SQLiteSearch]:
    """The search statements in a read transaction of their own (search_store).

    They run on the driver connection (hermes_store.prepared), like the Store's other
    methods. Learning what search knows of the database after a schema change takes a
    SQLAlchemy Connection: then, and only then, the search runs on one instead.
    """
    with driver(source) as db:
        db.run("BEGIN")
        try:
            on = OnDriver(db)
            state = known_state(on)
            if state is not None:
                yield SQLiteSearch(on, functools.partial(_known, state))
                return
        finally:
            db.connection.rollback()
    with source.connect() as conn:
        yield search_statements(conn)
        share_state(conn.info, db.info)


def _known(state: State) -> State:
    return state

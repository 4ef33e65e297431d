"""The search statements on SQLite: FTS5 MATCH on the word and trigram indexes, the LIKE scan.

Snippets are FTS5's own up to SNIPPET_EXACT_BYTES and fts5_snippet.EXACT_INSTANCES (the
search statement makes those that are cheap whatever the text, _bounded_snippets the
others after it); past them, bounded (:mod:`hermes_store.search.snippet`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
    LargeBinary,
    Select,
    String,
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
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from hermes_store.prepared import Driver, Prepared
from hermes_store.search import snippet as fts5_snippet
from hermes_store.search.context import CONTEXT_WINDOW_IDS, _chunks
from hermes_store.search.query import (
    _ASCII_LOWER,
    MAX_SEARCH_TERMS,
    TRIGRAM_INDEX,
    WORD_INDEX,
    Highlight,
    QuerySyntaxError,
    _escape_like,
    _reduced,
    _Route,
    _route,
    highlight_of,
    parse_query,
    sanitize_query,
)
from hermes_store.search.schema import (
    _RESULT_COLUMNS,
    _RESULT_KEYS,
    _filter_criteria,
    _Filters,
    _m,
    _s,
)
from hermes_store.sqlite import fts
from hermes_store.sqlite.pending import (
    _TOKENIZERS,
    _merge_pending,
    _pending_hits,
    _pending_ranges,
    _scan_hits,
)

log = logging.getLogger(__name__)

_sqlite_master = table("sqlite_master", column("type", String), column("name", String))
#: Each index in the table of its own name: the tables a store at head has.
_OWN_TABLES = {WORD_INDEX: WORD_INDEX, TRIGRAM_INDEX: TRIGRAM_INDEX}

#: token, as the legacy application does; beyond, one Python function tests them all at
#: once (see _like_any_registered). At 50k messages one LIKE token costs about 45 ms, the
#: function about 280 ms whatever the number of tokens.
SQL_LIKE_TOKENS = 4
#: How the LIKE scan tests more than SQL_LIKE_TOKENS tokens without a Python function.
_JSON_PATTERNS = "json_each"
#: A hit's snippet is FTS5's own snippet() when its indexed text is at most this many bytes
#: and holds at most fts5_snippet.EXACT_INSTANCES instances of the query's phrases (FTS5's
#: time grows with their square); otherwise a bounded one (fts5_snippet.bounded_*).
#: docs/search.md, "Bounds", says where the two differ.
SNIPPET_EXACT_BYTES = 256 * 1024
_SNIPPET = "snippet({}, 0, '>>>', '<<<', '...', 40)"


@dataclass(frozen=True)
class _Shape:
    """What the SQL of a search statement depends on (never the values it runs with).

    Statements are built and compiled once per shape (:func:`_prepared`), then run with
    their values as parameters.
    """

    #: The FTS5 table the route reads (from _index_tables), or None: the LIKE scan.
    table: str | None
    #: _Filters.given: visibility, source, excluded source, role terms.
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
        snippet: ColumnElement[Any] = literal_column(_SNIPPET.format(shape.table), String)
        if shape.page:  # FTS5's snippet where it is cheap whatever the text; the others after
            size: ColumnElement[Any] = sum(
                (func.coalesce(func.length(c.cast(LargeBinary)), 0) for c in _TEXT_COLUMNS),
                literal_column("2"),  # the separators
            )
            snippet = case((size <= bindparam("snippet_bytes", type_=Integer), snippet))
        columns: list[Any] = [_m.c.id]
        if shape.rank:
            columns.append(index.c.rank.label("rank"))
        statement = (
            select(*columns, snippet.label("snippet"))
            .select_from(
                index.join(_m, _m.c.id == index.c.rowid).join(_s, _s.c.id == _m.c.session_id)
            )
            .where(
                literal_column(shape.table).op("MATCH")(bindparam("match", type_=String)),
                *_filter_criteria(shape.filters),
            )
        )
    else:
        statement = _like_statement(shape)
    if not shape.page:
        return statement
    rank: ColumnElement[Any] = literal_column("rank")
    order: list[ColumnElement[Any]]
    if shape.table is None:
        order = [_m.c.timestamp.desc()]
    elif shape.sort == "newest":
        order = [_m.c.timestamp.desc(), rank]
    elif shape.sort == "oldest":
        order = [_m.c.timestamp.asc(), rank]
    else:
        order = [rank]
    return (
        statement.add_columns(*_RESULT_COLUMNS)
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
        .offset(bindparam("offset", type_=Integer))
    )


def _like_statement(shape: _Shape) -> Select[*tuple[Any, ...]]:
    """The LIKE scan: one condition per token, OR-joined. Compatibility quirk kept from the
    legacy application: this path ignores the active/compacted visibility filter."""
    texts = (_m.c.content, _m.c.tool_name, _m.c.tool_calls)
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
        literal_column("1"), func.instr(_m.c.content, first) - literal_column("40")
    )
    snippet = func.substr(_m.c.content, start, literal_column("120"), type_=String)
    columns: list[Any] = [_m.c.id]
    if shape.rank:
        columns.append(null().label("rank"))
    return (
        select(*columns, snippet.label("snippet"))
        .select_from(_m.join(_s, _s.c.id == _m.c.session_id))
        .where(or_(*conditions), *_filter_criteria(shape.filters))
    )


@functools.lru_cache(maxsize=256)
def _prepared(shape: _Shape) -> Prepared:
    """A shape's statement, compiled once."""
    return Prepared.of(_statement(shape))


def _shape_and_values(
    route: _Route,
    filters: _Filters,
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
            values["snippet_bytes"] = _cheap_bytes(route)
        given = filters.given(visibility=True)
        return _Shape(tables[route.index], given, rank, page, sort), values
    tokens = _reduced(route.like_tokens)
    needles = [token for token in tokens if "\x00" in token]
    patterns = [f"%{_escape_like(token)}%" for token in tokens if "\x00" not in token]
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
    filters = _Filters(
        include_inactive=include_inactive,
        source_filter=source_filter,
        exclude_sources=exclude_sources,
        role_filter=role_filter,
    )
    route = _route(sanitized, trigram=trigram)
    shape, values = _shape_and_values(route, filters, _OWN_TABLES, rank=True, page=False)
    return _statement(shape).params(**values)


_LIKE_ANY = "hermes_like_any"


@contextlib.contextmanager
def _like_any_registered(raw: sqlite3.Connection, route: _Route) -> Iterator[str | None]:
    """For the LIKE route with more than SQL_LIKE_TOKENS tokens, register (for this
    statement) a function that tests all of them at once; yield its name, or None when the
    driver cannot (SQL LIKE over a JSON array of the patterns then).

    SQL LIKE tries every token on every row: 340 short CJK tokens took 14 s at 50k
    messages. One regular expression of the tokens skips, in C, every position whose
    character starts no token (0.3 s there). Same answer: LIKE's ASCII-only case folding,
    and the text up to its first NUL, where LIKE stops reading it.
    """
    tokens = [token for token in _reduced(route.like_tokens) if "\x00" not in token]
    if (
        route.index is not None
        or len(tokens) <= SQL_LIKE_TOKENS
        or not hasattr(raw, "create_function")
    ):
        yield None
        return
    pattern = re.compile("|".join(re.escape(token.translate(_ASCII_LOWER)) for token in tokens))

    def like_any(*values: object) -> int:
        for value in values:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if isinstance(value, str) and pattern.search(
                value.split("\0", 1)[0].translate(_ASCII_LOWER)
            ):
                return 1
        return 0

    raw.create_function(_LIKE_ANY, 3, like_any, deterministic=True)
    try:
        yield _LIKE_ANY
    finally:
        raw.create_function(_LIKE_ANY, 3, None)


def _fetch_hits(
    on: _Runner,
    route: _Route,
    filters: _Filters,
    sort: str | None,
    page: tuple[int, int],
    state: _State,
    *,
    scan: bool = False,
) -> list[dict[str, Any]] | None:
    """Run one route; None when FTS5 rejected the query text (the caller decides what next).

    ``scan=True`` answers an FTS route without its index, by an exact scan of `messages`.
    Raises _Unreadable when the index or a row could not be read: that is no answer.
    """
    limit, offset = page
    bounds = None
    if route.index is not None and not scan:
        bounds = _pending_ranges(on, state).get(route.index)
    if bounds is not None:  # fetch the first pages whole, merge, then cut the page
        # A negative LIMIT is SQLite's "no limit" (and a negative OFFSET counts as 0).
        limit, offset = (-1 if limit < 0 else limit + max(offset, 0)), 0
    try:
        if scan:
            if route.index is not None and _rejected(route.index, route.match):
                return None
            return _scan_hits(on.connection(), route, filters, sort, page)
        with _like_any_registered(on.driver, route) as like_function:
            shape, values = _shape_and_values(
                route,
                filters,
                state.tables,
                rank=bounds is not None,
                sort=sort,
                like_function=like_function,
                blobs=_reading_leniently(on.driver),
            )
            values.update(limit=limit, offset=offset)
            keys = ("id", *(("rank",) if shape.rank else ()), "snippet", *_RESULT_KEYS)
            sql, params = _prepared(shape).bind(values)
            rows = [dict(zip(keys, row, strict=True)) for row in on.rows(sql, params)]
            _bounded_snippets(on, route, shape, rows)
        if bounds is not None:
            extra = _pending_hits(on.connection(), route, filters, bounds)
            rows = _merge_pending(rows, extra, sort, *page)
    except UnicodeEncodeError:  # a filter with a lone surrogate: nothing stored can match it
        log.debug("search: a filter is not encodable as UTF-8; no results")
        return []
    except (DBAPIError, sqlite3.Error) as exc:
        unreadable = _unreadable(exc)
        if unreadable is None:
            raise
        if route.index is not None and _rejected(route.index, route.match):
            log.debug("search: %s rejected the query", route.index)
            return None
        raise unreadable from None
    return rows


# -- telling a query FTS5 rejects from an index or a row that cannot be read ----------------
# Both are an OperationalError, mostly "SQL logic error" (SQLITE_ERROR): FTS5 says the same
# for a dropped `_idx` or `_docsize` table as for some queries, so its message cannot tell
# them apart. A MATCH against an empty table of the same tokenizer, in a connection of its
# own, can: only the query text is there to reject.

#: SQLite's primary result codes of failures of the connection or the file system, not of
#: what is stored (busy, locked, out of memory, read-only, interrupted, I/O error, disk
#: full, cannot open, locking protocol): the search raises them, it has no answer.
_NOT_THE_DATA = frozenset({5, 6, 7, 8, 9, 10, 13, 14, 15})


class _Unreadable(Exception):
    """The index or a row could not be read: neither the query's fault nor the connection's."""

    def __init__(self, why: str, error: BaseException) -> None:
        super().__init__(why)
        #: What failed, for ``degraded`` (SQLite's message; never a row's text).
        self.why = why
        #: The driver's exception, raised when nothing else can answer.
        self.error = error


def _unreadable(exc: DBAPIError | sqlite3.Error) -> _Unreadable | None:
    """A driver error as _Unreadable when it may come from the index or a row, else None."""
    error = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return _Unreadable(_why(error), exc) if _about_the_data(error) else None


def _about_the_data(error: BaseException) -> bool:
    """Whether a driver error may come from the index or a row (so another way of reading
    may answer), not from the connection, the file system or the call."""
    if not isinstance(error, sqlite3.DatabaseError) or isinstance(error, sqlite3.ProgrammingError):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    return code is None or code & 0xFF not in _NOT_THE_DATA


def _why(error: BaseException) -> str:
    """A failure in SQLite's own words: they name objects, never a row's text. A failure of
    the driver's own (text it cannot decode: its message quotes the text) is not quoted."""
    if getattr(error, "sqlite_errorcode", None) is not None:
        return f"SQLite: {error}"
    return "the driver could not read a text"


_probe_lock = threading.Lock()


@functools.cache
def _probe() -> sqlite3.Connection:
    """An in-memory database with an empty FTS5 table per index, its tokenizer the index's."""
    probe = sqlite3.connect(":memory:", check_same_thread=False)  # used under _probe_lock
    for index, tokenizer in _TOKENIZERS.items():
        probe.execute(f"CREATE VIRTUAL TABLE {index} USING fts5(content{tokenizer})")
    return probe


@functools.lru_cache(maxsize=256)
def _rejected(index: str, match: str) -> bool:
    """Whether FTS5 rejects this MATCH expression itself, whatever any table holds (about
    12 us: asked when a search failed or found nothing)."""
    with _probe_lock:
        try:
            _probe().execute(f"SELECT 1 FROM {index} WHERE {index} MATCH ?", (match,)).fetchall()
        except sqlite3.OperationalError:
            return True
    return False


# -- text that is not valid UTF-8 ----------------------------------------------------------
# SQLite stores what a writer gives it: bytes bound as TEXT stay invalid UTF-8, and the
# sqlite3 module refuses to turn them into str, with an error that quotes the text. Such
# a search is read again with each invalid byte replaced by U+FFFD (what unicode61 and the
# trigram tokenizer also treat as no letter), and the rows are named by id.


class _Replacing:
    """A sqlite3 text_factory: UTF-8 as str, each invalid byte as U+FFFD; counts those."""

    def __init__(self) -> None:
        self.replaced = 0

    def __call__(self, data: bytes) -> str:
        try:
            return data.decode()
        except UnicodeDecodeError:
            self.replaced += 1
            return data.decode("utf-8", "replace")


@contextlib.contextmanager
def _replacing_text(raw: sqlite3.Connection) -> Iterator[_Replacing]:
    """Read text on this connection with U+FFFD for invalid UTF-8, for the block."""
    factory, kept = _Replacing(), raw.text_factory
    raw.text_factory = factory
    try:
        yield factory
    finally:
        raw.text_factory = kept


def _reading_leniently(raw: sqlite3.Connection) -> bool:
    return isinstance(getattr(raw, "text_factory", None), _Replacing)


#: The texts a search returns of a message (hit or context), by column.
_TEXTS = {
    "messages.session_id": _m.c.session_id,
    "messages.role": _m.c.role,
    "messages.content": _m.c.content,
    "messages.tool_name": _m.c.tool_name,
    "messages.tool_calls": _m.c.tool_calls,
    "sessions.source": _s.c.source,
    "sessions.model": _s.c.model,
}
_AS_BYTES = Prepared.of(
    select(_m.c.id, *(column.cast(LargeBinary) for column in _TEXTS.values()))
    .select_from(_m.outerjoin(_s, _s.c.id == _m.c.session_id))
    .where(_m.c.id.in_(bindparam("ids", expanding=True)))
)
_WINDOW_IDS = Prepared.of(CONTEXT_WINDOW_IDS)
#: At most this many messages are named in ``degraded``.
_NAMED = 5


def _undecodable(on: _Runner, hit_ids: Sequence[int]) -> str | None:
    """The hits and context rows whose text is not valid UTF-8, named by id and column
    (never by content), as a clause of ``degraded``; None when there are none."""
    found: dict[int, list[str]] = {}
    for chunk in _chunks(hit_ids):
        window = sorted({row[0] for row in on.rows(*_WINDOW_IDS.bind({"ids": chunk}))})
        for row in on.rows(*_AS_BYTES.bind({"ids": window})):
            for name, value in zip(_TEXTS, row[1:], strict=True):
                if isinstance(value, bytes) and not _is_utf8(value):
                    found.setdefault(int(row[0]), []).append(name)
    if not found:
        return None
    named = [f"message {i} ({', '.join(columns)})" for i, columns in sorted(found.items())]
    if len(named) > _NAMED:
        named[_NAMED:] = [f"{len(named) - _NAMED} more"]
    return (
        f"{', '.join(named)}: text that is not valid UTF-8, shown with U+FFFD for each "
        "invalid byte (the store keeps it as written)"
    )


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


# -- snippets of bounded cost --------------------------------------------------------------


_TEXT_COLUMNS = (_m.c.content, _m.c.tool_name, _m.c.tool_calls)


def _indexed_text() -> ColumnElement[Any]:
    """What the index holds of a message (the view `messages_fts_source`'s expression)."""
    return (
        func.coalesce(_m.c.content, "")
        .concat(" ")
        .concat(func.coalesce(_m.c.tool_name, ""))
        .concat(" ")
        .concat(func.coalesce(_m.c.tool_calls, ""))
    )


@functools.cache
def _prepared_texts() -> Prepared:
    """The indexed text of the hits ``ids``, as bytes (a text need not be valid UTF-8)."""
    return Prepared.of(
        select(_m.c.id, _indexed_text().cast(LargeBinary)).where(
            _m.c.id.in_(bindparam("ids", expanding=True))
        )
    )


def _marks(route: _Route) -> Highlight | None:
    """What the route's snippets mark (None when the parser cannot tell: FTS5 decides)."""
    try:
        return highlight_of(parse_query(route.match, trigram=route.index == TRIGRAM_INDEX))
    except QuerySyntaxError:
        return None


def _cheap_bytes(route: _Route) -> int:
    """The indexed texts whose FTS5 snippet the search statement computes: those too short
    to hold more than EXACT_INSTANCES instances of the query's phrases (at most one per
    phrase a token; a word token and its separator take two bytes, a trigram one)."""
    marks = _marks(route)
    phrases = max(len(marks.phrases) if marks else MAX_SEARCH_TERMS, 1)
    bytes_per_token = 1 if route.index == TRIGRAM_INDEX else 2
    return fts5_snippet.EXACT_INSTANCES * bytes_per_token // phrases - 1


def _bounded_snippets(
    on: _Runner, route: _Route, shape: _Shape, rows: list[dict[str, Any]]
) -> None:
    """Fill in the snippets the search statement left out (longer texts)."""
    if shape.table is None or not shape.page:
        return
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
            f"SELECT rowid, {_SNIPPET.format(shape.table)} FROM {shape.table} "
            f"WHERE {shape.table} MATCH ? AND +rowid IN ({', '.join('?' * len(ids))})",
            [route.match, *ids],
        )

    snippets = _snippets_of(route, texts, fts5_snippets)
    for row in rows:
        if row["id"] in snippets:
            row["snippet"] = snippets[row["id"]]


def _snippets_of(
    route: _Route,
    texts: Mapping[int, object],
    fts5_snippets: Callable[[list[int]], Iterable[Sequence[Any]]],
) -> dict[int, str]:
    """The snippets of the texts (id -> indexed text, as bytes) longer than _cheap_bytes:
    FTS5's own where it stays cheap (SNIPPET_EXACT_BYTES, EXACT_INSTANCES), asked of
    ``fts5_snippets`` (ids -> (id, snippet) rows); the others bounded."""
    marks = _marks(route)
    trigram = route.index == TRIGRAM_INDEX
    phrases: list[Any] = []
    if marks is not None:
        phrases = [phrase[0][0] for phrase in marks.phrases] if trigram else list(marks.phrases)
    cheap = _cheap_bytes(route)
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


# -- where a search's statements run ---------------------------------------------------


class _NeedsConnection(Exception):
    """This search takes a path that runs on a SQLAlchemy Connection only."""


class _Runner(Protocol):
    """Runs a search's statements: on a SQLAlchemy Connection, or on the driver."""

    #: The cache of the pooled connection (what _state keeps).
    info: dict[Any, Any]
    #: The DBAPI connection (Python functions, the backfill markers).
    driver: sqlite3.Connection

    def rows(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Sequence[Any]]: ...

    def connection(self) -> Connection: ...


class _OnConnection:
    """Statements through a SQLAlchemy Connection (its events and logging see them)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.info = conn.info
        self.driver = cast(sqlite3.Connection, conn.connection.driver_connection)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Sequence[Any]]:
        return self.conn.exec_driver_sql(sql, tuple(params)).fetchall()

    def connection(self) -> Connection:
        return self.conn


class _OnDriver:
    """Statements on the pooled driver connection; the rare paths need a Connection."""

    def __init__(self, db: Driver) -> None:
        self.db = db
        self.info = db.info
        self.driver = db.connection

    def rows(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Sequence[Any]]:
        return self.db.run(sql, params).fetchall()

    def connection(self) -> Connection:
        raise _NeedsConnection


# -- what a search knows about its database ----------------------------------------------
# Kept with the DBAPI connection and checked once per schema change of its database (the
# schema cookie), so a normal search pays one PRAGMA: which tables hold the indexes, whether
# their search mechanism can be trusted. The backfill markers are re-read when the data may
# have changed (_pending_ranges). Statements are compiled once per shape (_prepared).
_STATE = "hermes_store.search.state"


@dataclass
class _State:
    """What search knows about one connection's database, for one schema cookie."""

    cookie: int
    #: Each FTS index present -> the table that holds it (_index_tables).
    tables: dict[str, str]
    #: Whether `state_meta` exists (where a deferred backfill keeps its markers).
    meta: bool
    #: Index -> why its search mechanism cannot be trusted; {} when it can.
    damaged: dict[str, str]
    #: The store is in the Hermes application's own layout (not searched here).
    application: bool
    #: _pending_ranges' last reading, and the (total_changes, data_version) it was made at.
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)
    markers_read_at: tuple[int, ...] | None = None


def _index_tables(conn: Connection) -> tuple[dict[str, str], bool]:
    """Each FTS index this database has -> the table that holds it, and whether `state_meta`
    exists. The one place search learns its table names: every statement is built from
    them, once per schema change."""
    staged = {index: fts.staged_name(index) for index in (WORD_INDEX, TRIGRAM_INDEX)}
    statement = select(_sqlite_master.c.name).where(
        _sqlite_master.c.type == "table",
        _sqlite_master.c.name.in_([WORD_INDEX, TRIGRAM_INDEX, "state_meta", *staged.values()]),
    )
    present = set(conn.execute(statement).scalars())
    # An index rebuilt beside its legacy table (`messages_fts_next`) is read from the new
    # table: the legacy one keeps serving the application meanwhile, but it is the one that
    # drifted; the new one plus its pending rows is exact.
    tables = {
        index: staged[index] if staged[index] in present else index
        for index in (WORD_INDEX, TRIGRAM_INDEX)
        if index in present or staged[index] in present
    }
    return tables, "state_meta" in present


def _state(on: _Runner) -> _State:
    """This connection's _State, made again when the schema cookie has changed."""
    cookie = int(on.rows("PRAGMA schema_version")[0][0])
    state: _State | None = on.info.get(_STATE)
    if state is None or state.cookie != cookie:
        conn = on.connection()
        tables, meta = _index_tables(conn)
        application = fts.is_application_layout(conn)
        damaged = {} if application else fts.check_mechanism(conn, probe_trigram=False).damaged()
        state = _State(cookie, tables, meta, damaged, application)
        conn.info[_STATE] = state
    return state


def accept_search_objects(conn: Connection) -> None:
    """Use this connection's indexes as they are, until the schema next changes.

    For deliberate variants of the search objects (the benchmarks' comparison-only
    layouts): search no longer compares them with this package's definition, so it does
    not answer by a scan. Not for stores in production: `hermes-store check` finds what
    differs, `check --repair` restores it.
    """
    cookie = int(conn.exec_driver_sql("PRAGMA schema_version").scalar_one())
    tables, meta = _index_tables(conn)
    conn.info[_STATE] = _State(cookie, tables, meta, {}, False)


def _degraded(index: str, why: str) -> str:
    """The one-line warning of a search answered without its damaged index."""
    return (
        f"the search index {index} is damaged ({why}); results come from a slower scan of "
        "the messages; run `hermes-store check --repair`"
    )


def _share_state(source: dict[Any, Any], target: dict[Any, Any]) -> None:
    """Give the driver connection what the Connection learnt of the database (_state).

    A store's own connections are not its engine's (hermes_store.prepared): without this,
    each of their searches would take the Connection again to learn it.
    """
    state: _State | None = source.get(_STATE)
    known: _State | None = target.get(_STATE)
    if (
        state is not None
        and target is not source
        and (known is None or known.cookie != state.cookie)
    ):
        target[_STATE] = _State(
            state.cookie, state.tables, state.meta, state.damaged, state.application
        )

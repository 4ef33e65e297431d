"""The message-search contract (shared/spec/search.md): sanitising, routing, filters, context."""

from __future__ import annotations

import contextlib
import functools
import heapq
import json
import logging
import re
import sqlite3
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, cast

from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
    LargeBinary,
    Select,
    String,
    and_,
    bindparam,
    column,
    false,
    func,
    literal_column,
    null,
    or_,
    select,
    table,
    tuple_,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DatabaseError, OperationalError
from sqlalchemy.orm import Session

from hermes_store import fts
from hermes_store.errors import QueryTooComplex, UnsupportedLayout
from hermes_store.prepared import Connections, Driver, Prepared, driver

__all__ = [
    "MAX_QUERY_CHARS",
    "MAX_SEARCH_TERMS",
    "TRIGRAM_INDEX",
    "WORD_INDEX",
    "ContextMessage",
    "SearchHit",
    "SearchResults",
    "contains_cjk",
    "count_cjk",
    "match_selectable",
    "sanitize_query",
    "search_messages",
    "search_store",
    "without_repeats",
]

log = logging.getLogger(__name__)

MAX_QUERY_CHARS = 2048
#: At most this many terms (words of phrases included, repeats removed first) go to an FTS5
#: index: FTS5's cost per matching row grows with the square of the term count (`the`
#: repeated 200 times took 19 s at 50k messages). 32 distinct terms OR-ed answer in 0.2 s
#: there; the LIKE route of short CJK tokens is not capped (its tokens are reduced instead).
MAX_SEARCH_TERMS = 32
WORD_INDEX = "messages_fts"
TRIGRAM_INDEX = "messages_fts_trigram"
CONTEXT_CHARS = 200
CONTENT_JSON_PREFIX = "\x00json:"
MULTIMODAL_PLACEHOLDER = "[multimodal content]"

_OPERATORS = frozenset({"AND", "OR", "NOT"})
_CJK_RANGES = (
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0x3400, 0x4DBF),  # CJK Extension A
    (0x20000, 0x2A6DF),  # CJK Extension B
    (0x3000, 0x303F),  # CJK Symbols and Punctuation
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0xAC00, 0xD7AF),  # Hangul Syllables
)
# Each kept phrase is replaced by one private-use character absent from the query, so a
# placeholder can never collide with user text and is neither a word character, whitespace,
# nor one of the characters the later steps rewrite.
_PLACEHOLDER_CODEPOINTS = range(0xE000, 0xF900)
_FTS_SPECIAL = re.compile(r'[+{}():"^]')
_STAR_RUN = re.compile(r"\*+")
_BARE_STAR = re.compile(r"(^|\s)\*")
_LEADING_OPERATOR = re.compile(r"^(AND|OR|NOT)\b\s*", re.IGNORECASE)
_TRAILING_OPERATOR = re.compile(r"\s+(AND|OR|NOT)\s*$", re.IGNORECASE)
_JOINED_TERM = re.compile(r"\b(\w+(?:[._-]\w+)+)\b")

_IN_CHUNK = 500  # ids per IN (...) of the context lookup, far below SQLite's variable limit

_messages = table(
    "messages",
    column("id", Integer),
    column("session_id", String),
    column("role", String),
    column("content", String),
    column("tool_name", String),
    column("tool_calls", String),
    column("timestamp", Float),
    column("active", Integer),
    column("compacted", Integer),
)
_sessions = table(
    "sessions",
    column("id", String),
    column("source", String),
    column("model", String),
    column("started_at", Float),
)
_m = _messages.alias("m")
_s = _sessions.alias("s")
_sqlite_master = table("sqlite_master", column("type", String), column("name", String))
#: Each index in the table of its own name: the tables a store at head has.
_OWN_TABLES = {WORD_INDEX: WORD_INDEX, TRIGRAM_INDEX: TRIGRAM_INDEX}

# The context windows of hits ``t``: each hit with its session's previous and next
# messages in (timestamp, id) order, every row of the session whatever its visibility flags,
# in one statement (per chunk of hits).
_target = _messages.alias("t")
_other = _messages.alias("n")
_window_row = _messages.alias("w")
# Row values, not (a < b OR a = b AND ...): SQLite then seeks the session's index
# (session_id, timestamp) to the neighbour instead of reading the whole session.
_target_key = tuple_(_target.c.timestamp, _target.c.id)
_other_key = tuple_(_other.c.timestamp, _other.c.id)
_previous_id = (
    select(_other.c.id)
    .where(_other.c.session_id == _target.c.session_id, _other_key < _target_key)
    .order_by(_other.c.timestamp.desc(), _other.c.id.desc())
    .limit(1)
    .scalar_subquery()
)
_next_id = (
    select(_other.c.id)
    .where(_other.c.session_id == _target.c.session_id, _other_key > _target_key)
    .order_by(_other.c.timestamp.asc(), _other.c.id.asc())
    .limit(1)
    .scalar_subquery()
)
_CONTEXT_WINDOWS = Prepared.of(
    select(_target.c.id, _window_row.c.role, _window_row.c.content)
    .select_from(
        _target.join(_window_row, _window_row.c.id.in_([_target.c.id, _previous_id, _next_id]))
    )
    .where(_target.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(_target.c.id, _window_row.c.timestamp, _window_row.c.id)
)


class ContextMessage(TypedDict):
    """One neighbour (or the hit itself) in a hit's context window."""

    role: str
    content: str


class SearchHit(TypedDict):
    """One result of :func:`search_messages`, with exactly the keys of the contract."""

    id: int
    session_id: str
    role: str
    snippet: str | None
    timestamp: float
    tool_name: str | None
    source: str
    model: str | None
    session_started: float
    context: list[ContextMessage]


class SearchResults(list[SearchHit]):
    """The hits of :func:`search_messages`: a list, plus why they did not come from the index.

    ``degraded`` is None normally. When the search index is damaged (its triggers or view
    are not this package's, or SQLite reports it malformed) the hits come from an exact scan
    of `messages` instead, and ``degraded`` says so in one line (ranking then only
    approximates BM25 over the whole store).
    """

    degraded: str | None

    def __init__(self, hits: Iterable[SearchHit] = (), degraded: str | None = None) -> None:
        super().__init__(hits)
        self.degraded = degraded


@dataclass(frozen=True)
class _Route:
    """Where a sanitised query is answered: an FTS index (``index``) or the LIKE scan (None)."""

    index: str | None
    match: str
    like_tokens: tuple[str, ...]


@dataclass(frozen=True)
class _Filters:
    """The caller's filters, as the contract applies them."""

    include_inactive: bool = False
    source_filter: Sequence[str] | None = None
    exclude_sources: Sequence[str] | None = None
    role_filter: Sequence[str] | None = None

    def given(self, *, visibility: bool) -> tuple[bool, bool, bool, bool]:
        """Which WHERE terms apply (visibility only where the path has it): the part of a
        statement's shape the filters decide."""
        return (
            visibility and not self.include_inactive,
            self.source_filter is not None,
            self.exclude_sources is not None,
            bool(self.role_filter),
        )

    def values(self) -> dict[str, Any]:
        """The values of the filter terms' parameters."""
        return {
            "sources": list(self.source_filter or ()),
            "excluded": list(self.exclude_sources or ()),
            "roles": list(self.role_filter or ()),
        }


def _is_cjk(char: str) -> bool:
    """Tell whether one character is in the contract's CJK ranges."""
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK_RANGES)


def contains_cjk(text: str) -> bool:
    """Tell whether ``text`` has at least one CJK character (the contract's ranges)."""
    return any(_is_cjk(char) for char in text)


def count_cjk(text: str) -> int:
    """Count the CJK characters of ``text``."""
    return sum(1 for char in text if _is_cjk(char))


def _free_placeholders(text: str) -> Iterator[str]:
    """Yield private-use characters that do not occur in ``text``."""
    used = set(text)
    return (chr(code) for code in _PLACEHOLDER_CODEPOINTS if chr(code) not in used)


def _set_phrases_aside(query: str) -> tuple[str, dict[str, str]]:
    """Replace balanced ``"..."`` phrases by placeholders and unmatched quotes by spaces."""
    placeholders = _free_placeholders(query)
    phrases: dict[str, str] = {}
    pieces: list[str] = []
    position = 0
    while (start := query.find('"', position)) != -1:
        pieces.append(query[position:start])
        end = query.find('"', start + 1)
        if end == -1:  # unmatched: no quote can follow, the rest is plain text
            pieces.append(" ")
            position = start + 1
            break
        placeholder = next(placeholders)
        phrases[placeholder] = query[start : end + 1]
        pieces.append(placeholder)
        position = end + 1
    pieces.append(query[position:])
    return "".join(pieces), phrases


def sanitize_query(query: str) -> str:
    """Turn user input into a safe FTS5 query, steps 1 to 7 of the contract, in order."""
    text, phrases = _set_phrases_aside(query[:MAX_QUERY_CHARS])
    text = _FTS_SPECIAL.sub(" ", text)
    text = _BARE_STAR.sub(r"\1", _STAR_RUN.sub("*", text))
    text = _LEADING_OPERATOR.sub("", text.strip())
    text = _TRAILING_OPERATOR.sub("", text.strip())
    text = _JOINED_TERM.sub(r'"\1"', text)
    if phrases:
        text = text.translate({ord(placeholder): phrase for placeholder, phrase in phrases.items()})
    return text.strip()


_TOKEN = re.compile(r'"(?:[^"]|"")*"|[^ ]+')


def _term_key(token: str) -> str:
    """Tokens with equal keys match the same rows: ASCII case folded (as unicode61 and the
    trigram tokenizer fold it), anything else compared as written."""
    return token.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def without_repeats(sanitized: str) -> str:
    """The sanitised query with repeated terms removed where that cannot change the hits.

    Without NOT, a query is OR-ed groups of AND-ed terms (explicit AND is the implicit
    one): a term repeated within a group, or a group repeated, adds nothing to the hit set
    but costs FTS5 work that grows with the square of the term count. Queries with NOT are
    left as written. BM25 counts each repeat, so the rank of a query with repeats may differ
    from the legacy application's; the rows do not.
    """
    if any(char != " " and (char.isspace() or not char.isprintable()) for char in sanitized):
        return sanitized  # FTS5 and Python disagree on what separates such tokens
    tokens = _TOKEN.findall(sanitized)
    if "NOT" in tokens:
        return sanitized
    joins = [index for index, word in enumerate(tokens) if word in ("AND", "OR")]
    if any(i in (0, len(tokens) - 1) or tokens[i + 1] in ("AND", "OR") for i in joins):
        return sanitized  # "a AND AND b": FTS5's syntax error is the contract's answer
    groups: list[list[str]] = [[]]
    for word in tokens:
        if word == "OR":
            groups.append([])
        elif word != "AND":
            groups[-1].append(word)
    kept: dict[tuple[str, ...], str] = {}
    for group in groups:
        terms = {_term_key(term): term for term in reversed(group)}  # first spelling kept
        keys = tuple(dict.fromkeys(_term_key(term) for term in group))
        kept.setdefault(tuple(sorted(keys)), " ".join(terms[key] for key in keys))
    return " OR ".join(kept.values())


def _count_terms(match: str) -> int:
    """Terms FTS5 evaluates in a MATCH expression: every word of every phrase, no operators."""
    count = 0
    for token in _TOKEN.findall(match):
        if token in _OPERATORS:
            continue
        count += max(1, len(token.strip('"').split())) if token.startswith('"') else 1
    return count


def _check_bounded(route: _Route) -> None:
    if route.index is not None and (terms := _count_terms(route.match)) > MAX_SEARCH_TERMS:
        raise QueryTooComplex(
            f"the search query has {terms} distinct terms; at most {MAX_SEARCH_TERMS} are "
            "searched at once (each one multiplies the index's work on every matching "
            "message): keep the words that matter"
        )


def _quote_token(token: str) -> str:
    """Quote one token as an FTS5 string, doubling inner quotes."""
    return '"' + token.replace('"', '""') + '"'


def _route(sanitized: str, *, trigram: bool) -> _Route:
    """Pick the index (or the LIKE scan) that answers a sanitised query."""
    if not contains_cjk(sanitized):
        return _Route(WORD_INDEX, sanitized, ())
    raw = sanitized.strip('"').strip()
    tokens = raw.split()
    terms = tuple(token for token in tokens if token.upper() not in _OPERATORS)
    like_tokens = terms or (raw,)
    long_enough = count_cjk(raw) >= 3 and all(
        count_cjk(term) >= 3 for term in terms if contains_cjk(term)
    )
    if trigram and long_enough:
        match = " ".join(
            token if token.upper() in _OPERATORS else _quote_token(token) for token in tokens
        )
        return _Route(TRIGRAM_INDEX, match, like_tokens)
    return _Route(None, "", like_tokens)


def _escape_like(token: str) -> str:
    """Escape ``\\``, ``%`` and ``_`` for a LIKE pattern with ``\\`` as the escape character."""
    return token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _filter_criteria(given: tuple[bool, bool, bool, bool]) -> list[ColumnElement[bool]]:
    """The WHERE terms of the filters given (see _Filters.given), values left as parameters."""
    visible_only, sources, excluded, roles = given
    criteria: list[ColumnElement[bool]] = []
    if visible_only:
        one = literal_column("1", Integer)
        criteria.append(or_(_m.c.active == one, _m.c.compacted == one))
    if sources:
        criteria.append(_s.c.source.in_(bindparam("sources", expanding=True)))
    if excluded:
        criteria.append(_s.c.source.not_in(bindparam("excluded", expanding=True)))
    if roles:
        criteria.append(_m.c.role.in_(bindparam("roles", expanding=True)))
    return criteria


def _reduced(tokens: Sequence[str]) -> list[str]:
    """The LIKE route's tokens without those that add nothing to its OR: repeats, and any
    token containing another one (a row with "数据" has "数"). LIKE folds ASCII case only."""
    unique = list({_term_key(token): token for token in reversed(tokens)}.values())[::-1]
    keys = {token: _term_key(token) for token in unique if "\x00" not in token}
    return [
        token
        for token in unique
        if token not in keys
        or not any(other != token and keys[other] in keys[token] for other in keys)
    ]


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


_RESULT_COLUMNS = (
    _m.c.session_id,
    _m.c.role,
    _m.c.timestamp,
    _m.c.tool_name,
    _s.c.source,
    _s.c.model,
    _s.c.started_at.label("session_started"),
)
_RESULT_KEYS = (
    "session_id",
    "role",
    "timestamp",
    "tool_name",
    "source",
    "model",
    "session_started",
)


def _statement(shape: _Shape) -> Select[*tuple[Any, ...]]:
    """The search statement of a shape, its values left as named parameters."""
    if shape.table is not None:
        index = table(shape.table, column("rowid", Integer), column("rank", Float))
        snippet = literal_column(f"snippet({shape.table}, 0, '>>>', '<<<', '...', 40)", String)
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
        conditions.append(getattr(func, shape.pattern_set)(*texts) == 1)
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
) -> tuple[_Shape, dict[str, Any]]:
    """The shape of a route's statement and the values of its parameters."""
    values = filters.values()
    if route.index is not None:
        values["match"] = route.match
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
    shape = _Shape(None, given, rank, page, None, len(needles), len(patterns), pattern_set)
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


def _normalise_sort(sort: object) -> str | None:
    """Return ``"newest"`` or ``"oldest"`` (case-insensitive, trimmed), else None (rank)."""
    if isinstance(sort, str) and sort.strip().lower() in ("newest", "oldest"):
        return sort.strip().lower()
    return None


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
    """Run one route; None when its index rejected the query (the caller decides what next).

    ``scan=True`` answers an FTS route without its index, by an exact scan of `messages`.
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
            return _scan_hits(on.connection(), route, filters, sort, page)
        with _like_any_registered(on.driver, route) as like_function:
            shape, values = _shape_and_values(
                route,
                filters,
                state.tables,
                rank=bounds is not None,
                sort=sort,
                like_function=like_function,
            )
            values.update(limit=limit, offset=offset)
            keys = ("id", *(("rank",) if shape.rank else ()), "snippet", *_RESULT_KEYS)
            sql, params = _prepared(shape).bind(values)
            rows = [dict(zip(keys, row, strict=True)) for row in on.rows(sql, params)]
        if bounds is not None:
            extra = _pending_hits(on.connection(), route, filters, bounds)
            rows = _merge_pending(rows, extra, sort, *page)
    except UnicodeEncodeError:  # lone surrogates cannot be bound: nothing can match them
        log.debug("search: query or filter not encodable as UTF-8; no results")
        return []
    except (OperationalError, sqlite3.OperationalError) as exc:
        if route.index is None:
            raise
        error = exc.orig if isinstance(exc, OperationalError) else exc
        log.debug("search: %s rejected the query (%s)", route.index, type(error).__name__)
        return None
    return rows


# -- a deferred backfill in progress --------------------------------------------------------
# While `optimize-storage` has not yet indexed the ids (indexed_upto, high_water] of an
# index, those rows are searched here: a scan over the range picks the rows that contain
# the query's terms (any of them, or all of them when the query is a plain conjunction),
# and a temporary FTS5 table with the same tokenizer holds just those rows to apply the
# exact MATCH expression and compute the same snippet.
#
# The scan must find a superset of what the index would match. FTS5 folds case for every
# script, unicode61 also removes diacritics ("naive" matches "naïve"), and both see text
# after a NUL character (multimodal content starts with one), while LIKE folds ASCII only
# and stops at the first NUL. So LIKE (fast, in C) only decides for rows that are plain
# ASCII; every other row is tested in Python on text folded at least as far as FTS5 folds
# it (`_fold`).
#: FTS5's trigram tokenizer indexes runs of this many characters.
TRIGRAM_LENGTH = 3
_TERM = re.compile(r"[^\W_]+")  # unicode61 token characters: letters and digits, not "_"
_QUOTED = re.compile(r'"(?:[^"]|"")*"')
_FTS_OPERATORS = frozenset({"AND", "OR", "NOT"})  # bare NEAR without "(" is a plain term
_PENDING_TABLE = "hermes_pending_rows"
_PENDING_MATCH = "hermes_pending_match"
_TOKENIZERS = {WORD_INDEX: "", TRIGRAM_INDEX: ", tokenize='trigram'"}


def _fold(text: str) -> str:
    """Case-fold and strip diacritics, at least as coarsely as unicode61 and trigram fold.

    Character by character, so a token found by FTS5 is a substring of the folded text.
    """
    if text.isascii():
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(char for char in decomposed if not unicodedata.combining(char)).casefold()


@functools.cache
def _markers() -> tuple[str, ...]:
    """The backfill keys of both indexes and of the tables they may be rebuilt in."""
    indexes = (WORD_INDEX, TRIGRAM_INDEX)
    tables = (*indexes, *(fts.staged_name(index) for index in indexes))
    markers = ("indexed_upto", "high_water")
    return tuple(f"{table}.backfill_{marker}" for table in tables for marker in markers)


def _pending_ranges(on: _Runner, state: _State) -> dict[str, tuple[int, int]]:
    """Index -> (indexed_upto, high_water) of each unfinished deferred backfill.

    The markers in `state_meta` are read again only when the database may have changed
    since: another connection committed (``data_version``) or this one wrote
    (``total_changes()``); otherwise the last reading stands.
    """
    if not state.meta:
        return {}
    changes = on.driver.execute("SELECT total_changes(), data_version FROM pragma_data_version")
    key = tuple(changes.fetchone())
    if state.markers_read_at != key:
        marks = ", ".join("?" * len(_markers()))
        found = dict(
            on.driver.execute(
                f"SELECT key, value FROM state_meta WHERE key IN ({marks})", _markers()
            )
        )
        pending = {}
        for index, table in state.tables.items():  # the markers of the table it is read from
            high = found.get(f"{table}.backfill_high_water")
            if high is not None:
                upto = found.get(f"{table}.backfill_indexed_upto")
                pending[index] = (int(upto or 0), int(high))
        state.pending, state.markers_read_at = pending, key
    return state.pending


def _candidate_terms(route: _Route) -> tuple[list[str], bool]:
    """Folded substrings of the rows matching the route, and whether each row has all of them.

    When the MATCH expression has no bare OR / NOT, every term is required; otherwise every
    matching row contains at least one of the terms.
    """
    # FTS5 reads a MATCH expression only up to its first NUL: so does this filter.
    visible = route.match.split("\0", 1)[0]
    if route.index == TRIGRAM_INDEX:
        # A trigram term shorter than 3 characters has no trigram: FTS5 treats it as a
        # phrase of no tokens, neutral beside other terms and matching nothing alone.
        terms = [_fold(token) for token in route.like_tokens if len(token) >= TRIGRAM_LENGTH]
        operators = _QUOTED.sub(" ", visible).split()
    else:
        # Operators are bare words outside quotes; inside a phrase every word is a token.
        words = _QUOTED.sub(" ", visible).split()
        operators = [word for word in words if word in _FTS_OPERATORS]
        parts = [word for word in words if word not in _FTS_OPERATORS]
        parts += _QUOTED.findall(visible)
        # "_" and the other non-token characters separate unicode61 tokens.
        terms = [_fold(term) for part in parts for term in _TERM.findall(part)]
    require_all = not any(word in ("OR", "NOT") for word in operators)
    return list(dict.fromkeys(t for t in terms if t)), require_all


def _pending_hits(
    conn: Connection, route: _Route, filters: _Filters, bounds: tuple[int, int]
) -> list[dict[str, Any]]:
    """Rows of the not-yet-indexed range that match the route, with rank and snippet."""
    assert route.index is not None
    terms, require_all = _candidate_terms(route)
    if not terms:
        return []
    low, high = bounds
    expression = (
        func.coalesce(_m.c.content, "")
        + " "
        + func.coalesce(_m.c.tool_name, "")
        + " "
        + func.coalesce(_m.c.tool_calls, "")
    )
    # LIKE decides for plain ASCII rows (none of them folds to a non-ASCII term); the
    # others are tested on their folded text, in Python.
    ascii_terms = [t for t in terms if t.isascii()]
    by_like: ColumnElement[bool] = false()
    if ascii_terms and (len(ascii_terms) == len(terms) or not require_all):
        by_like = (and_ if require_all else or_)(
            *(
                expression.like(
                    bindparam("term", f"%{_escape_like(t)}%", String, unique=True), "\\"
                )
                for t in ascii_terms
            )
        )
    raw: Any = getattr(conn.connection, "driver_connection", None)
    functions = hasattr(raw, "create_function")
    if functions:

        def folded_match(text: object) -> bool:
            if not isinstance(text, str) or (text.isascii() and "\0" not in text):
                return False  # LIKE saw all of it
            folded = _fold(text)
            return (all if require_all else any)(term in folded for term in terms)

        raw.create_function(_PENDING_MATCH, 1, folded_match)
        by_fold: ColumnElement[bool] = getattr(func, _PENDING_MATCH)(expression) == 1
    else:  # a driver without Python functions: every row LIKE may misjudge is a candidate
        # Plain ASCII without NUL: as many bytes as characters before the first NUL.
        by_fold = func.length(expression.cast(LargeBinary)) != func.length(expression)
    candidates = (
        select(_m.c.id, expression)
        .select_from(_m.join(_s, _s.c.id == _m.c.session_id))
        .where(
            _m.c.id > low,
            _m.c.id <= high,
            or_(by_like, by_fold),
            *_filter_criteria(filters.given(visibility=True)),
        )
    )
    try:
        rows = conn.execute(candidates, filters.values()).all()
    finally:
        if functions:
            raw.create_function(_PENDING_MATCH, 1, None)
    if not rows:
        return []
    matched = {
        int(rowid): (rank, snippet)
        for rowid, rank, snippet in _match_apart(route, [(int(i), text) for i, text in rows])
    }
    hits: list[dict[str, Any]] = []
    for chunk in _chunks(sorted(matched)):
        statement = (
            select(_m.c.id, *_RESULT_COLUMNS)
            .select_from(_m.join(_s, _s.c.id == _m.c.session_id))
            .where(_m.c.id.in_(chunk))
        )
        for row in conn.execute(statement).mappings():
            rank, snippet = matched[row["id"]]
            hits.append({"id": row["id"], "rank": rank, "snippet": snippet, **row})
    return hits


def _match_apart(route: _Route, rows: list[tuple[int, str]]) -> list[tuple[int, float, str]]:
    """(id, rank, snippet) of the rows the route's MATCH selects, in a private FTS5 table.

    The table lives in a connection of its own (same SQLite library, so the same
    tokenizers, ranking and snippets): it never writes to the caller's connection, and
    it works even in a transaction where a damaged index made FTS5 fail (SQLite then
    refuses to create another FTS5 table until that transaction ends).
    """
    assert route.index is not None
    with contextlib.closing(sqlite3.connect(":memory:")) as apart:
        apart.execute(
            f"CREATE VIRTUAL TABLE {_PENDING_TABLE} USING fts5(content{_TOKENIZERS[route.index]})"
        )
        apart.executemany(f"INSERT INTO {_PENDING_TABLE}(rowid, content) VALUES (?, ?)", rows)
        return apart.execute(
            f"SELECT rowid, rank, snippet({_PENDING_TABLE}, 0, '>>>', '<<<', '...', 40) "
            f"FROM {_PENDING_TABLE} WHERE {_PENDING_TABLE} MATCH ?",
            (route.match,),
        ).fetchall()


def _scan_hits(
    conn: Connection, route: _Route, filters: _Filters, sort: str | None, page: tuple[int, int]
) -> list[dict[str, Any]]:
    """Every message an FTS route matches, by the pending-rows scan over all ids; one page."""
    low, high = conn.execute(select(func.min(_m.c.id), func.max(_m.c.id))).one()
    if high is None:
        return []
    extra = _pending_hits(conn, route, filters, (int(low) - 1, int(high)))
    return _merge_pending([], extra, sort, *page)


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


def _merge_pending(
    rows: list[dict[str, Any]],
    extra: list[dict[str, Any]],
    sort: str | None,
    limit: int,
    offset: int,
) -> list[dict[str, Any]]:
    """Merge indexed hits (already ordered) with the pending range's, then page them."""
    if sort == "newest":

        def key(row: dict[str, Any]) -> tuple[float, float]:
            return (-row["timestamp"], row["rank"])
    elif sort == "oldest":

        def key(row: dict[str, Any]) -> tuple[float, float]:
            return (row["timestamp"], row["rank"])
    else:

        def key(row: dict[str, Any]) -> tuple[float, float]:
            return (row["rank"], 0.0)

    merged = list(heapq.merge(rows, sorted(extra, key=key), key=key))
    offset = max(offset, 0)  # SQLite's paging: a negative OFFSET is 0, a negative LIMIT none
    return merged[offset:] if limit < 0 else merged[offset : offset + limit]


def _context_text(raw: object) -> str:
    """Render stored content for a context entry: decoded, multimodal flattened, cut."""
    value: object = raw
    if isinstance(raw, str) and raw.startswith(CONTENT_JSON_PREFIX):
        try:
            value = json.loads(raw[len(CONTENT_JSON_PREFIX) :])
        except ValueError:  # undecodable: shown as stored, like the legacy application
            value = raw
    if isinstance(value, list):
        parts = (
            part.get("text", "")
            for part in value
            if isinstance(part, dict) and part.get("type") == "text" and part.get("text")
        )
        text = " ".join(parts).strip() or MULTIMODAL_PLACEHOLDER
    elif isinstance(value, str):
        text = value
    else:
        text = ""
    return text[:CONTEXT_CHARS]


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    """Split ids into IN-list sized chunks."""
    for start in range(0, len(ids), _IN_CHUNK):
        yield list(ids[start : start + _IN_CHUNK])


def _contexts(on: _Runner, hit_ids: Sequence[int]) -> dict[int, list[ContextMessage]]:
    """The context window of every hit: one statement per chunk of hits."""
    contexts: dict[int, list[ContextMessage]] = {hit_id: [] for hit_id in hit_ids}
    failed: set[int] = set()
    for chunk in _chunks(hit_ids):
        for hit_id, role, content in on.rows(*_CONTEXT_WINDOWS.bind({"ids": chunk})):
            if hit_id in failed:
                continue
            try:
                entry: ContextMessage = {"role": role, "content": _context_text(content)}
                contexts[hit_id].append(entry)
            except Exception:  # the contract: a hit whose context cannot be built gets []
                log.debug("search: context of message %s could not be built", hit_id, exc_info=True)
                failed.add(hit_id)
                contexts[hit_id] = []
    return contexts


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
    """Search message text exactly as the legacy application did (shared/spec/search.md).

    Never answers wrongly without saying so: when the index a query needs is damaged, the
    hits come from an exact scan of `messages`, one WARNING is logged and the result's
    ``degraded`` says why (see :class:`SearchResults`).
    """
    connection = conn.connection() if isinstance(conn, Session) else conn
    return _search(
        _OnConnection(connection),
        query,
        _Filters(include_inactive, source_filter, exclude_sources, role_filter),
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


def _search(
    on: _Runner, query: str, filters: _Filters, sort: str | None, page: tuple[int, int]
) -> SearchResults:
    """search_messages' answer, its statements run by ``on``."""
    if not query or not query.strip():
        return SearchResults()
    sanitized = without_repeats(sanitize_query(query))
    if not sanitized:
        return SearchResults()
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
        rows = _fetch_hits(on, route, filters, order, page, state, scan=bool(degraded))
    except DatabaseError as exc:  # 'database disk image is malformed' is no OperationalError
        if type(exc) is not DatabaseError or route.index is None or degraded:
            raise
        degraded = _degraded(route.index, f"SQLite: {exc.orig}")
        rows = _fetch_hits(on, route, filters, order, page, state, scan=True)
    if degraded:
        log.warning("search: %s", degraded)
    if rows is None and route.index == TRIGRAM_INDEX:  # trigram rejected it: LIKE scan
        route = _Route(None, "", route.like_tokens)
        rows = _fetch_hits(on, route, filters, order, page, state)
    if not rows:  # None here: the word index rejected the query (FTS5 syntax error)
        return SearchResults(degraded=degraded)
    log.debug("search: %d hit(s) from %s", len(rows), route.index or "LIKE scan")
    try:
        contexts = _contexts(on, [row["id"] for row in rows])
    except Exception:  # the contract: a failed context lookup leaves every hit with []
        log.debug("search: context lookup failed", exc_info=True)
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

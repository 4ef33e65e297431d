"""The search statements on PostgreSQL: the contract answered from expression indexes.

The text is stored once, in `messages`. The revision fts1 indexes the same expression the
SQLite view indexes, ``hermes_search_document(content, tool_name, tool_calls)``, twice: a
GIN index over its tsvector (``hermes_search_words``, tokenised like FTS5's unicode61) for
the word path, and a pg_trgm GIN index for the trigram path. Every statement here uses
exactly those expressions, so the planner can use those indexes.

- Word path: the sanitised query is parsed (:mod:`hermes_store.search.query`) and turned
  into a tsquery whose words are normalised by the same database functions as the
  documents (``phraseto_tsquery('simple', hermes_search_lexemes(:text))``, ``to_tsquery``
  with ``:*`` for prefixes), joined with ``&&``, ``||``, ``!!`` and ``<->`` / ``<N>``.
- Trigram path (CJK, 3+ characters a token): each token a case-insensitive substring test
  (``ILIKE``, served by the trigram index; ``LIKE`` for a token without case), joined as
  FTS5 joins them.
- LIKE scan (1-2 CJK characters): the contract's per-column LIKE, with SQLite's
  ASCII-only case folding, without the visibility filter (the legacy quirk).

The trigram path's and the LIKE scan's tests are :mod:`hermes_store.postgresql.substrings`.

The word path finds its matches first, alone (a materialised CTE), with the planner held to
a bitmap scan of the search index (reads.BY_INDEX): it takes the index expression for cheap
and would rather re-tokenise every row. The trigram path tests its matches in the same scan
of the trigram index (a LIKE is cheap to test again; reads.BY_TRIGRAM_INDEX, ranked).
Ranked, both read their newest matches by id and size only (newest_matches; the word path
from the newest ids down). Rank is ``ts_rank_cd`` (word path) or the share of the text its
tokens cover (trigram path, coverage), higher first, not FTS5's BM25; ties go to the lower
id. Only the newest matches within RANK_WINDOW and RANK_WINDOW_BYTES are ranked; older ones
follow them, newest first. Snippets are FTS5's own, made in memory from the page's texts,
or the pure-Python reproduction (:mod:`hermes_store.postgresql.snippets`).
docs/search.md, "PostgreSQL", lists every difference from SQLite.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Float,
    Integer,
    String,
    and_,
    bindparam,
    case,
    column,
    func,
    literal,
    literal_column,
    null,
    select,
    table,
    true,
)
from sqlalchemy.dialects.postgresql import TSVECTOR
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from hermes_store.declarations import WORDS_COLUMN
from hermes_store.errors import SearchFailed
from hermes_store.models import SERVER_ESCAPE, from_server_text, to_server_text
from hermes_store.postgresql import words
from hermes_store.postgresql.contexts import (
    CONTEXT_COLUMN,
    column_rows,
    context_column,
    context_rows,
)
from hermes_store.postgresql.newest import (
    TOP_ID,
    VISIBLE,
    Exact,
    Scores,
    floors,
    newest_matches,
    text_bytes,
)
from hermes_store.postgresql.reads import (
    BY_INDEX,
    BY_TRIGRAM_INDEX,
    rejected_query,
    rows_by_index,
    sqlstate,
)
from hermes_store.postgresql.reads import rows as plain_rows
from hermes_store.postgresql.snippets import memory_page_snippets, pure_snippet
from hermes_store.postgresql.substrings import (
    caseless,
    coverage,
    found_tokens,
    like_condition,
    like_pattern,
    phrase_tokens,
    shape,
    trigram_condition,
    trigram_residue,
)
from hermes_store.postgresql.tsquery import (
    Binds,
    coarse_tsquery_of,
    coarse_tsquery_texts,
    computed_once,
    positional,
    tsquery_of,
    tsquery_shape,
    tsquery_texts,
)
from hermes_store.prepared import Connections
from hermes_store.search.context import (
    ContextMessage,
    SearchResults,
    contexts_of,
)
from hermes_store.search.fts5_snippets import memory_indexes
from hermes_store.search.pipeline import Found, Plan
from hermes_store.search.query import (
    TRIGRAM_INDEX,
    WORD_INDEX,
    Node,
    Nothing,
    QuerySyntaxError,
    Route,
    highlight_of,
    not_understood,
    parse_query,
    route_query,
    simplify,
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

log = logging.getLogger(__name__)

#: The LIKE scan's snippet: this many characters of the content, from this many before the
#: first token (the contract's substr(content, instr(content, token) - 40, 120)).
LIKE_SNIPPET_BEFORE = 40
LIKE_SNIPPET_LENGTH = 120


def _document(columns: Any = M.c) -> ColumnElement[str]:
    """The indexed text: the expression both indexes are built on."""
    return func.hermes_search_document(
        columns.content, columns.tool_name, columns.tool_calls, type_=String
    )


def _words(stored: bool) -> ColumnElement[Any]:
    """The document's tsvector: the stored column of revision fts2 (``stored``), else the
    expression fts1's word index is built on."""
    if stored:
        return _STORED_WORDS
    return func.hermes_search_words(_document(), type_=TSVECTOR)


#: `messages` as a statement reads a matched row again, by the ctid it was found at (a TID
#: scan, one page, not the primary key's): its stored words (word path) or its text
#: (trigram path, _scores). The word path's rank reads the window's rows (``ranked``);
#: the exact test of newest_matches, and the trigram path's test and rank, the newest
#: matches (``exact_row``).
_MESSAGE_ROW = table(
    "messages",
    column("ctid"),
    column(WORDS_COLUMN, TSVECTOR),
    column("content", String),
    column("tool_name", String),
    column("tool_calls", String),
)
_RANKED, _EXACT_ROW = _MESSAGE_ROW.alias("ranked"), _MESSAGE_ROW.alias("exact_row")


def _read_again(
    alias: Any, row: Any, value: Callable[[Any], ColumnElement[Any]]
) -> ColumnElement[Any]:
    """``value`` of the row at ctid ``row`` (of _MESSAGE_ROW's columns, through ``alias``):
    for the rows a statement tests or ranks only, not carried along with every match."""
    return select(value(alias.c)).where(alias.c.ctid == row).scalar_subquery()


def _scores(
    passes: Callable[[ColumnElement[str]], ColumnElement[bool]],
    rank: Callable[[ColumnElement[str]], ColumnElement[float]],
) -> Scores:
    """newest.Scores for a test and a rank of the indexed text: the row at a ctid read
    once, its text joined once (a LATERAL subquery fenced by OFFSET 0: inlined, each of
    the four uses would decompress and join the text again). A row larger than
    RANK_WINDOW_BYTES is never in the window: no rank computed for it."""

    def scores(row: ColumnElement[Any], size: ColumnElement[int]) -> Any:
        document = select(_document(_EXACT_ROW.c).label("document")).correlate(_EXACT_ROW)
        joined = document.offset(0).lateral("joined")
        text = joined.c.document
        rankable = size <= bindparam("rank_bytes", type_=Integer)
        return (
            select(
                passes(text).label("passes"),
                case((rankable, rank(text)), else_=null()).label("rank"),
            )
            .select_from(_EXACT_ROW.join(joined, true()))
            .where(_EXACT_ROW.c.ctid == row)
            .correlate_except(_EXACT_ROW, joined)
            .lateral("scores")
        )

    return scores


#: The words revision fts2 stores in `messages` (PostgreSQL's alone: not an ORM column).
_STORED_WORDS = literal_column(f"{M.name}.{WORDS_COLUMN}", type_=TSVECTOR)


# -- the statements ------------------------------------------------------------------------


def _paged(statement: Any, page: tuple[int, int]) -> tuple[Any, dict[str, Any]]:
    """LIMIT / OFFSET as SQLite reads them: a negative LIMIT is none, a negative OFFSET 0."""
    limit, offset = page
    values = {"limit": None if limit < 0 else limit, "offset": max(offset, 0)}
    statement = statement.limit(bindparam("limit", type_=Integer)).offset(
        bindparam("offset", type_=Integer)
    )
    return statement, values


def _filter_values(filters: Filters) -> dict[str, Any]:
    """The filters' values as PostgreSQL stores text (the models' to_server_text): a NUL
    compares as it does on SQLite, equal only to a stored NUL."""
    return {
        key: [to_server_text(item) if isinstance(item, str) else item for item in values]
        for key, values in filters.values().items()
    }


def _select(condition: ColumnElement[bool], filters: Filters, *, visibility: bool) -> Any:
    visible, sources, excluded, roles = filters.given(visibility=visibility)
    criteria = filter_criteria((False, sources, excluded, roles))
    return (
        select(M.c.id, *RESULT_COLUMNS)
        .select_from(M.join(S, S.c.id == M.c.session_id))
        .where(condition, *((VISIBLE,) if visible else ()), *criteria)
    )


#: A hit's rank from the hits' columns (those the statement's rank inputs name).
Rank = Callable[[Any], ColumnElement[float]]
#: The columns rank reads when it tokenises the text again.
_TEXT_COLUMNS = (M.c.content, M.c.tool_name, M.c.tool_calls)
#: How many of a query's matches (the newest) are ranked by rank, and how many bytes of
#: indexed text they may hold in all: rank reads each one's stored words, or its text
#: (trigram path; at fts1, tokenised again: 0.3 s a megabyte), so ranking every match of a
#: common word, or a few huge messages, would take seconds. Within it the order is exact.
RANK_WINDOW = 200
RANK_WINDOW_BYTES = 1024 * 1024


def _matched(condition: ColumnElement[bool]) -> ColumnElement[bool]:
    """``condition`` as the ids it selects, found first, alone (a materialised CTE): with
    no other condition beside it the planner can only answer it from the search index
    (reads.BY_INDEX), and no other index (the visibility filter's) leads it to re-tokenise the
    rows that one selects."""
    matched = select(M.c.id).where(condition).cte("matched").prefix_with("MATERIALIZED")
    return M.c.id.in_(select(matched.c.id))


#: The columns a statement that reads the hits' indexed texts with them adds to its rows:
#: the parts of the text (hermes_search_document's arguments), as stored.
DOCUMENT_PARTS = ("document_content", "document_tool_name", "document_tool_calls")


def _document_parts(columns: Any) -> list[ColumnElement[Any]]:
    """The DOCUMENT_PARTS of a row: its text is joined in Python (_document_of) once the
    page is cut, not for every match."""
    parts = (columns.content, columns.tool_name, columns.tool_calls)
    return [part.label(name) for part, name in zip(parts, DOCUMENT_PARTS, strict=True)]


def _document_of(row: dict[str, Any]) -> str:
    """A row's indexed text from its DOCUMENT_PARTS (taken out of the row), joined as
    hermes_search_document (revision fts1) joins them, as the data layer gives text."""
    return from_server_text(" ".join(row.pop(name) or "" for name in DOCUMENT_PARTS))


def _ranked(
    condition: ColumnElement[bool],
    filters: Filters,
    sort: str | None,
    page: tuple[int, int],
    rank_of: Rank,
    rank_inputs: Sequence[ColumnElement[Any]] = _TEXT_COLUMNS,
    *,
    documents: bool = False,
    alone: bool = True,
    exact: Exact | None = None,
    scored: Scores | None = None,
    contexts: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """The hits in the contract's order (rank higher first, then the lower id), one page.

    Rank reads ``rank_inputs`` of each row (the stored words, or the text to tokenise or
    scan again): ordered by rank, the hits of the window pay it; ordered by time, only the
    rows of the page whose timestamp another match shares (the first limit + offset hits
    by time, ties included, are read; then the page is cut).

    With ``documents`` (``rank_inputs`` the text columns, or none and ranked), each row
    also holds its indexed text's parts (DOCUMENT_PARTS), for the snippets: no second
    statement to read them. With ``alone`` the condition's matches are found first, by
    themselves (_matched); without it, in the same scan that reads their rows (for a
    condition cheap to test again: no re-tokenising). Without ``rank_inputs``, ranked,
    only the newest matches are read further (newest_matches; ``exact``: the test of the rows
    ``condition`` selects, made there; ``scored``: the test and the rank, made in one read
    of each row tested, every match found at once, ``rank_of`` then reading the ``rank``
    column), and the page's columns for its rows alone; with ``contexts``, their context
    windows too (contexts.CONTEXT_COLUMN).
    """
    limit = page[0]
    if contexts and (rank_inputs or sort in ("newest", "oldest")):
        raise TypeError("the context windows are read with the thin rows' page only")
    if alone:
        condition = _matched(condition)
    if exact is not None and sort in ("newest", "oldest"):
        raise TypeError("an exact test is made on the ranked order only")
    if sort not in ("newest", "oldest"):
        # Ranked: the newest matches within RANK_WINDOW and RANK_WINDOW_BYTES (a sort of
        # ids and sizes only, no text), by rank; older matches after them, newest first.
        # CASE evaluates the rank of those rows only.
        newest = M.c.id.desc()
        thin = not rank_inputs
        if exact is not None and not thin:
            raise TypeError("an exact test is made on the thin rows only")
        if thin:
            newest = newest_matches(condition, filters, exact, scored=scored)
            by_id = newest.c.id.desc()
            statement = select(
                newest.c.id,
                newest.c.rank if scored is not None else newest.c.row,
                func.row_number().over(order_by=by_id).label("recency"),
                func.sum(newest.c.size).over(order_by=by_id, rows=(None, 0)).label("volume"),
            )
        else:
            statement = _select(condition, filters, visibility=True).add_columns(
                *rank_inputs,
                func.row_number().over(order_by=newest).label("recency"),
                func.sum(text_bytes()).over(order_by=newest, rows=(None, 0)).label("volume"),
            )
        hits = statement.subquery("hits")
        in_window = and_(
            hits.c.recency <= bindparam("rank_window", type_=Integer),
            hits.c.volume <= bindparam("rank_bytes", type_=Integer),
        )
        windowed = case((in_window, rank_of(hits.c)), else_=null())
        order = (
            windowed.label("hit_rank"),
            case((in_window, hits.c.id), else_=-hits.c.id).label("hit_order"),
        )
        if thin:
            # The page's order from the thin rows, then the page's columns: read for its
            # rows only.
            ordered = select(hits.c.id, *order).order_by(order[0].desc().nulls_last(), order[1])
            ordered, _ = _paged(ordered, page)
            chosen = ordered.subquery("page")
            outer = (
                select(M.c.id, *RESULT_COLUMNS)
                .select_from(
                    chosen.join(M, M.c.id == chosen.c.id).join(S, S.c.id == M.c.session_id)
                )
                .order_by(chosen.c.hit_rank.desc().nulls_last(), chosen.c.hit_order)
            )
            if documents:
                outer = outer.add_columns(*_document_parts(M.c))
            if contexts:
                outer = outer.add_columns(context_column(M.c))
            return outer, _ranked_values(sort, page)
        outer = select(hits.c.id, *(hits.c[key] for key in RESULT_KEYS)).order_by(
            windowed.desc().nulls_last(), case((in_window, hits.c.id), else_=-hits.c.id)
        )
        if documents:
            outer = outer.add_columns(*_document_parts(hits.c))
        outer, _ = _paged(outer, page)
        return outer, _ranked_values(sort, page)
    by_time = M.c.timestamp.desc() if sort == "newest" else M.c.timestamp.asc()
    statement = _select(condition, filters, visibility=True).add_columns(
        *rank_inputs,
        literal_column(f"{M.name}.ctid").label("row"),
        func.count().over(partition_by=M.c.timestamp).label("ties"),
    )
    if limit >= 0:
        statement = statement.order_by(by_time).fetch(
            bindparam("window", type_=Integer), with_ties=True
        )
    hits = statement.subquery("hits")
    rank = case((hits.c.ties > 1, rank_of(hits.c)), else_=null())
    in_time = hits.c.timestamp.desc() if sort == "newest" else hits.c.timestamp.asc()
    outer = select(hits.c.id, *(hits.c[key] for key in RESULT_KEYS)).order_by(
        in_time, rank.desc(), hits.c.id
    )
    if documents:
        outer = outer.add_columns(*_document_parts(hits.c))
    outer, _ = _paged(outer, page)
    return outer, _ranked_values(sort, page)


def _ranked_values(
    sort: str | None, page: tuple[int, int], top: int | None = None
) -> dict[str, Any]:
    """The parameters of _ranked's statement that are not the query's or the filters'
    (``top``: the store's newest id, which the ranges of newest_matches start from)."""
    limit, offset = page
    _, values = _paged(select(), page)
    if sort not in ("newest", "oldest"):
        newest = None if limit < 0 else max(RANK_WINDOW, limit + max(offset, 0))
        return {
            **values,
            "rank_window": RANK_WINDOW,
            "rank_bytes": RANK_WINDOW_BYTES,
            "newest": newest,
            **floors(top, newest),
        }
    if limit >= 0:
        values["window"] = limit + max(offset, 0)
    return values


#: Word statements kept at most (then all dropped): one per shape of query, filters, order,
#: paging and layout seen. Building one costs 2-7 ms here, as much as a whole search on
#: SQLite; queries of one shape differ in their values only.
WORD_STATEMENTS = 256
_WORD_STATEMENTS: dict[tuple[Any, ...], Any] = {}


def _coarse(tree: Node, sort: str | None, *, stored: bool) -> bool:
    """Whether the statement's condition is the coarse tsquery, the exact one tested on
    the newest of its matches only (ranked, over the stored words, a tree with positions)."""
    return stored and sort not in ("newest", "oldest") and positional(tree)


def word_statement(
    tree: Node, options: SearchOptions, *, stored: bool = True, top: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """The word path's statement for a simplified tree, and its parameters: over the
    stored words (``stored``, revision fts2), else over fts1's expression; ``top``: the
    store's newest id as the statement starts (newest_matches' ranges). Statements
    are kept by shape (_WORD_STATEMENTS): the key holds all that changes the SQL (the
    tsquery's shape, which decides the coarse tsquery's too, whether the coarse one is
    the condition, the filters given, the order, whether there is a limit, the layout);
    the planner's settings are no part of it (reads.BY_INDEX sets them apart)."""
    filters, sort, page = options.filters, options.order, options.page
    coarse = _coarse(tree, sort, stored=stored)
    given = filters.given(visibility=True)
    key = (tsquery_shape(tree), coarse, given, sort, page[0] >= 0, stored)
    statement = _WORD_STATEMENTS.get(key)
    if statement is None:
        statement, _ = _word_statement(tree, options, stored=stored)
        if len(_WORD_STATEMENTS) >= WORD_STATEMENTS:
            _WORD_STATEMENTS.clear()
        _WORD_STATEMENTS[key] = statement
    # The binds' values in the order _word_statement made them: the tsquery's, then the
    # coarse tsquery's.
    texts = tsquery_texts(tree) + (coarse_tsquery_texts(tree) if coarse else [])
    binds = {f"q{number}": text for number, text in enumerate(texts)}
    return statement, {**_filter_values(filters), **binds, **_ranked_values(sort, page, top)}


def _word_statement(
    tree: Node, options: SearchOptions, *, stored: bool
) -> tuple[Any, dict[str, Any]]:
    """word_statement's SQL, built, and its binds' values (q0, q1...: tsquery_texts', then
    coarse_tsquery_texts' where the condition is the coarse tsquery)."""
    filters, sort, page = options.filters, options.order, options.page
    binds = Binds()
    query = computed_once(tsquery_of(tree, binds))
    condition = _words(stored).op("@@", return_type=Boolean)(query)
    exact: Exact | None = None
    if _coarse(tree, sort, stored=stored):
        # Ranked: the index answers the coarse tsquery alone; the exact one is tested on
        # the newest of its matches only, as many as the page needs (newest_matches).
        coarse = computed_once(coarse_tsquery_of(tree, binds))
        condition = _STORED_WORDS.op("@@", return_type=Boolean)(coarse)

        def exact(matches: Any) -> ColumnElement[bool]:
            words = _read_again(_EXACT_ROW, matches.row, lambda row: row.search_words)
            return words.op("@@", return_type=Boolean)(query)

    # ts_rank_cd (cover density) with normalisation 1: divided by 1 + log(document
    # length), as BM25 favours short documents; cheaper than ts_rank on long texts.
    def rank_of(hits: Any) -> ColumnElement[float]:
        if stored:
            words = _read_again(_RANKED, hits.row, lambda ranked: ranked.search_words)
        else:
            words = func.hermes_search_words(_document(hits), type_=TSVECTOR)
        return func.ts_rank_cd(words, query, literal(1, Integer), type_=Float)

    # The stored words are cheap to test again: the matches are read in the scan that
    # finds them, and no row carries its words through the sort of every match.
    inputs = () if stored else _TEXT_COLUMNS
    # Ranked, the page's rows come with their indexed texts (no statement after for them).
    documents = stored and sort not in ("newest", "oldest")
    statement, _ = _ranked(
        condition,
        filters,
        sort,
        page,
        rank_of,
        inputs,
        documents=documents,
        alone=not stored,
        exact=exact,
    )
    return statement, binds.values


def trigram_statement(
    tree: Node, route: Route, options: SearchOptions
) -> tuple[Any, dict[str, Any]]:
    """The trigram path's statement for a simplified tree, and its parameters.

    By rank, the matches are found by id, size and ctid alone (newest_matches, every match
    at once), and the newest of them read again by ctid, each once for both the test the
    index cannot make and the rank (_scores), until the window holds enough: not every
    match's text carried through the sort, nor its session joined. The page's rows then
    come with their texts (for the snippets) and their context windows.
    By time, the matches' texts come with them (the ties' rank, the page's snippets).
    Statements are kept by shape (_TRIGRAM_STATEMENTS): building one costs more than a
    small search on SQLite does, and queries of one shape differ in values only.
    """
    filters, sort, page = options.filters, options.order, options.page
    found = found_tokens(tree)
    key = (
        shape(tree),
        tuple(caseless(token) for token in found),
        filters.given(visibility=True),
        sort,
        page[0] >= 0,
    )
    statement = _TRIGRAM_STATEMENTS.get(key)
    if statement is None:
        binds = Binds()
        patterns = [binds(like_pattern(token)) for token in phrase_tokens(tree)]
        tokens = [(binds(to_server_text(token)), caseless(token)) for token in found]

        by_time = sort in ("newest", "oldest")
        scored: Scores | None = None
        if by_time:
            condition = trigram_condition(tree, patterns, _document())
        else:
            # Ranked: the index's condition alone over every match; the rest (the tokens
            # before a text's first NUL, any OR or NOT whole) and the rank computed in one
            # read of each of the newest matches (_scores).
            condition = trigram_condition(tree, patterns, _document(), before_nul_only=False)
            scored = _scores(
                lambda text: trigram_residue(tree, patterns, text),
                lambda text: coverage(text, tokens),
            )

        def rank_of(hits: Any) -> ColumnElement[float]:
            return coverage(_document(hits), tokens) if by_time else hits.rank

        inputs = _TEXT_COLUMNS if by_time else ()
        # No id ranges (newest_matches, scored): a CJK word's matches are few beside the window's
        # 200, and each match a range reads is tested against its text again (the trigram
        # index is lossy), so a range that falls short costs a second reading of them all
        # (テスト at 200k messages: 9.4 ms with ranges, 7.0 without, 9.1 before either).
        statement, _ = _ranked(
            condition,
            filters,
            sort,
            page,
            rank_of,
            inputs,
            documents=True,
            alone=False,
            scored=scored,
            contexts=not by_time,
        )
        if len(_TRIGRAM_STATEMENTS) >= TRIGRAM_STATEMENTS:
            _TRIGRAM_STATEMENTS.clear()
        _TRIGRAM_STATEMENTS[key] = statement
    # The parameters in the order the patterns, then the rank's tokens, were made (q0, q1...).
    texts = [like_pattern(token) for token in phrase_tokens(tree)]
    texts += [to_server_text(token) for token in found]
    binds_values = {f"q{number}": text for number, text in enumerate(texts)}
    return statement, {**_filter_values(filters), **binds_values, **_ranked_values(sort, page)}


#: Trigram statements kept at most (then all dropped): one per shape of query, filters,
#: order and paging seen.
TRIGRAM_STATEMENTS = 256
_TRIGRAM_STATEMENTS: dict[tuple[Any, ...], Any] = {}


def like_statement(route: Route, options: SearchOptions) -> tuple[Any, dict[str, Any]]:
    """The LIKE scan (short CJK tokens): newest first whatever the sort, no visibility
    filter (the legacy quirk), the contract's snippet."""
    filters, page = options.filters, options.page
    binds = Binds()
    condition = like_condition(route.like_tokens, binds)
    first = binds(to_server_text(route.like_tokens[0]))
    start = func.greatest(1, func.strpos(M.c.content, first) - LIKE_SNIPPET_BEFORE)
    # Positions count stored characters: where an escape (3 of them for 1) is in the text,
    # the whole text comes back and the snippet is cut in Python (_like_snippet).
    snippet = case(
        (func.strpos(M.c.content, SERVER_ESCAPE) > 0, M.c.content),
        else_=func.substr(M.c.content, start, LIKE_SNIPPET_LENGTH, type_=String),
    ).label("snippet")
    statement = _select(condition, filters, visibility=False).add_columns(snippet)
    statement = statement.order_by(M.c.timestamp.desc(), M.c.id)
    statement, values = _paged(statement, page)
    return statement, {**_filter_values(filters), **binds.values, **values}


def _like_snippet(stored: str, first: str) -> str:
    """The LIKE scan's snippet of a stored text holding an escape, as like_statement's SQL
    cuts a text without one: from LIKE_SNIPPET_BEFORE characters before ``first``."""
    content = from_server_text(stored)
    start = max(0, content.find(first) - LIKE_SNIPPET_BEFORE)  # find: strpos - 1
    return content[start : start + LIKE_SNIPPET_LENGTH]


# -- one search ----------------------------------------------------------------------------


def _not_searchable(conn: Connection, tree: Node) -> str:
    """Why the server rejected the word path's statement: its tsquery alone is rejected
    (the query's fault: the reason, for ``query_error``). If the tsquery is fine, the
    rows or the search functions failed: SearchFailed, never an empty answer."""
    binds = Binds()
    try:
        with conn.begin_nested():
            conn.execute(select(tsquery_of(tree, binds)), binds.values).all()
    except DBAPIError as exc:
        if not rejected_query(exc):
            raise
        if sqlstate(exc).startswith("54"):
            why = "it is too large for PostgreSQL's text search: use fewer terms"
        else:
            why = (
                "PostgreSQL's text search cannot search for one of its terms (SQLSTATE "
                f"{sqlstate(exc)}): leave out words of characters that are no letters to it"
            )
        return f"the query was not understood: {why}; `hermes-store search --help` shows the syntax"
    raise _search_failed("the word path's statement")


def _search_failed(what: str) -> SearchFailed:
    return SearchFailed(
        f"PostgreSQL refused {what} for what no query causes: a message or the search "
        "functions of revision fts1 are broken; run `hermes-store check`"
    )


def _documents(conn: Connection, ids: Sequence[int]) -> dict[int, str]:
    """The indexed text of the page's hits, as the data layer gives text (NUL as NUL)."""
    statement = select(M.c.id, _document()).where(M.c.id.in_(bindparam("ids", expanding=True)))
    return {
        int(i): from_server_text(text) for i, text in conn.execute(statement, {"ids": list(ids)})
    }


class PostgreSQLSearch:
    """The search statements on one PostgreSQL connection (hermes_store.search.pipeline)."""

    def __init__(self, conn: Connection, *, own_transaction: bool = False) -> None:
        """``own_transaction``: ``conn``'s transaction is the search's own (read_transaction),
        so a rejected statement may roll it back; else the caller's, each such statement
        in a savepoint."""
        self.conn = conn
        self.guarded = not own_transaction
        #: The context windows the hits' statement read (contexts.CONTEXT_COLUMN), by hit.
        self._windows: dict[int, Any] = {}

    def plan(self, sanitized: str) -> Plan | SearchResults:
        # Both indexes exist at head (revision fts1): the trigram path is always there.
        return Plan(route_query(sanitized, trigram=True))

    def hits(self, plan: Plan, options: SearchOptions) -> Found:
        """The page's rows; a trigram query FTS5 would reject is answered by the LIKE scan,
        as on SQLite."""
        route, conn = plan.route, self.conn
        self._windows = {}
        rows: list[dict[str, Any]] | None = None
        if route.index == WORD_INDEX:
            try:
                tree = simplify(parse_query(route.match))
            except QuerySyntaxError:  # FTS5 would reject it: the contract's answer is []
                return Found([], route, query_error=not_understood(route.match))
            if isinstance(tree, Nothing):
                return Found([], route)
            rows = rows_by_index(
                conn,
                lambda read: word_statement(
                    tree, options, stored=words.reads_stored(read[0]), top=read[1]
                ),
                [words.LAYOUT, TOP_ID],
                guarded=self.guarded,
            )
            if rows is None:
                return Found([], route, query_error=_not_searchable(conn, tree))
            return Found(rows, route)
        if route.index == TRIGRAM_INDEX:
            try:
                trigram: Node | None = simplify(parse_query(route.match, trigram=True))
            except QuerySyntaxError:  # FTS5 rejects it: the LIKE scan answers, as on SQLite
                trigram = None
            if isinstance(trigram, Nothing):
                return Found([], route)
            if trigram is not None:
                statement = trigram_statement(trigram, route, options)
                # Ranked, the statement reads the page's context windows too: its own
                # settings (reads.BY_TRIGRAM_INDEX), and no statement after it.
                ranked = options.order not in ("newest", "oldest")
                rows = rows_by_index(
                    conn,
                    lambda _: statement,
                    guarded=self.guarded,
                    planner=BY_TRIGRAM_INDEX if ranked else BY_INDEX,
                    last=ranked,
                )
                if rows is not None:
                    self._windows = {
                        int(row["id"]): row.pop(CONTEXT_COLUMN)
                        for row in rows
                        if CONTEXT_COLUMN in row
                    }
                    return Found(rows, route)
        like = Route(None, "", route.like_tokens)
        rows = plain_rows(conn, *like_statement(like, options), guarded=self.guarded)
        if rows is None:  # plain patterns, escaped here: no query causes that
            raise _search_failed("the LIKE scan")
        for row in rows:
            if row["snippet"] is None:
                continue
            if SERVER_ESCAPE in row["snippet"]:  # the whole text: see like_statement
                row["snippet"] = _like_snippet(row["snippet"], route.like_tokens[0])
            else:
                row["snippet"] = from_server_text(row["snippet"])
        return Found(rows, like, from_index=False)

    def snippets(self, found: Found) -> None:
        """The word and trigram paths' snippets, from the indexed text of the page's hits:
        FTS5's own snippet() in memory where the running sqlite3 has the index's
        tokenizer (chosen once), else the pure-Python reproduction."""
        route = found.route
        if not found.from_index or route.index is None:
            return  # the LIKE scan's statement made them
        if all(DOCUMENT_PARTS[0] in row for row in found.rows):  # read with the hits
            documents = {int(row["id"]): _document_of(row) for row in found.rows}
        else:
            documents = _documents(self.conn, [int(row["id"]) for row in found.rows])
        made: dict[int, str] = {}
        if route.index in memory_indexes():
            made = memory_page_snippets(route, documents)
        marks = highlight_of(parse_query(route.match, trigram=route.index == TRIGRAM_INDEX))
        for row in found.rows:
            hit_id = int(row["id"])
            snippet = made.get(hit_id)
            row["snippet"] = (
                pure_snippet(documents[hit_id], route, marks) if snippet is None else snippet
            )

    def contexts(self, hit_ids: Sequence[int]) -> dict[int, list[ContextMessage]]:
        windows = self._windows
        try:
            if all(hit_id in windows for hit_id in hit_ids):  # read with the hits
                return contexts_of(
                    lambda chunk: column_rows((hit_id, windows[hit_id]) for hit_id in chunk),
                    hit_ids,
                )
            return contexts_of(lambda chunk: context_rows(self.conn, chunk), hit_ids)
        except Exception:  # the contract: a failed context lookup leaves every hit with []
            log.debug("search: context lookup failed", exc_info=True)
            return {}

    def read(self, answer: Callable[[], SearchResults]) -> SearchResults:
        """``answer``: PostgreSQL text is always valid UTF-8, read once."""
        return answer()


def search_statements(conn: Connection) -> PostgreSQLSearch:
    """The search statements on an open Connection (search_messages)."""
    return PostgreSQLSearch(conn)


@contextlib.contextmanager
def read_transaction(source: Engine | Connections) -> Iterator[PostgreSQLSearch]:
    """The search statements in a read transaction of their own: one snapshot."""
    with source.connect() as conn:
        conn.execution_options(isolation_level="REPEATABLE READ")
        yield PostgreSQLSearch(conn, own_transaction=True)
        # It wrote nothing: COMMIT ends it as ROLLBACK would, and keeps the connection's
        # prepared statements, which psycopg forgets at a ROLLBACK (reads.py).
        conn.commit()

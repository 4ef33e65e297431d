"""Search over the rows a deferred backfill has not indexed yet (SQLite)."""

from __future__ import annotations

import contextlib
import functools
import heapq
import re
import sqlite3
import unicodedata
from typing import Any

from sqlalchemy import ColumnElement, LargeBinary, String, and_, bindparam, false, func, or_, select

from hermes_store.prepared import Prepared
from hermes_store.search.context import chunks
from hermes_store.search.fts5_snippets import SNIPPET_SQL, snippets_of
from hermes_store.search.query import TRIGRAM_INDEX, WORD_INDEX, Route, escape_like
from hermes_store.search.schema import RESULT_COLUMNS, RESULT_KEYS, Filters, M, S, filter_criteria
from hermes_store.sqlite import fts
from hermes_store.sqlite.search_reading import TOKENIZERS
from hermes_store.sqlite.search_snippets import cheap_bytes
from hermes_store.sqlite.search_state import Runner, State

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


def pending_ranges(on: Runner, state: State) -> dict[str, tuple[int, int]]:
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


def _candidate_terms(route: Route) -> tuple[list[str], bool]:
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


def pending_hits(
    on: Runner, route: Route, filters: Filters, bounds: tuple[int, int]
) -> list[dict[str, Any]]:
    """Rows of the not-yet-indexed range that match the route, with rank and snippet."""
    assert route.index is not None
    terms, require_all = _candidate_terms(route)
    if not terms:
        return []
    low, high = bounds
    expression = (
        func.coalesce(M.c.content, "")
        + " "
        + func.coalesce(M.c.tool_name, "")
        + " "
        + func.coalesce(M.c.tool_calls, "")
    )
    # LIKE decides for plain ASCII rows (none of them folds to a non-ASCII term); the
    # others are tested on their folded text, in Python.
    ascii_terms = [t for t in terms if t.isascii()]
    by_like: ColumnElement[bool] = false()
    if ascii_terms and (len(ascii_terms) == len(terms) or not require_all):
        by_like = (and_ if require_all else or_)(
            *(
                expression.like(bindparam("term", f"%{escape_like(t)}%", String, unique=True), "\\")
                for t in ascii_terms
            )
        )
    raw: Any = on.driver
    functions = hasattr(raw, "create_function")
    if functions:

        def folded_match(data: object) -> bool:
            if not isinstance(data, bytes) or (data.isascii() and b"\0" not in data):
                return False  # LIKE saw all of it
            folded = _fold(data.decode("utf-8", "replace"))
            return (all if require_all else any)(term in folded for term in terms)

        raw.create_function(_PENDING_MATCH, 1, folded_match)
        # The bytes: sqlite3 cannot pass a Python function text that is not valid UTF-8
        # (a writer that stored bytes as TEXT); read with U+FFFD, such a row still matches.
        by_fold: ColumnElement[bool] = (
            getattr(func, _PENDING_MATCH)(expression.cast(LargeBinary)) == 1
        )
    else:  # a driver without Python functions: every row LIKE may misjudge is a candidate
        # Plain ASCII without NUL: as many bytes as characters before the first NUL.
        by_fold = func.length(expression.cast(LargeBinary)) != func.length(expression)
    candidates = (
        select(M.c.id, expression)
        .select_from(M.join(S, S.c.id == M.c.session_id))
        .where(
            M.c.id > low,
            M.c.id <= high,
            or_(by_like, by_fold),
            *filter_criteria(filters.given(visibility=True)),
        )
    )
    try:
        rows = on.rows(*Prepared.of(candidates).bind(filters.values()))
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
    for chunk in chunks(sorted(matched)):
        statement = (
            select(M.c.id, *RESULT_COLUMNS)
            .select_from(M.join(S, S.c.id == M.c.session_id))
            .where(M.c.id.in_(chunk))
        )
        for values in on.rows(*Prepared.of(statement).bind({})):
            row = dict(zip(("id", *RESULT_KEYS), values, strict=True))
            rank, snippet = matched[row["id"]]
            hits.append({"id": row["id"], "rank": rank, "snippet": snippet, **row})
    return hits


def _match_apart(route: Route, rows: list[tuple[int, str]]) -> list[tuple[int, float, str]]:
    """(id, rank, snippet) of the rows the route's MATCH selects, in a private FTS5 table.

    The table lives in a connection of its own (same SQLite library, so the same
    tokenizers, ranking and snippets): it never writes to the caller's connection, and
    it works even in a transaction where a damaged index made FTS5 fail (SQLite then
    refuses to create another FTS5 table until that transaction ends).
    """
    assert route.index is not None
    snippet = SNIPPET_SQL.format(_PENDING_TABLE)
    with contextlib.closing(sqlite3.connect(":memory:")) as apart:
        apart.execute(
            f"CREATE VIRTUAL TABLE {_PENDING_TABLE} USING fts5(content{TOKENIZERS[route.index]})"
        )
        apart.executemany(f"INSERT INTO {_PENDING_TABLE}(rowid, content) VALUES (?, ?)", rows)
        # FTS5's snippet where it is cheap whatever the text; the longer ones after it, as
        # the search statement's (hermes_store.search.fts5_snippets.snippets_of).
        matched = apart.execute(
            f"SELECT rowid, rank, CASE WHEN length(CAST(content AS BLOB)) <= ? THEN {snippet} END "
            f"FROM {_PENDING_TABLE} WHERE {_PENDING_TABLE} MATCH ?",
            (cheap_bytes(route), route.match),
        ).fetchall()
        texts = {
            rowid: text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
            for rowid, text in rows
        }
        longer = {rowid: texts[rowid] for rowid, _rank, text in matched if text is None}

        def fts5_snippets(ids: list[int]) -> list[Any]:
            return apart.execute(
                f"SELECT rowid, {snippet} FROM {_PENDING_TABLE} WHERE {_PENDING_TABLE} MATCH ? "
                f"AND rowid IN ({', '.join('?' * len(ids))})",
                (route.match, *ids),
            ).fetchall()

        snippets = snippets_of(route, longer, fts5_snippets, made_bytes=cheap_bytes(route))
        return [(rowid, rank, snippets.get(rowid, text)) for rowid, rank, text in matched]


def scan_hits(
    on: Runner, route: Route, filters: Filters, sort: str | None, page: tuple[int, int]
) -> list[dict[str, Any]]:
    """Every message an FTS route matches, by the pending-rows scan over all ids; one page."""
    low, high = on.rows(*_ID_RANGE.bind({}))[0]
    if high is None:
        return []
    extra = pending_hits(on, route, filters, (int(low) - 1, int(high)))
    return merge_pending([], extra, sort, *page)


_ID_RANGE = Prepared.of(select(func.min(M.c.id), func.max(M.c.id)))


def merge_pending(
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

"""The newest matches of a ranked search on PostgreSQL, by id and size only: the word
path's read from the newest ids down, the trigram path's all at once.

A ranked search ranks the newest matches only (RANK_WINDOW of them, or as many as the page
reaches, in ``hermes_store.postgresql.search``), so it needs those matches by id and size,
and no older one. The search index gives every match at once, unordered: reading them all
(each one a visit of its row in the heap, for its id, its visibility and its size) costs
a common word's every match, 7,240 rows and 4,332 pages for ``python`` at 50,000 messages
(12 ms), to keep 200 of them.

So the ids are cut into ranges from the newest down: the newest ``RECENT_SPANS[0]`` times
as many ids as the window needs, then up to ``RECENT_SPANS[1]`` times, then the rest. The
two recent ranges are read from a bitmap of the search index's matches and of the ids'
range (the primary key's), so only their own pages are visited; a range is read only
when the newer ones held fewer matches than the window needs (newest_matches says when).
A common word is answered from the first range (``python``: 462 rows, 1,464 buffers
against 5,642); a rare one reads the first range and the rest, each of its matches once,
as before plus one bitmap scan of the search index.

The matches of the ranges read are then cut to the newest ``newest`` by id: the same rows,
in the same order, as over every match, since every range older than those read was
needed by none of them. A test the index cannot make (``exact``, a phrase's) is made
within each range, newest first, until the range holds enough.

The id range is that of the store when the statement starts (``top``, read with the
planner's settings): a row written since has a higher id and is in the first range.

The trigram path reads every match at once (by id, size and ctid), then reads again the
newest of them, newest first, each once by its ctid, for the test its index cannot make
and for the rank together (Scores), until the window holds enough. Read twice, once for
each, the window's texts took more than half of the statement (`テスト` at 50,000 messages,
EXPLAIN ANALYZE: 1.4 of 2.6 ms); tested and ranked in the scan that finds every match, the
statement cost what all the matches' texts cost, more than the window's once a CJK word
has some thousand matches (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    and_,
    bindparam,
    case,
    false,
    func,
    literal_column,
    or_,
    select,
    true,
    union_all,
)

from hermes_store.search.schema import Filters, M, S, filter_criteria

#: The id ranges of a ranked search, newest first, as multiples of the matches it needs:
#: the newest 16 times as many ids (a word in one message of 16 or more is answered
#: there), then 128 times, then every older id.
RECENT_SPANS = (16, 128)
SPAN_RATIO = RECENT_SPANS[1] // RECENT_SPANS[0]

#: The test of a row of the matches (its columns: ``id``, ``size``, ``row``, the row's
#: ctid) that the statement's condition leaves to it.
Exact = Callable[[Any], ColumnElement[bool]]


#: What a row of the matches gives when read again by its ctid (its ``row`` and ``size``
#: columns): a LATERAL subquery of columns ``passes`` (the test the condition leaves) and
#: ``rank``.
Scores = Callable[[ColumnElement[Any], ColumnElement[int]], Any]


#: The visibility filter (active or compacted) in a form no index's predicate matches:
#: ``idx_messages_display_page`` is a partial index WHERE active = 1 OR compacted = 1, and
#: without the table's statistics (ANALYZE not run since the rows were written, e.g. with
#: autovacuum off) the planner takes that term to keep 1% of the rows and reads the whole
#: partial index instead of the search index, testing every visible row's words (7,800
#: messages under 8 writers: 55-118 ms a statement, where the search index takes 10-35).
#: It keeps nearly every row: a filter of the search index's matches, never the way to
#: them.
_ZERO, _ONE = literal_column("0", Integer), literal_column("1", Integer)
VISIBLE = or_(M.c.active + _ZERO == _ONE, M.c.compacted + _ZERO == _ONE)


def text_bytes(columns: Any = M.c) -> ColumnElement[int]:
    """The bytes of a row's indexed text, less its two separators (read from each value's
    header: nothing is decompressed)."""
    return sum(
        (func.coalesce(func.octet_length(c), 0) for c in (columns.content, columns.tool_name)),
        func.coalesce(func.octet_length(columns.tool_calls), 0),
    )


def newest_matches(
    condition: ColumnElement[bool],
    filters: Filters,
    exact: Exact | None,
    *,
    scored: Scores | None = None,
) -> Any:
    """The newest matches, newest first, with their sizes and ctids (columns ``id``,
    ``size``, ``row``: the ctid each was found at, for the word path's rank to read it
    again): as many as the bind ``newest`` says (all with NULL), read range by range (the
    binds ``floor0`` and ``floor1``: see :func:`floors`).

    The first range is always read. The second only when the first held fewer than
    ``newest`` matches but at least its share of them (a range SPAN_RATIO times wider
    can be expected to hold enough); else the matches are rare, and the rest of the ids
    is read at once: each range read costs a scan of the search index, whose posting
    lists for a common word in a rare phrase (``is`` in "database is locked") cost more
    than the few rows. The rest is read when the ranges read held fewer than ``newest``.
    Each count is PostgreSQL's to compute when first asked, in CASEs that ask in order.

    With ``scored`` (and no ``exact``), the trigram path's: every match at once, no
    ranges, and the newest that pass its test kept, each with its ``rank`` (columns
    ``id``, ``size``, ``rank``), both computed in one read of the row (_scored).
    """
    newest = bindparam("newest", type_=Integer)
    if scored is not None:
        if exact is not None:
            raise TypeError("scored matches are tested by their scores alone")
        every = _scored(condition, filters, scored, newest)
        return select(every.c.id, every.c.size, every.c.rank).subquery("newest")
    floor0, floor1 = (bindparam(f"floor{n}", type_=BigInteger) for n in range(2))
    first = _range(0, and_(condition, M.c.id > floor0), filters, exact, newest)
    count0 = _count(first)
    # The second range is read when the first is too short, but not by much.
    read_second = case(
        (count0 >= newest, false()), (count0 * SPAN_RATIO < newest, false()), else_=true()
    )
    second = _range(1, and_(condition, M.c.id > floor1, M.c.id <= floor0), filters, exact, newest)
    count1 = _count(second)
    # The rest: below the second range when it was read, else below the first. Found from
    # the search index alone (bounds no index can serve): read through the primary key,
    # it would be every older row, its words tested one by one.
    below = case((read_second, floor1), else_=floor0)
    older = M.c.id + _ZERO
    rest = _range(2, and_(condition, older <= floor0, older <= below), filters, exact, newest)
    read_rest = case(
        (count0 >= newest, false()),
        (count0 * SPAN_RATIO < newest, true()),
        (count0 + count1 >= newest, false()),
        else_=true(),
    )
    found = union_all(
        select(first.c.id, first.c.size, first.c.row),
        select(second.c.id, second.c.size, second.c.row).where(read_second),
        select(rest.c.id, rest.c.size, rest.c.row).where(read_rest),
    ).subquery("found")
    chosen = select(found.c.id, found.c.size, found.c.row)
    chosen = chosen.order_by(found.c.id.desc()).limit(newest)
    return chosen.subquery("newest")


def _count(matches: Any) -> Any:
    return select(func.count()).select_from(matches).scalar_subquery()


def _matches(n: int, condition: ColumnElement[bool], filters: Filters) -> Any:
    """A range's matches by id, size and ctid, found first (a materialised CTE): the size
    computed before any sort, so that no text goes through it. Without a filter on the
    sessions, no join: every message has its session (the foreign key)."""
    visible, sources, excluded, roles = filters.given(visibility=True)
    row: ColumnElement[Any] = literal_column(f"{M.name}.ctid").label("row")
    criteria = filter_criteria((False, sources, excluded, roles))
    source = M.join(S, S.c.id == M.c.session_id) if sources or excluded else M
    return (
        select(M.c.id, text_bytes().label("size"), row)
        .select_from(source)
        .where(condition, *((VISIBLE,) if visible else ()), *criteria)
        .cte(f"matches{n}")
        .prefix_with("MATERIALIZED")
    )


def _scored(condition: ColumnElement[bool], filters: Filters, scores: Scores, newest: Any) -> Any:
    """The newest ``newest`` matches that pass the test, each with its rank: the matches
    (_matches) newest first, each read again once by its ctid for both, until there are
    enough (the sort fenced by OFFSET 0, so that the read stays above it)."""
    matches = _matches(0, condition, filters)
    fenced = select(matches).order_by(matches.c.id.desc()).offset(0).subquery("by_id0")
    scored = scores(fenced.c.row, fenced.c.size)
    chosen = (
        select(fenced.c.id, fenced.c.size, scored.c.rank)
        .select_from(fenced.join(scored, true()))
        .where(scored.c.passes)
        .order_by(fenced.c.id.desc())
        .limit(newest)
    )
    return chosen.cte("newest0").prefix_with("MATERIALIZED")


def _range(
    n: int, condition: ColumnElement[bool], filters: Filters, exact: Exact | None, newest: Any
) -> Any:
    """One range's matches (_matches), its newest ``newest`` (a materialised CTE: read
    once, when first asked): ``exact`` tested on them newest first, each row read again by
    its ctid, until there are enough (the sort fenced by OFFSET 0, so that the test stays
    above it)."""
    matches = _matches(n, condition, filters)
    if exact is None:
        chosen = select(matches.c.id, matches.c.size, matches.c.row)
        chosen = chosen.order_by(matches.c.id.desc())
    else:
        fenced = select(matches).order_by(matches.c.id.desc()).offset(0).subquery(f"by_id{n}")
        chosen = select(fenced.c.id, fenced.c.size, fenced.c.row).where(exact(fenced.c))
        chosen = chosen.order_by(fenced.c.id.desc())
    return chosen.limit(newest).cte(f"newest{n}").prefix_with("MATERIALIZED")


#: The newest id of the store, read with the planner's settings (the statement that sets
#: them is planned before they apply: the primary key's last entry).
TOP_ID = select(func.max(M.c.id)).scalar_subquery().label("top_id")


#: The ranges' bound when every match is read (no limit, or no newest id known): above
#: every id, so that the ranges are empty and the rest is every match.
_ABOVE_ALL = 1 << 62


def floors(top: int | None, newest: int | None) -> dict[str, int]:
    """The ranges' lower bounds (exclusive) for a store whose newest id is ``top``: with no
    limit (``newest`` None) or no ``top``, every match is read as the rest."""
    if newest is None or top is None:
        return {f"floor{n}": _ABOVE_ALL for n in range(len(RECENT_SPANS))}
    return {f"floor{n}": top - span * newest for n, span in enumerate(RECENT_SPANS)}

"""One search, the same steps on every database: parse, plan, statement, hits, snippets, context.

The steps are here; what each database does of them is its backend's
(:meth:`hermes_store.backend.Backend.search_statements`): an object with the small
interface :class:`SearchStatements`, whose SQLite body is in hermes_store/sqlite/search.py
and PostgreSQL body in hermes_store/postgresql/search.py. Nothing here asks which database
it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hermes_store.search.context import ContextMessage, SearchResults, hit_of
from hermes_store.search.query import UNSTORABLE_QUERY, Route, check_bounded, index_query, storable
from hermes_store.search.schema import SearchOptions

#: The package's logger: `hermes-store search` keeps its degraded warning off stderr there.
log = logging.getLogger("hermes_store.search")


@dataclass(frozen=True)
class Plan:
    """A sanitised query as one store answers it: the index (or the LIKE scan) that does,
    and what the answer is known to lack already (a damaged index: ``degraded``)."""

    route: Route
    degraded: str | None = None


@dataclass
class Found:
    """The rows of a page of hits (``id``, ``snippet``, the result columns), or why none.

    ``route`` is the route that answered (a trigram query FTS5 rejects is answered by the
    LIKE scan); ``from_index`` says whether the rows came from its index, so that the
    snippets the statement left out (None) can be asked of it.
    """

    rows: list[dict[str, Any]]
    route: Route
    from_index: bool = True
    degraded: str | None = None
    query_error: str | None = None


class SearchStatements(Protocol):
    """What one database does of a search, on one connection, in one read transaction."""

    def plan(self, sanitized: str) -> Plan | SearchResults:
        """Route a sanitised query for this store; or the answer itself, when the store
        has nothing to search."""
        ...

    def hits(self, plan: Plan, options: SearchOptions) -> Found:
        """Run the plan's statement: one page of rows, in the contract's order."""
        ...

    def snippets(self, found: Found) -> None:
        """Fill in the snippets the statement left out (texts too long for it to make)."""
        ...

    def contexts(self, hit_ids: Sequence[int]) -> dict[int, list[ContextMessage]]:
        """Every hit's context window. Never fails: the contract leaves a hit whose context
        could not be read with []."""
        ...

    def read(self, answer: Callable[[], SearchResults]) -> SearchResults:
        """Run ``answer`` as this database reads: again, differently, if a text could not
        be read (SQLite: invalid UTF-8), saying so in ``degraded``."""
        ...


def search(statements: SearchStatements, options: SearchOptions) -> SearchResults:
    """One search (docs/search.md): every step but the database's own."""
    sanitized = index_query(options.query)  # parse: the contract's sanitising
    if not sanitized:
        return SearchResults()
    if not storable(sanitized):
        return SearchResults(query_error=UNSTORABLE_QUERY)
    plan = statements.plan(sanitized)
    if isinstance(plan, SearchResults):
        return plan
    check_bounded(plan.route)
    results = statements.read(lambda: _answer(statements, plan, options))
    if results.degraded:
        log.warning("search: %s", results.degraded)
    return results


def _answer(statements: SearchStatements, plan: Plan, options: SearchOptions) -> SearchResults:
    """The plan's hits, their snippets and their context."""
    found = statements.hits(plan, options)
    if not found.rows:
        return SearchResults(degraded=found.degraded, query_error=found.query_error)
    statements.snippets(found)
    log.debug("search: %d hit(s) from %s", len(found.rows), found.route.index or "LIKE scan")
    contexts = statements.contexts([int(row["id"]) for row in found.rows])
    hits = [hit_of(row, contexts.get(int(row["id"]), [])) for row in found.rows]
    # The contract's order (Ranking): the LIKE scan's is newest first, whatever was asked.
    order = (options.order or "rank") if found.route.index is not None else "newest"
    return SearchResults(hits, degraded=found.degraded, order=order)

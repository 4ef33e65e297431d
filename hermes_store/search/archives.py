"""One search over a hot store and its archives: one list, each message once.

An archive is an ordinary store at head that holds whole session trees moved out of the
hot store, with the same ids. Each store answers the search alone (the pipeline, on its
own database); this module merges the answers by the rules of docs/search.md, "Searching
archives":

- **Once.** A hit whose message id is in an earlier store (the hot store first, then the
  archives in the order given) is left out: that store serves the message. Ids are never
  reused (AUTOINCREMENT, a sequence), so one id is one message wherever it is.
- **Order.** ``newest`` / ``oldest``: by timestamp across the stores, each store's own
  order kept for its own ties, equal timestamps of different stores by the lower id. By
  rank: reciprocal-rank fusion of the stores' lists (position, then store order).
- **Paging.** Each store's first ``offset + limit`` hits that are not left out, fetched
  again further when leaving out some shortened them, then merged and cut.

Nothing here asks which database a store is on.
"""

from __future__ import annotations

import contextlib
import heapq
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, bindparam, select

from hermes_store.errors import ArchiveRefused, StoreError
from hermes_store.prepared import Connections, Prepared, driver
from hermes_store.search.context import SearchHit, SearchResults, chunks
from hermes_store.search.schema import MESSAGES, SearchOptions

if TYPE_CHECKING:
    from hermes_store.search.pipeline import SearchStatements

#: Reciprocal-rank fusion's constant: a hit at position r (from 1) of its store's list
#: scores 1 / (RRF_K + r). With no message in two lists (each is served once) the fused
#: order is by position, then store order, whatever the constant.
RRF_K = 60

#: Which of a chunk of message ids a store holds.
_PRESENT = Prepared.of(
    select(MESSAGES.c.id).where(MESSAGES.c.id.in_(bindparam("ids", expanding=True)))
)

Source = Engine | Connections


@dataclass(frozen=True)
class Searched:
    """One store a search reads: how a message names it, and where its connections are."""

    name: str
    source: Source


def shown_name(url: str | os.PathLike[str]) -> str:
    """An archive as messages name it: the path as given, a URL without its password."""
    from hermes_store.engine import display_url

    text = os.fspath(url)
    return display_url(text) if "://" in text else text


def require_archive(url: str | os.PathLike[str]) -> str:
    """Refuse, in one line naming it, an archive that cannot be searched with the hot
    store: missing, not a store, unreachable, or not at head. Returns its shown name.

    Only reads: nothing is created or changed.
    """
    from hermes_store.migrate import classify
    from hermes_store.revisions import head_revision

    name = shown_name(url)
    if os.fspath(url) == "":
        raise ArchiveRefused("an empty archive name names no store: give its path or URL")
    try:
        state = classify(os.fspath(url))
    except StoreError as exc:
        raise ArchiveRefused(f"archive {name} cannot be searched: {exc}") from None
    if state.kind == "new":
        raise ArchiveRefused(
            f"archive {name}: no such store (missing or empty); nothing was created. "
            "Check the path, or the URL's database"
        )
    head = head_revision()
    if state.revisions != (head,):
        raise ArchiveRefused(
            f"archive {name} is at {state.where()}, not at head {head}: run "
            f"`hermes-store upgrade --db {name}` on it first"
        )
    return name


@contextlib.contextmanager
def opening(name: str) -> Iterator[None]:
    """Opening the archive ``name``: a failure is ArchiveRefused, naming it."""
    try:
        yield
    except ArchiveRefused:
        raise
    except StoreError as exc:
        raise ArchiveRefused(f"archive {name} cannot be opened: {exc}") from None


def search_stores(
    hot: Source,
    archives: Sequence[Searched],
    options: SearchOptions,
) -> SearchResults:
    """``options``' search over the hot store and ``archives`` (docs/search.md,
    "Searching archives"): one page of the merged list."""
    if not archives:
        return _search_one(hot, options)
    limit, offset = options.page
    offset = max(offset, 0)
    wanted = None if limit < 0 else offset + limit  # None: every hit
    stores = [Searched("", hot), *archives]
    lists: list[list[SearchHit]] = []
    degraded: list[str] = []
    order: str | None = None
    for number, store in enumerate(stores):
        reader = _Reader(store, options, stores[:number])
        kept = reader.first(wanted, set().union(*({hit["id"] for hit in hits} for hits in lists)))
        for note in reader.degraded:
            degraded.append(f"archive {store.name}: {note}" if store.name else note)
        if reader.query_error is not None:
            return SearchResults(
                degraded="; ".join(degraded) or None, query_error=reader.query_error
            )
        order = order or reader.order
        lists.append(kept)
    merged = list(_merged(lists, order or "rank"))
    page = merged[offset:] if wanted is None else merged[offset:wanted]
    return SearchResults(page, degraded="; ".join(degraded) or None, order=order if page else None)


def _search_one(source: Source, options: SearchOptions) -> SearchResults:
    """One store's answer, in a read transaction of its own."""
    from hermes_store.backend import backend_of
    from hermes_store.search.pipeline import search

    statements: SearchStatements
    with backend_of(source.engine).search_transaction(source) as statements:
        return search(statements, options)


class _Reader:
    """One store's hits, read page after page until enough are not served by an earlier
    store."""

    def __init__(
        self,
        store: Searched,
        options: SearchOptions,
        earlier: Sequence[Searched],
    ) -> None:
        self.store = store
        self.options = options
        self.earlier = earlier
        self.degraded: list[str] = []
        self.query_error: str | None = None
        self.order: str | None = None

    def first(self, wanted: int | None, seen: set[int]) -> list[SearchHit]:
        """The store's first ``wanted`` hits (all with None) that no earlier store serves:
        neither among ``seen`` (the earlier stores' hits) nor held by one of them."""
        kept: list[SearchHit] = []
        start, count = 0, -1 if wanted is None else wanted
        while True:
            results = self._read(start, count)
            if self.query_error is not None:
                return []
            served = self._served_earlier([hit["id"] for hit in results], seen)
            kept += (hit for hit in results if hit["id"] not in served)
            start += len(results)
            if wanted is None or len(kept) >= wanted or len(results) < count:
                return kept if wanted is None else kept[:wanted]
            # Ask again for what is missing, and as much again as was left out this time.
            count = wanted - len(kept) + len(served)

    def _read(self, start: int, count: int) -> SearchResults:
        options = replace(self.options, limit=count, offset=start)
        with _named(self.store):
            results = _search_one(self.store.source, options)
        if results.degraded and results.degraded not in self.degraded:
            self.degraded.append(results.degraded)
        self.query_error = results.query_error
        self.order = self.order or results.order
        return results

    def _served_earlier(self, ids: Sequence[int], seen: set[int]) -> set[int]:
        served = {i for i in ids if i in seen}
        rest = [i for i in ids if i not in served]
        for store in self.earlier:
            if not rest:
                break
            with _named(store):
                held = set(_held(store.source, rest))
            served |= held
            rest = [i for i in rest if i not in held]
        return served


def _held(source: Source, ids: Sequence[int]) -> Iterator[int]:
    """Which of ``ids`` are message ids in the store of ``source``."""
    with driver(source) as db:
        for chunk in chunks(ids):
            yield from (int(row[0]) for row in db.execute(_PRESENT, ids=chunk).fetchall())


@contextlib.contextmanager
def _named(store: Searched) -> Iterator[None]:
    """An error of an archive's raised again naming it (its type kept: StoreBusy stays
    one); the hot store's as it is."""
    try:
        yield
    except StoreError as exc:
        if not store.name:
            raise
        message = f"archive {store.name}: {exc}"
        try:
            named = type(exc)(message)
        except TypeError:  # an error whose constructor needs more than a message
            named = StoreError(message)
        raise named from None


def _merged(lists: Sequence[Sequence[SearchHit]], order: str) -> Iterator[SearchHit]:
    """The stores' lists (each in its store's order) as one list in the contract's order."""
    if order in ("newest", "oldest"):
        sign = -1 if order == "newest" else 1

        def by_time(hit: SearchHit) -> tuple[Any, ...]:
            return (sign * hit["timestamp"], hit["id"])

        # A merge of the lists' heads: each store's own order of its ties is kept.
        yield from heapq.merge(*lists, key=by_time)
        return
    fused = sorted(
        (
            (-1.0 / (RRF_K + position), number, position)
            for number, hits in enumerate(lists)
            for position in range(1, len(hits) + 1)
        )
    )
    for _score, number, position in fused:
        yield lists[number][position - 1]

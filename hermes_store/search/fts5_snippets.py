"""Which hits get FTS5's own snippet and which a bounded one, and FTS5's own snippet() for
hits that no FTS5 index found (PostgreSQL's).

The contract's snippet is FTS5's ``snippet()`` (docs/search.md, "Snippets"). A database
whose hits come from FTS5 asks its index; one whose hits come from elsewhere gives the
page's hits to the ``sqlite3`` module's own FTS5: an in-memory table per thread, declared
as the store's index is (:data:`hermes_store.declarations.SQLITE`, the same name and
tokenizer options), the hits' indexed texts inserted with their ids as rowids, the same
MATCH expression and the same ``snippet()`` call (:data:`SNIPPET_SQL`), then rolled back.
The snippet is then FTS5's, computed in C, wherever it depends on the row and the query
only (:mod:`hermes_store.search.snippet` says where it does not).

Where the running sqlite3 lacks FTS5 or the trigram tokenizer (:func:`memory_indexes`,
asked once), the caller keeps the pure-Python reproduction.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from hermes_store.declarations import SQLITE
from hermes_store.search import snippet as fts5_snippet
from hermes_store.search.query import (
    MAX_SEARCH_TERMS,
    TRIGRAM_INDEX,
    Highlight,
    QuerySyntaxError,
    Route,
    highlight_of,
    parse_query,
)

__all__ = [
    "MEMORY_BATCH_CHARS",
    "SNIPPET_EXACT_BYTES",
    "SNIPPET_SQL",
    "cheap_bytes",
    "marks_of",
    "memory_indexes",
    "memory_snippets",
    "snippets_of",
]

log = logging.getLogger(__name__)

#: A hit's snippet is FTS5's own snippet() when its indexed text is at most this many bytes
#: and holds at most fts5_snippet.EXACT_INSTANCES instances of the query's phrases (FTS5's
#: time grows with their square); otherwise a bounded one (fts5_snippet.bounded_*).
#: docs/search.md, "Bounds", says where the two differ.
SNIPPET_EXACT_BYTES = 256 * 1024
#: The contract's snippet() call, for an FTS5 table's name.
SNIPPET_SQL = "snippet({}, 0, '>>>', '<<<', '...', 40)"
#: The in-memory table holds at most this many characters of text at once (at least one
#: hit): a page of every hit (``limit=-1``) is snippeted in batches, not copied whole.
MEMORY_BATCH_CHARS = 2 * 1024 * 1024


def marks_of(route: Route) -> Highlight | None:
    """What the route's snippets mark (None when the parser cannot tell: FTS5 decides)."""
    try:
        return highlight_of(parse_query(route.match, trigram=route.index == TRIGRAM_INDEX))
    except QuerySyntaxError:
        return None


def cheap_bytes(route: Route) -> int:
    """The indexed texts too short to hold more than EXACT_INSTANCES instances of the
    query's phrases (at most one per phrase a token; a word token and its separator take
    two bytes, a trigram one): their FTS5 snippet is cheap whatever they hold (SQLite's
    search statement makes it)."""
    marks = marks_of(route)
    phrases = max(len(marks.phrases) if marks else MAX_SEARCH_TERMS, 1)
    bytes_per_token = 1 if route.index == TRIGRAM_INDEX else 2
    return fts5_snippet.EXACT_INSTANCES * bytes_per_token // phrases - 1


def snippets_of(
    route: Route,
    texts: Mapping[int, object],
    fts5_snippets: Callable[[list[int]], Iterable[Sequence[Any]]],
    *,
    made_bytes: int = -1,
) -> dict[int, str]:
    """The snippets of the texts (id -> indexed text, as bytes) longer than ``made_bytes``
    (those an FTS5 statement made already): FTS5's own where it stays cheap
    (SNIPPET_EXACT_BYTES, EXACT_INSTANCES), asked of ``fts5_snippets`` (ids -> (id,
    snippet) rows); the others bounded. An id ``fts5_snippets`` leaves out has none here."""
    marks = marks_of(route)
    trigram = route.index == TRIGRAM_INDEX
    phrases: list[Any] = []
    if marks is not None:
        phrases = [phrase[0][0] for phrase in marks.phrases] if trigram else list(marks.phrases)
    cheap = cheap_bytes(route)
    exact: list[int] = []
    snippets: dict[int, str] = {}
    for hit_id, data in texts.items():
        if not isinstance(data, bytes) or len(data) <= made_bytes:
            continue  # a NULL text's snippet, or one FTS5 made
        if len(data) <= cheap:  # too short for too many instances: nothing to count
            exact.append(hit_id)
            continue
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


# -- FTS5's snippet() in memory ---------------------------------------------------------


@functools.cache
def memory_indexes() -> frozenset[str]:
    """The store's FTS5 indexes the running sqlite3 can declare in memory (FTS5 compiled
    in; the trigram tokenizer, SQLite 3.34 and later): asked once per process."""
    found = set()
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        for index in SQLITE.indexes:
            try:
                db.execute(index.inline_sql)
            except sqlite3.Error as exc:
                log.debug("search: no in-memory %s (%s)", index.name, type(exc).__name__)
            else:
                found.add(index.name)
    return frozenset(found)


class _Connections(threading.local):
    """One in-memory connection per thread (sqlite3 connections stay in their thread), and
    per process (SQLite's connections are not to be used across a fork)."""

    db: sqlite3.Connection | None = None
    pid: int = 0


_LOCAL = _Connections()


def _memory() -> sqlite3.Connection:
    """This thread's in-memory connection, its tables declared as the store's indexes (and
    always empty: every use is rolled back)."""
    db = _LOCAL.db
    if db is None or _LOCAL.pid != os.getpid():
        db = sqlite3.connect(":memory:", isolation_level=None)
        # FTS5 copies whole tokens and FTS5 text is valid UTF-8 in, valid out; should a
        # snippet ever not decode, it reads as SQLite's lenient reading gives it.
        db.text_factory = lambda data: data.decode("utf-8", "replace")
        for index in SQLITE.indexes:
            if index.name in memory_indexes():
                db.execute(index.inline_sql)
        _LOCAL.db, _LOCAL.pid = db, os.getpid()
    return db


def _batches(texts: Mapping[int, str]) -> Iterator[list[tuple[int, str]]]:
    """The texts in batches of at most MEMORY_BATCH_CHARS characters (at least one text
    a batch)."""
    batch: list[tuple[int, str]] = []
    size = 0
    for item in texts.items():
        if batch and size + len(item[1]) > MEMORY_BATCH_CHARS:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += len(item[1])
    if batch:
        yield batch


def memory_snippets(index: str, match: str, texts: Mapping[int, str]) -> dict[int, str]:
    """FTS5's snippet() (SNIPPET_SQL) of each text (id -> indexed text) that the MATCH
    expression ``match`` selects, in an in-memory table declared as the store's ``index``.

    A text the MATCH does not select, and every text when FTS5 refuses the expression or
    a text, has none here (the caller makes those another way). ``index`` must be one of
    :func:`memory_indexes`.
    """
    db = _memory()
    snippets: dict[int, str] = {}
    select = f"SELECT rowid, {SNIPPET_SQL.format(index)} FROM {index} WHERE {index} MATCH ?"
    for batch in _batches(texts):
        db.execute("BEGIN")
        try:
            db.executemany(f"INSERT INTO {index}(rowid, content) VALUES (?, ?)", batch)
            snippets.update(db.execute(select, (match,)).fetchall())
        except (sqlite3.Error, UnicodeEncodeError) as exc:  # never the text: it is a message
            log.debug("search: in-memory %s refused a batch (%s)", index, type(exc).__name__)
        finally:
            if db.in_transaction:  # an error may have ended it already
                db.execute("ROLLBACK")
    return snippets

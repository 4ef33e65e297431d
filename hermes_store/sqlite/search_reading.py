"""How a SQLite search reads what it cannot read at first: a query FTS5 rejects told from an
index or a row that cannot be read, and text that is not valid UTF-8, named by id."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
from collections.abc import Iterator, Sequence

from sqlalchemy import LargeBinary, bindparam, select
from sqlalchemy.exc import DBAPIError

from hermes_store.declarations import SQLITE
from hermes_store.prepared import Prepared
from hermes_store.search.context import CONTEXT_WINDOW_IDS, chunks
from hermes_store.search.schema import M, S
from hermes_store.sqlite.search_state import Runner

#: Each index's tokenizer, as its FTS5 table declares it (the probe and the pending rows').
#: Each index's FTS5 options after its `content` column (its tokenizer), as the declarations
#: have them.
TOKENIZERS = {
    index.name: index.inline_sql.partition("fts5(content")[2].removesuffix(")")
    for index in SQLITE.indexes
}

# -- telling a query FTS5 rejects from an index or a row that cannot be read ----------------
# Both are an OperationalError, mostly "SQL logic error" (SQLITE_ERROR): FTS5 says the same
# for a dropped `_idx` or `_docsize` table as for some queries, so its message cannot tell
# them apart. A MATCH against an empty table of the same tokenizer, in a connection of its
# own, can: only the query text is there to reject.

#: SQLite's primary result codes of failures of the connection or the file system, not of
#: what is stored (busy, locked, out of memory, read-only, interrupted, I/O error, disk
#: full, cannot open, locking protocol): the search raises them, it has no answer.
_NOT_THE_DATA = frozenset({5, 6, 7, 8, 9, 10, 13, 14, 15})


class Unreadable(Exception):
    """The index or a row could not be read: neither the query's fault nor the connection's."""

    def __init__(self, why: str, error: BaseException) -> None:
        super().__init__(why)
        #: What failed, for ``degraded`` (SQLite's message; never a row's text).
        self.why = why
        #: The driver's exception, raised when nothing else can answer.
        self.error = error


def as_unreadable(exc: DBAPIError | sqlite3.Error) -> Unreadable | None:
    """A driver error as Unreadable when it may come from the index or a row, else None."""
    error = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return Unreadable(_why(error), exc) if _about_the_data(error) else None


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
    for index, tokenizer in TOKENIZERS.items():
        probe.execute(f"CREATE VIRTUAL TABLE {index} USING fts5(content{tokenizer})")
    return probe


@functools.lru_cache(maxsize=256)
def rejected(index: str, match: str) -> bool:
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
def replacing_text(raw: sqlite3.Connection) -> Iterator[_Replacing]:
    """Read text on this connection with U+FFFD for invalid UTF-8, for the block."""
    factory, kept = _Replacing(), raw.text_factory
    raw.text_factory = factory
    try:
        yield factory
    finally:
        raw.text_factory = kept


def reading_leniently(raw: sqlite3.Connection) -> bool:
    return isinstance(getattr(raw, "text_factory", None), _Replacing)


#: The texts a search returns of a message (hit or context), by column.
_TEXTS = {
    "messages.session_id": M.c.session_id,
    "messages.role": M.c.role,
    "messages.content": M.c.content,
    "messages.tool_name": M.c.tool_name,
    "messages.tool_calls": M.c.tool_calls,
    "sessions.source": S.c.source,
    "sessions.model": S.c.model,
}
_AS_BYTES = Prepared.of(
    select(M.c.id, *(column.cast(LargeBinary) for column in _TEXTS.values()))
    .select_from(M.outerjoin(S, S.c.id == M.c.session_id))
    .where(M.c.id.in_(bindparam("ids", expanding=True)))
)
_WINDOW_IDS = Prepared.of(CONTEXT_WINDOW_IDS)
#: At most this many messages are named in ``degraded``.
_NAMED = 5


def undecodable(on: Runner, hit_ids: Sequence[int]) -> str | None:
    """The hits and context rows whose text is not valid UTF-8, named by id and column
    (never by content), as a clause of ``degraded``; None when there are none."""
    found: dict[int, list[str]] = {}
    for chunk in chunks(hit_ids):
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

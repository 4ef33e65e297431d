"""A hit's context rows and the shape of a search's result."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypedDict

from sqlalchemy import and_, bindparam, case, func, select, tuple_

from hermes_store.models import to_server_text
from hermes_store.prepared import Prepared
from hermes_store.search.schema import _messages

log = logging.getLogger(__name__)


class _Rows(Protocol):
    """Runs a compiled statement and returns its rows (a search's runner)."""

    def rows(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Sequence[Any]]: ...


CONTEXT_CHARS = 200
CONTENT_JSON_PREFIX = "\x00json:"
MULTIMODAL_PLACEHOLDER = "[multimodal content]"

_IN_CHUNK = 500  # ids per IN (...) of the context lookup, far below SQLite's variable limit

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
_windows = _target.join(_window_row, _window_row.c.id.in_([_target.c.id, _previous_id, _next_id]))
#: The ids of every message in the context windows of hits ``ids`` (the hits included).
CONTEXT_WINDOW_IDS = (
    select(_window_row.c.id)
    .select_from(_windows)
    .where(_target.c.id.in_(bindparam("ids", expanding=True)))
)


def _windows_of(content: Any) -> Any:
    """The context windows of hits ``ids``, each row's content as ``content`` selects it."""
    return (
        select(_target.c.id, _window_row.c.role, content.label("content"))
        .select_from(_windows)
        .where(_target.c.id.in_(bindparam("ids", expanding=True)))
        .order_by(_target.c.id, _window_row.c.timestamp, _window_row.c.id)
    )


# A context entry shows CONTEXT_CHARS characters: plain text is cut in SQL (a 10 MB tool
# output costs no copy); content stored as JSON (NUL + "json:") is read whole, to decode.
_content = _window_row.c.content
#: SQLite: its substr() stops at a NUL, so a text with one in its first CONTEXT_CHARS
#: characters (JSON content starts with one) is read whole; one shorter than that, too.
_cut = func.substr(_content, 1, CONTEXT_CHARS)
_CONTEXT_WINDOWS = Prepared.of(
    _windows_of(
        case(
            (and_(func.typeof(_content) == "text", func.length(_cut) == CONTEXT_CHARS), _cut),
            else_=_content,
        )
    )
)
#: PostgreSQL (hermes_store.models.to_server_text: a NUL is stored as U+FFFE there, and a
#: character of its codes as three): the characters that hold the first CONTEXT_CHARS.
CONTEXT_WINDOWS = _windows_of(
    case(
        (
            func.left(_content, len(CONTENT_JSON_PREFIX)) == to_server_text(CONTENT_JSON_PREFIX),
            _content,
        ),
        else_=func.substr(_content, 1, 3 * CONTEXT_CHARS),
    )
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
    """The hits of :func:`search_messages`: a list, plus what a person should know of them.

    ``degraded`` is None normally. When the search index is damaged (its triggers or view
    are not this package's, its shadow tables changed, or SQLite reports it malformed) the
    hits come from an exact scan of `messages` instead, and ``degraded`` says so in one line
    (ranking then only approximates BM25 over the whole store). It also names, by id, the
    messages among the hits and their context whose text is not valid UTF-8 (shown with
    U+FFFD in place of each invalid byte).

    ``query_error`` is None when the query was understood. When it was not (FTS5 rejects
    it, or it holds text no database can store) the hits are none, as the contract says,
    and ``query_error`` says why in one line a person can act on.
    """

    degraded: str | None
    query_error: str | None

    def __init__(
        self,
        hits: Iterable[SearchHit] = (),
        degraded: str | None = None,
        query_error: str | None = None,
    ) -> None:
        super().__init__(hits)
        self.degraded = degraded
        self.query_error = query_error


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


def _contexts(on: _Rows, hit_ids: Sequence[int]) -> dict[int, list[ContextMessage]]:
    """The context window of every hit: one statement per chunk of hits."""
    return contexts_of(lambda chunk: on.rows(*_CONTEXT_WINDOWS.bind({"ids": chunk})), hit_ids)


def contexts_of(
    windows: Callable[[list[int]], Iterable[Sequence[Any]]], hit_ids: Sequence[int]
) -> dict[int, list[ContextMessage]]:
    """The context window of every hit, from ``windows`` (CONTEXT_WINDOWS' rows for a chunk
    of hit ids: hit id, role, content)."""
    contexts: dict[int, list[ContextMessage]] = {hit_id: [] for hit_id in hit_ids}
    failed: set[int] = set()
    for chunk in _chunks(hit_ids):
        for hit_id, role, content in windows(chunk):
            if hit_id in failed:
                continue
            try:
                entry: ContextMessage = {"role": role, "content": _context_text(content)}
                contexts[hit_id].append(entry)
            except Exception as exc:  # the contract: a hit whose context cannot be built gets []
                # The type only: the exception's text may quote the message.
                log.debug("search: context of %s not built (%s)", hit_id, type(exc).__name__)
                failed.add(hit_id)
                contexts[hit_id] = []
    return contexts

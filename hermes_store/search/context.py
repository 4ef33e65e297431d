"""A hit's context rows and the shape of a search's result."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypedDict

from sqlalchemy import bindparam, select, tuple_

from hermes_store.search.schema import MESSAGES

log = logging.getLogger(__name__)


CONTEXT_CHARS = 200
CONTENT_JSON_PREFIX = "\x00json:"
MULTIMODAL_PLACEHOLDER = "[multimodal content]"

_IN_CHUNK = 500  # ids per IN (...) of the context lookup, far below SQLite's variable limit

# The context windows of hits ``t``: each hit with its session's previous and next
# messages in (timestamp, id) order, every row of the session whatever its visibility flags,
# in one statement (per chunk of hits).
_target = MESSAGES.alias("t")
_other = MESSAGES.alias("n")
_window_row = MESSAGES.alias("w")


def neighbours(target: Any) -> tuple[Any, Any]:
    """The ids of the messages before and after the hit ``target`` (columns ``id``,
    ``session_id``, ``timestamp``) in its session, in (timestamp, id) order: scalar
    subqueries, correlated to ``target`` (at any depth). Row values, not (a < b OR a = b
    AND ...): SQLite then seeks the session's index (session_id, timestamp) to the
    neighbour instead of reading the whole session."""
    target_key = tuple_(target.timestamp, target.id)
    other_key = tuple_(_other.c.timestamp, _other.c.id)

    def nearest(after: bool) -> Any:
        ordered = (_other.c.timestamp, _other.c.id)
        return (
            select(_other.c.id)
            .where(
                _other.c.session_id == target.session_id,
                other_key > target_key if after else other_key < target_key,
            )
            .order_by(*(column.asc() if after else column.desc() for column in ordered))
            .limit(1)
            .correlate_except(_other)
            .scalar_subquery()
        )

    return nearest(after=False), nearest(after=True)


_previous_id, _next_id = neighbours(_target.c)
_windows = _target.join(_window_row, _window_row.c.id.in_([_target.c.id, _previous_id, _next_id]))
#: The ids of every message in the context windows of hits ``ids`` (the hits included).
CONTEXT_WINDOW_IDS = (
    select(_window_row.c.id)
    .select_from(_windows)
    .where(_target.c.id.in_(bindparam("ids", expanding=True)))
)


def windows_of(
    content: Callable[[Any], Any],
    among: Callable[[Any], Any] = lambda hit_id: hit_id.in_(bindparam("ids", expanding=True)),
) -> Any:
    """The context windows of hits ``ids`` (hit id, role, content), each row's content as
    ``content`` (a function of the content column) selects it: each database cuts it in its
    own SQL. ``among``: the test that a hit's id is one of ``ids`` (an IN list by default)."""
    return (
        select(_target.c.id, _window_row.c.role, content(_window_row.c.content).label("content"))
        .select_from(_windows)
        .where(among(_target.c.id))
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

    ``order`` is the order the hits are in: ``"rank"``, ``"newest"`` or ``"oldest"`` (the
    LIKE scan's is ``"newest"`` whatever was asked); None when there are no hits.
    """

    degraded: str | None
    query_error: str | None
    order: str | None

    def __init__(
        self,
        hits: Iterable[SearchHit] = (),
        degraded: str | None = None,
        query_error: str | None = None,
        order: str | None = None,
    ) -> None:
        super().__init__(hits)
        self.degraded = degraded
        self.query_error = query_error
        self.order = order


def context_text(raw: object) -> str:
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


def chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    """Split ids into IN-list sized chunks."""
    for start in range(0, len(ids), _IN_CHUNK):
        yield list(ids[start : start + _IN_CHUNK])


def contexts_of(
    windows: Callable[[list[int]], Iterable[Sequence[Any]]], hit_ids: Sequence[int]
) -> dict[int, list[ContextMessage]]:
    """The context window of every hit, from ``windows`` (CONTEXT_WINDOWS' rows for a chunk
    of hit ids: hit id, role, content)."""
    contexts: dict[int, list[ContextMessage]] = {hit_id: [] for hit_id in hit_ids}
    failed: set[int] = set()
    for chunk in chunks(hit_ids):
        for hit_id, role, content in windows(chunk):
            if hit_id in failed:
                continue
            try:
                entry: ContextMessage = {"role": role, "content": context_text(content)}
                contexts[hit_id].append(entry)
            except Exception as exc:  # the contract: a hit whose context cannot be built gets []
                # The type only: the exception's text may quote the message.
                log.debug("search: context of %s not built (%s)", hit_id, type(exc).__name__)
                failed.add(hit_id)
                contexts[hit_id] = []
    return contexts


def hit_of(row: Mapping[str, Any], context: list[ContextMessage]) -> SearchHit:
    """A search's row (id, snippet and RESULT_KEYS) as the contract's hit: the one place a
    hit is built, for both databases."""
    return {
        "id": int(row["id"]),
        "session_id": row["session_id"],
        "role": row["role"],
        "snippet": row["snippet"],
        "timestamp": row["timestamp"],
        "tool_name": row["tool_name"],
        "source": row["source"],
        "model": row["model"],
        "session_started": row["session_started"],
        "context": context,
    }

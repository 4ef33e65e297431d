"""The typed read/write API the application uses, over the ORM models.

Design, in three rules:

- **Plain values in and out.** Store methods take and return the frozen dataclasses of
  :mod:`hermes_store.records` (:class:`NewMessage`, :class:`AgentSessionRecord`,
  :class:`MessageRecord`, :class:`SessionSummary`), copies taken inside the call's own
  transaction, never ORM objects: whatever a method returns stays usable after the store
  is closed and never loads anything behind the caller's back.
- **"Session" means an agent session** (a conversation, the `sessions` table, the
  :class:`~hermes_store.models.AgentSession` model) everywhere in this API:
  ``create_session``, ``get_session``, ``end_session``, ... The two ways to an SQLAlchemy
  ORM session say so in their names: :meth:`Store.orm_session` (reads) and
  :meth:`Store.orm_writer` (writes).
- **The session counters are kept in one place.** ``sessions.message_count`` and
  ``tool_call_count`` move only through :func:`_bump_counters`: ``append_messages``
  calls it, and so does a flush hook of every ORM session the store hands out, for the
  :class:`Message` objects the flush inserts, deletes or moves. The counters are not a
  database trigger: the legacy application, which keeps writing these stores, updates
  them in its own code, and a trigger would count its messages twice.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any, cast

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    Table,
    bindparam,
    delete,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, UOWTransaction, sessionmaker
from sqlalchemy.orm.attributes import History

from hermes_store.engine import BEGIN_OPTION, create_store_engine
from hermes_store.errors import SessionExists, SessionNotFound, StoreError, TitleTaken
from hermes_store.models import AgentSession, Message
from hermes_store.records import AgentSessionRecord, MessageRecord, NewMessage, SessionSummary
from hermes_store.search import SearchResults, search_messages

__all__ = [
    "MULTIMODAL_PREFIX",
    "AgentSessionRecord",
    "MessageRecord",
    "NewMessage",
    "SessionExists",
    "SessionNotFound",
    "SessionSummary",
    "Store",
    "StoreError",
    "TitleTaken",
    "count_tool_calls",
    "encode_content",
]

#: How the legacy application marks content that is a JSON list of multimodal parts.
MULTIMODAL_PREFIX = "\x00json:"

_sessions = cast(Table, AgentSession.__table__)
_messages = cast(Table, Message.__table__)

#: Record fields whose column has another name.
_RENAMED = {"compressed_summary": "_compressed_summary"}


def _record_columns(record: type[Any], table: Table) -> tuple[Column[Any], ...]:
    """The columns of ``table`` in the order of ``record``'s fields (one per field)."""
    return tuple(table.c[_RENAMED.get(f.name, f.name)] for f in fields(record))


_SESSION_COLUMNS = _record_columns(AgentSessionRecord, _sessions)
_MESSAGE_COLUMNS = _record_columns(MessageRecord, _messages)

# Prebuilt statements of the hot paths (compiled once, then served from the cache).
_SELECT_SESSION = select(*_SESSION_COLUMNS).where(_sessions.c.id == bindparam("session_id"))
#: A list of parameter sets runs as multi-row ``INSERT ... VALUES (...), (...) RETURNING``
#: statements (SQLAlchemy's "insertmanyvalues", up to 1000 rows each): real INSERTs, so the
#: FTS and display triggers index every row, at a fraction of one statement per row.
_INSERT_MESSAGES = insert(_messages).returning(_messages.c.id)
_BUMP_COUNTERS = (
    update(_sessions)
    .where(_sessions.c.id == bindparam("b_session_id"))
    .values(
        message_count=func.coalesce(_sessions.c.message_count, 0)
        + bindparam("b_messages", type_=Integer),
        tool_call_count=func.coalesce(_sessions.c.tool_call_count, 0)
        + bindparam("b_tool_calls", type_=Integer),
    )
)


def encode_content(content: str | list[Any] | None) -> str | None:
    """Store text as is and a list of parts the way the legacy application does."""
    if isinstance(content, list):
        return MULTIMODAL_PREFIX + json.dumps(content, ensure_ascii=False)
    return content


def count_tool_calls(tool_calls: str | list[Any] | None) -> int:
    """Number of calls in a tool_calls value (a JSON list); anything else counts as 0."""
    if tool_calls is None:
        return 0
    if isinstance(tool_calls, str):
        try:
            tool_calls = json.loads(tool_calls)
        except ValueError:
            return 0
    return len(tool_calls) if isinstance(tool_calls, list) else 0


# -- the session counters ----------------------------------------------------------------

#: Per agent session: [messages, tool calls] to add (negative to take away).
_Deltas = dict[str, list[int]]


def _add(deltas: _Deltas, session_id: str | None, messages: int, tool_calls: str | None) -> None:
    if session_id is None:
        return
    counts = deltas.setdefault(session_id, [0, 0])
    counts[0] += messages
    counts[1] += messages * count_tool_calls(tool_calls)


def _bump_counters(conn: Connection, deltas: Mapping[str, Sequence[int]]) -> int:
    """Add ``deltas`` to the sessions' message and tool-call counters; one prepared UPDATE.

    The one place that changes ``sessions.message_count`` and ``tool_call_count`` (a NULL
    counter counts as 0). Returns the number of sessions updated.
    """
    if not deltas:
        return 0
    params = [
        {"b_session_id": session_id, "b_messages": counts[0], "b_tool_calls": counts[1]}
        for session_id, counts in deltas.items()
    ]
    return int(conn.execute(_BUMP_COUNTERS, params).rowcount)


class _StoreSession(Session):
    """The ORM session of a Store: every flush keeps the session counters right.

    Message objects inserted or deleted by a flush, or moved to another session (or given
    other ``tool_calls``), update the counters in the flush's transaction. Statements run
    through ``execute()`` (``insert(Message)``, ``delete(Message)``, raw SQL) bypass the
    unit of work and the counters with it, as any SQL the legacy application runs does.
    """


_DELETED_SHARE = "hermes_store.deleted_message_share"


def _history_values(history: History) -> tuple[Any, Any]:
    """(value before the flush, value after it) of one column attribute."""
    before = [*history.deleted, *history.unchanged]
    after = [*history.added, *history.unchanged]
    return (before[0] if before else None, after[0] if after else None)


@event.listens_for(_StoreSession, "before_flush")
def _count_deleted_messages(session: Session, _flush: UOWTransaction, _objects: Any) -> None:
    # What a deleted message counted for is what its row holds: read it while the row
    # still exists (loading what has expired), and keep it for after the flush.
    deltas: _Deltas = {}
    for obj in session.deleted:
        if isinstance(obj, Message):
            unloaded = sa_inspect(obj).unloaded & {"session_id", "tool_calls"}
            if unloaded:
                session.refresh(obj, sorted(unloaded))
            attrs = sa_inspect(obj).attrs
            old_session, _ = _history_values(attrs.session_id.history)
            old_calls, _ = _history_values(attrs.tool_calls.history)
            _add(deltas, old_session, -1, old_calls)
    session.info[_DELETED_SHARE] = deltas


@event.listens_for(_StoreSession, "after_flush")
def _count_flushed_messages(session: Session, _flush: UOWTransaction) -> None:
    # session.new / dirty and attribute history still show the state before the flush,
    # with foreign keys set from relationships (message.session = ...) already synced.
    deltas: _Deltas = session.info.pop(_DELETED_SHARE, {})
    for obj in session.new:
        if isinstance(obj, Message):
            _add(deltas, obj.session_id, 1, obj.tool_calls)
    for obj in session.dirty:
        if not isinstance(obj, Message):
            continue
        attrs = sa_inspect(obj).attrs
        moved, calls = attrs.session_id.history, attrs.tool_calls.history
        if moved.has_changes() or calls.has_changes():
            old_session, new_session = _history_values(moved)
            old_calls, new_calls = _history_values(calls)
            _add(deltas, old_session, -1, old_calls)
            _add(deltas, new_session, 1, new_calls)
    changed = {sid: counts for sid, counts in deltas.items() if any(counts)}
    if changed:
        _bump_counters(session.connection(), changed)


# -- the store ---------------------------------------------------------------------------


class Store:
    """A session store: agent sessions, their messages, and the writes the agent makes.

    Every method runs in its own transaction (writes take the write lock at BEGIN) and
    returns plain records (see the module docstring). Open it with :meth:`open`; the store
    must already be at head (``migrate.upgrade``).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._write_engine = engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        self._read = sessionmaker(engine, class_=_StoreSession, expire_on_commit=False)
        self._write = sessionmaker(self._write_engine, class_=_StoreSession, expire_on_commit=False)

    @classmethod
    def open(cls, url: str | os.PathLike[str] | None = None, *, create: bool = False) -> Store:
        """Open a store at ``url`` (resolved like every entry point); it must be at head.

        The revision is not checked here: run ``migrate.upgrade`` first.
        """
        return cls(create_store_engine(url, create=create))

    def close(self) -> None:
        """Release the store's connections."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ORM access ------------------------------------------------------------------

    def orm_session(self) -> Session:
        """A new SQLAlchemy ORM session for queries over the models (reads start DEFERRED).

        Use it as a context manager. Objects it loads belong to it: read what you need
        before it closes. ``AgentSession.messages`` is write-only, so a transcript is read
        explicitly, e.g. ``db.scalars(row.messages.select().limit(50))``.
        """
        return self._read()

    def orm_writer(self) -> Session:
        """A new SQLAlchemy ORM session whose transactions take the write lock at BEGIN.

        Use ``with store.orm_writer() as db, db.begin(): ...``. Message objects it adds or
        deletes (``db.add(Message(...))``, ``row.messages.add(...)``, ``db.delete(m)``)
        keep the session counters right. Bulk statements run with ``db.execute()`` and raw
        SQL do not: they write the table as they are told, like the legacy application.
        """
        return self._write()

    def session(self) -> Session:
        """Deprecated name of :meth:`orm_session`."""
        warnings.warn(
            "Store.session() is renamed Store.orm_session()", DeprecationWarning, stacklevel=2
        )
        return self.orm_session()

    def writer(self) -> Session:
        """Deprecated name of :meth:`orm_writer`."""
        warnings.warn(
            "Store.writer() is renamed Store.orm_writer()", DeprecationWarning, stacklevel=2
        )
        return self.orm_writer()

    # -- writes ----------------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        source: str,
        *,
        model: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        started_at: float | None = None,
        title: str | None = None,
        **columns: Any,
    ) -> AgentSessionRecord:
        """Create an agent session and return it as stored (with the server defaults).

        Other `sessions` columns may be passed by name. Raises :class:`SessionExists` when
        the id is taken, :class:`TitleTaken` when another session has ``title``, and
        :class:`SessionNotFound` when ``parent_session_id`` names no session.
        """
        row = AgentSession(
            id=session_id,
            source=source,
            model=model,
            user_id=user_id,
            parent_session_id=parent_session_id,
            started_at=time.time() if started_at is None else started_at,
            title=title,
            message_count=0,
            tool_call_count=0,
            **columns,
        )
        with self._write.begin() as db:
            if _session_exists(db, session_id):
                raise SessionExists(
                    f"session {session_id!r} already exists: append to it with "
                    "append_messages(), or create the new session under another id"
                )
            if parent_session_id is not None and not _session_exists(db, parent_session_id):
                raise SessionNotFound(
                    f"no parent session {parent_session_id!r}: create it first, or pass "
                    "parent_session_id=None"
                )
            if title is not None and (
                db.scalar(select(AgentSession.id).where(AgentSession.title == title).limit(1))
                is not None
            ):
                raise TitleTaken(
                    f"another session is already titled {title!r}: session titles are "
                    "unique, pick another one (or none)"
                )
            db.add(row)
            db.flush()
            return AgentSessionRecord(
                *db.execute(_SELECT_SESSION, {"session_id": session_id}).one()
            )

    def append_message(self, session_id: str, message: NewMessage) -> int:
        """Append one message and bump the session's counters in the same transaction."""
        return self.append_messages(session_id, [message])[0]

    def append_messages(self, session_id: str, messages: Iterable[NewMessage]) -> list[int]:
        """Append messages in one write transaction; return their ids in order.

        The rows go in as multi-row INSERTs (1000 rows a statement) and the session's
        counters move once, by the batch's totals. Raises :class:`SessionNotFound` when
        the session does not exist; a row the schema refuses rolls the whole batch back.
        """
        rows: list[dict[str, Any]] = []
        tool_calls = 0
        for message in messages:
            rows.append(_message_values(session_id, message))
            tool_calls += count_tool_calls(message.tool_calls)
        with self._write_engine.begin() as conn:
            if _bump_counters(conn, {session_id: [len(rows), tool_calls]}) == 0:
                raise SessionNotFound(
                    f"no session {session_id!r}: create it with create_session() first"
                )
            if not rows:
                return []
            ids = list(conn.scalars(_INSERT_MESSAGES, rows))
        # RETURNING does not promise an order, but AUTOINCREMENT hands out increasing ids
        # in insertion order, which is the order of `rows`: sorted, they match.
        ids.sort()
        return ids

    def end_session(
        self, session_id: str, end_reason: str, *, ended_at: float | None = None
    ) -> None:
        """Mark a session ended with a reason."""
        with self._write.begin() as db:
            result = db.execute(
                update(AgentSession)
                .where(AgentSession.id == session_id)
                .values(
                    ended_at=time.time() if ended_at is None else ended_at, end_reason=end_reason
                )
            )
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise SessionNotFound(f"no session {session_id!r} to end")

    def set_message_flags(
        self,
        message_ids: Sequence[int],
        *,
        active: bool | None = None,
        compacted: bool | None = None,
    ) -> int:
        """Rewind (active=False) or archive (compacted=True) messages; return rows changed.

        The session counters do not change: they count every message appended, hidden
        or not, as the legacy application does.
        """
        values: dict[str, int] = {}
        if active is not None:
            values["active"] = int(active)
        if compacted is not None:
            values["compacted"] = int(compacted)
        if not values or not message_ids:
            return 0
        with self._write.begin() as db:
            result = db.execute(
                update(Message).where(Message.id.in_(list(message_ids))).values(**values)
            )
            return int(result.rowcount)  # type: ignore[attr-defined]

    def edit_message(self, message_id: int, content: str | list[Any] | None) -> None:
        """Replace a message's text (the FTS triggers re-index it)."""
        with self._write.begin() as db:
            result = db.execute(
                update(Message)
                .where(Message.id == message_id)
                .values(content=encode_content(content))
            )
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise StoreError(f"no message with id {message_id}")

    def delete_session(self, session_id: str) -> int:
        """Delete a session and its messages; its child sessions are kept, unparented.

        Returns the number of messages deleted. Per-model usage rows go with the session
        (ON DELETE CASCADE).
        """
        with self._write.begin() as db:
            if not _session_exists(db, session_id):
                raise SessionNotFound(f"no session {session_id!r} to delete")
            db.execute(
                update(AgentSession)
                .where(AgentSession.parent_session_id == session_id)
                .values(parent_session_id=None)
            )
            deleted = db.execute(delete(Message).where(Message.session_id == session_id))
            db.execute(delete(AgentSession).where(AgentSession.id == session_id))
            return int(deleted.rowcount)  # type: ignore[attr-defined]

    # -- reads -----------------------------------------------------------------------

    def get_session(self, session_id: str) -> AgentSessionRecord | None:
        """One agent session, every column, or None when there is none with this id."""
        with self.engine.connect() as conn:
            row = conn.execute(_SELECT_SESSION, {"session_id": session_id}).first()
        return None if row is None else AgentSessionRecord(*row)

    def messages(self, session_id: str, *, include_inactive: bool = True) -> list[MessageRecord]:
        """A session's messages in conversation order (timestamp, then id).

        ``include_inactive=False`` hides rewound messages (active=0) but keeps compacted
        ones (active=0, compacted=1), which the UI history still shows.
        """
        query = select(*_MESSAGE_COLUMNS).where(_messages.c.session_id == session_id)
        if not include_inactive:
            query = query.where((_messages.c.active == 1) | (_messages.c.compacted == 1))
        query = query.order_by(_messages.c.timestamp, _messages.c.id)
        with self.engine.connect() as conn:
            return [MessageRecord(*row) for row in conn.execute(query)]

    def list_sessions(
        self, *, limit: int = 50, offset: int = 0, source: str | None = None
    ) -> list[SessionSummary]:
        """Sessions newest first, with their message and tool-call counts."""
        s = _sessions.c
        query = select(
            s.id,
            s.source,
            s.title,
            s.model,
            s.started_at,
            s.ended_at,
            func.coalesce(s.message_count, 0),
            func.coalesce(s.tool_call_count, 0),
            s.parent_session_id,
        ).order_by(s.started_at.desc(), s.id)
        if source is not None:
            query = query.where(s.source == source)
        with self.engine.connect() as conn:
            return [SessionSummary(*row) for row in conn.execute(query.limit(limit).offset(offset))]

    def search(
        self,
        query: str,
        *,
        source_filter: Sequence[str] | None = None,
        exclude_sources: Sequence[str] | None = None,
        role_filter: Sequence[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        sort: str | None = None,
        include_inactive: bool = False,
    ) -> SearchResults:
        """Search message text; see :func:`hermes_store.search.search_messages`.

        The hits are plain dicts (with their context windows), ranked as the legacy
        application ranks them; ``results.degraded`` says when a damaged index made the
        search fall back to a scan.
        """
        with self.engine.connect() as conn:
            return search_messages(
                conn,
                query,
                source_filter=source_filter,
                exclude_sources=exclude_sources,
                role_filter=role_filter,
                limit=limit,
                offset=offset,
                sort=sort,
                include_inactive=include_inactive,
            )


def _session_exists(db: Session, session_id: str) -> bool:
    return db.scalar(select(AgentSession.id).where(AgentSession.id == session_id)) is not None


def _message_values(session_id: str, message: NewMessage) -> dict[str, Any]:
    """The `messages` row of a new message: the columns every insert path writes."""
    tool_calls = message.tool_calls
    if isinstance(tool_calls, list):
        tool_calls = json.dumps(tool_calls, ensure_ascii=False)
    return {
        "session_id": session_id,
        "role": message.role,
        "content": encode_content(message.content),
        "tool_calls": tool_calls,
        "tool_name": message.tool_name,
        "tool_call_id": message.tool_call_id,
        "timestamp": time.time() if message.timestamp is None else message.timestamp,
        "token_count": message.token_count,
        "finish_reason": message.finish_reason,
        "reasoning": message.reasoning,
        "platform_message_id": message.platform_message_id,
    }

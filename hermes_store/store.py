"""The typed read/write API the application uses, over the ORM models."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from hermes_store.engine import BEGIN_OPTION, create_store_engine
from hermes_store.errors import StoreError
from hermes_store.models import AgentSession, Message

#: How the legacy application marks content that is a JSON list of multimodal parts.
MULTIMODAL_PREFIX = "\x00json:"


class SessionNotFound(StoreError):
    """The session id given to a write does not exist in the store."""


@dataclass(frozen=True)
class NewMessage:
    """A message to append; ``content`` may be text or a list of multimodal parts."""

    role: str
    content: str | list[Any] | None = None
    tool_calls: str | list[dict[str, Any]] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    timestamp: float | None = None
    token_count: int | None = None
    finish_reason: str | None = None
    reasoning: str | None = None
    platform_message_id: str | None = None


@dataclass(frozen=True)
class SessionSummary:
    """A row of the session list: the session and its counters."""

    id: str
    source: str
    title: str | None
    model: str | None
    started_at: float
    ended_at: float | None
    message_count: int
    tool_call_count: int
    parent_session_id: str | None


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


class Store:
    """A session store: sessions, their messages, and the writes the agent makes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._read = sessionmaker(engine, expire_on_commit=False)
        self._write = sessionmaker(
            engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"}), expire_on_commit=False
        )

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

    def session(self) -> Session:
        """An ORM session for reads; application queries go through it."""
        return self._read()

    def writer(self) -> Session:
        """An ORM session whose transactions take the write lock at BEGIN (no upgrade deadlock)."""
        return self._write()

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
    ) -> AgentSession:
        """Create a session (other `sessions` columns may be passed by name)."""
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
            db.add(row)
        return row

    def append_message(self, session_id: str, message: NewMessage) -> int:
        """Append one message and bump the session's counters in the same transaction."""
        return self.append_messages(session_id, [message])[0]

    def append_messages(self, session_id: str, messages: Iterable[NewMessage]) -> list[int]:
        """Append several messages in one transaction; return their ids in order."""
        rows = [self._message_row(session_id, m) for m in messages]
        tool_calls = sum(count_tool_calls(m.tool_calls) for m in rows)
        with self._write.begin() as db:
            bumped = db.execute(
                update(AgentSession)
                .where(AgentSession.id == session_id)
                .values(
                    message_count=func.coalesce(AgentSession.message_count, 0) + len(rows),
                    tool_call_count=func.coalesce(AgentSession.tool_call_count, 0) + tool_calls,
                )
            )
            if bumped.rowcount == 0:  # type: ignore[attr-defined]
                raise SessionNotFound(
                    f"no session {session_id!r}: create it with create_session() first"
                )
            # One INSERT per row, not add_all(): a multi-row flush takes SQLAlchemy's
            # "insertmanyvalues" path, which refuses `messages.id` as its RETURNING sentinel
            # (the model declares it nullable to match the legacy DDL). Same transaction,
            # same write lock, so the ids are still consecutive and in order.
            for row in rows:
                db.add(row)
                db.flush()
            return [row.id for row in rows]

    @staticmethod
    def _message_row(session_id: str, message: NewMessage) -> Message:
        tool_calls = message.tool_calls
        if isinstance(tool_calls, list):
            tool_calls = json.dumps(tool_calls, ensure_ascii=False)
        return Message(
            session_id=session_id,
            role=message.role,
            content=encode_content(message.content),
            tool_calls=tool_calls,
            tool_name=message.tool_name,
            tool_call_id=message.tool_call_id,
            timestamp=time.time() if message.timestamp is None else message.timestamp,
            token_count=message.token_count,
            finish_reason=message.finish_reason,
            reasoning=message.reasoning,
            platform_message_id=message.platform_message_id,
        )

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
        """Rewind (active=False) or archive (compacted=True) messages; return rows changed."""
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
            if db.get(AgentSession, session_id) is None:
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

    def get_session(self, session_id: str) -> AgentSession | None:
        """One session, or None."""
        with self._read() as db:
            return db.get(AgentSession, session_id)

    def messages(self, session_id: str, *, include_inactive: bool = True) -> list[Message]:
        """A session's messages in conversation order (timestamp, then id).

        ``include_inactive=False`` hides rewound messages (active=0) but keeps compacted
        ones (active=0, compacted=1), which the UI history still shows.
        """
        query = select(Message).where(Message.session_id == session_id)
        if not include_inactive:
            query = query.where((Message.active == 1) | (Message.compacted == 1))
        with self._read() as db:
            return list(db.scalars(query.order_by(Message.timestamp, Message.id)))

    def list_sessions(
        self, *, limit: int = 50, offset: int = 0, source: str | None = None
    ) -> list[SessionSummary]:
        """Sessions newest first, with their message and tool-call counts."""
        query = select(AgentSession).order_by(AgentSession.started_at.desc(), AgentSession.id)
        if source is not None:
            query = query.where(AgentSession.source == source)
        with self._read() as db:
            return [
                SessionSummary(
                    id=s.id,
                    source=s.source,
                    title=s.title,
                    model=s.model,
                    started_at=s.started_at,
                    ended_at=s.ended_at,
                    message_count=s.message_count or 0,
                    tool_call_count=s.tool_call_count or 0,
                    parent_session_id=s.parent_session_id,
                )
                for s in db.scalars(query.limit(limit).offset(offset))
            ]

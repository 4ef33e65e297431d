"""The schema at head (the application's newest schema, revisions.LAST_APP_VERSION) as
SQLAlchemy sees it.

FTS5 tables, the view and the triggers are raw DDL in the revisions. One model set serves
both databases: SQLite's 64-bit INTEGER, REAL and BLOB are BIGINT, DOUBLE PRECISION and
BYTEA on PostgreSQL, and every partial index is partial on both."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sqlalchemy import BLOB as SQLITE_BLOB
from sqlalchemy import INTEGER as SQLITE_INTEGER
from sqlalchemy import REAL as SQLITE_REAL
from sqlalchemy import TEXT as SQLITE_TEXT
from sqlalchemy import (
    Column,
    ForeignKey,
    Index,
    PrimaryKeyConstraint,
    Table,
    desc,
    event,
    func,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import BIGINT, BYTEA, DOUBLE_PRECISION
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Mapper,
    WriteOnlyMapped,
    mapped_column,
    relationship,
)
from sqlalchemy.types import TypeDecorator, TypeEngine

from hermes_store.errors import TextNotStorable

#: SQLite's column types, and what holds the same values on PostgreSQL: INTEGER is 64-bit
#: in SQLite, and REAL an 8-byte float (PostgreSQL's REAL is 4 bytes: timestamps would
#: lose their seconds).
#: PostgreSQL text cannot hold NUL, which SQLite stores do (the multimodal content prefix
#: "\x00json:", binary tool output). So PostgreSQL stores text in a code, and what the data
#: layer gives and takes is the same on both databases:
#:
#: - NUL is stored as U+FFFE (a Unicode noncharacter: never in text people exchange);
#: - U+FFFE, U+FFFF, U+FDD0 and U+FDD1 themselves (noncharacters too) as U+FFFF followed by
#:   two of U+FDD0 / U+FDD1 (:data:`_ESCAPES`);
#: - every other character as itself.
#:
#: It is injective (U+FFFF starts an escape and only that, U+FDD0 / U+FDD1 follow it and
#: only that), and it keeps what search reads on the server true of the text itself: U+FFFE
#: stands for NUL alone, so ``split_part(text, U+FFFE, 1)`` is the text up to its first NUL;
#: and an escape is never found inside another, so the code of a string is in the code of a
#: text exactly when the string is in the text (LIKE, strpos, the trigram index). Stores
#: written before the escapes held NUL as U+FFFE already: they read the same. Reading is
#: total: a U+FFFF, U+FDD0 or U+FDD1 that is no escape (such an earlier store could hold
#: one) reads as itself.
NUL = "\x00"
SERVER_NUL = "\ufffe"
SERVER_ESCAPE = "\uffff"
_ESCAPES = {
    "\ufffe": "\uffff\ufdd0\ufdd0",
    "\uffff": "\uffff\ufdd0\ufdd1",
    "\ufdd0": "\uffff\ufdd1\ufdd0",
    "\ufdd1": "\uffff\ufdd1\ufdd1",
}
_TO_SERVER = {NUL: SERVER_NUL, **_ESCAPES}
_FROM_SERVER = {code: char for char, code in _TO_SERVER.items()}
_CODED_CHARACTER = re.compile("[\x00\ufffe\uffff\ufdd0\ufdd1]")
_CODE = re.compile("\ufffe|\uffff[\ufdd0\ufdd1]{2}")


def to_server_text(value: str) -> str:
    """A string as PostgreSQL stores it (NUL as U+FFFE, see :data:`SERVER_NUL`)."""
    # `in` first: constant time where the string cannot hold the character (ASCII and
    # Latin-1 strings cannot hold a noncharacter), a scan in C otherwise; no escape to
    # write is the usual case, NUL alone the next.
    if value.isascii() or not (
        "\ufffe" in value or "\uffff" in value or "\ufdd0" in value or "\ufdd1" in value
    ):
        return value.replace(NUL, SERVER_NUL) if NUL in value else value
    return _CODED_CHARACTER.sub(lambda found: _TO_SERVER[found[0]], value)


def from_server_text(value: str) -> str:
    """A string read from PostgreSQL as the data layer gives it (U+FFFE as NUL)."""
    if value.isascii():
        return value
    if SERVER_ESCAPE not in value:
        return value.replace(SERVER_NUL, NUL) if SERVER_NUL in value else value
    return _CODE.sub(lambda found: _FROM_SERVER[found[0]], value)


#: Why a text holding a lone surrogate is refused: neither database holds one (sqlite3 and
#: psycopg encode text as UTF-8, which has no lone surrogates).
UNSTORABLE_TEXT = (
    "the text for column '{column}' holds a lone surrogate (a code point from U+D800 to "
    "U+DFFF), which neither SQLite nor PostgreSQL can store: nothing was written. Pass "
    "valid Unicode (e.g. decode bytes with errors='replace')"
)


def unstorable_text(values: Iterable[tuple[str, Any]]) -> TextNotStorable | None:
    """The refusal of the first (column, value) whose text cannot be stored, or None."""
    for column, value in values:
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return TextNotStorable(UNSTORABLE_TEXT.format(column=column))
    return None


class ServerText(TypeDecorator[str]):
    """TEXT on PostgreSQL, stored in the code of :data:`SERVER_NUL` (NUL as U+FFFE)."""

    impl = SQLITE_TEXT
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else to_server_text(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else from_server_text(value)


TEXT: TypeEngine[str] = SQLITE_TEXT().with_variant(ServerText(), "postgresql")
INTEGER: TypeEngine[int] = SQLITE_INTEGER().with_variant(BIGINT(), "postgresql")
REAL: TypeEngine[float] = SQLITE_REAL().with_variant(DOUBLE_PRECISION(), "postgresql")
BLOB: TypeEngine[bytes] = SQLITE_BLOB().with_variant(BYTEA(), "postgresql")

ZERO = text("0")
EMPTY = text("''")


class Base(DeclarativeBase):
    """Declarative base of every hermes-store table.

    Primary keys other than composite ones are declared ``nullable=True`` because the
    legacy DDL does not say NOT NULL on them (SQLite then allows NULL in a TEXT key);
    the models describe the schema as it is, so that autogenerate finds no difference.
    """


@event.listens_for(Base, "before_insert", propagate=True)
@event.listens_for(Base, "before_update", propagate=True)
def _refuse_unstorable_text(mapper: Mapper[Any], _connection: Connection, target: Any) -> None:
    """A flush refuses an object holding text no database can store, before its row is
    written (the Store's own writes refuse it in ``hermes_store.prepared``)."""
    values = vars(target)
    refusal = unstorable_text(
        (attribute.columns[0].name, values.get(attribute.key)) for attribute in mapper.column_attrs
    )
    if refusal is not None:
        raise refusal


class AgentSession(Base):
    """One conversation of the agent on one platform (`sessions`)."""

    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    source: Mapped[str] = mapped_column(TEXT, nullable=False)
    user_id: Mapped[str | None] = mapped_column(TEXT)
    session_key: Mapped[str | None] = mapped_column(TEXT)
    chat_id: Mapped[str | None] = mapped_column(TEXT)
    chat_type: Mapped[str | None] = mapped_column(TEXT)
    thread_id: Mapped[str | None] = mapped_column(TEXT)
    display_name: Mapped[str | None] = mapped_column(TEXT)
    origin_json: Mapped[str | None] = mapped_column(TEXT)
    expiry_finalized: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    model: Mapped[str | None] = mapped_column(TEXT)
    model_config: Mapped[str | None] = mapped_column(TEXT)
    system_prompt: Mapped[str | None] = mapped_column(TEXT)
    parent_session_id: Mapped[str | None] = mapped_column(TEXT, ForeignKey("sessions.id"))
    started_at: Mapped[float] = mapped_column(REAL, nullable=False)
    ended_at: Mapped[float | None] = mapped_column(REAL)
    end_reason: Mapped[str | None] = mapped_column(TEXT)
    message_count: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    tool_call_count: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    input_tokens: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    output_tokens: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    cache_read_tokens: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    cache_write_tokens: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    reasoning_tokens: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    cwd: Mapped[str | None] = mapped_column(TEXT)
    git_branch: Mapped[str | None] = mapped_column(TEXT)
    git_repo_root: Mapped[str | None] = mapped_column(TEXT)
    billing_provider: Mapped[str | None] = mapped_column(TEXT)
    billing_base_url: Mapped[str | None] = mapped_column(TEXT)
    billing_mode: Mapped[str | None] = mapped_column(TEXT)
    estimated_cost_usd: Mapped[float | None] = mapped_column(REAL)
    actual_cost_usd: Mapped[float | None] = mapped_column(REAL)
    cost_status: Mapped[str | None] = mapped_column(TEXT)
    cost_source: Mapped[str | None] = mapped_column(TEXT)
    pricing_version: Mapped[str | None] = mapped_column(TEXT)
    title: Mapped[str | None] = mapped_column(TEXT)
    api_call_count: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    handoff_state: Mapped[str | None] = mapped_column(TEXT)
    handoff_platform: Mapped[str | None] = mapped_column(TEXT)
    handoff_error: Mapped[str | None] = mapped_column(TEXT)
    compression_failure_cooldown_until: Mapped[float | None] = mapped_column(REAL)
    compression_failure_error: Mapped[str | None] = mapped_column(TEXT)
    compression_fallback_streak: Mapped[int] = mapped_column(
        INTEGER, nullable=False, server_default=ZERO, default=0
    )
    rewind_count: Mapped[int] = mapped_column(
        INTEGER, nullable=False, server_default=ZERO, default=0
    )
    archived: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO, default=0)
    # Application schema 24 (columns it declared between 21 and 28).
    git_metadata_generation: Mapped[int] = mapped_column(
        INTEGER, nullable=False, server_default=ZERO, default=0
    )
    title_source: Mapped[str | None] = mapped_column(TEXT)
    last_activity_at: Mapped[float | None] = mapped_column(REAL)
    last_activity_description: Mapped[str | None] = mapped_column(TEXT)
    last_activity_provenance: Mapped[str | None] = mapped_column(TEXT)
    compression_ineffective_count: Mapped[int] = mapped_column(
        INTEGER, nullable=False, server_default=ZERO, default=0
    )
    compression_recovery_deadline: Mapped[float | None] = mapped_column(REAL)
    profile_name: Mapped[str | None] = mapped_column(TEXT)
    pinned: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO, default=0)
    hidden: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO, default=0)
    last_read_at: Mapped[float | None] = mapped_column(REAL)
    tool_names: Mapped[str | None] = mapped_column(TEXT)
    # Application schema 25: the prompt text lives in system_prompts (no foreign key, as
    # the application's reconciler adds the column).
    system_prompt_hash: Mapped[str | None] = mapped_column(TEXT)
    # Application schema 30.
    created_source: Mapped[str | None] = mapped_column(TEXT)
    compression_overload_streak: Mapped[int] = mapped_column(
        INTEGER, nullable=False, server_default=ZERO, default=0
    )
    transport_profile: Mapped[str | None] = mapped_column(TEXT)

    #: Write-only: a transcript can hold tens of thousands of rows, so it is never loaded as
    #: a whole by accident. Read with ``db.scalars(row.messages.select())`` (ordered by
    #: timestamp, then id; add ``.limit()`` to page), add with ``row.messages.add(m)``.
    messages: WriteOnlyMapped[Message] = relationship(
        back_populates="session",
        order_by="(Message.timestamp, Message.id)",
        passive_deletes=True,
    )
    parent: Mapped[AgentSession | None] = relationship(
        back_populates="children", remote_side="AgentSession.id"
    )
    children: Mapped[list[AgentSession]] = relationship(back_populates="parent")

    __table_args__ = (
        Index("idx_sessions_source", "source"),
        Index("idx_sessions_source_id", "source", "id"),
        Index("idx_sessions_parent", "parent_session_id"),
        Index("idx_sessions_started", desc("started_at")),
        Index("idx_sessions_session_key", "session_key", desc("started_at")),
        Index(
            "idx_sessions_gateway_peer",
            "source",
            "user_id",
            "chat_id",
            "chat_type",
            "thread_id",
            desc("started_at"),
        ),
        Index("idx_sessions_handoff_state", "handoff_state", "started_at"),
        Index("idx_sessions_system_prompt_hash", "system_prompt_hash"),
        Index("idx_sessions_tool_names", "tool_names"),
        Index(
            "idx_sessions_effective_activity",
            desc(func.coalesce(literal_column("last_activity_at"), literal_column("started_at"))),
            desc("started_at"),
        ),
        Index(
            "idx_sessions_title_unique",
            "title",
            unique=True,
            sqlite_where=text("title IS NOT NULL"),
        ),
    )

    def __repr__(self) -> str:
        return (
            f"AgentSession(id={self.id!r}, source={self.source!r}, messages={self.message_count})"
        )


class Message(Base):
    """One message of a session (`messages`); its text is what both FTS5 indexes search."""

    __tablename__ = "messages"
    __table_args__ = (
        Index("idx_messages_session", "session_id", "timestamp"),
        Index("idx_messages_session_active", "session_id", "active", "timestamp"),
        Index("idx_messages_active_null", "active", sqlite_where=text("active IS NULL")),
        Index(
            "idx_messages_platform_msg_id",
            "session_id",
            "platform_message_id",
            sqlite_where=text("platform_message_id IS NOT NULL"),
        ),
        Index("idx_messages_session_id", "session_id", "id"),
        Index(
            "idx_messages_assistant_calls_by_session",
            "session_id",
            sqlite_where=text("role = 'assistant' AND tool_calls IS NOT NULL"),
        ),
        Index(
            "idx_messages_display_page",
            "session_id",
            "display_order",
            desc("active"),
            desc("id"),
            sqlite_where=text("active = 1 OR compacted = 1"),
        ),
        Index(
            "idx_messages_display_backfill",
            "session_id",
            sqlite_where=text(
                "(display_order IS NULL OR display_identity IS NULL)"
                " AND (active = 1 OR compacted = 1)"
            ),
        ),
        Index(
            "idx_messages_display_identity",
            "session_id",
            "display_identity",
            "display_order",
            sqlite_where=text("display_identity IS NOT NULL AND (active = 1 OR compacted = 1)"),
        ),
        # implicit_returning=False: a flush of several new Message objects then INSERTs
        # them one by one and reads each id from the cursor. With RETURNING, SQLAlchemy
        # needs `id` as a sort sentinel, which it refuses for a nullable key (declared so
        # to match the legacy DDL). Explicit `insert().returning()` is unaffected.
        {"sqlite_autoincrement": True, "implicit_returning": False},
    )

    id: Mapped[int] = mapped_column(INTEGER, primary_key=True, autoincrement=True, nullable=True)
    # active_history: the old value is loaded before a change, so that the session counters
    # can move a message's share from its old session (see hermes_store.store).
    session_id: Mapped[str] = mapped_column(
        TEXT, ForeignKey("sessions.id"), nullable=False, active_history=True
    )
    role: Mapped[str] = mapped_column(TEXT, nullable=False)
    content: Mapped[str | None] = mapped_column(TEXT)
    tool_call_id: Mapped[str | None] = mapped_column(TEXT)
    tool_calls: Mapped[str | None] = mapped_column(TEXT, active_history=True)
    tool_name: Mapped[str | None] = mapped_column(TEXT)
    effect_disposition: Mapped[str | None] = mapped_column(TEXT)
    timestamp: Mapped[float] = mapped_column(REAL, nullable=False)
    token_count: Mapped[int | None] = mapped_column(INTEGER)
    finish_reason: Mapped[str | None] = mapped_column(TEXT)
    reasoning: Mapped[str | None] = mapped_column(TEXT)
    reasoning_content: Mapped[str | None] = mapped_column(TEXT)
    reasoning_details: Mapped[str | None] = mapped_column(TEXT)
    codex_reasoning_items: Mapped[str | None] = mapped_column(TEXT)
    codex_message_items: Mapped[str | None] = mapped_column(TEXT)
    platform_message_id: Mapped[str | None] = mapped_column(TEXT)
    observed: Mapped[int | None] = mapped_column(INTEGER, server_default=ZERO)
    active: Mapped[int] = mapped_column(
        INTEGER, nullable=False, server_default=text("1"), default=1
    )
    compacted: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO, default=0)
    # Application schema 24.
    _compressed_summary: Mapped[int] = mapped_column(
        "_compressed_summary", INTEGER, nullable=False, server_default=ZERO, default=0
    )
    api_content: Mapped[str | None] = mapped_column(TEXT)
    display_kind: Mapped[str | None] = mapped_column(TEXT)
    display_metadata: Mapped[str | None] = mapped_column(TEXT)
    # Application schema 30 (kept by the messages_display_* triggers).
    display_identity: Mapped[bytes | None] = mapped_column(BLOB)
    display_order: Mapped[int | None] = mapped_column(INTEGER)

    session: Mapped[AgentSession] = relationship(back_populates="messages")

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, session_id={self.session_id!r}, role={self.role!r})"


class StateMeta(Base):
    """Key/value bookkeeping of the application (`state_meta`)."""

    __tablename__ = "state_meta"

    key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    value: Mapped[str | None] = mapped_column(TEXT)

    def __repr__(self) -> str:
        return f"StateMeta(key={self.key!r})"


class CompressionLock(Base):
    """A lease on a session held while it is being compressed (`compression_locks`)."""

    __tablename__ = "compression_locks"
    __table_args__ = (Index("idx_compression_locks_expires", "expires_at"),)

    session_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    holder: Mapped[str] = mapped_column(TEXT, nullable=False)
    acquired_at: Mapped[float] = mapped_column(REAL, nullable=False)
    expires_at: Mapped[float] = mapped_column(REAL, nullable=False)

    def __repr__(self) -> str:
        return f"CompressionLock(session_id={self.session_id!r}, holder={self.holder!r})"


class GatewayRouting(Base):
    """Where a gateway routes a conversation key (`gateway_routing`, schema 19)."""

    __tablename__ = "gateway_routing"
    __table_args__ = (PrimaryKeyConstraint("scope", "session_key"),)

    scope: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=EMPTY, default="")
    session_key: Mapped[str] = mapped_column(TEXT, nullable=False)
    entry_json: Mapped[str] = mapped_column(TEXT, nullable=False)
    updated_at: Mapped[float] = mapped_column(REAL, nullable=False)

    def __repr__(self) -> str:
        return f"GatewayRouting(scope={self.scope!r}, session_key={self.session_key!r})"


class SessionModelUsage(Base):
    """Token and cost counters of one model inside one session (`session_model_usage`, 20)."""

    __tablename__ = "session_model_usage"
    __table_args__ = (
        PrimaryKeyConstraint(
            "session_id", "model", "billing_provider", "billing_base_url", "billing_mode", "task"
        ),
        Index("idx_session_model_usage_session", "session_id"),
        Index("idx_session_model_usage_model", "model"),
    )

    session_id: Mapped[str] = mapped_column(
        TEXT, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False
    )
    model: Mapped[str] = mapped_column(TEXT, nullable=False)
    billing_provider: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=EMPTY)
    billing_base_url: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=EMPTY)
    billing_mode: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=EMPTY)
    #: Application schema 22: usage is counted per task ('' is the main agent loop).
    task: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=EMPTY, default="")
    api_call_count: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)
    input_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)
    output_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)
    cache_read_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)
    cache_write_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)
    reasoning_tokens: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)
    estimated_cost_usd: Mapped[float] = mapped_column(REAL, nullable=False, server_default=ZERO)
    actual_cost_usd: Mapped[float] = mapped_column(REAL, nullable=False, server_default=ZERO)
    cost_status: Mapped[str | None] = mapped_column(TEXT)
    cost_source: Mapped[str | None] = mapped_column(TEXT)
    first_seen: Mapped[float | None] = mapped_column(REAL)
    last_seen: Mapped[float | None] = mapped_column(REAL)

    def __repr__(self) -> str:
        return f"SessionModelUsage(session_id={self.session_id!r}, model={self.model!r})"


class AsyncDelegation(Base):
    """A task delegated to another agent and its delivery state (`async_delegations`, 21)."""

    __tablename__ = "async_delegations"
    __table_args__ = (Index("idx_async_delegations_delivery", "delivery_state", "completed_at"),)

    delegation_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    origin_session: Mapped[str] = mapped_column(TEXT, nullable=False)
    origin_ui_session_id: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=EMPTY)
    parent_session_id: Mapped[str | None] = mapped_column(TEXT)
    state: Mapped[str] = mapped_column(TEXT, nullable=False)
    dispatched_at: Mapped[float] = mapped_column(REAL, nullable=False)
    completed_at: Mapped[float | None] = mapped_column(REAL)
    updated_at: Mapped[float] = mapped_column(REAL, nullable=False)
    event_json: Mapped[str | None] = mapped_column(TEXT)
    result_json: Mapped[str | None] = mapped_column(TEXT)
    delivery_state: Mapped[str] = mapped_column(
        TEXT, nullable=False, server_default=text("'pending'")
    )
    delivery_attempts: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)
    delivered_at: Mapped[float | None] = mapped_column(REAL)
    owner_pid: Mapped[int | None] = mapped_column(INTEGER)
    owner_started_at: Mapped[int | None] = mapped_column(INTEGER)
    task_json: Mapped[str | None] = mapped_column(TEXT)
    delivery_claim: Mapped[str | None] = mapped_column(TEXT)
    delivery_claimed_at: Mapped[float | None] = mapped_column(REAL)
    origin_session_id: Mapped[str] = mapped_column(
        TEXT, nullable=False, server_default=EMPTY, default=""
    )

    def __repr__(self) -> str:
        return f"AsyncDelegation(delegation_id={self.delegation_id!r}, state={self.state!r})"


class SystemPrompt(Base):
    """One distinct system prompt, keyed by the SHA-256 of its text (`system_prompts`, 25)."""

    __tablename__ = "system_prompts"

    hash: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    prompt: Mapped[str] = mapped_column(TEXT, nullable=False)

    def __repr__(self) -> str:
        return f"SystemPrompt(hash={self.hash!r})"


class GatewayHygieneState(Base):
    """Consecutive failures of one gateway conversation key (`gateway_hygiene_state`, 24)."""

    __tablename__ = "gateway_hygiene_state"

    session_key: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    failure_streak: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)

    def __repr__(self) -> str:
        return f"GatewayHygieneState(session_key={self.session_key!r})"


class ConversationGeneration(Base):
    """The generation counter of one conversation key (`conversation_generations`, 24)."""

    __tablename__ = "conversation_generations"
    __table_args__ = (PrimaryKeyConstraint("source", "session_key"),)

    source: Mapped[str] = mapped_column(TEXT, nullable=False)
    session_key: Mapped[str] = mapped_column(TEXT, nullable=False)
    generation: Mapped[int] = mapped_column(INTEGER, nullable=False, server_default=ZERO)

    def __repr__(self) -> str:
        return f"ConversationGeneration(source={self.source!r}, session_key={self.session_key!r})"


class GatewayHeartbeat(Base):
    """The liveness record of one gateway backend (`gateway_heartbeats`, 24)."""

    __tablename__ = "gateway_heartbeats"

    backend_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    pid: Mapped[int] = mapped_column(INTEGER, nullable=False)
    started_at: Mapped[float] = mapped_column(REAL, nullable=False)
    last_heartbeat: Mapped[float] = mapped_column(REAL, nullable=False)
    profile: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=EMPTY)
    host: Mapped[str] = mapped_column(TEXT, nullable=False, server_default=EMPTY)

    def __repr__(self) -> str:
        return f"GatewayHeartbeat(backend_id={self.backend_id!r}, pid={self.pid!r})"


class SessionTurnLease(Base):
    """A lease on one conversation's turn (`session_turn_leases`, 24)."""

    __tablename__ = "session_turn_leases"
    __table_args__ = (Index("idx_session_turn_leases_expires", "expires_at"),)

    conversation_id: Mapped[str] = mapped_column(TEXT, primary_key=True, nullable=True)
    holder: Mapped[str] = mapped_column(TEXT, nullable=False)
    acquired_at: Mapped[float] = mapped_column(REAL, nullable=False)
    expires_at: Mapped[float] = mapped_column(REAL, nullable=False)

    def __repr__(self) -> str:
        return f"SessionTurnLease(conversation_id={self.conversation_id!r})"


#: The application's schema number: exactly one row, equal to the application version
#: whose relational schema the store has (the search-layout revisions never change it).
#: Declared, not mapped: the legacy table has no primary key.
schema_version = Table(
    "schema_version",
    Base.metadata,
    Column("version", INTEGER, nullable=False),
)


def _partial_on_both() -> None:
    """Declare each partial index's WHERE once (``sqlite_where``); PostgreSQL gets the same."""
    for table in Base.metadata.tables.values():
        for index in table.indexes:
            where = index.dialect_options["sqlite"]["where"]
            if where is not None:
                index.dialect_options["postgresql"]["where"] = where


_partial_on_both()


def expression_indexes() -> list[Index]:
    """The models' indexes with a DESC column or an expression. SQLite does not reflect
    them, so autogenerate cannot compare them: ``alembic/env.py`` leaves them out, and
    ``tests/test_migrations.py`` compares their DDL with what the revisions create."""
    return [
        index
        for table in Base.metadata.sorted_tables
        for index in table.indexes
        if any(not isinstance(expression, Column) for expression in index.expressions)
    ]

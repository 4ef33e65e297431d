"""Create the legacy schema 17: sessions, messages, bookkeeping tables and inline FTS5 search.

This is the oldest schema hermes-store adopts. It includes the "drift set" (three
compression columns on sessions, messages.effect_disposition, idx_messages_active_null,
idx_sessions_handoff_state) that later legacy builds added without bumping the version,
so every store stamped 17 here has the full column set. Both FTS5 indexes are created
in the legacy INLINE layout with their six triggers when this SQLite has FTS5 (the
trigram index only when it has the trigram tokenizer); without FTS5 the store works
and search returns nothing, as in the legacy application.

On PostgreSQL the same tables and indexes are created with its types for the same values
(BIGINT, DOUBLE PRECISION, an identity key for messages); there is no FTS5 there, and its
search indexes come with the fts1 revision.

Downgrade drops every table: it is only meaningful on an empty store, and loses all data.

Revision ID: 17
Revises:
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op

revision: str = "17"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("alembic.runtime.migration")

SCHEMA_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"

SESSIONS_TABLE = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    cwd TEXT,
    git_branch TEXT,
    git_repo_root TEXT,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    title TEXT,
    api_call_count INTEGER DEFAULT 0,
    handoff_state TEXT,
    handoff_platform TEXT,
    handoff_error TEXT,
    compression_failure_cooldown_until REAL,
    compression_failure_error TEXT,
    compression_fallback_streak INTEGER NOT NULL DEFAULT 0,
    rewind_count INTEGER NOT NULL DEFAULT 0,
    archived INTEGER NOT NULL DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
)
"""

MESSAGES_TABLE = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    effect_disposition TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT,
    reasoning_content TEXT,
    reasoning_details TEXT,
    codex_reasoning_items TEXT,
    codex_message_items TEXT,
    platform_message_id TEXT,
    observed INTEGER DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1,
    compacted INTEGER NOT NULL DEFAULT 0
)
"""

STATE_META_TABLE = "CREATE TABLE IF NOT EXISTS state_meta (key TEXT PRIMARY KEY, value TEXT)"

COMPRESSION_LOCKS_TABLE = """
CREATE TABLE IF NOT EXISTS compression_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
)
"""

INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_source_id ON sessions(source, id)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_session_key ON sessions(session_key, started_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_gateway_peer"
    " ON sessions(source, user_id, chat_id, chat_type, thread_id, started_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_handoff_state ON sessions(handoff_state, started_at)",
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique ON sessions(title)"
    " WHERE title IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp)",
    "CREATE INDEX IF NOT EXISTS idx_messages_session_active"
    " ON messages(session_id, active, timestamp)",
    "CREATE INDEX IF NOT EXISTS idx_messages_active_null ON messages(active) WHERE active IS NULL",
    "CREATE INDEX IF NOT EXISTS idx_messages_platform_msg_id"
    " ON messages(session_id, platform_message_id) WHERE platform_message_id IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS idx_compression_locks_expires ON compression_locks(expires_at)",
)

MESSAGES_FTS_TABLE = "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(content)"
MESSAGES_FTS_TRIGRAM_TABLE = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram"
    " USING fts5(content, tokenize='trigram')"
)

MESSAGES_FTS_INSERT_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
MESSAGES_FTS_DELETE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
END
"""
MESSAGES_FTS_UPDATE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
MESSAGES_FTS_TRIGRAM_INSERT_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
MESSAGES_FTS_TRIGRAM_DELETE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
END
"""
MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""

TABLES = ("compression_locks", "state_meta", "messages", "sessions", "schema_version")

#: How PostgreSQL declares the messages key SQLite declares INTEGER PRIMARY KEY AUTOINCREMENT.
POSTGRESQL_MESSAGES_KEY = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"


def _postgresql(ddl: str) -> str:
    """This SQLite DDL as PostgreSQL declares the same values: SQLite's INTEGER is 64-bit and
    its REAL an 8-byte float (BIGINT and DOUBLE PRECISION; PostgreSQL's REAL is 4 bytes)."""
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", ddl)


def _try_execute(statement: str) -> str | None:
    """Run one statement inside a SAVEPOINT; return SQLite's refusal instead of raising.

    Offline (`--sql`) the statement is emitted as is: the SQL is for a SQLite with FTS5 and
    the trigram tokenizer (3.34 and newer).
    """
    if context.is_offline_mode():
        op.execute(statement)
        return None
    bind = op.get_bind()
    try:
        with bind.begin_nested():
            bind.exec_driver_sql(statement)
    except sa.exc.OperationalError as exc:
        message = str(exc.orig)
        if "no such module" in message or "no such tokenizer" in message:
            return message
        raise
    return None


def _upgrade_postgresql() -> None:
    messages = MESSAGES_TABLE.replace("INTEGER PRIMARY KEY AUTOINCREMENT", POSTGRESQL_MESSAGES_KEY)
    for ddl in (SCHEMA_VERSION_TABLE, SESSIONS_TABLE, messages, STATE_META_TABLE):
        op.execute(_postgresql(ddl))
    op.execute(_postgresql(COMPRESSION_LOCKS_TABLE))
    for ddl in INDEXES:
        op.execute(ddl)
    op.execute("DELETE FROM schema_version")
    op.execute("INSERT INTO schema_version (version) VALUES (17)")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _upgrade_postgresql()
        return
    for ddl in (SCHEMA_VERSION_TABLE, SESSIONS_TABLE, MESSAGES_TABLE, STATE_META_TABLE):
        op.execute(ddl)
    op.execute(COMPRESSION_LOCKS_TABLE)
    for ddl in INDEXES:
        op.execute(ddl)

    refused = _try_execute(MESSAGES_FTS_TABLE)
    if refused:
        log.warning("SQLite has no FTS5 (%s): search will return nothing until it has", refused)
    else:
        for ddl in (MESSAGES_FTS_INSERT_TRIGGER, MESSAGES_FTS_DELETE_TRIGGER):
            op.execute(ddl)
        op.execute(MESSAGES_FTS_UPDATE_TRIGGER)
        refused = _try_execute(MESSAGES_FTS_TRIGRAM_TABLE)
        if refused:
            log.warning("SQLite has no trigram tokenizer (%s): CJK search uses LIKE", refused)
        else:
            op.execute(MESSAGES_FTS_TRIGRAM_INSERT_TRIGGER)
            op.execute(MESSAGES_FTS_TRIGRAM_DELETE_TRIGGER)
            op.execute(MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER)

    op.execute("DELETE FROM schema_version")
    op.execute("INSERT INTO schema_version (version) VALUES (17)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"DROP TABLE IF EXISTS {table}")
        return
    for trigger in (
        "messages_fts_insert",
        "messages_fts_delete",
        "messages_fts_update",
        "messages_fts_trigram_insert",
        "messages_fts_trigram_delete",
        "messages_fts_trigram_update",
    ):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    op.execute("DROP TABLE IF EXISTS messages_fts_trigram")
    op.execute("DROP TABLE IF EXISTS messages_fts")
    for table in TABLES:
        op.execute(f"DROP TABLE IF EXISTS {table}")

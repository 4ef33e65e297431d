"""Add the columns and tables the application brought in by declaration after schema 21.

Application schema 24. The application adds columns on every open from its declared
schema, whatever the version, and bumped 24, 26, 27 and 28 without a data step. Its
public history has no snapshot between 21 and 28, so which of those bumps brought which
column cannot be told; hermes-store gives all of them to 24, the first. They are:
sessions' activity, profile, pin/hide and tool-name columns; messages' compressed-summary
flag, API content and display columns; the gateway hygiene, conversation generation,
gateway heartbeat and turn lease tables; two message indexes. Each is added only when
missing (a store may already have it from a newer application build).

Downgrade drops them: values written in these columns and tables are lost.

Revision ID: 24
Revises: 23
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "24"
down_revision: str | None = "23"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Why this revision cannot be written out as SQL by `--sql` (offline mode).
OFFLINE_REFUSAL = "it adds only the columns each table of the store lacks, which it reads"

NEW_COLUMNS = {
    "sessions": {
        "git_metadata_generation": "INTEGER NOT NULL DEFAULT 0",
        "title_source": "TEXT",
        "last_activity_at": "REAL",
        "last_activity_description": "TEXT",
        "last_activity_provenance": "TEXT",
        "compression_ineffective_count": "INTEGER NOT NULL DEFAULT 0",
        "compression_recovery_deadline": "REAL",
        "profile_name": "TEXT",
        "pinned": "INTEGER NOT NULL DEFAULT 0",
        "hidden": "INTEGER NOT NULL DEFAULT 0",
        "last_read_at": "REAL",
        "tool_names": "TEXT",
    },
    "messages": {
        "_compressed_summary": "INTEGER NOT NULL DEFAULT 0",
        "api_content": "TEXT",
        "display_kind": "TEXT",
        "display_metadata": "TEXT",
    },
}

GATEWAY_HYGIENE_STATE_TABLE = """
CREATE TABLE IF NOT EXISTS gateway_hygiene_state (
    session_key TEXT PRIMARY KEY,
    failure_streak INTEGER NOT NULL DEFAULT 0
)
"""
CONVERSATION_GENERATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS conversation_generations (
    source TEXT NOT NULL,
    session_key TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (source, session_key)
)
"""
GATEWAY_HEARTBEATS_TABLE = """
CREATE TABLE IF NOT EXISTS gateway_heartbeats (
    backend_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    profile TEXT NOT NULL DEFAULT '',
    host TEXT NOT NULL DEFAULT ''
)
"""
SESSION_TURN_LEASES_TABLE = """
CREATE TABLE IF NOT EXISTS session_turn_leases (
    conversation_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
)
"""
NEW_TABLES = {
    "gateway_hygiene_state": GATEWAY_HYGIENE_STATE_TABLE,
    "conversation_generations": CONVERSATION_GENERATIONS_TABLE,
    "gateway_heartbeats": GATEWAY_HEARTBEATS_TABLE,
    "session_turn_leases": SESSION_TURN_LEASES_TABLE,
}
NEW_INDEXES = {
    "idx_session_turn_leases_expires": (
        "CREATE INDEX IF NOT EXISTS idx_session_turn_leases_expires"
        " ON session_turn_leases(expires_at)"
    ),
    "idx_messages_session_id": (
        "CREATE INDEX IF NOT EXISTS idx_messages_session_id ON messages(session_id, id)"
    ),
    "idx_messages_assistant_calls_by_session": (
        "CREATE INDEX IF NOT EXISTS idx_messages_assistant_calls_by_session ON messages(session_id)"
        " WHERE role = 'assistant' AND tool_calls IS NOT NULL"
    ),
}


def _columns(table: str) -> set[str]:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        return {column["name"] for column in sa.inspect(bind).get_columns(table)}
    return {row[1] for row in bind.exec_driver_sql(f"PRAGMA table_info({table})")}


def _postgresql(ddl: str) -> str:
    """This SQLite DDL as PostgreSQL declares the same values: SQLite's INTEGER is 64-bit and
    its REAL an 8-byte float (BIGINT and DOUBLE PRECISION; PostgreSQL's REAL is 4 bytes)."""
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", ddl)


def _declared(ddl: str) -> str:
    return _postgresql(ddl) if op.get_bind().dialect.name == "postgresql" else ddl


def upgrade() -> None:
    for table, columns in NEW_COLUMNS.items():
        existing = _columns(table)
        for name, declaration in columns.items():
            if name not in existing:
                op.execute(_declared(f'ALTER TABLE {table} ADD COLUMN "{name}" {declaration}'))
    for ddl in (*NEW_TABLES.values(), *NEW_INDEXES.values()):
        op.execute(_declared(ddl))
    op.execute("UPDATE schema_version SET version = 24")


def downgrade() -> None:
    for index in NEW_INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {index}")
    for table in NEW_TABLES:
        op.execute(f"DROP TABLE IF EXISTS {table}")
    for table, columns in NEW_COLUMNS.items():
        existing = _columns(table)
        for name in reversed(columns):
            if name in existing:
                op.execute(f'ALTER TABLE {table} DROP COLUMN "{name}"')
    op.execute("UPDATE schema_version SET version = 23")

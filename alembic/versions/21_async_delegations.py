"""Create async_delegations, the ledger of tasks handed to other agents.

Legacy schema 21; no data migration. Downgrade drops the table: pending and delivered
delegations recorded in it are lost.

Revision ID: 21
Revises: 20
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from alembic import op

revision: str = "21"
down_revision: str | None = "20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ASYNC_DELEGATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS async_delegations (
    delegation_id TEXT PRIMARY KEY,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '',
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at REAL NOT NULL,
    completed_at REAL,
    updated_at REAL NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at REAL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at REAL
)
"""
ASYNC_DELEGATIONS_DELIVERY_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_async_delegations_delivery"
    " ON async_delegations(delivery_state, completed_at)"
)


def _postgresql(ddl: str) -> str:
    """This SQLite DDL as PostgreSQL declares the same values: SQLite's INTEGER is 64-bit and
    its REAL an 8-byte float (BIGINT and DOUBLE PRECISION; PostgreSQL's REAL is 4 bytes)."""
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", ddl)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_postgresql(ASYNC_DELEGATIONS_TABLE))
    else:
        op.execute(ASYNC_DELEGATIONS_TABLE)
    op.execute(ASYNC_DELEGATIONS_DELIVERY_INDEX)
    op.execute("UPDATE schema_version SET version = 21")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS async_delegations")
    op.execute("UPDATE schema_version SET version = 20")

"""Create session_model_usage and seed it with one row per session that used tokens.

Legacy schema 20. Each existing session whose token counters sum above zero gets one
usage row for its model (`unknown` when NULL) and billing route, with its counters,
costs and first/last seen times; INSERT OR IGNORE keeps the seed idempotent.

Downgrade drops the table: per-model usage recorded after this step is lost (the
per-session totals on `sessions` remain).

Revision ID: 20
Revises: 19
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from alembic import op

revision: str = "20"
down_revision: str | None = "19"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SESSION_MODEL_USAGE_TABLE = """
CREATE TABLE IF NOT EXISTS session_model_usage (
    session_id TEXT NOT NULL,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    api_call_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0,
    actual_cost_usd REAL NOT NULL DEFAULT 0,
    cost_status TEXT,
    cost_source TEXT,
    first_seen REAL,
    last_seen REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode),
    FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE
)
"""
SESSION_MODEL_USAGE_SESSION_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_session_model_usage_session ON session_model_usage(session_id)"
)
SESSION_MODEL_USAGE_MODEL_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_session_model_usage_model ON session_model_usage(model)"
)

SEED_USAGE = """
INSERT OR IGNORE INTO session_model_usage (
    session_id, model, billing_provider, billing_base_url, billing_mode,
    api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    reasoning_tokens, estimated_cost_usd, actual_cost_usd, cost_status, cost_source,
    first_seen, last_seen
)
SELECT
    id, COALESCE(model, 'unknown'), COALESCE(billing_provider, ''),
    COALESCE(billing_base_url, ''), COALESCE(billing_mode, ''),
    COALESCE(api_call_count, 0), COALESCE(input_tokens, 0), COALESCE(output_tokens, 0),
    COALESCE(cache_read_tokens, 0), COALESCE(cache_write_tokens, 0),
    COALESCE(reasoning_tokens, 0), COALESCE(estimated_cost_usd, 0),
    COALESCE(actual_cost_usd, 0), cost_status, cost_source,
    started_at, COALESCE(ended_at, started_at)
FROM sessions
WHERE COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) + COALESCE(cache_read_tokens, 0)
    + COALESCE(cache_write_tokens, 0) + COALESCE(reasoning_tokens, 0) > 0
"""


def _postgresql(ddl: str) -> str:
    """This SQLite DDL as PostgreSQL declares the same values: SQLite's INTEGER is 64-bit and
    its REAL an 8-byte float (BIGINT and DOUBLE PRECISION; PostgreSQL's REAL is 4 bytes)."""
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", ddl)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_postgresql(SESSION_MODEL_USAGE_TABLE))
        op.execute(SESSION_MODEL_USAGE_SESSION_INDEX)
        op.execute(SESSION_MODEL_USAGE_MODEL_INDEX)
        op.execute(SEED_USAGE.replace("INSERT OR IGNORE", "INSERT") + "ON CONFLICT DO NOTHING")
        op.execute("UPDATE schema_version SET version = 20")
        return
    op.execute(SESSION_MODEL_USAGE_TABLE)
    op.execute(SESSION_MODEL_USAGE_SESSION_INDEX)
    op.execute(SESSION_MODEL_USAGE_MODEL_INDEX)
    op.execute(SEED_USAGE)
    op.execute("UPDATE schema_version SET version = 20")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS session_model_usage")
    op.execute("UPDATE schema_version SET version = 19")

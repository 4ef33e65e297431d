"""Put `task` into the key of session_model_usage, so usage is counted per task.

Application schema 22. The application records token usage per (session, model, billing
route, task): the main loop ('') apart from vision, compression or title generation. The
table is rebuilt with `task TEXT NOT NULL DEFAULT ''` after `billing_mode` and the key
extended by it; every existing row keeps its values with task ''. A table that already
has `task` in its key (the application's own on-open repair got there first) is left as
it is.

Downgrade rebuilds the five-column key: rows that differ only by task are summed into
one (their counters and costs added, first/last seen widened), so per-task detail is lost.

Revision ID: 22
Revises: 21
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "22"
down_revision: str | None = "21"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Why this revision cannot be written out as SQL by `--sql` (offline mode).
OFFLINE_REFUSAL = "it reads the columns of session_model_usage to decide how to rebuild it"

SESSION_MODEL_USAGE_TABLE = """
CREATE TABLE session_model_usage (
    session_id TEXT NOT NULL,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
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
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task),
    FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE
)
"""
COPY_ROWS = """
INSERT INTO session_model_usage (
    session_id, model, billing_provider, billing_base_url, billing_mode, task,
    api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    reasoning_tokens, estimated_cost_usd, actual_cost_usd, cost_status, cost_source,
    first_seen, last_seen
)
SELECT
    session_id, model, billing_provider, billing_base_url, billing_mode, {task},
    api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    reasoning_tokens, estimated_cost_usd, actual_cost_usd, cost_status, cost_source,
    first_seen, last_seen
FROM session_model_usage_before_22
"""
SESSION_MODEL_USAGE_SESSION_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_session_model_usage_session ON session_model_usage(session_id)"
)
SESSION_MODEL_USAGE_MODEL_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_session_model_usage_model ON session_model_usage(model)"
)

# The schema-21 table, repeated for the downgrade (revisions are frozen).
SESSION_MODEL_USAGE_TABLE_21 = """
CREATE TABLE session_model_usage (
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
MERGE_TASKS = """
INSERT INTO session_model_usage (
    session_id, model, billing_provider, billing_base_url, billing_mode,
    api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    reasoning_tokens, estimated_cost_usd, actual_cost_usd, cost_status, cost_source,
    first_seen, last_seen
)
SELECT
    session_id, model, billing_provider, billing_base_url, billing_mode,
    sum(api_call_count), sum(input_tokens), sum(output_tokens), sum(cache_read_tokens),
    sum(cache_write_tokens), sum(reasoning_tokens), sum(estimated_cost_usd),
    sum(actual_cost_usd), max(cost_status), max(cost_source), min(first_seen), max(last_seen)
FROM session_model_usage_before_22
GROUP BY session_id, model, billing_provider, billing_base_url, billing_mode
"""


def _key_columns() -> set[str]:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        key = sa.inspect(bind).get_pk_constraint("session_model_usage")
        return set(key["constrained_columns"])
    rows = bind.exec_driver_sql("PRAGMA table_info(session_model_usage)")
    return {row[1] for row in rows if row[5]}


def _all_columns() -> set[str]:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        return {column["name"] for column in sa.inspect(bind).get_columns("session_model_usage")}
    rows = bind.exec_driver_sql("PRAGMA table_info(session_model_usage)")
    return {row[1] for row in rows}


#: PostgreSQL names a table's key, foreign key and indexes apart from the table: renamed
#: with it, so that the rebuilt table can take the names back.
POSTGRESQL_NAMES = (
    "ALTER TABLE session_model_usage_before_22"
    " RENAME CONSTRAINT session_model_usage_pkey TO session_model_usage_before_22_pkey",
    "ALTER TABLE session_model_usage_before_22 RENAME CONSTRAINT"
    " session_model_usage_session_id_fkey TO session_model_usage_before_22_session_id_fkey",
    "ALTER INDEX idx_session_model_usage_session RENAME TO idx_session_model_usage_session_22",
    "ALTER INDEX idx_session_model_usage_model RENAME TO idx_session_model_usage_model_22",
)


def _set_aside() -> None:
    """Rename the table (and, on PostgreSQL, what is named apart from it) to rebuild it."""
    op.execute("ALTER TABLE session_model_usage RENAME TO session_model_usage_before_22")
    if op.get_bind().dialect.name == "postgresql":
        for ddl in POSTGRESQL_NAMES:
            op.execute(ddl)


def _declared(ddl: str) -> str:
    """PostgreSQL: SQLite's INTEGER is 64-bit and its REAL an 8-byte float."""
    if op.get_bind().dialect.name != "postgresql":
        return ddl
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", re.sub(r"\bINTEGER\b", "BIGINT", ddl))


def upgrade() -> None:
    if "task" not in _key_columns():
        # `task` may exist outside the key: the application's reconciler adds the column.
        task = "COALESCE(task, '')" if "task" in _all_columns() else "''"
        _set_aside()
        op.execute(_declared(SESSION_MODEL_USAGE_TABLE))
        op.execute(COPY_ROWS.format(task=task))
        op.execute("DROP TABLE session_model_usage_before_22")
        op.execute(SESSION_MODEL_USAGE_SESSION_INDEX)
        op.execute(SESSION_MODEL_USAGE_MODEL_INDEX)
    op.execute("UPDATE schema_version SET version = 22")


def downgrade() -> None:
    _set_aside()
    op.execute(_declared(SESSION_MODEL_USAGE_TABLE_21))
    op.execute(MERGE_TASKS)
    op.execute("DROP TABLE session_model_usage_before_22")
    op.execute(SESSION_MODEL_USAGE_SESSION_INDEX)
    op.execute(SESSION_MODEL_USAGE_MODEL_INDEX)
    op.execute("UPDATE schema_version SET version = 21")

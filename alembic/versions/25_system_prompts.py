"""Store each distinct system prompt once, in system_prompts, keyed by its SHA-256.

Application schema 25. Sessions of one agent repeat the same long system prompt; the
application moved the text into `system_prompts(hash, prompt)` and points each session
at it through `sessions.system_prompt_hash`. For every session with an inline prompt,
the prompt is stored under the SHA-256 (hex) of its UTF-8 text (identical prompts share
one row), the session's hash set and its inline `system_prompt` cleared. The column stays:
the application still reads it as a fallback. `system_prompt_hash` carries no foreign key,
as on every store the application's own column reconciler upgraded.

Downgrade writes each session's prompt back inline, then drops the table, the column and
its index: nothing is lost.

Revision ID: 25
Revises: 24
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "25"
down_revision: str | None = "24"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Why this revision cannot be written out as SQL by `--sql` (offline mode).
OFFLINE_REFUSAL = (
    "it moves each session's system prompt into system_prompts with a hash computed in Python"
)

SYSTEM_PROMPTS_TABLE = """
CREATE TABLE IF NOT EXISTS system_prompts (
    hash TEXT PRIMARY KEY,
    prompt TEXT NOT NULL
)
"""
SYSTEM_PROMPT_HASH_COLUMN = 'ALTER TABLE sessions ADD COLUMN "system_prompt_hash" TEXT'
SYSTEM_PROMPT_HASH_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_system_prompt_hash ON sessions(system_prompt_hash)"
)
STORE_PROMPT = sa.text(
    "INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (:hash, :prompt)"
)
STORE_PROMPT_POSTGRESQL = sa.text(
    "INSERT INTO system_prompts (hash, prompt) VALUES (:hash, :prompt) ON CONFLICT DO NOTHING"
)
POINT_SESSION = sa.text(
    "UPDATE sessions SET system_prompt_hash = :hash, system_prompt = NULL WHERE id = :id"
)
PROMPTS_BACK_INLINE = """
UPDATE sessions SET system_prompt = (
    SELECT prompt FROM system_prompts WHERE system_prompts.hash = sessions.system_prompt_hash
)
WHERE system_prompt IS NULL AND system_prompt_hash IS NOT NULL
"""
BATCH = 500


def _columns(table: str) -> set[str]:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        return {column["name"] for column in sa.inspect(bind).get_columns(table)}
    return {row[1] for row in bind.exec_driver_sql(f"PRAGMA table_info({table})")}


def upgrade() -> None:
    bind = op.get_bind()
    postgresql = bind.dialect.name == "postgresql"
    op.execute(SYSTEM_PROMPTS_TABLE)
    if "system_prompt_hash" not in _columns("sessions"):
        op.execute(SYSTEM_PROMPT_HASH_COLUMN)
    op.execute(SYSTEM_PROMPT_HASH_INDEX)
    rows = bind.exec_driver_sql(
        "SELECT id, system_prompt FROM sessions WHERE system_prompt IS NOT NULL"
    ).all()
    for start in range(0, len(rows), BATCH):
        prompts, pointers = [], []
        for session_id, prompt in rows[start : start + BATCH]:
            digest = hashlib.sha256(str(prompt).encode("utf-8")).hexdigest()
            prompts.append({"hash": digest, "prompt": prompt})
            pointers.append({"hash": digest, "id": session_id})
        bind.execute(STORE_PROMPT_POSTGRESQL if postgresql else STORE_PROMPT, prompts)
        bind.execute(POINT_SESSION, pointers)
    op.execute("UPDATE schema_version SET version = 25")


def downgrade() -> None:
    op.execute(PROMPTS_BACK_INLINE)
    op.execute("DROP INDEX IF EXISTS idx_sessions_system_prompt_hash")
    op.execute('ALTER TABLE sessions DROP COLUMN "system_prompt_hash"')
    op.execute("DROP TABLE IF EXISTS system_prompts")
    op.execute("UPDATE schema_version SET version = 24")

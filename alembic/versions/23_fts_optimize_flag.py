"""Flag a store whose search indexes still copy every message, as the application does.

Application schema 23. The application redesigned its full-text search (text stored
once, in its own layout) but converts an existing store only when its owner asks: at 23
it records `state_meta('fts_optimize_available', '1')` on a store whose word index is
still the legacy inline one, and changes nothing else. This step does the same. A store
whose indexes hermes-store already moved to external content is not flagged: its text is
already stored once, and the application's optimize-storage would only rebuild it.

Downgrade removes the flag.

Revision ID: 23
Revises: 22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "23"
down_revision: str | None = "22"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Why this revision cannot be written out as SQL by `--sql` (offline mode).
OFFLINE_REFUSAL = "it reads the word index's declaration to decide whether to set the flag"

FLAG = "fts_optimize_available"


def _word_index_is_inline() -> bool:
    """The legacy inline word index: declared without `content=`, keeping a `_content` copy.

    PostgreSQL has no FTS5 index, so no flag to set.
    """
    if op.get_bind().dialect.name == "postgresql":
        return False
    row = (
        op.get_bind()
        .execute(
            sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages_fts'")
        )
        .first()
    )
    if row is None or row[0] is None:
        return False
    declaration = str(row[0]).replace(" ", "").lower()
    return "content=" not in declaration and "tool_name" not in declaration


def upgrade() -> None:
    if _word_index_is_inline():
        op.get_bind().execute(
            sa.text("INSERT OR REPLACE INTO state_meta (key, value) VALUES (:key, '1')"),
            {"key": FLAG},
        )
    op.execute("UPDATE schema_version SET version = 23")


def downgrade() -> None:
    op.get_bind().execute(sa.text("DELETE FROM state_meta WHERE key = :key"), {"key": FLAG})
    op.execute("UPDATE schema_version SET version = 22")

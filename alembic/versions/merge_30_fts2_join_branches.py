"""Join the application's schema chain and the search layout's revision fts2 into one head.

Revision fts2 (stored words on PostgreSQL) follows fts1 on the search-layout branch, which
the application's versions do not depend on; this revision changes nothing and gives
`alembic upgrade head` one head again: the newest schema and the newest layout.

Revision ID: merge_30_fts2
Revises: merge_30_fts1, fts2
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "merge_30_fts2"
down_revision: str | Sequence[str] | None = ("merge_30_fts1", "fts2")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing to do: both parents did the work."""


def downgrade() -> None:
    """Nothing to undo."""

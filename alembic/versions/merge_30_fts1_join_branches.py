"""Join the application's schema chain and the search-layout branch into one head.

The relational schema follows the application's versions (17 .. 30) and the search
layout has its own branch (fts1 ..., from 17), so that the layout can move to external
content without moving the relational schema past the application the operator runs
(`--app-version`). This revision changes nothing: it only gives `alembic upgrade head`,
the deploy step, one head that means "the newest schema and the newest layout".

Revision ID: merge_30_fts1
Revises: 30, fts1
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "merge_30_fts1"
down_revision: str | Sequence[str] | None = ("30", "fts1")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing to do: both parents did the work."""


def downgrade() -> None:
    """Nothing to undo."""

"""Record application schema 29; it changes no table and no data.

Application schema 29. The application's 29 narrowed which messages its own trigram
index covers (cron sessions left out); its current code runs that change together with
30's, as one step, and so does hermes-store (see revision 30). This step only records the
number.

Downgrade records 28 again.

Revision ID: 29
Revises: 28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "29"
down_revision: str | None = "28"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("UPDATE schema_version SET version = 29")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 28")

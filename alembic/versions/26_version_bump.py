"""Record application schema 26; it changes no table and no data.

Application schema 26. The application bumped 26 for columns it adds by declaration on
every open, without a data step; hermes-store gives those columns to 24 (see that
revision), so this step only records the number, keeping `schema_version` equal to what
the store has.

Downgrade records 25 again.

Revision ID: 26
Revises: 25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "26"
down_revision: str | None = "25"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("UPDATE schema_version SET version = 26")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 25")

"""Record application schema 28; it changes no table and no data.

Application schema 28. The application bumped 28 for columns it adds by declaration on
every open, without a data step; hermes-store gives those columns to 24 (see that
revision), so this step only records the number, keeping `schema_version` equal to what
the store has.

Downgrade records 27 again.

Revision ID: 28
Revises: 27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "28"
down_revision: str | None = "27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("UPDATE schema_version SET version = 28")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 27")

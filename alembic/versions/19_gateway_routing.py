"""Create gateway_routing, where gateways record how a conversation key is routed.

Legacy schema 19; no data migration. Downgrade drops the table and the routes in it
(gateways rebuild their routes as conversations arrive).

Revision ID: 19
Revises: 18
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "19"
down_revision: str | None = "18"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GATEWAY_ROUTING_TABLE = """
CREATE TABLE IF NOT EXISTS gateway_routing (
    scope TEXT NOT NULL DEFAULT '',
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, session_key)
)
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite's REAL is an 8-byte float
        op.execute(GATEWAY_ROUTING_TABLE.replace("REAL", "DOUBLE PRECISION"))
    else:
        op.execute(GATEWAY_ROUTING_TABLE)
    op.execute("UPDATE schema_version SET version = 19")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS gateway_routing")
    op.execute("UPDATE schema_version SET version = 18")

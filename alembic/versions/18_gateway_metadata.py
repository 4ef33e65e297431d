"""Add gateway metadata to sessions and backfill it from the gateway's sessions.json.

Legacy schema 18. `sessions` gains `display_name`, `origin_json` and `expiry_finalized`;
then, best effort, every session listed in `<HERMES_HOME>/sessions/sessions.json` gets
its NULL gateway columns filled from its entry (existing values are never overwritten)
and `expiry_finalized` set when the entry says the session's memory was flushed or its
expiry finalised. A missing, unreadable or malformed file is logged and skipped: it never
fails the migration. HERMES_HOME comes from `-x hermes_home=DIR`, else $HERMES_HOME,
else ~/.hermes.

Downgrade drops the three columns: the backfilled display names, origins and expiry
flags are lost (the NULL columns filled from sessions.json are kept, since they existed
before this step and cannot be told apart from values the application wrote).

Revision ID: 18
Revises: 17
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from alembic import context, op

revision: str = "18"
down_revision: str | None = "17"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Why this revision cannot be written out as SQL by `--sql` (offline mode).
OFFLINE_REFUSAL = (
    "it reads the gateway's sessions.json and the store's columns to backfill the gateway metadata"
)

log = logging.getLogger("alembic.runtime.migration")

#: Added only when missing: a legacy build adds its columns on every open but bumps the
#: version only when its FTS work succeeds, so a store stamped 17 may already have them.
NEW_COLUMNS = {
    "display_name": "ALTER TABLE sessions ADD COLUMN display_name TEXT",
    "origin_json": "ALTER TABLE sessions ADD COLUMN origin_json TEXT",
    "expiry_finalized": "ALTER TABLE sessions ADD COLUMN expiry_finalized INTEGER DEFAULT 0",
}

BACKFILL_UPDATE = sa.text(
    """
    UPDATE sessions SET
        session_key = COALESCE(session_key, :session_key),
        chat_id = COALESCE(chat_id, :chat_id),
        thread_id = COALESCE(thread_id, :thread_id),
        chat_type = COALESCE(chat_type, :chat_type),
        display_name = COALESCE(display_name, :display_name),
        origin_json = COALESCE(origin_json, :origin_json),
        expiry_finalized = CASE
            WHEN :finalized AND COALESCE(expiry_finalized, 0) = 0 THEN 1
            ELSE expiry_finalized
        END
    WHERE id = :session_id
    """
)


def _hermes_home() -> Path:
    x_home = context.get_x_argument(as_dictionary=True).get("hermes_home")
    return Path(x_home or os.environ.get("HERMES_HOME") or "~/.hermes").expanduser()


def _text(value: Any) -> str | None:
    """A JSON scalar as the TEXT the column stores; anything else is not backfilled."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int, float)):
        return str(value)
    return None


def _load_index(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        log.info("gateway backfill skipped: %s does not exist", path)
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("gateway backfill skipped: %s is unreadable or malformed (%s)", path, exc)
        return None
    if not isinstance(data, dict):
        log.warning("gateway backfill skipped: %s is not a JSON object", path)
        return None
    return data


def _backfill(path: Path) -> int:
    data = _load_index(path)
    if data is None:
        return 0
    bind = op.get_bind()
    updated = 0
    for key, entry in data.items():
        if key.startswith("_") or not isinstance(entry, dict):
            continue
        session_id = _text(entry.get("session_id"))
        if session_id is None:
            continue
        origin = entry.get("origin")
        origin = origin if isinstance(origin, dict) else None
        params = {
            "session_id": session_id,
            "session_key": _text(entry.get("session_key")) or key,
            "chat_id": _text(origin.get("chat_id")) if origin else None,
            "thread_id": _text(origin.get("thread_id")) if origin else None,
            "chat_type": _text(entry.get("chat_type")),
            "display_name": _text(entry.get("display_name")),
            "origin_json": json.dumps(origin) if origin is not None else None,
            "finalized": bool(entry.get("expiry_finalized") or entry.get("memory_flushed")),
        }
        updated += bind.execute(BACKFILL_UPDATE, params).rowcount or 0
    return updated


def _columns(table: str) -> set[str]:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        return {column["name"] for column in sa.inspect(bind).get_columns(table)}
    return {row[1] for row in bind.exec_driver_sql(f"PRAGMA table_info({table})")}


def upgrade() -> None:
    existing = _columns("sessions")
    postgresql = op.get_bind().dialect.name == "postgresql"
    for column, ddl in NEW_COLUMNS.items():
        if column not in existing:
            # PostgreSQL: SQLite's INTEGER is 64-bit.
            op.execute(ddl.replace("INTEGER", "BIGINT") if postgresql else ddl)
    path = _hermes_home() / "sessions" / "sessions.json"
    updated = _backfill(path)
    if updated:
        log.info("gateway backfill: %d session(s) updated from %s", updated, path)
    op.execute("UPDATE schema_version SET version = 18")


def downgrade() -> None:
    for column in ("expiry_finalized", "origin_json", "display_name"):
        op.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
    op.execute("UPDATE schema_version SET version = 17")

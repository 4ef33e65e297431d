"""Index sessions by activity, order messages for display, narrow the app's trigram coverage.

Application schema 30 (with 29, which its current code runs in the same step):
- `idx_sessions_effective_activity`, sessions by last activity (else start), newest first;
- what the newest application build at 30 declares beyond the older 30 builds, added only
  when missing: `sessions.created_source`, `compression_overload_streak`,
  `transport_profile`; `messages.display_identity`, `display_order`;
  `async_delegations.origin_session_id`; the display indexes, the tool-name index, and the
  four `messages_display_*` triggers that keep `display_order` right as messages are
  written, hidden and deleted;
- the legacy inline search triggers' broad update triggers replaced by the application's
  narrow ones (`AFTER UPDATE OF content, tool_name, tool_calls, role`), as it does on
  every open: the display triggers update `display_order` of the row just
  inserted, and a broad update trigger would then index that row a second time (the insert
  fails with a constraint error);
- search coverage, only on a store whose indexes are in the APPLICATION's own external
  layout (its view `messages_fts_src`): its trigram index stops covering cron and
  subagent sessions and delegated children. As the application does, the trigram view
  and triggers are recreated and the trigram index rebuilt. A store in the legacy inline
  layout, a trigram that still indexes `tool_calls` (the application's first external
  layout, left to its optimize-storage) and hermes-store's own layout are not touched,
  as the application skips them.

On PostgreSQL: the same index, columns and display indexes, and the four display triggers
as PL/pgSQL trigger functions (same names; the insert one sets the new row's
display_order before it is written); there are no FTS5 objects to narrow.

Downgrade drops the index, the triggers and the columns (their values are lost) and
widens the inline update triggers again; the application's trigram coverage is not
widened again (the application has no way back either).

Revision ID: 30
Revises: 29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "30"
down_revision: str | None = "29"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Why this revision cannot be written out as SQL by `--sql` (offline mode).
OFFLINE_REFUSAL = (
    "it reads the store's columns, triggers and search layout to decide what to change"
)

EFFECTIVE_ACTIVITY_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_effective_activity"
    " ON sessions(COALESCE(last_activity_at, started_at) DESC, started_at DESC)"
)
NEW_COLUMNS = {
    "sessions": {
        "created_source": "TEXT",
        "compression_overload_streak": "INTEGER NOT NULL DEFAULT 0",
        "transport_profile": "TEXT",
    },
    "messages": {"display_identity": "BLOB", "display_order": "INTEGER"},
    "async_delegations": {"origin_session_id": "TEXT NOT NULL DEFAULT ''"},
}
NEW_INDEXES = {
    "idx_messages_display_page": """
CREATE INDEX IF NOT EXISTS idx_messages_display_page
    ON messages(session_id, display_order, active DESC, id DESC)
    WHERE active = 1 OR compacted = 1
""",
    "idx_messages_display_backfill": """
CREATE INDEX IF NOT EXISTS idx_messages_display_backfill
    ON messages(session_id) WHERE (display_order IS NULL OR display_identity IS NULL)
    AND (active = 1 OR compacted = 1)
""",
    "idx_messages_display_identity": """
CREATE INDEX IF NOT EXISTS idx_messages_display_identity
    ON messages(session_id, display_identity, display_order)
    WHERE display_identity IS NOT NULL AND (active = 1 OR compacted = 1)
""",
    "idx_sessions_tool_names": "CREATE INDEX IF NOT EXISTS idx_sessions_tool_names"
    " ON sessions(tool_names)",
}

MESSAGES_DISPLAY_ORDER_INSERT_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_display_order_insert
AFTER INSERT ON messages WHEN new.display_order IS NULL
BEGIN
    UPDATE messages SET display_order = COALESCE((
        SELECT display_order FROM messages
        WHERE session_id = new.session_id AND id <> new.id
          AND (active = 1 OR compacted = 1)
          AND display_identity = new.display_identity AND display_order IS NOT NULL
        ORDER BY display_order LIMIT 1
    ), new.id) WHERE id = new.id;
END
"""
MESSAGES_DISPLAY_VISIBILITY_UPDATE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_display_visibility_update
AFTER UPDATE OF active, compacted ON messages
WHEN (new.active = 1 OR new.compacted = 1) <> (old.active = 1 OR old.compacted = 1)
BEGIN
    UPDATE messages SET display_order = MIN(new.id, COALESCE((
        SELECT display_order FROM messages
        WHERE session_id = new.session_id AND id <> new.id
          AND (active = 1 OR compacted = 1)
          AND display_identity = new.display_identity AND display_order IS NOT NULL
        ORDER BY display_order LIMIT 1
    ), new.id)) WHERE id = new.id
      AND (new.active = 1 OR new.compacted = 1);
    UPDATE messages SET display_order = (SELECT display_order FROM messages WHERE id = new.id)
    WHERE session_id = new.session_id AND id <> new.id AND (active = 1 OR compacted = 1)
      AND display_identity = new.display_identity
      AND (new.active = 1 OR new.compacted = 1);
    UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = old.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = old.display_identity
    ) WHERE session_id = old.session_id AND (active = 1 OR compacted = 1)
      AND display_identity = old.display_identity
      AND NOT (new.active = 1 OR new.compacted = 1);
END
"""
MESSAGES_DISPLAY_IDENTITY_UPDATE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_display_identity_update
AFTER UPDATE OF role, content, timestamp, tool_call_id, tool_calls, tool_name,
                display_kind ON messages
WHEN new.role IS NOT old.role
  OR new.content IS NOT old.content
  OR new.timestamp IS NOT old.timestamp
  OR new.tool_call_id IS NOT old.tool_call_id
  OR new.tool_calls IS NOT old.tool_calls
  OR new.tool_name IS NOT old.tool_name
  OR new.display_kind IS NOT old.display_kind
BEGIN
    UPDATE messages SET display_identity = NULL, display_order = NULL
    WHERE id = new.id OR (
        session_id = old.session_id AND display_identity = old.display_identity
        AND (active = 1 OR compacted = 1)
    );
END
"""
MESSAGES_DISPLAY_IDENTITY_DELETE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS messages_display_identity_delete
AFTER DELETE ON messages WHEN old.active = 1 OR old.compacted = 1
BEGIN
    UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = old.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = old.display_identity
    ) WHERE session_id = old.session_id AND (active = 1 OR compacted = 1)
      AND display_identity = old.display_identity;
END
"""
DISPLAY_TRIGGERS = {
    "messages_display_order_insert": MESSAGES_DISPLAY_ORDER_INSERT_TRIGGER,
    "messages_display_visibility_update": MESSAGES_DISPLAY_VISIBILITY_UPDATE_TRIGGER,
    "messages_display_identity_update": MESSAGES_DISPLAY_IDENTITY_UPDATE_TRIGGER,
    "messages_display_identity_delete": MESSAGES_DISPLAY_IDENTITY_DELETE_TRIGGER,
}

# PostgreSQL: the same four display triggers. Its triggers run a function; the insert one
# sets the new row's display_order before it is written (SQLite updates it just after),
# with the same result, and `IS NOT` is spelt IS DISTINCT FROM.
POSTGRESQL_DISPLAY_FUNCTIONS = {
    "messages_display_order_insert": """
CREATE OR REPLACE FUNCTION messages_display_order_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.display_order = COALESCE((
        SELECT display_order FROM messages
        WHERE session_id = NEW.session_id AND id <> NEW.id
          AND (active = 1 OR compacted = 1)
          AND display_identity = NEW.display_identity AND display_order IS NOT NULL
        ORDER BY display_order LIMIT 1
    ), NEW.id);
    RETURN NEW;
END
$$
""",
    "messages_display_visibility_update": """
CREATE OR REPLACE FUNCTION messages_display_visibility_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE messages SET display_order = LEAST(NEW.id, COALESCE((
        SELECT display_order FROM messages
        WHERE session_id = NEW.session_id AND id <> NEW.id
          AND (active = 1 OR compacted = 1)
          AND display_identity = NEW.display_identity AND display_order IS NOT NULL
        ORDER BY display_order LIMIT 1
    ), NEW.id)) WHERE id = NEW.id
      AND (NEW.active = 1 OR NEW.compacted = 1);
    UPDATE messages SET display_order = (SELECT display_order FROM messages WHERE id = NEW.id)
    WHERE session_id = NEW.session_id AND id <> NEW.id AND (active = 1 OR compacted = 1)
      AND display_identity = NEW.display_identity
      AND (NEW.active = 1 OR NEW.compacted = 1);
    UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = OLD.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = OLD.display_identity
    ) WHERE session_id = OLD.session_id AND (active = 1 OR compacted = 1)
      AND display_identity = OLD.display_identity
      AND NOT (NEW.active = 1 OR NEW.compacted = 1);
    RETURN NULL;
END
$$
""",
    "messages_display_identity_update": """
CREATE OR REPLACE FUNCTION messages_display_identity_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE messages SET display_identity = NULL, display_order = NULL
    WHERE id = NEW.id OR (
        session_id = OLD.session_id AND display_identity = OLD.display_identity
        AND (active = 1 OR compacted = 1)
    );
    RETURN NULL;
END
$$
""",
    "messages_display_identity_delete": """
CREATE OR REPLACE FUNCTION messages_display_identity_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = OLD.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = OLD.display_identity
    ) WHERE session_id = OLD.session_id AND (active = 1 OR compacted = 1)
      AND display_identity = OLD.display_identity;
    RETURN NULL;
END
$$
""",
}
POSTGRESQL_DISPLAY_TRIGGERS = {
    "messages_display_order_insert": """
CREATE TRIGGER messages_display_order_insert
BEFORE INSERT ON messages FOR EACH ROW WHEN (NEW.display_order IS NULL)
EXECUTE FUNCTION messages_display_order_insert()
""",
    "messages_display_visibility_update": """
CREATE TRIGGER messages_display_visibility_update
AFTER UPDATE OF active, compacted ON messages FOR EACH ROW
WHEN ((NEW.active = 1 OR NEW.compacted = 1) <> (OLD.active = 1 OR OLD.compacted = 1))
EXECUTE FUNCTION messages_display_visibility_update()
""",
    "messages_display_identity_update": """
CREATE TRIGGER messages_display_identity_update
AFTER UPDATE OF role, content, timestamp, tool_call_id, tool_calls, tool_name,
                display_kind ON messages FOR EACH ROW
WHEN (NEW.role IS DISTINCT FROM OLD.role
  OR NEW.content IS DISTINCT FROM OLD.content
  OR NEW.timestamp IS DISTINCT FROM OLD.timestamp
  OR NEW.tool_call_id IS DISTINCT FROM OLD.tool_call_id
  OR NEW.tool_calls IS DISTINCT FROM OLD.tool_calls
  OR NEW.tool_name IS DISTINCT FROM OLD.tool_name
  OR NEW.display_kind IS DISTINCT FROM OLD.display_kind)
EXECUTE FUNCTION messages_display_identity_update()
""",
    "messages_display_identity_delete": """
CREATE TRIGGER messages_display_identity_delete
AFTER DELETE ON messages FOR EACH ROW WHEN (OLD.active = 1 OR OLD.compacted = 1)
EXECUTE FUNCTION messages_display_identity_delete()
""",
}
#: SQLite's column types as PostgreSQL declares the same values.
POSTGRESQL_TYPES = {"INTEGER": "BIGINT", "BLOB": "BYTEA"}


# The application's own trigram objects at 30 (its layout, not hermes-store's): a view of
# the messages it covers and three triggers that keep its trigram index on that view.
APPLICATION_VIEW = "messages_fts_src"
APPLICATION_TRIGRAM_VIEW = "messages_fts_trigram_src"
_COVERED = (
    "source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN json_valid({p}model_config)"
    " THEN {p}model_config ELSE json_object() END), '$._delegate_from') IS NULL"
)
_BACKFILL_GUARD = """({row}.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR {row}.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))"""
APPLICATION_TRIGRAM_VIEW_30 = f"""
CREATE VIEW IF NOT EXISTS messages_fts_trigram_src AS
    SELECT m.id, m.role, m.content, m.tool_name
    FROM messages AS m
    JOIN sessions AS s ON s.id = m.session_id
    WHERE m.role <> 'tool' AND s.{_COVERED.format(p="s.")}
"""
APPLICATION_TRIGRAM_INSERT_TRIGGER_30 = f"""
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_insert AFTER INSERT ON messages
WHEN new.role <> 'tool'
   AND EXISTS (SELECT 1 FROM sessions
               WHERE id = new.session_id AND {_COVERED.format(p="")})
   AND {_BACKFILL_GUARD.format(row="new")}
BEGIN
    INSERT INTO messages_fts_trigram(rowid, content, tool_name)
    VALUES (new.id, new.content, new.tool_name);
END
"""
APPLICATION_TRIGRAM_DELETE_TRIGGER_30 = f"""
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_delete AFTER DELETE ON messages
WHEN old.role <> 'tool'
   AND EXISTS (SELECT 1 FROM sessions
               WHERE id = old.session_id AND {_COVERED.format(p="")})
   AND {_BACKFILL_GUARD.format(row="old")}
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name)
    VALUES ('delete', old.id, old.content, old.tool_name);
END
"""
APPLICATION_TRIGRAM_UPDATE_TRIGGER_30 = f"""
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_update
AFTER UPDATE OF content, tool_name, role ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.role IS NOT new.role)
   AND {_BACKFILL_GUARD.format(row="old")}
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name)
    SELECT 'delete', old.id, old.content, old.tool_name
    WHERE old.role <> 'tool'
      AND EXISTS (SELECT 1 FROM sessions
                  WHERE id = old.session_id AND {_COVERED.format(p="")});
    INSERT INTO messages_fts_trigram(rowid, content, tool_name)
    SELECT new.id, new.content, new.tool_name
    WHERE new.role <> 'tool'
      AND EXISTS (SELECT 1 FROM sessions
                  WHERE id = new.session_id AND {_COVERED.format(p="")});
END
"""
APPLICATION_TRIGRAM_TRIGGERS = (
    "messages_fts_trigram_insert",
    "messages_fts_trigram_delete",
    "messages_fts_trigram_update",
)


# The legacy inline update triggers: broad, as 17 created them, and narrowed, as the
# application at 30 re-creates a broad one on every open (its current inline DDL: only the
# indexed columns and `role` fire it, and a tool message's content is indexed up to 8192
# characters).
INLINE_UPDATE_TRIGGER_BROAD = """
CREATE TRIGGER {name} AFTER UPDATE ON messages BEGIN
    DELETE FROM {index} WHERE rowid = old.id;
    INSERT INTO {index}(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
            || COALESCE(new.tool_calls, '')
    );
END
"""
INLINE_UPDATE_TRIGGER_NARROW = """
CREATE TRIGGER {name}
AFTER UPDATE OF content, tool_name, tool_calls, role ON messages BEGIN
    DELETE FROM {index} WHERE rowid = old.id;
    INSERT INTO {index}(rowid, content) VALUES (
        new.id,
        COALESCE(CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END, '')
        || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END
"""
INLINE_UPDATE_TRIGGERS = {
    "messages_fts_update": "messages_fts",
    "messages_fts_trigram_update": "messages_fts_trigram",
}


def _normalised(sql: str) -> str:
    return " ".join(sql.replace("IF NOT EXISTS ", "").split()).upper()


def _replace_inline_update_triggers(old: str, new: str) -> None:
    """Swap the inline update triggers that are exactly of the ``old`` form for ``new``.

    Only the legacy inline form is touched: hermes-store's external triggers and the
    application's own layout keep theirs.
    """
    for name, index in INLINE_UPDATE_TRIGGERS.items():
        sql = _sql_of("trigger", name)
        if sql is None:
            continue
        if old is INLINE_UPDATE_TRIGGER_BROAD:
            # Any broad inline one, whatever its spelling: with the display triggers, a
            # broad update trigger makes every insert fail.
            text = _normalised(sql)
            if (
                "AFTER UPDATE ON MESSAGES" not in text
                or f"DELETE FROM {index.upper()} " not in text
            ):
                continue
        elif _normalised(sql) != _normalised(old.format(name=name, index=index)):
            continue
        op.execute(f"DROP TRIGGER {name}")
        op.execute(new.format(name=name, index=index))


def _columns(table: str) -> set[str]:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        return {column["name"] for column in sa.inspect(bind).get_columns(table)}
    return {row[1] for row in bind.exec_driver_sql(f"PRAGMA table_info({table})")}


def _upgrade_postgresql() -> None:
    """The same columns, indexes and display triggers; no FTS5 objects to narrow."""
    op.execute(EFFECTIVE_ACTIVITY_INDEX)
    for table, columns in NEW_COLUMNS.items():
        existing = _columns(table)
        for name, declaration in columns.items():
            if name not in existing:
                sql_type, _, rest = declaration.partition(" ")
                declared = " ".join(filter(None, (POSTGRESQL_TYPES.get(sql_type, sql_type), rest)))
                op.execute(f'ALTER TABLE {table} ADD COLUMN "{name}" {declared}')
    for ddl in NEW_INDEXES.values():
        op.execute(ddl)
    for name, function in POSTGRESQL_DISPLAY_FUNCTIONS.items():
        op.execute(function)
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON messages")
        op.execute(POSTGRESQL_DISPLAY_TRIGGERS[name])
    op.execute("UPDATE schema_version SET version = 30")


def _sql_of(kind: str, name: str) -> str | None:
    row = (
        op.get_bind()
        .execute(
            sa.text("SELECT sql FROM sqlite_master WHERE type = :kind AND name = :name"),
            {"kind": kind, "name": name},
        )
        .first()
    )
    return None if row is None else str(row[0])


def _narrow_application_trigram() -> None:
    """The application's 29/30 trigram coverage step, on its own layout only."""
    if _sql_of("view", APPLICATION_VIEW) is None:
        return  # legacy inline or hermes-store's layout: the application skips these too
    trigram = _sql_of("table", "messages_fts_trigram")
    if trigram is None or "tool_calls" in trigram.lower():
        return  # no trigram index, or the application's first layout (its optimize-storage)
    for trigger in APPLICATION_TRIGRAM_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    op.execute(f"DROP VIEW IF EXISTS {APPLICATION_TRIGRAM_VIEW}")
    for ddl in (
        APPLICATION_TRIGRAM_VIEW_30,
        APPLICATION_TRIGRAM_INSERT_TRIGGER_30,
        APPLICATION_TRIGRAM_DELETE_TRIGGER_30,
        APPLICATION_TRIGRAM_UPDATE_TRIGGER_30,
    ):
        op.execute(ddl)
    op.execute("INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES ('rebuild')")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _upgrade_postgresql()
        return
    _replace_inline_update_triggers(INLINE_UPDATE_TRIGGER_BROAD, INLINE_UPDATE_TRIGGER_NARROW)
    op.execute(EFFECTIVE_ACTIVITY_INDEX)
    for table, columns in NEW_COLUMNS.items():
        existing = _columns(table)
        for name, declaration in columns.items():
            if name not in existing:
                op.execute(f'ALTER TABLE {table} ADD COLUMN "{name}" {declaration}')
    for ddl in (*NEW_INDEXES.values(), *DISPLAY_TRIGGERS.values()):
        op.execute(ddl)
    _narrow_application_trigram()
    op.execute("UPDATE schema_version SET version = 30")


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for trigger in DISPLAY_TRIGGERS:
        if postgresql:
            op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON messages")
            op.execute(f"DROP FUNCTION IF EXISTS {trigger}()")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    for index in (*NEW_INDEXES, "idx_sessions_effective_activity"):
        op.execute(f"DROP INDEX IF EXISTS {index}")
    for table, columns in NEW_COLUMNS.items():
        existing = _columns(table)
        for name in reversed(columns):
            if name in existing:
                op.execute(f'ALTER TABLE {table} DROP COLUMN "{name}"')
    if postgresql:
        op.execute("UPDATE schema_version SET version = 29")
        return
    _replace_inline_update_triggers(INLINE_UPDATE_TRIGGER_NARROW, INLINE_UPDATE_TRIGGER_BROAD)
    op.execute("UPDATE schema_version SET version = 29")

"""Frozen DDL of the legacy Hermes session store, schema 17 to 21.

Every constant is one SQL statement exactly as the legacy application ran it (see
shared/spec/legacy-store.md). This is reference data for migration tests: never edit a
statement to match new code; if the spec changes, add constants and say why.

History the constants reproduce:

- v17 tables (`SESSIONS_V17`, `MESSAGES_V17`, ...) and v17 indexes: the v21 schema without the
  v18 columns, the v19/v20/v21 tables and indexes, and the "drift set".
- The drift set: three `sessions` columns, `messages.effect_disposition` and two indexes that
  application builds added WITHOUT bumping the version, so a store stamped 17 to 20 may or may
  not have them. They arrive by `ALTER TABLE ... ADD COLUMN` (appended at the end).
- v18: three `sessions` columns, appended by `ALTER TABLE ... ADD COLUMN`.
- v19, v20, v21: new tables and their indexes.
- `SESSIONS_V21` / `MESSAGES_V21`: the same tables as a store created fresh at v21 declares
  them (columns in declaration order).
- The inline FTS5 layout (v11 to v21): two one-column FTS5 tables with their own copy of the
  indexed text, and six triggers with the legacy names.
"""

from __future__ import annotations

from typing import Final

# --------------------------------------------------------------------------------------------
# Version bookkeeping
# --------------------------------------------------------------------------------------------

SCHEMA_VERSION_TABLE: Final = """\
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
)"""

SCHEMA_VERSION_INSERT: Final = "INSERT INTO schema_version (version) VALUES (?)"

# --------------------------------------------------------------------------------------------
# v17 tables (declaration order of a store created at v17; no v18 columns, no drift set)
# --------------------------------------------------------------------------------------------

SESSIONS_V17: Final = """\
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    cwd TEXT,
    git_branch TEXT,
    git_repo_root TEXT,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    title TEXT,
    api_call_count INTEGER DEFAULT 0,
    handoff_state TEXT,
    handoff_platform TEXT,
    handoff_error TEXT,
    rewind_count INTEGER NOT NULL DEFAULT 0,
    archived INTEGER NOT NULL DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
)"""

MESSAGES_V17: Final = """\
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT,
    reasoning_content TEXT,
    reasoning_details TEXT,
    codex_reasoning_items TEXT,
    codex_message_items TEXT,
    platform_message_id TEXT,
    observed INTEGER DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1,
    compacted INTEGER NOT NULL DEFAULT 0
)"""

STATE_META: Final = """\
CREATE TABLE IF NOT EXISTS state_meta (
    key TEXT PRIMARY KEY,
    value TEXT
)"""

COMPRESSION_LOCKS: Final = """\
CREATE TABLE IF NOT EXISTS compression_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
)"""

# --------------------------------------------------------------------------------------------
# v17 indexes
# --------------------------------------------------------------------------------------------

IDX_SESSIONS_SOURCE: Final = "CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source)"

IDX_SESSIONS_SOURCE_ID: Final = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_source_id ON sessions(source, id)"
)

IDX_SESSIONS_PARENT: Final = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id)"
)

IDX_SESSIONS_STARTED: Final = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC)"
)

IDX_SESSIONS_SESSION_KEY: Final = """\
CREATE INDEX IF NOT EXISTS idx_sessions_session_key
    ON sessions(session_key, started_at DESC)"""

IDX_SESSIONS_GATEWAY_PEER: Final = """\
CREATE INDEX IF NOT EXISTS idx_sessions_gateway_peer
    ON sessions(source, user_id, chat_id, chat_type, thread_id, started_at DESC)"""

IDX_SESSIONS_TITLE_UNIQUE: Final = """\
CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique
    ON sessions(title) WHERE title IS NOT NULL"""

IDX_MESSAGES_SESSION: Final = (
    "CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp)"
)

IDX_MESSAGES_SESSION_ACTIVE: Final = """\
CREATE INDEX IF NOT EXISTS idx_messages_session_active
    ON messages(session_id, active, timestamp)"""

IDX_MESSAGES_PLATFORM_MSG_ID: Final = """\
CREATE INDEX IF NOT EXISTS idx_messages_platform_msg_id
    ON messages(session_id, platform_message_id) WHERE platform_message_id IS NOT NULL"""

IDX_COMPRESSION_LOCKS_EXPIRES: Final = (
    "CREATE INDEX IF NOT EXISTS idx_compression_locks_expires ON compression_locks(expires_at)"
)

# --------------------------------------------------------------------------------------------
# The drift set (added by application builds without a version bump)
# --------------------------------------------------------------------------------------------

SESSIONS_ADD_COMPRESSION_FAILURE_COOLDOWN_UNTIL: Final = (
    "ALTER TABLE sessions ADD COLUMN compression_failure_cooldown_until REAL"
)

SESSIONS_ADD_COMPRESSION_FAILURE_ERROR: Final = (
    "ALTER TABLE sessions ADD COLUMN compression_failure_error TEXT"
)

SESSIONS_ADD_COMPRESSION_FALLBACK_STREAK: Final = (
    "ALTER TABLE sessions ADD COLUMN compression_fallback_streak INTEGER NOT NULL DEFAULT 0"
)

MESSAGES_ADD_EFFECT_DISPOSITION: Final = "ALTER TABLE messages ADD COLUMN effect_disposition TEXT"

IDX_MESSAGES_ACTIVE_NULL: Final = """\
CREATE INDEX IF NOT EXISTS idx_messages_active_null
    ON messages(active) WHERE active IS NULL"""

IDX_SESSIONS_HANDOFF_STATE: Final = """\
CREATE INDEX IF NOT EXISTS idx_sessions_handoff_state
    ON sessions(handoff_state, started_at)"""

# --------------------------------------------------------------------------------------------
# v18: gateway metadata columns
# --------------------------------------------------------------------------------------------

SESSIONS_ADD_DISPLAY_NAME: Final = "ALTER TABLE sessions ADD COLUMN display_name TEXT"

SESSIONS_ADD_ORIGIN_JSON: Final = "ALTER TABLE sessions ADD COLUMN origin_json TEXT"

SESSIONS_ADD_EXPIRY_FINALIZED: Final = (
    "ALTER TABLE sessions ADD COLUMN expiry_finalized INTEGER DEFAULT 0"
)

# --------------------------------------------------------------------------------------------
# v19: gateway routing
# --------------------------------------------------------------------------------------------

GATEWAY_ROUTING: Final = """\
CREATE TABLE IF NOT EXISTS gateway_routing (
    scope TEXT NOT NULL DEFAULT '',
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, session_key)
)"""

# --------------------------------------------------------------------------------------------
# v20: per-model usage
# --------------------------------------------------------------------------------------------

SESSION_MODEL_USAGE: Final = """\
CREATE TABLE IF NOT EXISTS session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    api_call_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0,
    actual_cost_usd REAL NOT NULL DEFAULT 0,
    cost_status TEXT,
    cost_source TEXT,
    first_seen REAL,
    last_seen REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode)
)"""

IDX_SESSION_MODEL_USAGE_SESSION: Final = (
    "CREATE INDEX IF NOT EXISTS idx_session_model_usage_session ON session_model_usage(session_id)"
)

IDX_SESSION_MODEL_USAGE_MODEL: Final = (
    "CREATE INDEX IF NOT EXISTS idx_session_model_usage_model ON session_model_usage(model)"
)

# --------------------------------------------------------------------------------------------
# v21: async delegations
# --------------------------------------------------------------------------------------------

ASYNC_DELEGATIONS: Final = """\
CREATE TABLE IF NOT EXISTS async_delegations (
    delegation_id TEXT PRIMARY KEY,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '',
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at REAL NOT NULL,
    completed_at REAL,
    updated_at REAL NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at REAL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at REAL
)"""

IDX_ASYNC_DELEGATIONS_DELIVERY: Final = """\
CREATE INDEX IF NOT EXISTS idx_async_delegations_delivery
    ON async_delegations(delivery_state, completed_at)"""

# --------------------------------------------------------------------------------------------
# v21 created fresh: sessions and messages in declaration order
# --------------------------------------------------------------------------------------------

SESSIONS_V21: Final = """\
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    display_name TEXT,
    origin_json TEXT,
    expiry_finalized INTEGER DEFAULT 0,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    cwd TEXT,
    git_branch TEXT,
    git_repo_root TEXT,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    title TEXT,
    api_call_count INTEGER DEFAULT 0,
    handoff_state TEXT,
    handoff_platform TEXT,
    handoff_error TEXT,
    compression_failure_cooldown_until REAL,
    compression_failure_error TEXT,
    compression_fallback_streak INTEGER NOT NULL DEFAULT 0,
    rewind_count INTEGER NOT NULL DEFAULT 0,
    archived INTEGER NOT NULL DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
)"""

MESSAGES_V21: Final = """\
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    effect_disposition TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT,
    reasoning_content TEXT,
    reasoning_details TEXT,
    codex_reasoning_items TEXT,
    codex_message_items TEXT,
    platform_message_id TEXT,
    observed INTEGER DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1,
    compacted INTEGER NOT NULL DEFAULT 0
)"""

# --------------------------------------------------------------------------------------------
# Full-text search, the INLINE layout (v11 to v21)
# --------------------------------------------------------------------------------------------

MESSAGES_FTS: Final = """\
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content
)"""

MESSAGES_FTS_INSERT_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""  # noqa: E501  (frozen legacy text)

MESSAGES_FTS_DELETE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
END"""

MESSAGES_FTS_UPDATE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""  # noqa: E501  (frozen legacy text)

MESSAGES_FTS_TRIGRAM: Final = """\
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram USING fts5(
    content,
    tokenize='trigram'
)"""

MESSAGES_FTS_TRIGRAM_INSERT_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""  # noqa: E501  (frozen legacy text)

MESSAGES_FTS_TRIGRAM_DELETE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
END"""

MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""  # noqa: E501  (frozen legacy text)

# --------------------------------------------------------------------------------------------
# Groups, in the order the legacy application ran them (tuples of the constants above)
# --------------------------------------------------------------------------------------------

V17_TABLES: Final = (
    SCHEMA_VERSION_TABLE,
    SESSIONS_V17,
    MESSAGES_V17,
    STATE_META,
    COMPRESSION_LOCKS,
)

V17_INDEXES: Final = (
    IDX_SESSIONS_SOURCE,
    IDX_SESSIONS_SOURCE_ID,
    IDX_SESSIONS_PARENT,
    IDX_SESSIONS_STARTED,
    IDX_MESSAGES_SESSION,
    IDX_COMPRESSION_LOCKS_EXPIRES,
    IDX_MESSAGES_SESSION_ACTIVE,
    IDX_SESSIONS_SESSION_KEY,
    IDX_SESSIONS_GATEWAY_PEER,
    IDX_SESSIONS_TITLE_UNIQUE,
    IDX_MESSAGES_PLATFORM_MSG_ID,
)

DRIFT_COLUMNS: Final = (
    SESSIONS_ADD_COMPRESSION_FAILURE_COOLDOWN_UNTIL,
    SESSIONS_ADD_COMPRESSION_FAILURE_ERROR,
    SESSIONS_ADD_COMPRESSION_FALLBACK_STREAK,
    MESSAGES_ADD_EFFECT_DISPOSITION,
)

DRIFT_INDEXES: Final = (IDX_MESSAGES_ACTIVE_NULL, IDX_SESSIONS_HANDOFF_STATE)

V18_COLUMNS: Final = (
    SESSIONS_ADD_DISPLAY_NAME,
    SESSIONS_ADD_ORIGIN_JSON,
    SESSIONS_ADD_EXPIRY_FINALIZED,
)

V19_TABLES: Final = (GATEWAY_ROUTING,)

V20_TABLES: Final = (SESSION_MODEL_USAGE,)

V20_INDEXES: Final = (IDX_SESSION_MODEL_USAGE_SESSION, IDX_SESSION_MODEL_USAGE_MODEL)

V21_TABLES: Final = (ASYNC_DELEGATIONS,)

V21_INDEXES: Final = (IDX_ASYNC_DELEGATIONS_DELIVERY,)

#: A store created fresh at v21: every table in declaration order, then every index.
FRESH_V21_TABLES: Final = (
    SCHEMA_VERSION_TABLE,
    SESSIONS_V21,
    MESSAGES_V21,
    SESSION_MODEL_USAGE,
    STATE_META,
    GATEWAY_ROUTING,
    COMPRESSION_LOCKS,
    ASYNC_DELEGATIONS,
)

FRESH_V21_INDEXES: Final = (
    IDX_SESSIONS_SOURCE,
    IDX_SESSIONS_SOURCE_ID,
    IDX_SESSIONS_PARENT,
    IDX_SESSIONS_STARTED,
    IDX_MESSAGES_SESSION,
    IDX_COMPRESSION_LOCKS_EXPIRES,
    IDX_SESSION_MODEL_USAGE_SESSION,
    IDX_SESSION_MODEL_USAGE_MODEL,
    IDX_ASYNC_DELEGATIONS_DELIVERY,
    IDX_MESSAGES_SESSION_ACTIVE,
    IDX_MESSAGES_ACTIVE_NULL,
    IDX_SESSIONS_SESSION_KEY,
    IDX_SESSIONS_GATEWAY_PEER,
    IDX_SESSIONS_HANDOFF_STATE,
    IDX_SESSIONS_TITLE_UNIQUE,
    IDX_MESSAGES_PLATFORM_MSG_ID,
)

FTS_WORD: Final = (
    MESSAGES_FTS,
    MESSAGES_FTS_INSERT_TRIGGER,
    MESSAGES_FTS_DELETE_TRIGGER,
    MESSAGES_FTS_UPDATE_TRIGGER,
)

FTS_TRIGRAM: Final = (
    MESSAGES_FTS_TRIGRAM,
    MESSAGES_FTS_TRIGRAM_INSERT_TRIGGER,
    MESSAGES_FTS_TRIGRAM_DELETE_TRIGGER,
    MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER,
)

#: The six trigger names the legacy application checks for.
FTS_TRIGGER_NAMES: Final = (
    "messages_fts_insert",
    "messages_fts_delete",
    "messages_fts_update",
    "messages_fts_trigram_insert",
    "messages_fts_trigram_delete",
    "messages_fts_trigram_update",
)

#: The text both FTS tables index for a message row (rowid = messages.id), as a SELECT expression.
INDEXED_EXPRESSION: Final = (
    "COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"
)

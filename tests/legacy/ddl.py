"""Frozen DDL of the legacy Hermes session store, schema 17 to 30.

Every constant is one SQL statement exactly as the legacy application ran it (see
docs/legacy-store.md). This is reference data for migration tests: never edit a
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

Schema 22 to 30 (NousResearch/hermes-agent, `hermes_state_common.py` at 00704d08 for the
newest schema-30 build and f31cf971 for the older one, `hermes_state_schema.py` for the data
steps; the attribution of undated columns to 24 is hermes-store's decision):

- v22: `session_model_usage` rebuilt with `task` in its primary key, by the application's
  rename / create / copy / drop sequence (the CREATE keeps the source's indentation).
- v23: no DDL; an existing store in the inline layout gets `fts_optimize_available = '1'`.
- v24: twelve `sessions` and four `messages` columns, added by the application's column
  reconciler (`ALTER TABLE "t" ADD COLUMN "c" <type>`, names quoted), four tables and three
  indexes from its `SCHEMA_SQL`.
- v25: `system_prompts`, `sessions.system_prompt_hash` (reconciled, so without the foreign
  key a fresh store declares) and its index.
- v26 to v29: nothing.
- v30: `idx_sessions_effective_activity`; the "v30 drift set" (six columns, four indexes and
  the four `messages_display_*` triggers) arrived later without a bump (00704d08 has it,
  f31cf971 does not).
- The application's own FTS layout 3 (`APP_FTS3_*`: a projection view, a three-column
  external-content `messages_fts`, a filtered view and a two-column trigram table, six
  triggers), and the inline-layout triggers the schema-30 application re-creates after it
  loses them (`LEGACY_FTS_V30_*`).
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

# ============================================================================================
# Schema 22 to 30
# ============================================================================================

#: The application's `set_meta`: an upsert into `state_meta`, parameters (key, value).
STATE_META_UPSERT: Final = (
    "INSERT INTO state_meta (key, value) VALUES (?, ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)

# --------------------------------------------------------------------------------------------
# v22: session_model_usage gets `task` in its primary key (the application's rebuild)
# --------------------------------------------------------------------------------------------

SESSION_MODEL_USAGE_RENAME_TO_V21: Final = (
    "ALTER TABLE session_model_usage RENAME TO session_model_usage_v21"
)

SESSION_MODEL_USAGE_V22: Final = """\
CREATE TABLE session_model_usage (
                                   session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
                                   model TEXT NOT NULL,
                                   billing_provider TEXT NOT NULL DEFAULT '',
                                   billing_base_url TEXT NOT NULL DEFAULT '',
                                   billing_mode TEXT NOT NULL DEFAULT '',
                                   task TEXT NOT NULL DEFAULT '',
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
                                   PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)
                               )"""  # noqa: E501  (frozen legacy text)

SESSION_MODEL_USAGE_COPY_FROM_V21: Final = """\
INSERT INTO session_model_usage (
                                   session_id, model, billing_provider, billing_base_url,
                                   billing_mode, task, api_call_count, input_tokens,
                                   output_tokens, cache_read_tokens, cache_write_tokens,
                                   reasoning_tokens, estimated_cost_usd, actual_cost_usd,
                                   cost_status, cost_source, first_seen, last_seen
                               )
                               SELECT session_id, model, billing_provider, billing_base_url,
                                      billing_mode, '', api_call_count, input_tokens,
                                      output_tokens, cache_read_tokens, cache_write_tokens,
                                      reasoning_tokens, estimated_cost_usd, actual_cost_usd,
                                      cost_status, cost_source, first_seen, last_seen
                               FROM session_model_usage_v21"""

SESSION_MODEL_USAGE_DROP_V21: Final = "DROP TABLE session_model_usage_v21"

# The two indexes are re-created with the same text as at v20
# (IDX_SESSION_MODEL_USAGE_SESSION, IDX_SESSION_MODEL_USAGE_MODEL).

# --------------------------------------------------------------------------------------------
# v23: no DDL; the inline layout is flagged for the application's optimize-storage
# --------------------------------------------------------------------------------------------

#: The (key, value) the v23 step writes with `STATE_META_UPSERT` on an inline-layout store.
FTS_OPTIMIZE_AVAILABLE: Final = ("fts_optimize_available", "1")

# --------------------------------------------------------------------------------------------
# v24: tables and indexes from SCHEMA_SQL, columns from the reconciler
# --------------------------------------------------------------------------------------------

GATEWAY_HYGIENE_STATE: Final = """\
CREATE TABLE IF NOT EXISTS gateway_hygiene_state (
    session_key TEXT PRIMARY KEY,
    failure_streak INTEGER NOT NULL DEFAULT 0
)"""

CONVERSATION_GENERATIONS: Final = """\
CREATE TABLE IF NOT EXISTS conversation_generations (
    source TEXT NOT NULL,
    session_key TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (source, session_key)
)"""

GATEWAY_HEARTBEATS: Final = """\
CREATE TABLE IF NOT EXISTS gateway_heartbeats (
    backend_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    profile TEXT NOT NULL DEFAULT '',
    host TEXT NOT NULL DEFAULT ''
)"""

SESSION_TURN_LEASES: Final = """\
CREATE TABLE IF NOT EXISTS session_turn_leases (
    conversation_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
)"""

IDX_MESSAGES_SESSION_ID: Final = (
    "CREATE INDEX IF NOT EXISTS idx_messages_session_id ON messages(session_id, id)"
)

IDX_MESSAGES_ASSISTANT_CALLS_BY_SESSION: Final = """\
CREATE INDEX IF NOT EXISTS idx_messages_assistant_calls_by_session
    ON messages(session_id)
    WHERE role = 'assistant' AND tool_calls IS NOT NULL"""

IDX_SESSION_TURN_LEASES_EXPIRES: Final = (
    "CREATE INDEX IF NOT EXISTS idx_session_turn_leases_expires ON session_turn_leases(expires_at)"
)

SESSIONS_ADD_GIT_METADATA_GENERATION: Final = (
    'ALTER TABLE "sessions" ADD COLUMN "git_metadata_generation" INTEGER NOT NULL DEFAULT 0'
)

SESSIONS_ADD_TITLE_SOURCE: Final = 'ALTER TABLE "sessions" ADD COLUMN "title_source" TEXT'

SESSIONS_ADD_LAST_ACTIVITY_AT: Final = 'ALTER TABLE "sessions" ADD COLUMN "last_activity_at" REAL'

SESSIONS_ADD_LAST_ACTIVITY_DESCRIPTION: Final = (
    'ALTER TABLE "sessions" ADD COLUMN "last_activity_description" TEXT'
)

SESSIONS_ADD_LAST_ACTIVITY_PROVENANCE: Final = (
    'ALTER TABLE "sessions" ADD COLUMN "last_activity_provenance" TEXT'
)

SESSIONS_ADD_COMPRESSION_INEFFECTIVE_COUNT: Final = (
    'ALTER TABLE "sessions" ADD COLUMN "compression_ineffective_count" INTEGER NOT NULL DEFAULT 0'
)

SESSIONS_ADD_COMPRESSION_RECOVERY_DEADLINE: Final = (
    'ALTER TABLE "sessions" ADD COLUMN "compression_recovery_deadline" REAL'
)

SESSIONS_ADD_PROFILE_NAME: Final = 'ALTER TABLE "sessions" ADD COLUMN "profile_name" TEXT'

SESSIONS_ADD_PINNED: Final = 'ALTER TABLE "sessions" ADD COLUMN "pinned" INTEGER NOT NULL DEFAULT 0'

SESSIONS_ADD_HIDDEN: Final = 'ALTER TABLE "sessions" ADD COLUMN "hidden" INTEGER NOT NULL DEFAULT 0'

SESSIONS_ADD_LAST_READ_AT: Final = 'ALTER TABLE "sessions" ADD COLUMN "last_read_at" REAL'

SESSIONS_ADD_TOOL_NAMES: Final = 'ALTER TABLE "sessions" ADD COLUMN "tool_names" TEXT'

MESSAGES_ADD_COMPRESSED_SUMMARY: Final = (
    'ALTER TABLE "messages" ADD COLUMN "_compressed_summary" INTEGER NOT NULL DEFAULT 0'
)

MESSAGES_ADD_API_CONTENT: Final = 'ALTER TABLE "messages" ADD COLUMN "api_content" TEXT'

MESSAGES_ADD_DISPLAY_KIND: Final = 'ALTER TABLE "messages" ADD COLUMN "display_kind" TEXT'

MESSAGES_ADD_DISPLAY_METADATA: Final = 'ALTER TABLE "messages" ADD COLUMN "display_metadata" TEXT'

# --------------------------------------------------------------------------------------------
# v25: system prompts stored once, by content hash
# --------------------------------------------------------------------------------------------

SYSTEM_PROMPTS: Final = """\
CREATE TABLE IF NOT EXISTS system_prompts (
    hash TEXT PRIMARY KEY,
    prompt TEXT NOT NULL
)"""

SESSIONS_ADD_SYSTEM_PROMPT_HASH: Final = (
    'ALTER TABLE "sessions" ADD COLUMN "system_prompt_hash" TEXT'
)

IDX_SESSIONS_SYSTEM_PROMPT_HASH: Final = """\
CREATE INDEX IF NOT EXISTS idx_sessions_system_prompt_hash
    ON sessions(system_prompt_hash)"""

#: Store a prompt (hash = sha256 of its UTF-8 bytes, hex), parameters (hash, prompt).
SYSTEM_PROMPT_INSERT: Final = "INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?, ?)"

#: Point a session at its stored prompt and clear the inline copy, parameters (hash, id).
SESSIONS_SET_SYSTEM_PROMPT_HASH: Final = (
    "UPDATE sessions SET system_prompt_hash = ?, system_prompt = NULL WHERE id = ?"
)

# --------------------------------------------------------------------------------------------
# v30 (older build f31cf971): the effective-activity index
# --------------------------------------------------------------------------------------------

IDX_SESSIONS_EFFECTIVE_ACTIVITY: Final = """\
CREATE INDEX IF NOT EXISTS idx_sessions_effective_activity
    ON sessions(COALESCE(last_activity_at, started_at) DESC, started_at DESC)"""

# --------------------------------------------------------------------------------------------
# The v30 drift set (newest schema-30 build 00704d08, no version bump)
# --------------------------------------------------------------------------------------------

SESSIONS_ADD_CREATED_SOURCE: Final = 'ALTER TABLE "sessions" ADD COLUMN "created_source" TEXT'

SESSIONS_ADD_COMPRESSION_OVERLOAD_STREAK: Final = (
    'ALTER TABLE "sessions" ADD COLUMN "compression_overload_streak" INTEGER NOT NULL DEFAULT 0'
)

SESSIONS_ADD_TRANSPORT_PROFILE: Final = 'ALTER TABLE "sessions" ADD COLUMN "transport_profile" TEXT'

MESSAGES_ADD_DISPLAY_IDENTITY: Final = 'ALTER TABLE "messages" ADD COLUMN "display_identity" BLOB'

MESSAGES_ADD_DISPLAY_ORDER: Final = 'ALTER TABLE "messages" ADD COLUMN "display_order" INTEGER'

ASYNC_DELEGATIONS_ADD_ORIGIN_SESSION_ID: Final = (
    'ALTER TABLE "async_delegations" ADD COLUMN "origin_session_id" TEXT NOT NULL DEFAULT \'\''
)

IDX_MESSAGES_DISPLAY_PAGE: Final = """\
CREATE INDEX IF NOT EXISTS idx_messages_display_page
    ON messages(session_id, display_order, active DESC, id DESC)
    WHERE active = 1 OR compacted = 1"""

IDX_MESSAGES_DISPLAY_BACKFILL: Final = """\
CREATE INDEX IF NOT EXISTS idx_messages_display_backfill
    ON messages(session_id) WHERE (display_order IS NULL OR display_identity IS NULL)
    AND (active = 1 OR compacted = 1)"""

IDX_MESSAGES_DISPLAY_IDENTITY: Final = """\
CREATE INDEX IF NOT EXISTS idx_messages_display_identity
    ON messages(session_id, display_identity, display_order)
    WHERE display_identity IS NOT NULL AND (active = 1 OR compacted = 1)"""

IDX_SESSIONS_TOOL_NAMES: Final = """\
CREATE INDEX IF NOT EXISTS idx_sessions_tool_names
    ON sessions(tool_names)"""

MESSAGES_DISPLAY_ORDER_INSERT_TRIGGER: Final = """\
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
END"""

MESSAGES_DISPLAY_VISIBILITY_UPDATE_TRIGGER: Final = """\
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
END"""

MESSAGES_DISPLAY_IDENTITY_UPDATE_TRIGGER: Final = """\
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
END"""

MESSAGES_DISPLAY_IDENTITY_DELETE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_display_identity_delete
AFTER DELETE ON messages WHEN old.active = 1 OR old.compacted = 1
BEGIN
    UPDATE messages SET display_order = (
        SELECT MIN(peer.id) FROM messages AS peer
        WHERE peer.session_id = old.session_id AND (peer.active = 1 OR peer.compacted = 1)
          AND peer.display_identity = old.display_identity
    ) WHERE session_id = old.session_id AND (active = 1 OR compacted = 1)
      AND display_identity = old.display_identity;
END"""

# --------------------------------------------------------------------------------------------
# The inline layout as the schema-30 application (00704d08) re-creates it after losing its
# triggers (LEGACY_FTS_SQL / LEGACY_FTS_TRIGRAM_SQL): tool rows cut to 8192 characters and
# `role` in `UPDATE OF`. The virtual tables are the same text as MESSAGES_FTS and
# MESSAGES_FTS_TRIGRAM, which `CREATE ... IF NOT EXISTS` leaves alone.
# --------------------------------------------------------------------------------------------

LEGACY_FTS_V30_INSERT_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END, '')
        || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""

LEGACY_FTS_V30_DELETE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
END"""

LEGACY_FTS_V30_UPDATE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_update
AFTER UPDATE OF content, tool_name, tool_calls, role ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    INSERT INTO messages_fts(rowid, content) VALUES (
        new.id,
        COALESCE(CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END, '')
        || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""

LEGACY_FTS_V30_TRIGRAM_INSERT_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END, '')
        || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""

LEGACY_FTS_V30_TRIGRAM_DELETE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
END"""

LEGACY_FTS_V30_TRIGRAM_UPDATE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_update
AFTER UPDATE OF content, tool_name, tool_calls, role ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (
        new.id,
        COALESCE(CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END, '')
        || ' ' || COALESCE(new.tool_name, '') || ' ' || COALESCE(new.tool_calls, '')
    );
END"""

DROP_MESSAGES_FTS_UPDATE_TRIGGER: Final = "DROP TRIGGER IF EXISTS messages_fts_update"

DROP_MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER: Final = (
    "DROP TRIGGER IF EXISTS messages_fts_trigram_update"
)

#: The text the v30 inline triggers index for a message row, as a SELECT expression.
INDEXED_EXPRESSION_V30: Final = (
    "COALESCE(CASE WHEN role = 'tool' THEN substr(COALESCE(content, ''), 1, 8192)"
    " ELSE content END, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"
)

# --------------------------------------------------------------------------------------------
# The application's own FTS layout 3 (FTS_SQL / FTS_TRIGRAM_SQL at 00704d08), what its
# optimize-storage leaves and what a store it creates fresh has. The `--` comments between
# the source's statements are not stored by SQLite and are left out.
# --------------------------------------------------------------------------------------------

APP_FTS3_SOURCE_VIEW: Final = """\
CREATE VIEW IF NOT EXISTS messages_fts_src AS
    SELECT id,
           CASE WHEN role = 'tool'
                THEN substr(COALESCE(content, ''), 1, 8192)
                ELSE content END AS content,
           tool_name, tool_calls
    FROM messages"""

APP_FTS3_MESSAGES_FTS: Final = """\
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content,
    tool_name,
    tool_calls,
    content='messages_fts_src',
    content_rowid='id'
)"""

APP_FTS3_INSERT_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages
WHEN (new.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'fts_rebuild_high_water'), -1)
   OR new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                          WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (
        new.id,
        CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END,
        new.tool_name,
        new.tool_calls
    );
END"""

APP_FTS3_DELETE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages
WHEN (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                         WHERE key = 'fts_rebuild_high_water'), -1)
   OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                          WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES (
        'delete',
        old.id,
        CASE WHEN old.role = 'tool'
         THEN substr(COALESCE(old.content, ''), 1, 8192)
         ELSE old.content END,
        old.tool_name,
        old.tool_calls
    );
END"""

APP_FTS3_UPDATE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_update
AFTER UPDATE OF content, tool_name, tool_calls, role ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.tool_calls IS NOT new.tool_calls
    OR old.role IS NOT new.role)
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
    VALUES (
        'delete',
        old.id,
        CASE WHEN old.role = 'tool'
         THEN substr(COALESCE(old.content, ''), 1, 8192)
         ELSE old.content END,
        old.tool_name,
        old.tool_calls
    );
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    VALUES (
        new.id,
        CASE WHEN new.role = 'tool'
         THEN substr(COALESCE(new.content, ''), 1, 8192)
         ELSE new.content END,
        new.tool_name,
        new.tool_calls
    );
END"""

APP_FTS3_TRIGRAM_SOURCE_VIEW: Final = """\
CREATE VIEW IF NOT EXISTS messages_fts_trigram_src AS
    SELECT m.id, m.role, m.content, m.tool_name
    FROM messages AS m
    JOIN sessions AS s ON s.id = m.session_id
    WHERE m.role <> 'tool' AND s.source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN json_valid(s.model_config) THEN s.model_config ELSE json_object() END), '$._delegate_from') IS NULL"""  # noqa: E501  (frozen legacy text)

APP_FTS3_MESSAGES_FTS_TRIGRAM: Final = """\
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram USING fts5(
    content,
    tool_name,
    content='messages_fts_trigram_src',
    content_rowid='id',
    tokenize='trigram'
)"""

APP_FTS3_TRIGRAM_INSERT_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_insert AFTER INSERT ON messages
WHEN new.role <> 'tool'
   AND EXISTS (SELECT 1 FROM sessions
               WHERE id = new.session_id AND source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN json_valid(model_config) THEN model_config ELSE json_object() END), '$._delegate_from') IS NULL)
   AND (new.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR new.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(rowid, content, tool_name)
    VALUES (new.id, new.content, new.tool_name);
END"""  # noqa: E501  (frozen legacy text)

APP_FTS3_TRIGRAM_DELETE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_delete AFTER DELETE ON messages
WHEN old.role <> 'tool'
   AND EXISTS (SELECT 1 FROM sessions
               WHERE id = old.session_id AND source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN json_valid(model_config) THEN model_config ELSE json_object() END), '$._delegate_from') IS NULL)
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name)
    VALUES ('delete', old.id, old.content, old.tool_name);
END"""  # noqa: E501  (frozen legacy text)

APP_FTS3_TRIGRAM_UPDATE_TRIGGER: Final = """\
CREATE TRIGGER IF NOT EXISTS messages_fts_trigram_update
AFTER UPDATE OF content, tool_name, role ON messages
WHEN (old.content IS NOT new.content
    OR old.tool_name IS NOT new.tool_name
    OR old.role IS NOT new.role)
   AND (old.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                           WHERE key = 'fts_rebuild_high_water'), -1)
     OR old.id <= COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta
                            WHERE key = 'fts_rebuild_progress'), -1))
BEGIN
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content, tool_name)
    SELECT 'delete', old.id, old.content, old.tool_name
    WHERE old.role <> 'tool'
      AND EXISTS (SELECT 1 FROM sessions
                  WHERE id = old.session_id AND source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN json_valid(model_config) THEN model_config ELSE json_object() END), '$._delegate_from') IS NULL);
    INSERT INTO messages_fts_trigram(rowid, content, tool_name)
    SELECT new.id, new.content, new.tool_name
    WHERE new.role <> 'tool'
      AND EXISTS (SELECT 1 FROM sessions
                  WHERE id = new.session_id AND source NOT IN ('cron', 'subagent') AND json_extract((CASE WHEN json_valid(model_config) THEN model_config ELSE json_object() END), '$._delegate_from') IS NULL);
END"""  # noqa: E501  (frozen legacy text)

#: The (key, value) that marks a store whose FTS is in the application's layout 3.
FTS_STORAGE_VERSION_3: Final = ("fts_storage_version", "3")

# --------------------------------------------------------------------------------------------
# Groups for 22 to 30, in the order the application ran them
# --------------------------------------------------------------------------------------------

#: v22: the rebuild of `session_model_usage`, then its two indexes again.
V22_STEPS: Final = (
    SESSION_MODEL_USAGE_RENAME_TO_V21,
    SESSION_MODEL_USAGE_V22,
    SESSION_MODEL_USAGE_COPY_FROM_V21,
    SESSION_MODEL_USAGE_DROP_V21,
    IDX_SESSION_MODEL_USAGE_SESSION,
    IDX_SESSION_MODEL_USAGE_MODEL,
)

V24_TABLES: Final = (
    GATEWAY_HYGIENE_STATE,
    CONVERSATION_GENERATIONS,
    GATEWAY_HEARTBEATS,
    SESSION_TURN_LEASES,
)

#: v24 indexes, in SCHEMA_SQL order (they only use columns every store has).
V24_INDEXES: Final = (
    IDX_MESSAGES_SESSION_ID,
    IDX_MESSAGES_ASSISTANT_CALLS_BY_SESSION,
    IDX_SESSION_TURN_LEASES_EXPIRES,
)

#: v24 columns, in the reconciler's order (SCHEMA_SQL declaration order).
V24_COLUMNS: Final = (
    SESSIONS_ADD_GIT_METADATA_GENERATION,
    SESSIONS_ADD_TITLE_SOURCE,
    SESSIONS_ADD_LAST_ACTIVITY_AT,
    SESSIONS_ADD_LAST_ACTIVITY_DESCRIPTION,
    SESSIONS_ADD_LAST_ACTIVITY_PROVENANCE,
    SESSIONS_ADD_COMPRESSION_INEFFECTIVE_COUNT,
    SESSIONS_ADD_COMPRESSION_RECOVERY_DEADLINE,
    SESSIONS_ADD_PROFILE_NAME,
    SESSIONS_ADD_PINNED,
    SESSIONS_ADD_HIDDEN,
    SESSIONS_ADD_LAST_READ_AT,
    SESSIONS_ADD_TOOL_NAMES,
    MESSAGES_ADD_COMPRESSED_SUMMARY,
    MESSAGES_ADD_API_CONTENT,
    MESSAGES_ADD_DISPLAY_KIND,
    MESSAGES_ADD_DISPLAY_METADATA,
)

#: v24 as one application open: SCHEMA_SQL (tables, indexes), then the reconciler.
V24_STEPS: Final = (*V24_TABLES, *V24_INDEXES, *V24_COLUMNS)

#: v25 as one application open: SCHEMA_SQL, the reconciler, DEFERRED_INDEX_SQL.
V25_STEPS: Final = (
    SYSTEM_PROMPTS,
    SESSIONS_ADD_SYSTEM_PROMPT_HASH,
    IDX_SESSIONS_SYSTEM_PROMPT_HASH,
)

#: v30 as the older schema-30 build (f31cf971) left it.
V30_STEPS: Final = (IDX_SESSIONS_EFFECTIVE_ACTIVITY,)

V30_DRIFT_COLUMNS: Final = (
    SESSIONS_ADD_CREATED_SOURCE,
    SESSIONS_ADD_COMPRESSION_OVERLOAD_STREAK,
    SESSIONS_ADD_TRANSPORT_PROFILE,
    MESSAGES_ADD_DISPLAY_IDENTITY,
    MESSAGES_ADD_DISPLAY_ORDER,
    ASYNC_DELEGATIONS_ADD_ORIGIN_SESSION_ID,
)

V30_DRIFT_INDEXES: Final = (
    IDX_MESSAGES_DISPLAY_PAGE,
    IDX_MESSAGES_DISPLAY_BACKFILL,
    IDX_MESSAGES_DISPLAY_IDENTITY,
    IDX_SESSIONS_TOOL_NAMES,
)

V30_DRIFT_TRIGGERS: Final = (
    MESSAGES_DISPLAY_ORDER_INSERT_TRIGGER,
    MESSAGES_DISPLAY_VISIBILITY_UPDATE_TRIGGER,
    MESSAGES_DISPLAY_IDENTITY_UPDATE_TRIGGER,
    MESSAGES_DISPLAY_IDENTITY_DELETE_TRIGGER,
)

#: The names of the four display triggers of the v30 drift set.
DISPLAY_TRIGGER_NAMES: Final = (
    "messages_display_order_insert",
    "messages_display_visibility_update",
    "messages_display_identity_update",
    "messages_display_identity_delete",
)

#: What the newest schema-30 build (00704d08) adds on opening any store at 21 or later, in
#: the order it runs: SCHEMA_SQL tables and indexes, the reconciler's columns (SCHEMA_SQL
#: declaration order, table by table), then DEFERRED_INDEX_SQL. A builder applies the ones a
#: store does not have yet.
NEWEST_V30_OPEN: Final = (
    SYSTEM_PROMPTS,
    *V24_TABLES,
    *V24_INDEXES,
    SESSIONS_ADD_CREATED_SOURCE,
    SESSIONS_ADD_SYSTEM_PROMPT_HASH,
    SESSIONS_ADD_GIT_METADATA_GENERATION,
    SESSIONS_ADD_TITLE_SOURCE,
    SESSIONS_ADD_LAST_ACTIVITY_AT,
    SESSIONS_ADD_LAST_ACTIVITY_DESCRIPTION,
    SESSIONS_ADD_LAST_ACTIVITY_PROVENANCE,
    SESSIONS_ADD_COMPRESSION_INEFFECTIVE_COUNT,
    SESSIONS_ADD_COMPRESSION_RECOVERY_DEADLINE,
    SESSIONS_ADD_COMPRESSION_OVERLOAD_STREAK,
    SESSIONS_ADD_PROFILE_NAME,
    SESSIONS_ADD_TRANSPORT_PROFILE,
    SESSIONS_ADD_PINNED,
    SESSIONS_ADD_HIDDEN,
    SESSIONS_ADD_LAST_READ_AT,
    SESSIONS_ADD_TOOL_NAMES,
    MESSAGES_ADD_COMPRESSED_SUMMARY,
    MESSAGES_ADD_API_CONTENT,
    MESSAGES_ADD_DISPLAY_KIND,
    MESSAGES_ADD_DISPLAY_METADATA,
    MESSAGES_ADD_DISPLAY_IDENTITY,
    MESSAGES_ADD_DISPLAY_ORDER,
    ASYNC_DELEGATIONS_ADD_ORIGIN_SESSION_ID,
    IDX_MESSAGES_DISPLAY_PAGE,
    IDX_MESSAGES_DISPLAY_BACKFILL,
    IDX_MESSAGES_DISPLAY_IDENTITY,
    *V30_DRIFT_TRIGGERS,
    IDX_SESSIONS_SYSTEM_PROMPT_HASH,
    IDX_SESSIONS_TOOL_NAMES,
    IDX_SESSIONS_EFFECTIVE_ACTIVITY,
)

#: The newest schema-30 build, on every open of an inline-layout store, replaces an update
#: trigger that fires on any column (`AFTER UPDATE ON messages`, the v11..v21 form) by its own
#: narrow one (`_migrate_broad_fts_update_triggers`). Without that, the display triggers'
#: UPDATE would index a new row before `messages_fts_insert` does, and every INSERT would
#: fail with a constraint error.
NEWEST_V30_NARROW_FTS_UPDATE: Final = (
    DROP_MESSAGES_FTS_UPDATE_TRIGGER,
    LEGACY_FTS_V30_UPDATE_TRIGGER,
)

NEWEST_V30_NARROW_FTS_TRIGRAM_UPDATE: Final = (
    DROP_MESSAGES_FTS_TRIGRAM_UPDATE_TRIGGER,
    LEGACY_FTS_V30_TRIGRAM_UPDATE_TRIGGER,
)

LEGACY_FTS_V30_WORD: Final = (
    MESSAGES_FTS,
    LEGACY_FTS_V30_INSERT_TRIGGER,
    LEGACY_FTS_V30_DELETE_TRIGGER,
    LEGACY_FTS_V30_UPDATE_TRIGGER,
)

LEGACY_FTS_V30_TRIGRAM: Final = (
    MESSAGES_FTS_TRIGRAM,
    LEGACY_FTS_V30_TRIGRAM_INSERT_TRIGGER,
    LEGACY_FTS_V30_TRIGRAM_DELETE_TRIGGER,
    LEGACY_FTS_V30_TRIGRAM_UPDATE_TRIGGER,
)

APP_FTS3_WORD: Final = (
    APP_FTS3_SOURCE_VIEW,
    APP_FTS3_MESSAGES_FTS,
    APP_FTS3_INSERT_TRIGGER,
    APP_FTS3_DELETE_TRIGGER,
    APP_FTS3_UPDATE_TRIGGER,
)

#: Layout 3's trigram half; without the trigram tokenizer only its first statement (the
#: view) succeeds, so such a store has the view and no table or triggers.
APP_FTS3_TRIGRAM: Final = (
    APP_FTS3_TRIGRAM_SOURCE_VIEW,
    APP_FTS3_MESSAGES_FTS_TRIGRAM,
    APP_FTS3_TRIGRAM_INSERT_TRIGGER,
    APP_FTS3_TRIGRAM_DELETE_TRIGGER,
    APP_FTS3_TRIGRAM_UPDATE_TRIGGER,
)

"""Write legacy Hermes store files (schema 17 to 30) from the frozen DDL in `ddl`.

Only the stdlib `sqlite3` is used, so these fixtures stay independent of the SQLAlchemy models
and revisions they are meant to check.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import ddl

__all__ = [
    "LEGACY_VERSIONS",
    "build_legacy_store",
    "insert_legacy_rows",
    "insert_rows",
    "insert_sample_rows",
    "store_system_prompt",
    "system_prompt_hash",
    "write_sessions_json",
]

#: The schema versions `build_legacy_store` can write.
LEGACY_VERSIONS: tuple[int, ...] = tuple(range(17, 31))

#: The first version whose stores can be in the application's own FTS layout 3.
FIRST_APP_FTS_VERSION = 23

StrPath = str | os.PathLike[str]


def build_legacy_store(
    path: StrPath,
    version: int,
    *,
    drift: bool = True,
    fts: bool = True,
    trigram: bool = True,
    fresh_order: bool = False,
    app_fts: bool = False,
) -> None:
    """Create a legacy store at `path` stamped `version`, as the legacy application left it.

    By default the file looks long-lived: the v17 tables, then the drift set and the v18
    columns appended by `ALTER TABLE ... ADD COLUMN`, then each later step's tables, columns
    and indexes in order (v22 rebuilds `session_model_usage` as the application does).

    `drift` says which application build opened the store last. Up to 21 it is the v21 drift
    set: `drift=False` leaves it out (only possible below 21: the v21 schema includes it).
    From 22 on, `drift=True` means the newest schema-30 build opened it and added everything
    of later versions that it adds without a bump (the later steps' tables, columns and
    indexes, and the v30 drift set with its display triggers) and, as it does on every open,
    replaced the inline layout's broad update triggers by its narrow ones (`AFTER UPDATE OF
    content, tool_name, tool_calls, role`); `drift=False` is exactly version N, for 30 the
    older schema-30 build without the v30 drift set, inline triggers as at 21.

    `fresh_order=True` (v21 only) writes a store created fresh at 21, columns in declaration
    order. `fts=False` is a SQLite without FTS5: no FTS tables, no FTS triggers.
    `trigram=False` is a SQLite without the trigram tokenizer: no `messages_fts_trigram` and
    none of its three triggers.

    FTS is the legacy inline layout unless `app_fts=True` (version 23 or later): then it is
    the application's own layout 3 (two views, external-content tables, six triggers) with
    `state_meta` `fts_storage_version = '3'`, as its optimize-storage leaves it. Without the
    trigram tokenizer that layout keeps its `messages_fts_trigram_src` view (the application's
    script stops at the table). An inline store at 23 or later has `fts_optimize_available =
    '1'` in `state_meta`, as the v23 step writes it.
    """
    if version not in LEGACY_VERSIONS:
        raise ValueError(f"legacy version must be one of {LEGACY_VERSIONS}, got {version!r}")
    if fresh_order and version != 21:
        raise ValueError("fresh_order=True builds a store created fresh at v21; use version=21")
    if not drift and version == 21:
        raise ValueError(
            "the v21 schema includes the drift set; drift=False is for versions 17 to 20"
            " and 22 to 30"
        )
    if app_fts and version < FIRST_APP_FTS_VERSION:
        raise ValueError(
            f"app_fts=True is the application's FTS layout 3, which exists from"
            f" v{FIRST_APP_FTS_VERSION}; got version {version}"
        )
    if app_fts and not fts:
        raise ValueError("app_fts=True needs FTS5; it cannot be combined with fts=False")
    target = Path(path)
    if target.exists():
        raise FileExistsError(f"refusing to build a legacy store over existing file {target}")
    target.parent.mkdir(parents=True, exist_ok=True)

    statements = (
        _fresh_v21_statements(fts=fts, trigram=trigram)
        if fresh_order
        else _long_lived_statements(version, drift=drift, fts=fts, trigram=trigram, app_fts=app_fts)
    )
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in statements:
            conn.execute(statement)
        conn.execute(ddl.SCHEMA_VERSION_INSERT, (version,))
        if app_fts:
            conn.execute(ddl.STATE_META_UPSERT, ddl.FTS_STORAGE_VERSION_3)
        elif fts and version >= FIRST_APP_FTS_VERSION:
            conn.execute(ddl.STATE_META_UPSERT, ddl.FTS_OPTIMIZE_AVAILABLE)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _fts_statements(*, fts: bool, trigram: bool) -> list[str]:
    """The inline FTS tables and triggers that this SQLite build would have had."""
    if not fts:
        return []
    return [*ddl.FTS_WORD, *(ddl.FTS_TRIGRAM if trigram else ())]


def _long_lived_statements(
    version: int, *, drift: bool, fts: bool, trigram: bool, app_fts: bool = False
) -> list[str]:
    """A store opened by every application build from v17 up to `version`."""
    statements: list[str] = [*ddl.V17_TABLES, *ddl.V17_INDEXES]
    if not app_fts:
        statements += _fts_statements(fts=fts, trigram=trigram)
    if drift or version >= 21:
        statements += [*ddl.DRIFT_COLUMNS, *ddl.DRIFT_INDEXES]
    if version >= 18:
        statements += ddl.V18_COLUMNS
    if version >= 19:
        statements += ddl.V19_TABLES
    if version >= 20:
        statements += [*ddl.V20_TABLES, *ddl.V20_INDEXES]
    if version >= 21:
        statements += [*ddl.V21_TABLES, *ddl.V21_INDEXES]
    if version >= 22:
        statements += ddl.V22_STEPS
    if version >= 24:
        statements += ddl.V24_STEPS
    if version >= 25:
        statements += ddl.V25_STEPS
    if version >= 30:
        statements += ddl.V30_STEPS
    if drift and version >= 22:
        # The newest schema-30 build opened the store last: it adds what the store lacks.
        statements += [s for s in ddl.NEWEST_V30_OPEN if s not in statements]
        if fts and not app_fts:
            statements += ddl.NEWEST_V30_NARROW_FTS_UPDATE
            if trigram:
                statements += ddl.NEWEST_V30_NARROW_FTS_TRIGRAM_UPDATE
    if app_fts:
        # The application's optimize-storage ran last and left its layout 3.
        statements += ddl.APP_FTS3_WORD
        statements += ddl.APP_FTS3_TRIGRAM if trigram else ddl.APP_FTS3_TRIGRAM[:1]
    return statements


def _fresh_v21_statements(*, fts: bool, trigram: bool) -> list[str]:
    """A store created by the v21 application on an empty file."""
    return [
        *ddl.FRESH_V21_TABLES,
        *ddl.FRESH_V21_INDEXES,
        *_fts_statements(fts=fts, trigram=trigram),
    ]


def _quote_identifier(name: str) -> str:
    """Quote a column or table name for SQLite."""
    return '"' + name.replace('"', '""') + '"'


def _insert(conn: sqlite3.Connection, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
    """Plain INSERT of each row, its columns taken from its keys."""
    for row in rows:
        if not row:
            raise ValueError(f"empty row for table {table}")
        columns = ", ".join(_quote_identifier(column) for column in row)
        marks = ", ".join("?" for _ in row)
        conn.execute(
            f"INSERT INTO {_quote_identifier(table)} ({columns}) VALUES ({marks})",
            tuple(row.values()),
        )


def insert_legacy_rows(
    path: StrPath,
    sessions: Sequence[Mapping[str, Any]],
    messages: Sequence[Mapping[str, Any]],
) -> None:
    """Insert `sessions` then `messages` with plain INSERTs (legacy triggers fire) and commit.

    Column names come from each dict's keys; rows may use different keys. Foreign keys are
    not enforced (SQLite's default, like most legacy connections), so a test can also write
    orphaned rows.
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"no legacy store at {target}")
    conn = sqlite3.connect(target)
    try:
        with conn:
            _insert(conn, "sessions", sessions)
            _insert(conn, "messages", messages)
    finally:
        conn.close()


def insert_rows(path: StrPath, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert `rows` into any `table` with plain INSERTs (triggers fire) and commit.

    For the tables `insert_legacy_rows` does not cover: `session_model_usage`,
    `gateway_routing`, `async_delegations`, the v24 tables, `system_prompts`, ...
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"no legacy store at {target}")
    conn = sqlite3.connect(target)
    try:
        with conn:
            _insert(conn, table, rows)
    finally:
        conn.close()


def system_prompt_hash(prompt: str) -> str:
    """The application's key for a stored system prompt: sha256 of its UTF-8 bytes, hex."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def store_system_prompt(path: StrPath, session_id: str, prompt: str) -> str:
    """Store `prompt` for a session as the v25+ application does and return its hash.

    The prompt goes into `system_prompts` once per distinct text (INSERT OR IGNORE), the
    session points at it by `system_prompt_hash` and its inline `system_prompt` is NULL.
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"no legacy store at {target}")
    digest = system_prompt_hash(prompt)
    conn = sqlite3.connect(target)
    try:
        if not _has_table(conn, "system_prompts"):
            raise ValueError(f"{target} has no system_prompts table (it arrived at v25)")
        with conn:
            conn.execute(ddl.SYSTEM_PROMPT_INSERT, (digest, prompt))
            conn.execute(ddl.SESSIONS_SET_SYSTEM_PROMPT_HASH, (digest, session_id))
    finally:
        conn.close()
    return digest


def _has_table(conn: sqlite3.Connection, table: str) -> bool:
    """Whether `table` exists."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return row is not None


#: The system prompt two of the sample sessions share (stored once from v25 on).
SAMPLE_SYSTEM_PROMPT = (
    "You are Hermes, a helpful assistant. Answer briefly and cite the files you touch."
)


def _sample_sessions(version: int) -> list[dict[str, Any]]:
    """Four sessions: a CLI chat, a Telegram DM, a cron run and a delegated subagent."""
    base = 1_700_000_000.0
    return [
        {
            "id": "20240101_cli",
            "source": "cli",
            "model": "anthropic/claude-sonnet-4",
            "system_prompt": SAMPLE_SYSTEM_PROMPT,
            "started_at": base,
            "ended_at": base + 600.0,
            "end_reason": "user_exit",
            "message_count": 4,
            "tool_call_count": 1,
            "input_tokens": 5200,
            "output_tokens": 830,
            "cache_read_tokens": 4100,
            "api_call_count": 2,
            "billing_provider": "openrouter",
            "estimated_cost_usd": 0.0291,
            "cost_status": "estimated",
            "cwd": "/home/dev/project",
            "git_branch": "main",
            "title": "Refactor the config parser",
        },
        {
            "id": "20240102_telegram",
            "source": "telegram",
            "user_id": "4242",
            "model": "anthropic/claude-sonnet-4",
            "system_prompt": SAMPLE_SYSTEM_PROMPT,
            "started_at": base + 86_400.0,
            "message_count": 2,
            "input_tokens": 900,
            "output_tokens": 120,
            "api_call_count": 1,
            "session_key": "agent:main:telegram:dm:4242",
            "chat_id": "4242",
            "chat_type": "dm",
            **({"display_name": "Ada"} if version >= 18 else {}),
        },
        {
            "id": "20240103_cron",
            "source": "cron",
            "model": "openai/gpt-4.1-mini",
            "system_prompt": "You run scheduled jobs.",
            "started_at": base + 172_800.0,
            "ended_at": base + 172_830.0,
            "message_count": 2,
            "input_tokens": 300,
            "output_tokens": 40,
            "api_call_count": 1,
        },
        {
            "id": "20240101_sub",
            "source": "subagent",
            "parent_session_id": "20240101_cli",
            "model": "anthropic/claude-sonnet-4",
            "model_config": json.dumps({"_delegate_from": "20240101_cli"}),
            "started_at": base + 120.0,
            "ended_at": base + 180.0,
            "message_count": 2,
            "input_tokens": 700,
            "output_tokens": 90,
            "api_call_count": 1,
        },
    ]


def _sample_messages() -> list[dict[str, Any]]:
    """Ten messages, with a tool call and its result, and a CJK line."""
    base = 1_700_000_000.0
    calls = json.dumps(
        [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "config.py"}'},
            }
        ]
    )
    tool_result = {"tool_call_id": "call_1", "tool_name": "read_file"}
    cli, tg, cron, sub = "20240101_cli", "20240102_telegram", "20240103_cron", "20240101_sub"
    rows: list[tuple[str, str, str | None, float, dict[str, Any]]] = [
        (cli, "user", "Refactor the config parser to use tomllib", 1.0, {}),
        (cli, "assistant", "Let me read the parser first.", 5.0, {"tool_calls": calls}),
        (cli, "tool", "def parse(path): ...", 6.0, tool_result),
        (cli, "assistant", "Done: the parser now uses tomllib.", 30.0, {"finish_reason": "stop"}),
        (sub, "user", "Check the parser tests", 121.0, {}),
        (sub, "assistant", "All parser tests pass.", 150.0, {"finish_reason": "stop"}),
        (tg, "user", "数据库迁移怎么做？", 86_401.0, {"platform_message_id": "m-901"}),
        (tg, "assistant", "Copy the file first, then run alembic upgrade head.", 86_405.0, {}),
        (cron, "user", "Run the nightly backup report", 172_801.0, {}),
        (cron, "assistant", "Backup report: 3 databases, all fresh.", 172_820.0, {}),
    ]
    return [
        {"session_id": sid, "role": role, "content": content, "timestamp": base + offset, **extra}
        for sid, role, content, offset, extra in rows
    ]


def _sample_usage(version: int) -> list[dict[str, Any]]:
    """Per-model usage: one row per session, plus a compression row from v22 (task key)."""
    rows = [
        {
            "session_id": "20240101_cli",
            "model": "anthropic/claude-sonnet-4",
            "billing_provider": "openrouter",
            "api_call_count": 2,
            "input_tokens": 5200,
            "output_tokens": 830,
            "cache_read_tokens": 4100,
            "estimated_cost_usd": 0.0291,
            "cost_status": "estimated",
            "first_seen": 1_700_000_000.0,
            "last_seen": 1_700_000_600.0,
        },
        {
            "session_id": "20240102_telegram",
            "model": "anthropic/claude-sonnet-4",
            "api_call_count": 1,
            "input_tokens": 900,
            "output_tokens": 120,
            "first_seen": 1_700_086_400.0,
            "last_seen": 1_700_086_405.0,
        },
    ]
    if version >= 22:
        rows.append(
            {
                "session_id": "20240101_cli",
                "model": "anthropic/claude-sonnet-4",
                "billing_provider": "openrouter",
                "task": "compression",
                "api_call_count": 1,
                "input_tokens": 3000,
                "output_tokens": 400,
                "first_seen": 1_700_000_300.0,
                "last_seen": 1_700_000_300.0,
            }
        )
    return rows


def _sample_v24_rows() -> dict[str, list[dict[str, Any]]]:
    """One row in each table v24 brought."""
    return {
        "gateway_hygiene_state": [
            {"session_key": "agent:main:telegram:dm:4242", "failure_streak": 1}
        ],
        "conversation_generations": [
            {"source": "telegram", "session_key": "agent:main:telegram:dm:4242", "generation": 2}
        ],
        "gateway_heartbeats": [
            {
                "backend_id": "gw-1",
                "pid": 4321,
                "started_at": 1_700_086_000.0,
                "last_heartbeat": 1_700_086_500.0,
                "profile": "default",
                "host": "devbox",
            }
        ],
        "session_turn_leases": [
            {
                "conversation_id": "agent:main:telegram:dm:4242",
                "holder": "gw-1:4321",
                "acquired_at": 1_700_086_401.0,
                "expires_at": 1_700_086_461.0,
            }
        ],
    }


def insert_sample_rows(path: StrPath) -> dict[str, list[dict[str, Any]]]:
    """Fill a store with a small real-looking data set for its schema version; return it.

    Four sessions (CLI, Telegram, cron, a delegated subagent) and their messages in every
    version; from 19 a gateway route, from 20 per-model usage (from 22 also a row with a
    non-empty `task`), from 21 an async delegation, from 24 a row in each of its tables. The
    system prompts are inline below 25; from 25 they are stored once in `system_prompts` and
    the sessions hold `system_prompt_hash` (inline `system_prompt` NULL). Rows use only
    columns of their version, so they fit with or without drift. Returns the rows written per
    table, as stored (the message dicts without their ids, which are 1 to 10 in order).
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"no legacy store at {target}")
    conn = sqlite3.connect(target)
    try:
        (version,) = conn.execute("SELECT version FROM schema_version").fetchone()
        sessions = _sample_sessions(version)
        written: dict[str, list[dict[str, Any]]] = {
            "sessions": sessions,
            "messages": _sample_messages(),
        }
        if version >= 25:
            prompts = {s["system_prompt"] for s in sessions if s.get("system_prompt")}
            written["system_prompts"] = [
                {"hash": system_prompt_hash(p), "prompt": p} for p in sorted(prompts)
            ]
            for session in sessions:
                prompt = session.pop("system_prompt", None)
                if prompt is not None:
                    session["system_prompt_hash"] = system_prompt_hash(prompt)
        if version >= 19:
            entry = {"session_id": "20240102_telegram", "platform": "telegram"}
            written["gateway_routing"] = [
                {
                    "session_key": "agent:main:telegram:dm:4242",
                    "entry_json": json.dumps(entry),
                    "updated_at": 1_700_086_405.0,
                }
            ]
        if version >= 20:
            written["session_model_usage"] = _sample_usage(version)
        if version >= 21:
            written["async_delegations"] = [
                {
                    "delegation_id": "del-1",
                    "origin_session": "20240101_cli",
                    "parent_session_id": "20240101_cli",
                    "state": "completed",
                    "dispatched_at": 1_700_000_120.0,
                    "completed_at": 1_700_000_180.0,
                    "updated_at": 1_700_000_181.0,
                    "result_json": json.dumps({"summary": "All parser tests pass."}),
                    "delivery_state": "delivered",
                    "delivery_attempts": 1,
                    "delivered_at": 1_700_000_182.0,
                }
            ]
        if version >= 24:
            written.update(_sample_v24_rows())
        with conn:
            for table in ("system_prompts", "sessions", "messages"):
                if table in written:
                    _insert(conn, table, written[table])
            for table, rows in written.items():
                if table not in ("system_prompts", "sessions", "messages"):
                    _insert(conn, table, rows)
    finally:
        conn.close()
    return written


def write_sessions_json(hermes_home: StrPath, data: Mapping[str, Any] | str | bytes) -> Path:
    """Write the gateway index `<hermes_home>/sessions/sessions.json` and return its path.

    A mapping is serialised as JSON; a `str` or `bytes` is written verbatim, so tests can
    write malformed or non-UTF-8 files.
    """
    target = Path(hermes_home) / "sessions" / "sessions.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        target.write_bytes(data)
    elif isinstance(data, str):
        target.write_text(data, encoding="utf-8")
    else:
        target.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return target

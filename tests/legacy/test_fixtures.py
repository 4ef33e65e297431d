"""The legacy store builders produce what docs/legacy-store.md describes.

The expected v21 schema below is restated from the spec by hand, independently of `ddl.py`,
so a typo in the frozen DDL shows up as a difference here. The additions of 22 to 30 are
restated the same way from the application's schema 30 (NousResearch/hermes-agent): which
version brought what (undated columns attributed to 24), and what only the newest schema-30
build adds without a bump.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from . import ddl
from .build import (
    LEGACY_VERSIONS,
    build_legacy_store,
    insert_legacy_rows,
    insert_rows,
    insert_sample_rows,
    store_system_prompt,
    system_prompt_hash,
    write_sessions_json,
)
from .schema import diff_snapshots, schema_snapshot, table_data

# (type, default, notnull, pk position) per column, straight from the spec's tables.
T, I, R = "TEXT", "INTEGER", "REAL"  # noqa: E741
Col = tuple[str, str | None, bool, int]


def _plain(
    names: str, kind: str, default: str | None = None, notnull: bool = False
) -> dict[str, Col]:
    return {name: (kind, default, notnull, 0) for name in names.split()}


EXPECTED_V21_COLUMNS: dict[str, dict[str, Col]] = {
    "schema_version": {"version": (I, None, True, 0)},
    "sessions": {
        "id": (T, None, False, 1),
        "source": (T, None, True, 0),
        **_plain("user_id session_key chat_id chat_type thread_id display_name origin_json", T),
        "expiry_finalized": (I, "0", False, 0),
        **_plain("model model_config system_prompt parent_session_id", T),
        "started_at": (R, None, True, 0),
        "ended_at": (R, None, False, 0),
        "end_reason": (T, None, False, 0),
        **_plain("message_count tool_call_count", I, "0"),
        **_plain(
            "input_tokens output_tokens cache_read_tokens cache_write_tokens reasoning_tokens",
            I,
            "0",
        ),
        **_plain("cwd git_branch git_repo_root billing_provider billing_base_url billing_mode", T),
        **_plain("estimated_cost_usd actual_cost_usd", R),
        **_plain("cost_status cost_source pricing_version title", T),
        "api_call_count": (I, "0", False, 0),
        **_plain("handoff_state handoff_platform handoff_error", T),
        "compression_failure_cooldown_until": (R, None, False, 0),
        "compression_failure_error": (T, None, False, 0),
        **_plain("compression_fallback_streak rewind_count archived", I, "0", notnull=True),
    },
    "messages": {
        "id": (I, None, True, 1),  # rowid alias: never NULL (see schema.py)
        **_plain("session_id role", T, notnull=True),
        **_plain("content tool_call_id tool_calls tool_name effect_disposition", T),
        "timestamp": (R, None, True, 0),
        "token_count": (I, None, False, 0),
        **_plain(
            "finish_reason reasoning reasoning_content reasoning_details"
            " codex_reasoning_items codex_message_items platform_message_id",
            T,
        ),
        "observed": (I, "0", False, 0),
        "active": (I, "1", True, 0),
        "compacted": (I, "0", True, 0),
    },
    "state_meta": {"key": (T, None, False, 1), "value": (T, None, False, 0)},
    "compression_locks": {
        "session_id": (T, None, False, 1),
        "holder": (T, None, True, 0),
        **_plain("acquired_at expires_at", R, notnull=True),
    },
    "gateway_routing": {
        "scope": (T, "''", True, 1),
        "session_key": (T, None, True, 2),
        "entry_json": (T, None, True, 0),
        "updated_at": (R, None, True, 0),
    },
    "session_model_usage": {
        "session_id": (T, None, True, 1),
        "model": (T, None, True, 2),
        "billing_provider": (T, "''", True, 3),
        "billing_base_url": (T, "''", True, 4),
        "billing_mode": (T, "''", True, 5),
        **_plain(
            "api_call_count input_tokens output_tokens cache_read_tokens cache_write_tokens"
            " reasoning_tokens",
            I,
            "0",
            notnull=True,
        ),
        **_plain("estimated_cost_usd actual_cost_usd", R, "0", notnull=True),
        **_plain("cost_status cost_source", T),
        **_plain("first_seen last_seen", R),
    },
    "async_delegations": {
        "delegation_id": (T, None, False, 1),
        "origin_session": (T, None, True, 0),
        "origin_ui_session_id": (T, "''", True, 0),
        "parent_session_id": (T, None, False, 0),
        "state": (T, None, True, 0),
        "dispatched_at": (R, None, True, 0),
        "completed_at": (R, None, False, 0),
        "updated_at": (R, None, True, 0),
        **_plain("event_json result_json", T),
        "delivery_state": (T, "'pending'", True, 0),
        "delivery_attempts": (I, "0", True, 0),
        "delivered_at": (R, None, False, 0),
        **_plain("owner_pid owner_started_at", I),
        **_plain("task_json delivery_claim", T),
        "delivery_claimed_at": (R, None, False, 0),
    },
}

# index name -> (table, unique, key columns, partial WHERE clause)
EXPECTED_V21_INDEXES: dict[str, tuple[str, bool, tuple[str, ...], str | None]] = {
    "idx_sessions_source": ("sessions", False, ("source",), None),
    "idx_sessions_source_id": ("sessions", False, ("source", "id"), None),
    "idx_sessions_parent": ("sessions", False, ("parent_session_id",), None),
    "idx_sessions_started": ("sessions", False, ("started_at DESC",), None),
    "idx_sessions_session_key": ("sessions", False, ("session_key", "started_at DESC"), None),
    "idx_sessions_gateway_peer": (
        "sessions",
        False,
        ("source", "user_id", "chat_id", "chat_type", "thread_id", "started_at DESC"),
        None,
    ),
    "idx_sessions_handoff_state": ("sessions", False, ("handoff_state", "started_at"), None),
    "idx_sessions_title_unique": ("sessions", True, ("title",), "title is not null"),
    "idx_messages_session": ("messages", False, ("session_id", "timestamp"), None),
    "idx_messages_session_active": (
        "messages",
        False,
        ("session_id", "active", "timestamp"),
        None,
    ),
    "idx_messages_active_null": ("messages", False, ("active",), "active is null"),
    "idx_messages_platform_msg_id": (
        "messages",
        False,
        ("session_id", "platform_message_id"),
        "platform_message_id is not null",
    ),
    "idx_compression_locks_expires": ("compression_locks", False, ("expires_at",), None),
    "idx_session_model_usage_session": ("session_model_usage", False, ("session_id",), None),
    "idx_session_model_usage_model": ("session_model_usage", False, ("model",), None),
    "idx_async_delegations_delivery": (
        "async_delegations",
        False,
        ("delivery_state", "completed_at"),
        None,
    ),
}

DRIFT_COLUMNS = {
    "sessions": {
        "compression_failure_cooldown_until",
        "compression_failure_error",
        "compression_fallback_streak",
    },
    "messages": {"effect_disposition"},
}
DRIFT_INDEXES = {"idx_messages_active_null", "idx_sessions_handoff_state"}
V18_COLUMNS = {"display_name", "origin_json", "expiry_finalized"}
LATER_TABLES = {19: "gateway_routing", 20: "session_model_usage", 21: "async_delegations"}
LATER_INDEXES = {
    20: {"idx_session_model_usage_session", "idx_session_model_usage_model"},
    21: {"idx_async_delegations_delivery"},
}


def _build(tmp_path: Path, version: int, **options: bool) -> Path:
    path = tmp_path / f"state-{version}-{len(list(tmp_path.iterdir()))}.db"
    build_legacy_store(path, version, **options)
    return path


def _columns(snapshot: dict[str, Any], table: str) -> dict[str, Col]:
    return {
        name: (c["type"], c["default"], c["notnull"], c["pk"])
        for name, c in snapshot["tables"][table]["columns"].items()
    }


def _indexes(snapshot: dict[str, Any]) -> dict[str, tuple[str, bool, tuple[str, ...], Any]]:
    return {
        name: (table, index["unique"], index["columns"], index["where"])
        for table, info in snapshot["tables"].items()
        for name, index in info["indexes"].items()
    }


def _column_order(path: Path, table: str) -> list[str]:
    with closing(sqlite3.connect(path)) as conn, conn:
        return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def _session(session_id: str = "s1", **extra: Any) -> dict[str, Any]:
    return {"id": session_id, "source": "cli", "started_at": 1_700_000_000.0, **extra}


def _message(**values: Any) -> dict[str, Any]:
    return {"session_id": "s1", "role": "user", "timestamp": 1_700_000_001.0, **values}


# ------------------------------------------------------------------------------------------
# Versions, tables, columns, indexes
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fresh_order", [False, True])
def test_v21_matches_the_spec(tmp_path: Path, fresh_order: bool) -> None:
    snapshot = schema_snapshot(_build(tmp_path, 21, fresh_order=fresh_order))

    assert set(snapshot["tables"]) == set(EXPECTED_V21_COLUMNS)
    for table, expected in EXPECTED_V21_COLUMNS.items():
        assert _columns(snapshot, table) == expected, table
    assert _indexes(snapshot) == EXPECTED_V21_INDEXES
    fks = {table: info["foreign_keys"] for table, info in snapshot["tables"].items()}
    assert fks == {
        "schema_version": (),
        "sessions": (("sessions", ("parent_session_id",), ("id",), "NO ACTION", "NO ACTION"),),
        "messages": (("sessions", ("session_id",), ("id",), "NO ACTION", "NO ACTION"),),
        "state_meta": (),
        "compression_locks": (),
        "gateway_routing": (),
        "session_model_usage": (("sessions", ("session_id",), ("id",), "NO ACTION", "CASCADE"),),
        "async_delegations": (),
    }
    autoincrement = {t for t, info in snapshot["tables"].items() if info["autoincrement"]}
    assert autoincrement == {"messages"}
    assert snapshot["views"] == {}


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_schema_version_holds_one_row_with_the_version(tmp_path: Path, version: int) -> None:
    path = _build(tmp_path, version)

    assert table_data(path, "schema_version") == [{"version": version}]
    with closing(sqlite3.connect(path)) as conn, conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "sqlite_sequence" in names  # messages.id is AUTOINCREMENT


UP_TO_21 = [version for version in LEGACY_VERSIONS if version <= 21]


@pytest.mark.parametrize("version", UP_TO_21)
def test_each_version_has_exactly_its_steps(tmp_path: Path, version: int) -> None:
    snapshot = schema_snapshot(_build(tmp_path, version))

    tables = set(snapshot["tables"])
    for since, table in LATER_TABLES.items():
        assert (table in tables) == (version >= since), table
    sessions = set(snapshot["tables"]["sessions"]["columns"])
    assert (sessions >= V18_COLUMNS) == (version >= 18)
    assert not (V18_COLUMNS & sessions) or version >= 18
    indexes = set(_indexes(snapshot))
    for since, names in LATER_INDEXES.items():
        assert (names <= indexes) == (version >= since)
        assert not (names & indexes) or version >= since
    # Everything of a v17 store is what the v21 spec says, minus what came later.
    for table, columns in _columns_by_table(snapshot).items():
        for name, column in columns.items():
            assert EXPECTED_V21_COLUMNS[table][name] == column, f"{table}.{name}"
    for name, index in _indexes(snapshot).items():
        assert EXPECTED_V21_INDEXES[name] == index, name


def _columns_by_table(snapshot: dict[str, Any]) -> dict[str, dict[str, Col]]:
    return {table: _columns(snapshot, table) for table in snapshot["tables"]}


@pytest.mark.parametrize("version", [17, 18, 19, 20])
def test_drift_set_follows_the_drift_flag(tmp_path: Path, version: int) -> None:
    with_drift = schema_snapshot(_build(tmp_path, version, drift=True))
    without = schema_snapshot(_build(tmp_path, version, drift=False))

    for table, names in DRIFT_COLUMNS.items():
        assert names <= set(with_drift["tables"][table]["columns"])
        assert not names & set(without["tables"][table]["columns"])
    assert set(_indexes(with_drift)) >= DRIFT_INDEXES
    assert not DRIFT_INDEXES & set(_indexes(without))


def test_v17_without_drift_is_the_v17_baseline(tmp_path: Path) -> None:
    snapshot = schema_snapshot(_build(tmp_path, 17, drift=False))

    expected = {
        table: dict(columns)
        for table, columns in EXPECTED_V21_COLUMNS.items()
        if table not in LATER_TABLES.values()
    }
    for name in V18_COLUMNS | DRIFT_COLUMNS["sessions"]:
        del expected["sessions"][name]
    del expected["messages"]["effect_disposition"]
    assert _columns_by_table(snapshot) == expected
    later = DRIFT_INDEXES.union(*LATER_INDEXES.values())
    assert set(_indexes(snapshot)) == set(EXPECTED_V21_INDEXES) - later


def test_fresh_and_long_lived_v21_are_equal_but_ordered_differently(tmp_path: Path) -> None:
    long_lived = _build(tmp_path, 21)
    fresh = _build(tmp_path, 21, fresh_order=True)

    assert diff_snapshots(schema_snapshot(long_lived), schema_snapshot(fresh)) == ""
    assert schema_snapshot(long_lived) == schema_snapshot(fresh)
    long_order = _column_order(long_lived, "sessions")
    assert long_order != _column_order(fresh, "sessions")
    assert long_order[-3:] == ["display_name", "origin_json", "expiry_finalized"]
    assert _column_order(long_lived, "messages")[-1] == "effect_disposition"
    assert _column_order(fresh, "messages")[7] == "effect_disposition"


def test_builder_rejects_stores_the_spec_does_not_describe(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one of"):
        build_legacy_store(tmp_path / "a.db", 16)
    with pytest.raises(ValueError, match="fresh"):
        build_legacy_store(tmp_path / "b.db", 20, fresh_order=True)
    with pytest.raises(ValueError, match="drift"):
        build_legacy_store(tmp_path / "c.db", 21, drift=False)
    path = _build(tmp_path, 17)
    with pytest.raises(FileExistsError):
        build_legacy_store(path, 17)


# ------------------------------------------------------------------------------------------
# Full-text search
# ------------------------------------------------------------------------------------------


def test_triggers_are_the_six_legacy_names(tmp_path: Path) -> None:
    snapshot = schema_snapshot(_build(tmp_path, 21))

    assert set(snapshot["triggers"]) == set(ddl.FTS_TRIGGER_NAMES)
    assert {t["table"] for t in snapshot["triggers"].values()} == {"messages"}
    assert snapshot["virtual_tables"] == {
        "messages_fts": "create virtual table messages_fts using fts5(content)",
        "messages_fts_trigram": (
            "create virtual table messages_fts_trigram using fts5(content,tokenize=trigram)"
        ),
    }


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_without_fts5_there_are_no_fts_tables_or_triggers(tmp_path: Path, version: int) -> None:
    path = _build(tmp_path, version, fts=False)
    snapshot = schema_snapshot(path)

    assert set(snapshot["triggers"]) <= set(ddl.DISPLAY_TRIGGER_NAMES)  # not FTS triggers
    assert snapshot["virtual_tables"] == {}
    assert snapshot["views"] == {}
    assert table_data(path, "state_meta") == []
    with closing(sqlite3.connect(path)) as conn, conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert not {name for name in names if name.startswith("messages_fts")}
    insert_legacy_rows(path, [_session()], [_message(content="still writable")])
    assert len(table_data(path, "messages")) == 1


def test_without_trigram_only_the_trigram_table_is_missing(tmp_path: Path) -> None:
    snapshot = schema_snapshot(_build(tmp_path, 21, trigram=False))

    assert set(snapshot["virtual_tables"]) == {"messages_fts"}
    assert set(snapshot["triggers"]) == {
        "messages_fts_insert",
        "messages_fts_delete",
        "messages_fts_update",
    }


def _search(path: Path, table: str, query: str) -> list[int]:
    with closing(sqlite3.connect(path)) as conn, conn:
        sql = f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid"
        return [row[0] for row in conn.execute(sql, (query,))]


@pytest.mark.parametrize("version", [17, 21])
def test_messages_are_indexed_by_the_legacy_triggers(tmp_path: Path, version: int) -> None:
    path = _build(tmp_path, version, drift=False) if version < 21 else _build(tmp_path, 21)
    insert_legacy_rows(
        path,
        [_session()],
        [
            _message(content="the quick brown fox"),
            _message(role="tool", content=None, tool_name="web_search", tool_calls='[{"id":1}]'),
        ],
    )

    assert _search(path, "messages_fts", "fox") == [1]
    assert _search(path, "messages_fts", "web_search") == [2]
    assert _search(path, "messages_fts_trigram", '"brow"') == [1]
    with closing(sqlite3.connect(path)) as conn, conn:
        indexed = conn.execute("SELECT id, c0 FROM messages_fts_content ORDER BY id").fetchall()
        expected = conn.execute(
            f"SELECT id, {ddl.INDEXED_EXPRESSION} FROM messages ORDER BY id"
        ).fetchall()
        assert indexed == expected
        assert indexed[1] == (2, ' web_search [{"id":1}]')
        conn.execute("UPDATE messages SET content = 'a lazy dog' WHERE id = 1")
        conn.execute("UPDATE messages SET active = 0 WHERE id = 2")
        conn.execute("DELETE FROM messages WHERE id = 2")

    assert _search(path, "messages_fts", "fox") == []
    assert _search(path, "messages_fts", "dog") == [1]
    assert _search(path, "messages_fts_trigram", '"laz"') == [1]
    assert _search(path, "messages_fts", "web_search") == []
    assert _search(path, "messages_fts_trigram", '"web_search"') == []


# ------------------------------------------------------------------------------------------
# Helpers: snapshot normalisation, data, sessions.json
# ------------------------------------------------------------------------------------------


def _snapshot_of(*statements: str) -> dict[str, Any]:
    conn = sqlite3.connect(":memory:")
    try:
        for statement in statements:
            conn.execute(statement)
        return schema_snapshot(conn)
    finally:
        conn.close()


def test_snapshot_ignores_spelling_but_not_meaning() -> None:
    legacy = _snapshot_of(
        "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, n INTEGER DEFAULT 0, s TEXT)",
        "CREATE INDEX IF NOT EXISTS ix ON t(n DESC) WHERE s IS NOT NULL",
        "CREATE VIRTUAL TABLE IF NOT EXISTS f USING fts5(content, tokenize='trigram')",
    )
    respelled = _snapshot_of(
        'CREATE TABLE "T" (s text, N integer default (0), "id" INTEGER NOT NULL, PRIMARY KEY (id))',
        'CREATE INDEX ix ON "t" ( "n" desc )  where S  is not   NULL;',
        'CREATE VIRTUAL TABLE f USING fts5("content", tokenize = "trigram")',
    )
    text_default = _snapshot_of(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER DEFAULT '0', s TEXT)",
        "CREATE INDEX ix ON t(n DESC) WHERE s IS NOT NULL",
        "CREATE VIRTUAL TABLE f USING fts5(content, tokenize='trigram')",
    )

    assert diff_snapshots(legacy, respelled) == ""
    assert diff_snapshots(legacy, text_default, ("legacy", "new")) == (
        "tables.t.columns.n.default: legacy='0' new=\"'0'\""
    )


def test_diff_names_what_differs(tmp_path: Path) -> None:
    old = schema_snapshot(_build(tmp_path, 17, drift=False))
    new = schema_snapshot(_build(tmp_path, 17))

    diff = diff_snapshots(old, new, ("old", "new")).splitlines()

    assert (
        "tables.messages.columns.effect_disposition: only in new: "
        + repr({"type": "TEXT", "default": None, "notnull": False, "pk": 0})
        in diff
    )
    assert any(
        line.startswith("tables.sessions.indexes.idx_sessions_handoff_state") for line in diff
    )
    assert len(diff) == 6  # four drift columns and two drift indexes


def test_table_data_ignores_column_order() -> None:
    one = sqlite3.connect(":memory:")
    two = sqlite3.connect(":memory:")
    one.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    two.execute("CREATE TABLE t (b TEXT, a INTEGER)")
    one.executemany("INSERT INTO t (a, b) VALUES (?, ?)", [(2, "x"), (None, "y"), (1, None)])
    two.executemany("INSERT INTO t (b, a) VALUES (?, ?)", [(None, 1), ("x", 2), ("y", None)])

    assert table_data(one, "t") == table_data(two, "t")
    assert table_data(one, "t")[0] == {"a": None, "b": "y"}


def test_insert_legacy_rows_uses_the_given_columns(tmp_path: Path) -> None:
    path = _build(tmp_path, 18)
    insert_legacy_rows(
        path,
        [_session(), _session("s2", parent_session_id="s1", title="child")],
        [_message(content="hi"), _message(session_id="s2", role="assistant", content="yo")],
    )

    sessions = table_data(path, "sessions")
    assert [s["id"] for s in sessions] == ["s1", "s2"]
    assert sessions[1]["parent_session_id"] == "s1"
    assert sessions[0]["message_count"] == 0  # legacy default
    assert sessions[0]["expiry_finalized"] == 0
    messages = table_data(path, "messages")
    assert [(m["id"], m["active"], m["compacted"]) for m in messages] == [(1, 1, 0), (2, 1, 0)]
    insert_legacy_rows(path, [_session("s3"), _session("s4")], [])  # NULL titles may repeat
    with pytest.raises(sqlite3.IntegrityError, match="title"):
        insert_legacy_rows(path, [_session("s5", title="child")], [])


def test_write_sessions_json(tmp_path: Path) -> None:
    home = tmp_path / "hermes"
    entry = {"session_id": "s1", "origin": {"chat_id": "42"}, "memory_flushed": True}

    path = write_sessions_json(home, {"telegram:42": entry, "_meta": {"v": 1}})
    assert path == home / "sessions" / "sessions.json"
    assert json.loads(path.read_text(encoding="utf-8"))["telegram:42"] == entry
    write_sessions_json(home, "{not json")
    assert path.read_text(encoding="utf-8") == "{not json"
    write_sessions_json(home, b"\xff\xfe")
    assert path.read_bytes() == b"\xff\xfe"


# ------------------------------------------------------------------------------------------
# Schema 22 to 30
# ------------------------------------------------------------------------------------------

LATER_VERSIONS = [version for version in LEGACY_VERSIONS if version >= 22]

# What each step adds, restated by hand: table -> column -> (type, default, notnull, pk).
STEP_COLUMNS: dict[str, dict[str, dict[str, Col]]] = {
    "22": {"session_model_usage": {"task": (T, "''", True, 6)}},
    "24": {
        "sessions": {
            "git_metadata_generation": (I, "0", True, 0),
            **_plain("title_source", T),
            "last_activity_at": (R, None, False, 0),
            **_plain("last_activity_description last_activity_provenance", T),
            "compression_ineffective_count": (I, "0", True, 0),
            "compression_recovery_deadline": (R, None, False, 0),
            "profile_name": (T, None, False, 0),
            **_plain("pinned hidden", I, "0", notnull=True),
            "last_read_at": (R, None, False, 0),
            "tool_names": (T, None, False, 0),
        },
        "messages": {
            "_compressed_summary": (I, "0", True, 0),
            **_plain("api_content display_kind display_metadata", T),
        },
        "gateway_hygiene_state": {
            "session_key": (T, None, False, 1),
            "failure_streak": (I, "0", True, 0),
        },
        "conversation_generations": {
            "source": (T, None, True, 1),
            "session_key": (T, None, True, 2),
            "generation": (I, "0", True, 0),
        },
        "gateway_heartbeats": {
            "backend_id": (T, None, False, 1),
            "pid": (I, None, True, 0),
            **_plain("started_at last_heartbeat", R, notnull=True),
            **_plain("profile host", T, "''", notnull=True),
        },
        "session_turn_leases": {
            "conversation_id": (T, None, False, 1),
            "holder": (T, None, True, 0),
            **_plain("acquired_at expires_at", R, notnull=True),
        },
    },
    "25": {
        "sessions": {"system_prompt_hash": (T, None, False, 0)},
        "system_prompts": {"hash": (T, None, False, 1), "prompt": (T, None, True, 0)},
    },
    "30": {},
    "30 drift": {
        "sessions": {
            "created_source": (T, None, False, 0),
            "compression_overload_streak": (I, "0", True, 0),
            "transport_profile": (T, None, False, 0),
        },
        "messages": {
            "display_identity": ("BLOB", None, False, 0),
            "display_order": (I, None, False, 0),
        },
        "async_delegations": {"origin_session_id": (T, "''", True, 0)},
    },
}

ACTIVE_OR_COMPACTED = "(active=1 or compacted=1)"  # as schema.normalise_sql spaces it
STEP_INDEXES: dict[str, dict[str, tuple[str, bool, tuple[str, ...], str | None]]] = {
    "22": {},
    "24": {
        "idx_messages_session_id": ("messages", False, ("session_id", "id"), None),
        "idx_messages_assistant_calls_by_session": (
            "messages",
            False,
            ("session_id",),
            "role='assistant' and tool_calls is not null",
        ),
        "idx_session_turn_leases_expires": ("session_turn_leases", False, ("expires_at",), None),
    },
    "25": {
        "idx_sessions_system_prompt_hash": ("sessions", False, ("system_prompt_hash",), None),
    },
    "30": {
        "idx_sessions_effective_activity": (
            "sessions",
            False,
            ("<expression> DESC", "started_at DESC"),
            None,
        ),
    },
    "30 drift": {
        "idx_messages_display_page": (
            "messages",
            False,
            ("session_id", "display_order", "active DESC", "id DESC"),
            "active=1 or compacted=1",
        ),
        "idx_messages_display_backfill": (
            "messages",
            False,
            ("session_id",),
            f"(display_order is null or display_identity is null)and{ACTIVE_OR_COMPACTED}",
        ),
        "idx_messages_display_identity": (
            "messages",
            False,
            ("session_id", "display_identity", "display_order"),
            f"display_identity is not null and{ACTIVE_OR_COMPACTED}",
        ),
        "idx_sessions_tool_names": ("sessions", False, ("tool_names",), None),
    },
}
DISPLAY_TRIGGERS = {
    "messages_display_order_insert",
    "messages_display_visibility_update",
    "messages_display_identity_update",
    "messages_display_identity_delete",
}
INLINE_FTS_TRIGGERS = set(ddl.FTS_TRIGGER_NAMES)


def _steps(version: int, drift: bool) -> list[str]:
    """The steps a store at `version` has: exactly its own, or (drift) all of them."""
    steps = [step for step in ("22", "24", "25", "30") if drift or int(step) <= version]
    return [*steps, "30 drift"] if drift else steps


def _expected(version: int, drift: bool) -> tuple[dict[str, dict[str, Col]], dict[str, Any]]:
    columns = {table: dict(cols) for table, cols in EXPECTED_V21_COLUMNS.items()}
    indexes = dict(EXPECTED_V21_INDEXES)
    for step in _steps(version, drift):
        for table, added in STEP_COLUMNS[step].items():
            columns.setdefault(table, {}).update(added)
        indexes.update(STEP_INDEXES[step])
    return columns, indexes


EXPECTED_V21_USAGE_KEY = (
    "session_id",
    "model",
    "billing_provider",
    "billing_base_url",
    "billing_mode",
)


def _primary_key(table: dict[str, Any]) -> tuple[str, ...]:
    keyed = [(column["pk"], name) for name, column in table["columns"].items() if column["pk"]]
    return tuple(name for _pk, name in sorted(keyed))


def _state_meta(path: Path) -> dict[str, str]:
    return {row["key"]: row["value"] for row in table_data(path, "state_meta")}


def _sql(path: Path, name: str) -> str:
    with closing(sqlite3.connect(path)) as conn, conn:
        return conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]


@pytest.mark.parametrize("drift", [True, False])
@pytest.mark.parametrize("version", LATER_VERSIONS)
def test_versions_22_to_30_have_exactly_their_steps(
    tmp_path: Path, version: int, drift: bool
) -> None:
    path = _build(tmp_path, version, drift=drift)
    snapshot = schema_snapshot(path)
    columns, indexes = _expected(version, drift)

    assert _columns_by_table(snapshot) == columns
    assert _indexes(snapshot) == indexes
    display = DISPLAY_TRIGGERS if drift else set()
    assert set(snapshot["triggers"]) == INLINE_FTS_TRIGGERS | display
    # The newest build narrows the broad inline update triggers (else its display trigger's
    # UPDATE would index each new row twice and every INSERT would fail).
    narrow = "after update of content,tool_name,tool_calls,role on messages"
    for name in ("messages_fts_update", "messages_fts_trigram_update"):
        assert (narrow in snapshot["triggers"][name]["sql"]) == drift, name
    assert "after insert on messages begin" in snapshot["triggers"]["messages_fts_insert"]["sql"]
    assert "8192" not in snapshot["triggers"]["messages_fts_insert"]["sql"]  # kept as created
    assert table_data(path, "schema_version") == [{"version": version}]
    # The reconciler adds columns without REFERENCES: system_prompt_hash has no foreign key.
    assert snapshot["tables"]["sessions"]["foreign_keys"] == (
        ("sessions", ("parent_session_id",), ("id",), "NO ACTION", "NO ACTION"),
    )
    assert snapshot["views"] == {}


@pytest.mark.parametrize("version", LATER_VERSIONS)
def test_distinctive_objects_arrive_at_their_version(tmp_path: Path, version: int) -> None:
    snapshot = schema_snapshot(_build(tmp_path, version, drift=False))
    tables = snapshot["tables"]

    usage_key = _primary_key(tables["session_model_usage"])
    assert usage_key[-1] == "task"
    assert usage_key == (*EXPECTED_V21_USAGE_KEY, "task")
    assert ("gateway_heartbeats" in tables) == (version >= 24)
    assert ("tool_names" in tables["sessions"]["columns"]) == (version >= 24)
    assert ("system_prompts" in tables) == (version >= 25)
    assert ("system_prompt_hash" in tables["sessions"]["columns"]) == (version >= 25)
    indexes = _indexes(snapshot)
    assert ("idx_sessions_effective_activity" in indexes) == (version >= 30)
    assert "idx_sessions_tool_names" not in indexes
    assert "created_source" not in tables["sessions"]["columns"]
    assert not DISPLAY_TRIGGERS & set(snapshot["triggers"])


def test_with_drift_every_later_version_is_the_newest_30(tmp_path: Path) -> None:
    """drift=True is the newest schema-30 build's open: same schema at 22 as at 30."""
    newest = schema_snapshot(_build(tmp_path, 30))
    for version in LATER_VERSIONS:
        assert diff_snapshots(schema_snapshot(_build(tmp_path, version)), newest) == ""


def test_26_to_29_change_nothing_after_25(tmp_path: Path) -> None:
    at_25 = schema_snapshot(_build(tmp_path, 25, drift=False))
    for version in (26, 27, 28, 29):
        assert schema_snapshot(_build(tmp_path, version, drift=False)) == at_25


def test_v22_differs_from_v21_only_by_the_usage_task(tmp_path: Path) -> None:
    v21 = schema_snapshot(_build(tmp_path, 21))
    v22 = schema_snapshot(_build(tmp_path, 22, drift=False))

    assert diff_snapshots(v21, v22, ("v21", "v22")).splitlines() == [
        "tables.session_model_usage.columns.task: only in v22: "
        + repr({"type": "TEXT", "default": "''", "notnull": True, "pk": 6})
    ]


def test_v22_usage_table_is_the_applications_rebuild(tmp_path: Path) -> None:
    path = _build(tmp_path, 22, drift=False)

    sql = _sql(path, "session_model_usage")
    assert sql == ddl.SESSION_MODEL_USAGE_V22
    assert sql.startswith("CREATE TABLE session_model_usage (\n" + " " * 35 + "session_id ")
    with closing(sqlite3.connect(path)) as conn, conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "session_model_usage_v21" not in names
    insert_legacy_rows(path, [_session()], [])
    usage = {"session_id": "s1", "model": "m", "input_tokens": 10}
    insert_rows(path, "session_model_usage", [usage, {**usage, "task": "compression"}])
    assert sorted(row["task"] for row in table_data(path, "session_model_usage")) == [
        "",
        "compression",
    ]
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        insert_rows(path, "session_model_usage", [{**usage, "task": "compression"}])


def test_v21_usage_key_has_no_task(tmp_path: Path) -> None:
    path = _build(tmp_path, 21)
    insert_legacy_rows(path, [_session()], [])
    insert_rows(path, "session_model_usage", [{"session_id": "s1", "model": "m"}])
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        insert_rows(path, "session_model_usage", [{"session_id": "s1", "model": "m"}])


def test_later_columns_are_appended_as_the_reconciler_writes_them(tmp_path: Path) -> None:
    exact = _build(tmp_path, 30, drift=False)
    newest = _build(tmp_path, 22, drift=True)

    assert _column_order(exact, "sessions")[-13:] == [
        *STEP_COLUMNS["24"]["sessions"],
        "system_prompt_hash",
    ]
    # The newest build adds everything missing in one pass, in its declaration order.
    assert _column_order(newest, "sessions")[-16:] == [
        "created_source",
        "system_prompt_hash",
        "git_metadata_generation",
        "title_source",
        "last_activity_at",
        "last_activity_description",
        "last_activity_provenance",
        "compression_ineffective_count",
        "compression_recovery_deadline",
        "compression_overload_streak",
        "profile_name",
        "transport_profile",
        "pinned",
        "hidden",
        "last_read_at",
        "tool_names",
    ]
    assert _column_order(newest, "messages")[-6:] == [
        "_compressed_summary",
        "api_content",
        "display_kind",
        "display_metadata",
        "display_identity",
        "display_order",
    ]
    assert _column_order(newest, "async_delegations")[-1] == "origin_session_id"
    sessions_sql = _sql(newest, "sessions")
    assert '"tool_names" TEXT' in sessions_sql
    assert '"pinned" INTEGER NOT NULL DEFAULT 0' in sessions_sql
    assert "system_prompts" not in sessions_sql  # no REFERENCES from the reconciler


@pytest.mark.parametrize(
    ("version", "options", "expected"),
    [
        (21, {}, {}),
        (22, {}, {}),
        (23, {"drift": False}, {"fts_optimize_available": "1"}),
        (30, {}, {"fts_optimize_available": "1"}),
        (30, {"fts": False}, {}),
        (23, {"app_fts": True}, {"fts_storage_version": "3"}),
        (30, {"app_fts": True, "trigram": False}, {"fts_storage_version": "3"}),
    ],
)
def test_state_meta_records_the_fts_layout(
    tmp_path: Path, version: int, options: dict[str, bool], expected: dict[str, str]
) -> None:
    assert _state_meta(_build(tmp_path, version, **options)) == expected


def test_builder_rejects_app_fts_where_it_cannot_exist(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="v23"):
        build_legacy_store(tmp_path / "a.db", 22, app_fts=True)
    with pytest.raises(ValueError, match="FTS5"):
        build_legacy_store(tmp_path / "b.db", 30, app_fts=True, fts=False)
    build_legacy_store(tmp_path / "c.db", 22, drift=False)  # allowed from 22 on


@pytest.mark.parametrize("drift", [True, False])
@pytest.mark.parametrize("version", LATER_VERSIONS)
def test_inline_triggers_index_messages_at_every_later_version(
    tmp_path: Path, version: int, drift: bool
) -> None:
    path = _build(tmp_path, version, drift=drift)
    insert_legacy_rows(
        path,
        [_session()],
        [
            _message(content="the quick brown fox"),
            _message(role="tool", content="ok", tool_name="web_search", tool_calls="[]"),
        ],
    )

    assert _search(path, "messages_fts", "fox") == [1]
    assert _search(path, "messages_fts", "web_search") == [2]
    assert _search(path, "messages_fts_trigram", '"brow"') == [1]
    if drift:  # messages_display_order_insert numbered the rows
        orders = {m["id"]: m["display_order"] for m in table_data(path, "messages")}
        assert orders == {1: 1, 2: 2}
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE messages SET content = 'a lazy dog' WHERE id = 1")
        conn.execute("DELETE FROM messages WHERE id = 2")
    assert _search(path, "messages_fts", "fox") == []
    assert _search(path, "messages_fts", "dog") == [1]
    assert _search(path, "messages_fts_trigram", '"web_search"') == []


@pytest.mark.parametrize("drift", [True, False])
def test_v30_without_trigram_keeps_writing(tmp_path: Path, drift: bool) -> None:
    path = _build(tmp_path, 30, drift=drift, trigram=False)
    insert_legacy_rows(path, [_session()], [_message(content="hello world")])

    snapshot = schema_snapshot(path)
    assert set(snapshot["virtual_tables"]) == {"messages_fts"}
    base = {"messages_fts_insert", "messages_fts_delete", "messages_fts_update"}
    assert set(snapshot["triggers"]) == base | (DISPLAY_TRIGGERS if drift else set())
    assert _search(path, "messages_fts", "hello") == [1]


def test_v30_inline_recovery_triggers_cut_tool_rows(tmp_path: Path) -> None:
    """The schema-30 application re-creates lost inline triggers in its own form."""
    path = _build(tmp_path, 30)
    with closing(sqlite3.connect(path)) as conn, conn:
        for name in ddl.FTS_TRIGGER_NAMES:
            conn.execute(f"DROP TRIGGER {name}")
        for statement in (*ddl.LEGACY_FTS_V30_WORD, *ddl.LEGACY_FTS_V30_TRIGRAM):
            conn.execute(statement)
    long_output = "x" * 9000 + " needle"
    insert_legacy_rows(
        path,
        [_session()],
        [
            _message(content="deploy the service"),
            _message(role="tool", content=long_output, tool_name="shell"),
        ],
    )

    snapshot = schema_snapshot(path)
    assert set(snapshot["triggers"]) == INLINE_FTS_TRIGGERS | DISPLAY_TRIGGERS
    assert (
        "after update of content,tool_name,tool_calls,role on messages"
        in (snapshot["triggers"]["messages_fts_update"]["sql"])
    )
    assert _search(path, "messages_fts", "deploy") == [1]
    assert _search(path, "messages_fts", "shell") == [2]
    assert _search(path, "messages_fts", "needle") == []  # past the 8192-character cut
    with closing(sqlite3.connect(path)) as conn, conn:
        indexed = conn.execute("SELECT id, c0 FROM messages_fts_content ORDER BY id").fetchall()
        expected = conn.execute(
            f"SELECT id, {ddl.INDEXED_EXPRESSION_V30} FROM messages ORDER BY id"
        ).fetchall()
    assert indexed == expected
    assert len(indexed[1][1]) == 8192 + len("  shell")


def _integrity_check(path: Path, table: str) -> None:
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")


@pytest.mark.parametrize("version", [23, 30])
def test_app_fts_is_the_applications_layout_3(tmp_path: Path, version: int) -> None:
    path = _build(tmp_path, version, app_fts=True)
    snapshot = schema_snapshot(path)

    assert set(snapshot["views"]) == {"messages_fts_src", "messages_fts_trigram_src"}
    assert snapshot["virtual_tables"] == {
        "messages_fts": (
            "create virtual table messages_fts using fts5(content,tool_name,tool_calls,"
            "content=messages_fts_src,content_rowid=id)"
        ),
        "messages_fts_trigram": (
            "create virtual table messages_fts_trigram using fts5(content,tool_name,"
            "content=messages_fts_trigram_src,content_rowid=id,tokenize=trigram)"
        ),
    }
    assert set(snapshot["triggers"]) == INLINE_FTS_TRIGGERS | DISPLAY_TRIGGERS
    with closing(sqlite3.connect(path)) as conn, conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "messages_fts_content" not in names  # external content: no private copy
    assert table_data(path, "schema_version") == [{"version": version}]


def test_app_fts_search_and_trigram_exclusions(tmp_path: Path) -> None:
    path = _build(tmp_path, 30, app_fts=True)
    insert_sample_rows(path)
    # ids: 1-4 cli (3 is the tool row), 5-6 subagent, 7-8 telegram, 9-10 cron

    assert _search(path, "messages_fts", "tomllib") == [1, 4]
    assert _search(path, "messages_fts", "read_file") == [2, 3]  # its call, and the tool row
    assert _search(path, "messages_fts", "backup") == [9, 10]
    assert _search(path, "messages_fts", "parser tests") == [5, 6]
    assert _search(path, "messages_fts_trigram", "数据库") == [7]
    assert _search(path, "messages_fts_trigram", "tomllib") == [1, 4]
    assert _search(path, "messages_fts_trigram", "backup") == []  # cron session
    assert _search(path, "messages_fts_trigram", '"parser tests"') == []  # subagent session
    assert _search(path, "messages_fts_trigram", "read_file") == []  # tool row
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE messages SET content = 'Switch to ruamel' WHERE id = 1")
        conn.execute("UPDATE messages SET active = 0 WHERE id = 2")
        conn.execute("DELETE FROM messages WHERE id IN (3, 9)")
    assert _search(path, "messages_fts", "tomllib") == [4]
    assert _search(path, "messages_fts", "ruamel") == [1]
    assert _search(path, "messages_fts_trigram", "ruamel") == [1]
    assert _search(path, "messages_fts", "backup") == [10]
    for table in ("messages_fts", "messages_fts_trigram"):
        _integrity_check(path, table)


def test_app_fts_without_trigram_keeps_only_the_trigram_view(tmp_path: Path) -> None:
    snapshot = schema_snapshot(_build(tmp_path, 30, app_fts=True, trigram=False))

    assert set(snapshot["virtual_tables"]) == {"messages_fts"}
    assert set(snapshot["views"]) == {"messages_fts_src", "messages_fts_trigram_src"}
    assert set(snapshot["triggers"]) == {
        "messages_fts_insert",
        "messages_fts_delete",
        "messages_fts_update",
        *DISPLAY_TRIGGERS,
    }


# ------------------------------------------------------------------------------------------
# Rows at any version
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "drift"),
    [(v, drift) for v in LEGACY_VERSIONS for drift in (True, False) if drift or v != 21],
)
def test_sample_rows_fit_every_version(tmp_path: Path, version: int, drift: bool) -> None:
    path = _build(tmp_path, version, drift=drift)
    written = insert_sample_rows(path)

    for table, rows in written.items():
        stored = table_data(path, table)
        assert len(stored) == len(rows), table
        for row in rows:
            assert any(all(s[k] == v for k, v in row.items()) for s in stored), (table, row)
    assert "gateway_routing" in written if version >= 19 else "gateway_routing" not in written
    assert ("gateway_heartbeats" in written) == (version >= 24)
    sessions = table_data(path, "sessions")
    if version >= 25:
        assert len(table_data(path, "system_prompts")) == 2  # the shared prompt stored once
        assert all(s["system_prompt"] is None for s in sessions)
        by_id = {s["id"]: s for s in sessions}
        assert by_id["20240101_cli"]["system_prompt_hash"] == system_prompt_hash(
            "You are Hermes, a helpful assistant. Answer briefly and cite the files you touch."
        )
    else:
        assert sum(s["system_prompt"] is not None for s in sessions) == 3
    if version >= 22:
        tasks = sorted(row["task"] for row in table_data(path, "session_model_usage"))
        assert tasks == ["", "", "compression"]


def test_sample_rows_are_found_by_the_inline_index(tmp_path: Path) -> None:
    path = _build(tmp_path, 25)
    insert_sample_rows(path)

    assert _search(path, "messages_fts", "tomllib") == [1, 4]
    assert _search(path, "messages_fts_trigram", "数据库") == [7]
    assert _search(path, "messages_fts_trigram", "backup") == [9, 10]  # inline: no exclusions


def test_store_system_prompt_stores_each_text_once(tmp_path: Path) -> None:
    path = _build(tmp_path, 25, drift=False)
    insert_legacy_rows(path, [_session("a", system_prompt="inline"), _session("b")], [])

    digest = store_system_prompt(path, "a", "Be brief.")
    assert store_system_prompt(path, "b", "Be brief.") == digest
    assert digest == hashlib.sha256(b"Be brief.").hexdigest()
    assert table_data(path, "system_prompts") == [{"hash": digest, "prompt": "Be brief."}]
    sessions = table_data(path, "sessions")
    assert [(s["system_prompt"], s["system_prompt_hash"]) for s in sessions] == [
        (None, digest),
        (None, digest),
    ]
    old = _build(tmp_path, 24, drift=False)
    insert_legacy_rows(old, [_session()], [])
    with pytest.raises(ValueError, match="v25"):
        store_system_prompt(old, "s1", "Be brief.")

"""The legacy store builders produce what shared/spec/legacy-store.md describes.

The expected v21 schema below is restated from the spec by hand, independently of `ddl.py`,
so a typo in the frozen DDL shows up as a difference here.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from . import ddl
from .build import LEGACY_VERSIONS, build_legacy_store, insert_legacy_rows, write_sessions_json
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


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
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

    assert snapshot["triggers"] == {}
    assert snapshot["virtual_tables"] == {}
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

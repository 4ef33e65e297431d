"""A store upgraded from any starting point equals a store created fresh by the revisions, and
the fresh chain reproduces the legacy application's own schema."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from legacy.build import build_legacy_store, insert_legacy_rows
from legacy.schema import diff_snapshots, schema_snapshot, table_data

from hermes_store import migrate

#: Rows that exist at every legacy version (only v17 columns), with awkward values.
SESSIONS: list[dict[str, Any]] = [
    {
        "id": "s1",
        "source": "telegram",
        "user_id": "42",
        "session_key": "agent:main:telegram:dm:42",
        "chat_id": "42",
        "chat_type": "dm",
        "model": "anthropic/claude",
        "started_at": 1_700_000_000.125,
        "ended_at": 1_700_000_500.5,
        "title": "Trip — Paris 🇫🇷",
        "input_tokens": 1200,
        "output_tokens": 300,
        "estimated_cost_usd": 0.0123,
        "rewind_count": 2,
    },
    {"id": "s2", "source": "cli", "parent_session_id": "s1", "started_at": 1_700_000_600.0},
    {"id": "s3", "source": "discord", "started_at": 1_700_000_700.0, "archived": 1},
]
MESSAGES: list[dict[str, Any]] = [
    {"session_id": "s1", "role": "system", "content": "You are Hermes.", "timestamp": 1.0},
    {"session_id": "s1", "role": "user", "content": "plan a trip to Paris", "timestamp": 2.0},
    {
        "session_id": "s1",
        "role": "assistant",
        "tool_calls": '[{"id": "c1", "type": "function", "function": {"name": "web_search"}}]',
        "timestamp": 3.0,
        "token_count": 17,
        "finish_reason": "tool_calls",
    },
    {
        "session_id": "s1",
        "role": "tool",
        "tool_call_id": "c1",
        "tool_name": "web_search",
        "content": "Louvre: open 9-18",
        "timestamp": 4.0,
        "active": 0,
    },
    {"session_id": "s2", "role": "user", "content": "東京の天気は？", "timestamp": 5.0},
    {
        "session_id": "s2",
        "role": "user",
        "content": '\x00json:[{"type": "image_url", "image_url": {"url": "data:,"}}]',
        "timestamp": 6.0,
        "compacted": 1,
    },
]


def _empty(path: Path) -> None:
    path.touch()


def _legacy(version: int, **options: bool) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        build_legacy_store(path, version, **options)
        insert_legacy_rows(path, SESSIONS, MESSAGES)

    return build


STARTING_POINTS = {
    "empty file": _empty,
    "17 without drift": _legacy(17, drift=False),
    "17 with drift": _legacy(17),
    "19": _legacy(19),
    "21 long-lived": _legacy(21),
    "21 fresh order": _legacy(21, fresh_order=True),
    "25 exact": _legacy(25, drift=False),
    "27 with later columns": _legacy(27),
    "30 older build": _legacy(30, drift=False),
    "30 newest build": _legacy(30),
}
HEAD = migrate.head_revision()


def _fresh(tmp_path: Path, revision: str, *, rows: bool) -> Path:
    """A store created by the revisions alone, the same rows inserted afterwards."""
    path = tmp_path / f"fresh-{revision}.db"
    migrate.upgrade(str(path), revision)
    if rows:
        insert_legacy_rows(path, SESSIONS, MESSAGES)
    return path


def _search(path: Path, table: str, query: str) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        sql = f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid"
        return [row[0] for row in conn.execute(sql, (query,))]
    finally:
        conn.close()


def _without_display_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "display_order"} for row in rows]


def _assert_same_schema(fresh: Path, upgraded: Path) -> None:
    diff = diff_snapshots(schema_snapshot(fresh), schema_snapshot(upgraded), ("fresh", "upgraded"))
    assert not diff, "\n" + diff


@pytest.mark.parametrize("start", STARTING_POINTS)
def test_upgrade_to_21_equals_a_fresh_21(tmp_path: Path, start: str) -> None:
    path = tmp_path / "state.db"
    if start.startswith(("25", "27", "30")):
        pytest.skip("a store above 21 is not taken back to 21 by an upgrade")
    STARTING_POINTS[start](path)
    has_rows = start != "empty file"

    migrate.upgrade(str(path), "21")

    fresh = _fresh(tmp_path, "21", rows=has_rows)
    _assert_same_schema(fresh, path)
    for table in ("schema_version", "sessions", "messages"):
        assert table_data(path, table) == table_data(fresh, table), table
    if has_rows:
        # Still the legacy inline layout at 21: both copies of the text untouched.
        for table in ("messages_fts_content", "messages_fts_trigram_content"):
            assert table_data(path, table) == table_data(fresh, table), table
        assert _search(path, "messages_fts", "paris") == [2]
        assert _search(path, "messages_fts", "web_search") == [3, 4]
        assert _search(path, "messages_fts_trigram", "東京の天気") == [5]


@pytest.mark.parametrize("start", STARTING_POINTS)
def test_upgrade_to_head_equals_a_fresh_head(tmp_path: Path, start: str) -> None:
    path = tmp_path / "state.db"
    STARTING_POINTS[start](path)
    has_rows = start != "empty file"

    assert migrate.upgrade(str(path)).after == (HEAD,)

    fresh = _fresh(tmp_path, HEAD, rows=has_rows)
    _assert_same_schema(fresh, path)
    for table in ("schema_version", "sessions"):
        assert table_data(path, table) == table_data(fresh, table), table
    # The display triggers of schema 30 number the messages written from then on; the
    # application fills older rows' display order itself, later, as it pages through them.
    assert _without_display_order(table_data(path, "messages")) == _without_display_order(
        table_data(fresh, "messages")
    )
    if has_rows:
        assert _search(path, "messages_fts", "paris") == [2]
        assert _search(path, "messages_fts", "louvre") == [4]
        assert _search(path, "messages_fts_trigram", "東京の天気") == [5]


@pytest.mark.parametrize(
    ("revision", "drift"),
    [(str(v), drift) for v in range(17, 22) for drift in (True, False) if drift or v < 21],
)
def test_fresh_chain_matches_the_long_lived_legacy_store_at_each_version(
    tmp_path: Path, revision: str, drift: bool
) -> None:
    """Stamped 17 to 20, the chain has the drift set; a legacy store with it is equal."""
    legacy = tmp_path / "legacy.db"
    build_legacy_store(legacy, int(revision), drift=drift)
    fresh = _fresh(tmp_path, revision, rows=False)
    diff = diff_snapshots(schema_snapshot(fresh), schema_snapshot(legacy), ("chain", "legacy"))
    if drift:
        assert not diff, "\n" + diff
    else:
        # Exactly the drift set differs, nothing else.
        assert sorted(line.split(":")[0] for line in diff.splitlines()) == sorted(
            [
                "tables.messages.columns.effect_disposition",
                "tables.messages.indexes.idx_messages_active_null",
                "tables.sessions.columns.compression_failure_cooldown_until",
                "tables.sessions.columns.compression_failure_error",
                "tables.sessions.columns.compression_fallback_streak",
                "tables.sessions.indexes.idx_sessions_handoff_state",
            ]
        )


def test_fresh_chain_reproduces_the_legacy_v21_schema_exactly(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.db"
    build_legacy_store(legacy, 21, fresh_order=True)
    fresh = _fresh(tmp_path, "21", rows=False)

    diff = diff_snapshots(schema_snapshot(fresh), schema_snapshot(legacy), ("chain", "legacy"))
    assert not diff, "\n" + diff
    # And the legacy triggers index what the legacy application indexes.
    for path in (fresh, legacy):
        insert_legacy_rows(path, SESSIONS, MESSAGES)
    for table in ("messages_fts_content", "messages_fts_trigram_content"):
        assert table_data(fresh, table) == table_data(legacy, table), table

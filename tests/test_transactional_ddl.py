"""A revision that fails midway leaves the store exactly as it was before that revision: each
revision's DDL and data steps run in one transaction, on SQLite too."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from legacy import ddl
from legacy.build import build_legacy_store, insert_legacy_rows
from legacy.schema import diff_snapshots, schema_snapshot, table_data
from sqlalchemy.exc import OperationalError

from alembic import op
from hermes_store import migrate
from hermes_store.revisions import fts_head_revision

SESSIONS = [
    {"id": "s1", "source": "cli", "started_at": 1.0, "input_tokens": 5},
    {"id": "s2", "source": "telegram", "started_at": 2.0},
]
MESSAGES = [
    {"session_id": "s1", "role": "user", "content": "where is the Louvre", "timestamp": 1.0},
    {
        "session_id": "s1",
        "role": "tool",
        "tool_name": "maps",
        "content": "Paris 1er",
        "timestamp": 2,
    },
    {"session_id": "s2", "role": "user", "content": "東京タワーの高さ", "timestamp": 3.0},
]


class SimulatedCrash(RuntimeError):
    """Raised by a patched revision, in place of a real failure."""


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ScriptDirectory:
    """The revision scripts, loaded once and used by every upgrade of the test, so that a
    patched revision module is the one that runs (Alembic reloads the files otherwise)."""
    loaded = migrate.script_directory()
    monkeypatch.setattr(ScriptDirectory, "from_config", classmethod(lambda cls, config: loaded))
    return loaded


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path)


def _one(path: Path, sql: str) -> Any:
    conn = _connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _state(path: Path) -> dict[str, Any]:
    """Everything a user could observe: schema, version bookkeeping and every row."""
    tables = {row[0] for row in _one(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    return {
        "schema": schema_snapshot(path),
        "alembic_version": _one(path, "SELECT version_num FROM alembic_version"),
        "data": {table: table_data(path, table) for table in sorted(tables)},
        "sql": sorted(_one(path, "SELECT type, name, sql FROM sqlite_master"), key=repr),
    }


def _assert_same_state(before: dict[str, Any], path: Path) -> None:
    after = _state(path)
    diff = diff_snapshots(before["schema"], after["schema"], ("before", "after the failure"))
    assert not diff, "\n" + diff
    assert after["alembic_version"] == before["alembic_version"]
    assert after["data"] == before["data"]
    assert after["sql"] == before["sql"]


def _search(path: Path, table: str, query: str) -> list[int]:
    sql = f"SELECT rowid FROM {table} WHERE {table} MATCH '{query}' ORDER BY rowid"
    return [row[0] for row in _one(path, sql)]


def _assert_healthy(path: Path) -> None:
    """SQLite's and both FTS5 indexes' own integrity checks pass, and search finds rows."""
    assert _one(path, "PRAGMA integrity_check") == [("ok",)]
    conn = _connect(path)
    try:
        for table in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")
    finally:
        conn.close()
    assert _search(path, "messages_fts", "louvre") == [1]
    assert _search(path, "messages_fts", "maps") == [2]
    assert _search(path, "messages_fts_trigram", "タワー") == [3]


def _legacy_store(tmp_path: Path, version: int) -> Path:
    path = tmp_path / "state.db"
    build_legacy_store(path, version)
    insert_legacy_rows(path, SESSIONS, MESSAGES)
    return path


# --------------------------------------------------------------------------------------------
# Revision 19: DDL then a failing statement
# --------------------------------------------------------------------------------------------


def _fail_after(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    original: Callable[[], None] = module.upgrade

    def upgrade_then_fail() -> None:
        original()  # CREATE TABLE gateway_routing, UPDATE schema_version SET version = 19
        op.execute("INSERT INTO no_such_table VALUES (1)")

    monkeypatch.setattr(module, "upgrade", upgrade_then_fail)


def test_a_failing_revision_19_leaves_the_store_at_18(
    tmp_path: Path, script: ScriptDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _legacy_store(tmp_path, 17)
    migrate.upgrade(str(path), "18")
    before = _state(path)
    assert before["alembic_version"] == [("18",)]
    _fail_after(monkeypatch, script.get_revision("19").module)

    with pytest.raises(OperationalError, match="no_such_table"):
        migrate.upgrade(str(path), "21")

    _assert_same_state(before, path)
    assert _one(path, "SELECT version FROM schema_version") == [(18,)]
    assert "gateway_routing" not in before["schema"]["tables"]
    assert not _one(path, "SELECT 1 FROM sqlite_master WHERE name = 'gateway_routing'")

    monkeypatch.undo()  # the fixed revision: the same store now upgrades
    assert migrate.upgrade(str(path), "21").after == ("21",)
    assert _one(path, "SELECT version FROM schema_version") == [(21,)]


def test_revisions_before_the_failing_one_stay_committed(
    tmp_path: Path, script: ScriptDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From an unversioned legacy 17: adoption and 18 are kept, 19 is rolled back, and the
    store equals one that stopped at 18 on purpose."""
    reference = _legacy_store(tmp_path / "reference", 17)
    migrate.upgrade(str(reference), "18")
    path = _legacy_store(tmp_path, 17)
    _fail_after(monkeypatch, script.get_revision("19").module)

    with pytest.raises(OperationalError):
        migrate.upgrade(str(path))

    _assert_same_state(_state(reference), path)


# --------------------------------------------------------------------------------------------
# Revision 22: fails after converting both indexes in place
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["after the trigram swap", "before the layout marker"])
def test_a_failing_conversion_leaves_the_inline_indexes_intact(
    tmp_path: Path, script: ScriptDirectory, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    path = _legacy_store(tmp_path, 21)
    migrate.upgrade(str(path), "21")
    before = _state(path)
    module = script.get_revision("fts1").module
    converted: list[tuple[str, str, bool]] = []
    original_convert = module._convert

    def convert(name: str, *args: Any, **kwargs: Any) -> None:
        original_convert(name, *args, **kwargs)
        has_copy = module._declaration(f"{name}_content") is not None
        converted.append((name, module._layout(name), has_copy))
        if where == "after the trigram swap" and name == module.TRIGRAM:
            raise SimulatedCrash("crash after the in-place swap")

    monkeypatch.setattr(module, "_convert", convert)
    if where == "before the layout marker":

        def crash(value: str | None) -> None:
            raise SimulatedCrash("crash before the layout marker")

        monkeypatch.setattr(module, "_set_marker", crash)

    with pytest.raises(SimulatedCrash):
        # The conversion is the only step that changes the store (fts2 after it changes
        # nothing on SQLite, and never runs: the conversion failed).
        migrate.upgrade(str(path), app_version=21)

    # The swap did happen inside the transaction, in place (no copy left) ...
    assert converted == [
        ("messages_fts", "external", False),
        ("messages_fts_trigram", "external", False),
    ]
    # ... and was rolled back: inline tables with their copies, legacy triggers, version 21.
    _assert_same_state(before, path)
    assert _one(path, "SELECT version FROM schema_version") == [(21,)]
    tables = {row[0] for row in _one(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"messages_fts_content", "messages_fts_trigram_content"} <= tables
    assert "messages_fts_source" not in before["schema"]["views"]
    assert not _one(path, "SELECT 1 FROM sqlite_master WHERE type = 'view'")
    triggers = _one(path, "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
    assert {name for name, _ in triggers} == set(ddl.FTS_TRIGGER_NAMES)
    _assert_healthy(path)

    # The legacy triggers still keep the inline indexes in step.
    conn = _connect(path)
    with conn:
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp)"
            " VALUES ('s2', 'user', 'croissant recipe', 4.0)"
        )
    conn.close()
    assert _search(path, "messages_fts", "croissant") == [4]

    monkeypatch.undo()  # a later real upgrade completes
    assert migrate.upgrade(str(path), app_version=21).after == ("21", fts_head_revision())
    assert _one(path, "SELECT version FROM schema_version") == [(21,)]
    tables = {row[0] for row in _one(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert not {"messages_fts_content", "messages_fts_trigram_content"} & tables
    _assert_healthy(path)
    assert _search(path, "messages_fts", "croissant") == [4]

"""Revision 18 fills the sessions' gateway columns from `<HERMES_HOME>/sessions/sessions.json`,
best effort: it only fills NULLs, skips what it cannot read, and never fails the upgrade."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from legacy import ddl
from legacy.build import build_legacy_store, insert_legacy_rows, write_sessions_json
from legacy.schema import table_data

from hermes_store import migrate

GATEWAY = ("session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json")
#: What revision 18 gives a row that sessions.json does not mention.
UNTOUCHED = {**dict.fromkeys(GATEWAY), "expiry_finalized": 0}


def _session(session_id: str, **values: Any) -> dict[str, Any]:
    return {"id": session_id, "source": "telegram", "started_at": 1_700_000_000.0, **values}


def _store(
    tmp_path: Path, *sessions: dict[str, Any], v18_columns: bool = False, name: str = "state.db"
) -> Path:
    """A legacy store stamped 17 holding `sessions`; with `v18_columns` a later legacy build
    has already added the v18 columns without bumping the version."""
    path = tmp_path / name
    build_legacy_store(path, 17)
    if v18_columns:
        conn = sqlite3.connect(path)
        with conn:
            for statement in ddl.V18_COLUMNS:
                conn.execute(statement)
        conn.close()
    insert_legacy_rows(path, list(sessions) or [_session("s1")], [])
    return path


def _upgrade(path: Path, **x: str) -> dict[str, dict[str, Any]]:
    """Upgrade to 18 and return the sessions by id (gateway columns only)."""
    assert migrate.upgrade(str(path), "18", x=x or None).after == ("18",)
    rows = table_data(path, "sessions")
    return {row["id"]: {k: row[k] for k in (*GATEWAY, "expiry_finalized")} for row in rows}


def _alembic_version(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("SELECT version_num FROM alembic_version").fetchone()[0])
    finally:
        conn.close()


def test_without_sessions_json_the_gateway_columns_stay_empty(tmp_path: Path) -> None:
    path = _store(tmp_path, _session("s1"), _session("s2", session_key="k2", chat_id="7"))
    sessions = _upgrade(path)
    assert sessions["s1"] == UNTOUCHED
    assert sessions["s2"] == {**UNTOUCHED, "session_key": "k2", "chat_id": "7"}


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        b'{"agent:main": {"session_id": "s1", "display_name": "\xff"}}',  # not UTF-8
        "",
        json.dumps([{"session_id": "s1", "display_name": "Alice"}]),  # a list, not an object
        json.dumps("s1"),
        "null",
    ],
    ids=["malformed", "not-utf8", "empty", "list", "string", "null"],
)
def test_unusable_sessions_json_is_skipped_and_the_upgrade_completes(
    tmp_path: Path, isolated_home: Path, content: str | bytes
) -> None:
    path = _store(tmp_path, _session("s1"))
    write_sessions_json(isolated_home, content)
    assert _upgrade(path)["s1"] == UNTOUCHED
    assert _alembic_version(path) == "18"
    # And the rest of the chain still runs.
    assert migrate.upgrade(str(path)).after == (migrate.head_revision(),)


def test_a_directory_in_place_of_sessions_json_is_skipped(
    tmp_path: Path, isolated_home: Path
) -> None:
    path = _store(tmp_path, _session("s1"))
    (isolated_home / "sessions" / "sessions.json").mkdir(parents=True)
    assert _upgrade(path)["s1"] == UNTOUCHED


def test_an_entry_with_an_origin_fills_every_gateway_column(
    tmp_path: Path, isolated_home: Path
) -> None:
    origin = {"platform": "telegram", "chat_id": 42, "thread_id": "t-9", "user": {"id": 1}}
    write_sessions_json(
        isolated_home,
        {
            "agent:main:telegram:dm:42": {
                "session_id": "s1",
                "session_key": "agent:main:telegram:dm:42:v2",
                "chat_type": "dm",
                "display_name": "Alice — 東京",
                "origin": origin,
                "memory_flushed": True,
            }
        },
    )
    path = _store(tmp_path, _session("s1"), _session("s2"))
    sessions = _upgrade(path)
    s1 = sessions["s1"]
    assert s1["session_key"] == "agent:main:telegram:dm:42:v2"  # entry.session_key wins
    assert (s1["chat_id"], s1["thread_id"]) == ("42", "t-9")
    assert (s1["chat_type"], s1["display_name"]) == ("dm", "Alice — 東京")
    assert json.loads(s1["origin_json"]) == origin
    assert s1["expiry_finalized"] == 1
    assert sessions["s2"] == UNTOUCHED


def test_session_key_falls_back_to_the_json_key(tmp_path: Path, isolated_home: Path) -> None:
    write_sessions_json(
        isolated_home,
        {
            "agent:main:discord:group:5": {"session_id": "s1"},
            "agent:main:slack:dm:6": {"session_id": "s2", "session_key": ""},
        },
    )
    sessions = _upgrade(_store(tmp_path, _session("s1"), _session("s2")))
    assert sessions["s1"] == {**UNTOUCHED, "session_key": "agent:main:discord:group:5"}
    assert sessions["s2"] == {**UNTOUCHED, "session_key": "agent:main:slack:dm:6"}


@pytest.mark.parametrize("origin", ["telegram:42", ["chat_id", 42], None, 42])
def test_an_origin_that_is_not_an_object_fills_nothing_from_it(
    tmp_path: Path, isolated_home: Path, origin: Any
) -> None:
    write_sessions_json(
        isolated_home,
        {"k1": {"session_id": "s1", "origin": origin, "chat_type": "group", "display_name": "G"}},
    )
    sessions = _upgrade(_store(tmp_path, _session("s1")))
    assert sessions["s1"] == {
        **UNTOUCHED,
        "session_key": "k1",
        "chat_type": "group",
        "display_name": "G",
    }


def test_private_keys_non_objects_and_entries_without_session_id_are_skipped(
    tmp_path: Path, isolated_home: Path
) -> None:
    write_sessions_json(
        isolated_home,
        {
            "_meta": {"session_id": "s1", "display_name": "from _meta", "memory_flushed": True},
            "_version": 3,
            "k-list": ["session_id", "s1"],
            "k-string": "s1",
            "k-number": 1,
            "k-null": None,
            "k-no-id": {"display_name": "no id", "origin": {"chat_id": "1"}},
            "k-null-id": {"session_id": None, "display_name": "null id"},
            "k-object-id": {"session_id": {"id": "s1"}, "display_name": "object id"},
            "k-ok": {"session_id": "s2", "display_name": "ok"},
        },
    )
    sessions = _upgrade(_store(tmp_path, _session("s1"), _session("s2")))
    assert sessions["s1"] == UNTOUCHED
    assert sessions["s2"] == {**UNTOUCHED, "session_key": "k-ok", "display_name": "ok"}


def test_values_already_present_are_never_overwritten(tmp_path: Path, isolated_home: Path) -> None:
    """A later legacy build added the v18 columns and wrote some of them: only NULLs fill."""
    write_sessions_json(
        isolated_home,
        {
            "json-key": {
                "session_id": "s1",
                "session_key": "json-session-key",
                "chat_type": "json-chat-type",
                "display_name": "json name",
                "origin": {"chat_id": "json-chat", "thread_id": "json-thread"},
            },
            "json-key-2": {
                "session_id": "s2",
                "display_name": "json name 2",
                "origin": {"chat_id": "json-chat-2", "thread_id": "json-thread-2"},
            },
        },
    )
    kept = {
        "session_key": "app-key",
        "chat_id": "app-chat",
        "chat_type": "app-type",
        "thread_id": "app-thread",
        "display_name": "app name",
        "origin_json": '{"chat_id": "app-chat"}',
    }
    path = _store(
        tmp_path,
        _session("s1", **kept),
        _session("s2", chat_id="app-chat-2", display_name="app name 2"),
        v18_columns=True,
    )
    sessions = _upgrade(path)
    assert sessions["s1"] == {**kept, "expiry_finalized": 0}
    assert sessions["s2"] == {
        "session_key": "json-key-2",
        "chat_id": "app-chat-2",
        "chat_type": None,
        "thread_id": "json-thread-2",
        "display_name": "app name 2",
        "origin_json": json.dumps({"chat_id": "json-chat-2", "thread_id": "json-thread-2"}),
        "expiry_finalized": 0,
    }


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"memory_flushed": True}, 1),
        ({"expiry_finalized": True}, 1),
        ({"expiry_finalized": 1, "memory_flushed": False}, 1),
        ({"memory_flushed": "yes"}, 1),
        ({"memory_flushed": False, "expiry_finalized": 0}, 0),
        ({"memory_flushed": None, "expiry_finalized": ""}, 0),
        ({}, 0),
    ],
)
def test_expiry_finalized_is_set_when_the_entry_says_so(
    tmp_path: Path, isolated_home: Path, entry: dict[str, Any], expected: int
) -> None:
    write_sessions_json(isolated_home, {"k": {"session_id": "s1", **entry}})
    assert _upgrade(_store(tmp_path, _session("s1")))["s1"]["expiry_finalized"] == expected


@pytest.mark.parametrize(
    ("before", "truthy", "after"),
    [(None, True, 1), (None, False, None), (1, False, 1), (0, True, 1), (2, True, 2)],
)
def test_expiry_finalized_only_moves_from_unset_to_set(
    tmp_path: Path, isolated_home: Path, before: int | None, truthy: bool, after: int | None
) -> None:
    write_sessions_json(isolated_home, {"k": {"session_id": "s1", "memory_flushed": truthy}})
    path = _store(tmp_path, _session("s1", expiry_finalized=before), v18_columns=True)
    assert _upgrade(path)["s1"]["expiry_finalized"] == after


def test_an_entry_for_an_unknown_session_changes_nothing(
    tmp_path: Path, isolated_home: Path
) -> None:
    write_sessions_json(
        isolated_home,
        {"k": {"session_id": "gone", "display_name": "x", "origin": {"chat_id": "1"}}},
    )
    path = _store(tmp_path, _session("s1"))
    before = table_data(path, "sessions")
    sessions = _upgrade(path)
    assert sessions == {"s1": UNTOUCHED}
    assert [
        {k: v for k, v in row.items() if k in before[0]} for row in table_data(path, "sessions")
    ] == before


def test_x_hermes_home_takes_precedence_over_the_environment(
    tmp_path: Path, isolated_home: Path
) -> None:
    write_sessions_json(isolated_home, {"from-env": {"session_id": "s1", "display_name": "env"}})
    other_home = tmp_path / "other-home"
    write_sessions_json(other_home, {"from-x": {"session_id": "s1", "display_name": "x"}})

    with_x = _upgrade(_store(tmp_path, _session("s1"), name="x.db"), hermes_home=str(other_home))
    assert (with_x["s1"]["session_key"], with_x["s1"]["display_name"]) == ("from-x", "x")

    from_env = _upgrade(_store(tmp_path, _session("s1"), name="env.db"))
    assert (from_env["s1"]["session_key"], from_env["s1"]["display_name"]) == ("from-env", "env")


def test_a_hostile_index_never_fails_the_migration(tmp_path: Path, isolated_home: Path) -> None:
    write_sessions_json(
        isolated_home,
        {
            "k1": {
                "session_id": "s1",
                "session_key": {"nested": True},
                "chat_type": ["dm"],
                "display_name": 3.5,
                "origin": {"chat_id": {"id": 1}, "thread_id": True, "extra": [None, 1e308]},
                "expiry_finalized": [],
                "memory_flushed": {},
            },
            "k2": {"session_id": 12345, "display_name": False},
            "'; DROP TABLE sessions; --": {"session_id": "s2", "chat_type": "x'y"},
        },
    )
    path = _store(tmp_path, _session("s1"), _session("s2"), _session("12345"))
    sessions = _upgrade(path)
    assert _alembic_version(path) == "18"
    origin = {"chat_id": {"id": 1}, "thread_id": True, "extra": [None, 1e308]}
    assert json.loads(sessions["s1"]["origin_json"]) == origin
    assert sessions["s1"]["expiry_finalized"] == 0  # [] and {} are falsy
    # Quotes in keys and values are data, not SQL.
    assert sessions["s2"] == {
        **UNTOUCHED,
        "session_key": "'; DROP TABLE sessions; --",
        "chat_type": "x'y",
    }

"""Stores of every application version 17..30: adopted, upgraded, and never claiming a
version they do not have.

The relational schema follows the application's numbered versions; the search layout is a
branch of its own (revision fts1) that never touches `schema_version`.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store, insert_legacy_rows
from legacy.schema import diff_snapshots, schema_snapshot, table_data

from alembic import command
from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.errors import SchemaTooNew, StoreError
from hermes_store.revisions import (
    FTS_EXTERNAL_REVISION,
    LAST_APP_VERSION,
    fts_head_revision,
    head_revision,
)

HEAD = head_revision()
PROMPT = "You are Hermes, a careful assistant."
SESSIONS: list[dict[str, Any]] = [
    {
        "id": "s1",
        "source": "telegram",
        "model": "anthropic/claude",
        "system_prompt": PROMPT,
        "started_at": 1_700_000_000.5,
        "input_tokens": 1200,
        "output_tokens": 300,
    },
    {"id": "s2", "source": "cli", "system_prompt": PROMPT, "started_at": 1_700_000_100.0},
    {"id": "s3", "source": "cron", "started_at": 1_700_000_200.0},
]
MESSAGES: list[dict[str, Any]] = [
    {"session_id": "s1", "role": "user", "content": "deploy the docker stack", "timestamp": 1.0},
    {"session_id": "s1", "role": "assistant", "content": "数据库已经备份", "timestamp": 2.0},
    {
        "session_id": "s2",
        "role": "tool",
        "tool_name": "web_search",
        "content": "Louvre: open 9-18",
        "timestamp": 3.0,
    },
    {"session_id": "s3", "role": "user", "content": "nightly report", "timestamp": 4.0},
]
VERSIONS = range(17, LAST_APP_VERSION + 1)
#: A version newer than any this package has a revision for.
NEWER = LAST_APP_VERSION + 1


def scalar(path: Path, sql: str) -> Any:
    with sqlite3.connect(path) as conn:
        row = conn.execute(sql).fetchone()
    return None if row is None else row[0]


def usage_key(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("PRAGMA table_info(session_model_usage)").fetchall()
    return [row[1] for row in sorted(rows, key=lambda row: row[5]) if row[5]]


def legacy_store(path: Path, version: int, **options: Any) -> Path:
    build_legacy_store(path, version, **options)
    insert_legacy_rows(path, SESSIONS, MESSAGES)
    return path


def fresh_head(tmp_path: Path) -> Path:
    path = tmp_path / "fresh.db"
    migrate.upgrade(str(path))
    return path


def assert_same_schema(expected: Path, actual: Path) -> None:
    diff = diff_snapshots(schema_snapshot(expected), schema_snapshot(actual), ("fresh", "upgraded"))
    assert not diff, "\n" + diff


def match(path: Path, table: str, query: str) -> list[int]:
    with sqlite3.connect(path) as conn:
        sql = f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid"
        return [row[0] for row in conn.execute(sql, (query,))]


@pytest.mark.parametrize("drift", [True, False], ids=["drift", "exact"])
@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_upgrades_to_the_fresh_head_and_keeps_every_row(
    tmp_path: Path, version: int, drift: bool
) -> None:
    if version == 21 and not drift:
        pytest.skip("the schema-21 application always has the drift set")
    path = legacy_store(tmp_path / "state.db", version, drift=drift)
    messages_before = table_data(path, "messages")

    result = migrate.upgrade(str(path))

    assert result.adopted == str(version)
    assert result.after == (HEAD,)
    assert (result.schema_before, result.schema_after) == (version, LAST_APP_VERSION)
    assert (result.layout_before, result.layout_after) == ("inline", "external")
    assert_same_schema(fresh_head(tmp_path), path)
    assert scalar(path, "SELECT version FROM schema_version") == LAST_APP_VERSION
    assert scalar(path, "SELECT value FROM state_meta WHERE key = 'hermes_store.fts_layout'") == (
        "external"
    )
    # Every message is still there, with the values it had (new columns only added).
    after = {row["id"]: row for row in table_data(path, "messages")}
    for row in messages_before:
        assert {key: after[row["id"]][key] for key in row} == row
    assert match(path, "messages_fts", "docker") == [1]
    assert match(path, "messages_fts_trigram", "数据库") == [2]
    digest = hashlib.sha256(PROMPT.encode()).hexdigest()
    if version < 25:
        # Schema 25 moved the prompts out of `sessions`, each distinct one stored once.
        assert table_data(path, "system_prompts") == [{"hash": digest, "prompt": PROMPT}]
        pointed = f"SELECT count(*) FROM sessions WHERE system_prompt_hash = '{digest}'"
        assert scalar(path, pointed) == 2
        assert scalar(path, "SELECT count(*) FROM sessions WHERE system_prompt IS NOT NULL") == 0
    else:
        # Written inline into a store already at 25: the application reads them as they are.
        inline = f"SELECT count(*) FROM sessions WHERE system_prompt = '{PROMPT}'"
        assert scalar(path, inline) == 2


def test_the_relational_schema_at_head_is_the_applications_30(tmp_path: Path) -> None:
    """The chain's 30 equals a store the newest schema-30 application wrote (frozen DDL)."""
    legacy = tmp_path / "legacy-30.db"
    build_legacy_store(legacy, 30, drift=True)
    chain = tmp_path / "chain-30.db"
    migrate.upgrade(str(chain), "30")

    diff = diff_snapshots(schema_snapshot(legacy), schema_snapshot(chain), ("app", "chain"))
    assert not diff, "\n" + diff
    assert usage_key(chain)[-1] == "task"


@pytest.mark.parametrize("version", range(22, LAST_APP_VERSION + 1))
def test_each_revision_matches_the_application_at_that_version(
    tmp_path: Path, version: int
) -> None:
    legacy = tmp_path / "legacy.db"
    # Exactly that version; from 30 on, the newest build (the chain's 30 has its drift set).
    build_legacy_store(legacy, version, drift=version >= 30)
    chain = tmp_path / "chain.db"
    migrate.upgrade(str(chain), str(version))

    diff = diff_snapshots(schema_snapshot(legacy), schema_snapshot(chain), ("app", "chain"))
    assert not diff, "\n" + diff


def test_a_usage_row_per_task_can_be_written_after_the_upgrade(tmp_path: Path) -> None:
    """The application at 22+ upserts usage per task; on a 5-column key that fails."""
    path = legacy_store(tmp_path / "state.db", 21)
    migrate.upgrade(str(path))

    assert usage_key(path) == [
        "session_id",
        "model",
        "billing_provider",
        "billing_base_url",
        "billing_mode",
        "task",
    ]
    upsert = (
        "INSERT INTO session_model_usage (session_id, model, task, input_tokens) "
        "VALUES ('s1', 'anthropic/claude', ?, 10) "
        "ON CONFLICT (session_id, model, billing_provider, billing_base_url, billing_mode, task) "
        "DO UPDATE SET input_tokens = input_tokens + excluded.input_tokens"
    )
    with sqlite3.connect(path) as conn:
        for task in ("", "vision", "vision"):
            conn.execute(upsert, (task,))
        rows = conn.execute(
            "SELECT task, input_tokens FROM session_model_usage ORDER BY task"
        ).fetchall()
    # The main loop and vision counted apart, each row upserted in place.
    assert rows == [("", 10), ("vision", 20)]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_search_revision_alone_never_changes_schema_version(
    tmp_path: Path, version: int
) -> None:
    path = legacy_store(tmp_path / "state.db", version, drift=version == 21)
    migrate.upgrade(str(path), str(version))  # adopted at its own version first
    before = schema_snapshot(path)["tables"]

    result = migrate.upgrade(str(path), FTS_EXTERNAL_REVISION)

    assert scalar(path, "SELECT version FROM schema_version") == version
    # fts1 descends from 17: at 17 it is the only head.
    expected = (FTS_EXTERNAL_REVISION,) if version == 17 else (str(version), FTS_EXTERNAL_REVISION)
    assert result.after == expected
    assert result.layout_after == "external"
    assert schema_snapshot(path)["tables"] == before  # no relational change at all
    assert match(path, "messages_fts", "docker") == [1]


def test_app_version_21_converts_search_and_leaves_the_schema_at_21(tmp_path: Path) -> None:
    path = legacy_store(tmp_path / "state.db", 21)
    tables_before = schema_snapshot(path)["tables"]

    result = migrate.upgrade(str(path), app_version=21)

    # The search layout's head: the conversion and every layout revision after it.
    assert result.after == ("21", fts_head_revision())
    assert (result.schema_after, result.layout_after) == (21, "external")
    assert scalar(path, "SELECT version FROM schema_version") == 21
    assert schema_snapshot(path)["tables"] == tables_before
    assert "task" not in usage_key(path)
    # The next plain upgrade (the agent moved on) carries it the rest of the way.
    result = migrate.upgrade(str(path))
    assert (result.schema_before, result.schema_after, result.after) == (
        21,
        LAST_APP_VERSION,
        (HEAD,),
    )
    assert_same_schema(fresh_head(tmp_path), path)


def test_app_version_below_the_store_refuses_and_changes_nothing(tmp_path: Path) -> None:
    path = legacy_store(tmp_path / "state.db", 25, drift=False)
    image = path.read_bytes()

    with pytest.raises(StoreError, match="newer than --app-version 21"):
        migrate.upgrade(str(path), app_version=21)
    assert path.read_bytes() == image


@pytest.mark.parametrize("value", ["16", str(NEWER), "latest"])
def test_app_version_out_of_range_is_a_clear_error(tmp_path: Path, value: str) -> None:
    path = legacy_store(tmp_path / "state.db", 21)
    with pytest.raises(
        StoreError, match=f"supports the application's schema 17 to {LAST_APP_VERSION}"
    ):
        migrate.upgrade(str(path), x={"app_version": value})


def test_the_cli_and_bare_alembic_take_the_app_version(tmp_path: Path) -> None:
    cli_store = legacy_store(tmp_path / "cli.db", 21)
    result = CliRunner().invoke(main, ["upgrade", "--db", str(cli_store), "--app-version", "21"])
    assert result.exit_code == 0, result.output
    assert "application schema: 21 -> 21; search layout: inline -> external" in result.output
    assert scalar(cli_store, "SELECT version FROM schema_version") == 21

    x_store = legacy_store(tmp_path / "x.db", 21)
    # As the bare `alembic -x db=... -x app_version=21 upgrade head` runs it: no connection.
    command.upgrade(migrate.alembic_config(x={"db": str(x_store), "app_version": "21"}), "head")
    assert scalar(x_store, "SELECT version FROM schema_version") == 21
    assert scalar(x_store, "SELECT count(*) FROM alembic_version") == 2


def test_newer_than_the_newest_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    path = legacy_store(tmp_path / "state.db", LAST_APP_VERSION)
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE schema_version SET version = {NEWER}")
    image = path.read_bytes()

    with pytest.raises(SchemaTooNew, match=f"newer than {LAST_APP_VERSION}"):
        migrate.upgrade(str(path))
    assert path.read_bytes() == image


def _misstamped(tmp_path: Path) -> Path:
    """A store an earlier hermes-store upgraded: revision "22", schema 22, 5-column key."""
    path = legacy_store(tmp_path / "state.db", 21)
    migrate.upgrade(str(path), app_version=21)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM alembic_version")
        conn.execute("INSERT INTO alembic_version VALUES ('22')")
        conn.execute("UPDATE schema_version SET version = 22")
        conn.execute("DELETE FROM state_meta WHERE key = 'hermes_store.fts_layout'")
    return path


def test_a_store_misstamped_22_by_an_earlier_hermes_store_is_recognised(tmp_path: Path) -> None:
    path = _misstamped(tmp_path)
    state = migrate.inspect_file(path)
    assert (state.misstamped, state.legacy_version) == (True, 21)

    result = migrate.upgrade(str(path))

    assert result.restamped
    assert (result.before, result.after) == (("22",), (HEAD,))
    assert (result.schema_before, result.schema_after) == (21, LAST_APP_VERSION)
    assert usage_key(path)[-1] == "task"  # the application's real 22 ran this time
    assert_same_schema(fresh_head(tmp_path), path)
    assert match(path, "messages_fts", "docker") == [1]


def test_a_misstamped_store_can_stop_at_the_agents_version(tmp_path: Path) -> None:
    path = _misstamped(tmp_path)

    result = migrate.upgrade(str(path), app_version=21)

    # The search layout's head: the conversion and every layout revision after it.
    assert result.after == ("21", fts_head_revision())
    assert scalar(path, "SELECT version FROM schema_version") == 21
    assert "task" not in usage_key(path)


def _application_layout_store(tmp_path: Path) -> Path:
    return legacy_store(tmp_path / "state.db", 30, app_fts=True)


def _fts_objects(path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT type, name, sql FROM sqlite_master "
            "WHERE name LIKE 'messages_fts%' ORDER BY type, name"
        ).fetchall()


def test_a_store_in_the_applications_own_layout_is_left_as_it_is(tmp_path: Path) -> None:
    path = _application_layout_store(tmp_path)
    objects = _fts_objects(path)

    result = migrate.upgrade(str(path))

    assert (result.layout_before, result.layout_after) == ("application", "application")
    assert _fts_objects(path) == objects
    assert scalar(path, "SELECT value FROM state_meta WHERE key = 'hermes_store.fts_layout'") == (
        "application"
    )
    assert match(path, "messages_fts", "docker") == [1]


def test_search_on_the_applications_layout_refuses_in_one_line(tmp_path: Path) -> None:
    path = _application_layout_store(tmp_path)
    migrate.upgrade(str(path))

    result = CliRunner().invoke(main, ["search", "--db", str(path), "docker"])

    assert result.exit_code == 1
    assert "application's own" in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["check", "storage", "optimize", "stats"])
def test_maintenance_works_on_the_applications_layout(tmp_path: Path, command: str) -> None:
    path = _application_layout_store(tmp_path)
    migrate.upgrade(str(path))

    result = CliRunner().invoke(main, [command, "--db", str(path)])

    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert match(path, "messages_fts", "docker") == [1]

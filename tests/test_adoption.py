"""Adoption of unversioned legacy stores, refusal of what cannot be adopted (file untouched),
and where the store is found: `-x db`, then $HERMES_STORE_URL, then $HERMES_HOME/state.db."""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from legacy import ddl
from legacy.build import build_legacy_store, insert_legacy_rows
from legacy.schema import diff_snapshots, schema_snapshot, table_data

from hermes_store import migrate
from hermes_store.errors import (
    NotADatabase,
    SchemaTooNew,
    SchemaTooOld,
    StoreError,
    UnknownSchema,
)
from hermes_store.revisions import LAST_APP_VERSION

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LATER_TABLES = {19: "gateway_routing", 20: "session_model_usage", 21: "async_delegations"}
DRIFT_COLUMNS = {
    "sessions": {
        "compression_failure_cooldown_until": None,
        "compression_failure_error": None,
        "compression_fallback_streak": 0,
    },
    "messages": {"effect_disposition": None},
}
V18_COLUMNS = {"display_name", "origin_json", "expiry_finalized"}

SESSIONS = [
    {
        "id": "s1",
        "source": "whatsapp",
        "model": "m",
        "started_at": 1_700_000_000.123456789,
        "ended_at": 1_700_000_001.5,
        "title": "Café ☕",
        "input_tokens": 2**40,
        "estimated_cost_usd": 1e-9,
    },
    {"id": "s2", "source": "cli", "parent_session_id": "s1", "started_at": 2.0, "archived": 1},
]
MESSAGES = [
    {"session_id": "s1", "role": "user", "content": "bonjour, une table pour deux", "timestamp": 1},
    {
        "session_id": "s1",
        "role": "user",
        "content": '\x00json:[{"type": "text", "text": "multi"}]',
        "timestamp": 2.5,
        "active": 0,
    },
    {"session_id": "s2", "role": "tool", "tool_name": "shell", "content": "", "timestamp": 3.0},
]


def _sql(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            for statement in statements:
                conn.execute(statement)
    finally:
        conn.close()


def _scalar(path: Path, sql: str) -> Any:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


def _all_data(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table but Alembic's (FTS shadow tables included)."""
    return {table: table_data(path, table) for table in _tables(path) - {"alembic_version"}}


# --------------------------------------------------------------------------------------------
# Adoption
# --------------------------------------------------------------------------------------------

ADOPTABLE = [(v, drift) for v in range(17, 22) for drift in (True, False) if drift or v < 21]
HEAD = migrate.head_revision()


@pytest.mark.parametrize(("version", "drift"), ADOPTABLE)
def test_adoption_stamps_the_store_at_its_own_version(
    tmp_path: Path, version: int, drift: bool
) -> None:
    path = tmp_path / "state.db"
    build_legacy_store(path, version, drift=drift)
    insert_legacy_rows(path, SESSIONS, MESSAGES)
    before = _all_data(path)

    result = migrate.upgrade(str(path), str(version))
    assert (result.before, result.adopted, result.after) == ((), str(version), (str(version),))

    assert _scalar(path, "SELECT group_concat(version_num) FROM alembic_version") == str(version)
    assert table_data(path, "schema_version") == [{"version": version}]
    # No revision after its version ran: later tables are still absent.
    for later, table in LATER_TABLES.items():
        assert (table in _tables(path)) == (later <= version), table
    # The drift set was added: the schema is the one the revisions create at that version.
    reference = tmp_path / "reference.db"
    migrate.upgrade(str(reference), str(version))
    diff = diff_snapshots(schema_snapshot(reference), schema_snapshot(path), ("chain", "adopted"))
    assert not diff, "\n" + diff
    # The data is unchanged; rows only gained the drift columns, with their defaults.
    after = _all_data(path)
    assert set(after) == set(before)
    for table, rows in before.items():
        added = {} if drift else DRIFT_COLUMNS.get(table, {})
        assert after[table] == [{**row, **added} for row in rows], table


@pytest.mark.parametrize(("version", "drift"), ADOPTABLE)
def test_adopted_store_upgrades_to_head_with_its_rows(
    tmp_path: Path, version: int, drift: bool
) -> None:
    path = tmp_path / "state.db"
    build_legacy_store(path, version, drift=drift)
    insert_legacy_rows(path, SESSIONS, MESSAGES)
    messages = table_data(path, "messages")

    assert migrate.upgrade(str(path)).after == (HEAD,)

    assert table_data(path, "schema_version") == [{"version": LAST_APP_VERSION}]
    added = {} if drift else DRIFT_COLUMNS["messages"]
    after = table_data(path, "messages")
    # Later application versions add columns too: the rows keep every value they had.
    assert [{k: row[k] for k in {**messages[0], **added}} for row in after] == [
        {**row, **added} for row in messages
    ]
    sessions = {row["id"]: row for row in table_data(path, "sessions")}
    assert sessions["s1"]["started_at"] == SESSIONS[0]["started_at"]
    assert sessions["s1"]["title"] == "Café ☕"
    conn = sqlite3.connect(path)
    try:
        found = conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'table'")
        assert found.fetchall() == [(1,)]
    finally:
        conn.close()


def test_a_store_stamped_17_that_a_later_legacy_build_extended_upgrades(tmp_path: Path) -> None:
    """A legacy build adds its columns and tables on every open but bumps the version only when
    its FTS work succeeds: a store stamped 17 can already have the v18 to v21 objects."""
    path = tmp_path / "state.db"
    build_legacy_store(path, 17)
    _sql(path, *ddl.V18_COLUMNS, *ddl.V19_TABLES, *ddl.V20_TABLES, *ddl.V20_INDEXES)
    _sql(path, *ddl.V21_TABLES, *ddl.V21_INDEXES)
    insert_legacy_rows(path, [{**SESSIONS[0], "display_name": "kept"}], MESSAGES[:1])

    assert migrate.upgrade(str(path)).after == (HEAD,)

    reference = tmp_path / "reference.db"
    migrate.upgrade(str(reference))
    diff = diff_snapshots(schema_snapshot(reference), schema_snapshot(path), ("fresh", "upgraded"))
    assert not diff, "\n" + diff
    assert table_data(path, "sessions")[0]["display_name"] == "kept"
    assert [row["session_id"] for row in table_data(path, "session_model_usage")] == ["s1"]


def test_an_already_versioned_store_is_not_adopted_again(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    build_legacy_store(path, 19)
    migrate.upgrade(str(path), "19")
    result = migrate.upgrade(str(path), "19")
    assert (result.adopted, result.before, result.after) == (None, ("19",), ("19",))
    assert migrate.upgrade(str(path), "20").after == ("20",)
    assert table_data(path, "schema_version") == [{"version": 20}]


@pytest.mark.parametrize("kind", ["missing", "zero-byte", "missing directory"])
def test_a_new_store_is_created_at_head_readable_by_its_owner_only(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "new" / "state.db" if kind == "missing directory" else tmp_path / "state.db"
    if kind == "zero-byte":
        path.touch(mode=0o644)
        path.chmod(0o644)

    assert migrate.upgrade(str(path)).after == (HEAD,)

    assert table_data(path, "schema_version") == [{"version": LAST_APP_VERSION}]
    assert _scalar(path, "SELECT version_num FROM alembic_version") == HEAD
    for candidate in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
        if candidate.exists():
            assert stat.S_IMODE(candidate.stat().st_mode) == 0o600, candidate.name
    if kind == "missing directory":
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


# --------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------


def _legacy_with(version: int, *statements: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        build_legacy_store(path, version)
        insert_legacy_rows(path, SESSIONS, MESSAGES)
        _sql(path, *statements)

    return make


def _versioned_at(revision: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        migrate.upgrade(str(path))
        _sql(path, f"UPDATE alembic_version SET version_num = '{revision}'")

    return make


def _unrelated(path: Path) -> None:
    _sql(
        path,
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)",
        "INSERT INTO notes VALUES (1, 'x')",
    )


def _text(path: Path) -> None:
    path.write_text("sessions:\n  - id: s1\n", encoding="utf-8")


def _random(path: Path) -> None:
    path.write_bytes(random.Random(1).randbytes(8192))


def _damaged(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + random.Random(2).randbytes(8176))


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "keep.txt").write_text("mine", encoding="utf-8")


#: The refusal of a legacy schema newer than the newest this package knows.
TOO_NEW = f"schema {LAST_APP_VERSION + 1} unversioned"
#: case -> (how to make the file, error, words the message must contain)
REFUSALS: dict[str, tuple[Callable[[Path], None], type[StoreError], tuple[str, ...]]] = {
    "schema 16": (
        _legacy_with(17, "UPDATE schema_version SET version = 16"),
        SchemaTooOld,
        ("legacy schema 16", "17"),
    ),
    TOO_NEW: (
        _legacy_with(21, f"UPDATE schema_version SET version = {LAST_APP_VERSION + 1}"),
        SchemaTooNew,
        (f"legacy schema {LAST_APP_VERSION + 1}", f"newer than {LAST_APP_VERSION}"),
    ),
    "schema 40 unversioned": (
        _legacy_with(21, "UPDATE schema_version SET version = 40"),
        SchemaTooNew,
        ("legacy schema 40",),
    ),
    "unknown revision": (_versioned_at("fts9"), SchemaTooNew, ("'fts9'",)),
    "unrelated tables": (_unrelated, UnknownSchema, ("notes", "schema_version")),
    "schema_version empty": (
        _legacy_with(19, "DELETE FROM schema_version"),
        UnknownSchema,
        ("schema_version", "[]"),
    ),
    "schema_version two rows": (
        _legacy_with(19, "INSERT INTO schema_version VALUES (20)"),
        UnknownSchema,
        ("schema_version", "19", "20"),
    ),
    "sessions missing": (
        _legacy_with(19, "PRAGMA foreign_keys = OFF", "DROP TABLE sessions"),
        UnknownSchema,
        ("'sessions'",),
    ),
    "messages lack columns": (
        _legacy_with(
            19,
            "DROP TABLE messages_fts",
            "DROP TABLE messages_fts_trigram",
            "DROP TABLE messages",
            "CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT)",
        ),
        UnknownSchema,
        ("'messages'", "content", "role", "timestamp"),
    ),
    "text file": (_text, NotADatabase, ("not a SQLite database",)),
    "random bytes": (_random, NotADatabase, ("not a SQLite database",)),
    "damaged SQLite": (_damaged, NotADatabase, ("cannot read",)),
    "directory": (_directory, NotADatabase, ("directory",)),
}


def _state(path: Path) -> dict[str, Any]:
    """What a user could see of the store: its bytes and mode, or a directory's listing."""
    if path.is_dir():
        return {"listing": sorted(p.name for p in path.iterdir()), "mode": path.stat().st_mode}
    return {"bytes": path.read_bytes(), "mode": path.stat().st_mode}


def _assert_untouched(path: Path, before: dict[str, Any], home: Path) -> None:
    assert _state(path) == before, "the refused file was modified"
    assert not path.with_name(path.name + "-journal").exists()
    wal = path.with_name(path.name + "-wal")
    # A read-only look may leave an empty WAL behind; it must hold no frames to replay.
    assert not wal.exists() or wal.stat().st_size == 0
    assert not (home / "state.db").exists(), "a default store was created instead"


def _make(directory: Path, case: str) -> tuple[Path, dict[str, Any]]:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "state.db"
    REFUSALS[case][0](path)
    return path, _state(path)


@pytest.mark.parametrize("case", REFUSALS)
def test_a_store_that_cannot_be_adopted_is_refused_and_left_as_it_was(
    tmp_path: Path, isolated_home: Path, case: str
) -> None:
    path, before = _make(tmp_path, case)
    _, error, words = REFUSALS[case]

    with pytest.raises(error) as raised:
        migrate.upgrade(str(path))

    message = str(raised.value)
    assert str(path) in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    _assert_untouched(path, before, isolated_home)


@pytest.mark.parametrize("case", ["schema 16", "unknown revision", "text file", "directory"])
def test_inspect_file_refuses_without_writing(
    tmp_path: Path, isolated_home: Path, case: str
) -> None:
    path, before = _make(tmp_path, case)
    with pytest.raises(REFUSALS[case][1]):
        migrate.inspect_file(path)
    _assert_untouched(path, before, isolated_home)


def _alembic_runs(
    runs: dict[str, tuple[list[str], dict[str, str]]],
) -> dict[str, tuple[int, str]]:
    """Run the real `alembic` command line once per entry, concurrently, from the project root;
    return each run's exit status and stderr."""
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "alembic", "-c", str(PROJECT_ROOT / "alembic.ini"), *args],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (args, env) in runs.items()
    }
    results = {}
    try:
        for name, process in processes.items():
            _, stderr = process.communicate(timeout=120)
            results[name] = (process.returncode, stderr)
    finally:
        for process in processes.values():  # never left running into later tests
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


#: The refusals the CLI is checked on (those of the brief; the library test covers the rest).
CLI_REFUSALS = [
    "schema 16",
    TOO_NEW,
    "unknown revision",
    "unrelated tables",
    "schema_version empty",
    "schema_version two rows",
    "sessions missing",
    "text file",
    "random bytes",
    "directory",
]


def test_the_alembic_cli_refuses_with_the_message_and_no_traceback(
    tmp_path: Path, isolated_home: Path, subtests: pytest.Subtests
) -> None:
    made = {case: _make(tmp_path / case.replace(" ", "-"), case) for case in CLI_REFUSALS}
    results = _alembic_runs(
        {
            case: (["-x", f"db={path}", "upgrade", "head"], dict(os.environ))
            for case, (path, _) in made.items()
        }
    )
    for case, (path, before) in made.items():
        with subtests.test(case=case):
            returncode, stderr = results[case]
            assert returncode != 0
            assert "Traceback" not in stderr, stderr
            for word in REFUSALS[case][2]:
                assert word in stderr, stderr
            _assert_untouched(path, before, isolated_home)


# --------------------------------------------------------------------------------------------
# Where the store is
# --------------------------------------------------------------------------------------------


def test_store_location_precedence_on_the_cli(tmp_path: Path) -> None:
    """-x db beats $HERMES_STORE_URL, which beats $HERMES_HOME/state.db."""
    homes = {name: tmp_path / name / "home" for name in ("x", "url", "home", "broken-url")}
    x_db = {name: tmp_path / name / "x.db" for name in homes}
    url_db = {name: tmp_path / name / "url.db" for name in homes}
    base = {k: v for k, v in os.environ.items() if k != "HERMES_STORE_URL"}
    url_env = {name: dict(base, HERMES_HOME=str(homes[name])) for name in homes}
    for name in ("x", "url"):
        url_env[name]["HERMES_STORE_URL"] = f"sqlite:///{url_db[name]}"
    broken = url_db["broken-url"]
    broken.parent.mkdir(parents=True)
    _text(broken)
    url_env["broken-url"]["HERMES_STORE_URL"] = str(broken)
    broken_before = _state(broken)

    results = _alembic_runs(
        {
            "x": (["-x", f"db={x_db['x']}", "upgrade", "head"], url_env["x"]),
            "url": (["upgrade", "head"], url_env["url"]),
            "home": (["upgrade", "head"], url_env["home"]),
            "broken-url": (
                ["-x", f"db={x_db['broken-url']}", "upgrade", "17"],
                url_env["broken-url"],
            ),
        }
    )
    for name, (returncode, stderr) in results.items():
        assert returncode == 0, f"{name}: {stderr}"

    def created(name: str) -> list[bool]:
        return [p.exists() for p in (x_db[name], url_db[name], homes[name] / "state.db")]

    assert created("x") == [True, False, False]
    assert created("url") == [False, True, False]
    assert created("home") == [False, False, True]
    assert _scalar(x_db["x"], "SELECT version_num FROM alembic_version") == HEAD
    assert _scalar(url_db["url"], "SELECT version_num FROM alembic_version") == HEAD
    assert _scalar(homes["home"] / "state.db", "SELECT version_num FROM alembic_version") == HEAD
    # A broken $HERMES_STORE_URL does not matter when -x db names the store.
    assert _scalar(x_db["broken-url"], "SELECT version_num FROM alembic_version") == "17"
    assert _state(broken) == broken_before

"""The `hermes-store` console script: every command through click's runner, a few as processes.

The JSON a command prints is checked against the database itself (read with the stdlib
`sqlite3`), and every error path must end in a non-zero exit with a one-line message.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner, Result
from legacy.build import build_legacy_store

from hermes_store import migrate
from hermes_store.cli import demo as demo_command
from hermes_store.cli import every_command, main, progress
from hermes_store.demo import corpus
from hermes_store.engine import ENV_BUSY_TIMEOUT, create_store_engine
from hermes_store.errors import StoreError
from hermes_store.revisions import FTS_EXTERNAL_REVISION, fts_head_revision
from hermes_store.search import search_messages
from hermes_store.sqlite import fts
from hermes_store.sqlite.backend import SQLiteBackend
from hermes_store.sqlite.storage import FTS_COPIES, FTS_INDEX, GROUPS, MESSAGE_DATA

PROJECT_ROOT = Path(__file__).resolve().parent.parent

HEAD = migrate.head_revision()
FTS_INDEXES = ["messages_fts", "messages_fts_trigram"]
#: Commands that only read a store: they must never create one.
READ_ONLY_COMMANDS = (
    ["current"],
    ["stats"],
    ["storage"],
    ["check"],
    ["search", "error"],
)
#: Every command that opens an existing store (optimize writes, but never creates one).
EXISTING_STORE_COMMANDS = (*READ_ONLY_COMMANDS, ["optimize"])
SOURCES = ("cli", "telegram", "discord")
REPORTING_COMMANDS = ("upgrade", "current", "stats", "storage", "optimize", "check", "search")


# --------------------------------------------------------------------------------------
# Stores
# --------------------------------------------------------------------------------------


def _no_wal(path: Path) -> None:
    """A template must be one self-contained file (the last close checkpointed the WAL)."""
    assert not path.with_name(path.name + "-wal").exists()


def fill(path: Path) -> None:
    """200 corpus messages in sessions of three sources, every ninth message rewound.

    Sources and visibility are set here rather than left to the corpus generator, so that
    the filter tests always have something to filter.
    """
    data = corpus.generate(200, 5)
    assert len(data.sessions) >= 2, "the corpus should spread 200 messages over sessions"
    for number, session in enumerate(data.sessions):
        session["source"] = SOURCES[number % len(SOURCES)]
    for number, message in enumerate(data.messages):
        if number % 9 == 4:
            message["active"] = message["compacted"] = 0
    with closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, data)
        conn.commit()
    _no_wal(path)


@pytest.fixture(scope="session")
def head_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store created at head holding the messages of `fill`."""
    path = tmp_path_factory.mktemp("templates") / "head.db"
    migrate.upgrade(str(path))
    fill(path)
    return path


@pytest.fixture(scope="session")
def legacy_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A long-lived schema-21 store (inline FTS5, never under Alembic) filled by `fill`."""
    path = tmp_path_factory.mktemp("templates") / "legacy.db"
    build_legacy_store(path, 21)
    fill(path)
    return path


@pytest.fixture
def head_store(head_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(head_template, tmp_path / "state.db"))


@pytest.fixture
def legacy_store(legacy_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(legacy_template, tmp_path / "legacy.db"))


def query(path: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows of one statement, read with the stdlib driver (independent of the CLI)."""
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


def scalar(path: Path, sql: str, params: Sequence[Any] = ()) -> Any:
    return query(path, sql, params)[0][0]


def fingerprint(path: Path) -> tuple[bytes, int]:
    """Content hash and mtime of a file: proof that a refused command left it alone."""
    return hashlib.sha256(path.read_bytes()).digest(), path.stat().st_mtime_ns


def sidecars(path: Path) -> list[Path]:
    return [
        p for s in ("-wal", "-shm", "-journal") if (p := path.with_name(path.name + s)).exists()
    ]


@contextmanager
def write_lock(path: Path) -> Iterator[None]:
    """Another connection holds the write lock (`BEGIN IMMEDIATE`) while the block runs."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


# --------------------------------------------------------------------------------------
# Running the command
# --------------------------------------------------------------------------------------


def invoke(*args: str | Path, expect: int | None = 0, color: bool = False) -> Result:
    """Run the command in-process; stdout and stderr are kept apart."""
    result = CliRunner().invoke(main, [str(a) for a in args], color=color)
    if expect is not None:
        assert result.exit_code == expect, (result.exit_code, result.output, result.exception)
    if expect == 0:
        assert result.exception is None
    return result


def invoke_json(*args: str | Path, expect: int | None = 0) -> Any:
    result = invoke(*args, "--json", expect=expect)
    return json.loads(result.stdout)


def assert_one_line_error(result: Result, *fragments: str) -> str:
    """Exit 1, a single `Error: ...` line on stderr naming what went wrong, no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    # click turns the expected failures into SystemExit; anything else is a bug.
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.output
    return lines[0]


class Proc(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_process(*args: str | Path, env: dict[str, str] | None = None) -> Proc:
    """The command as a real process: `python -m hermes_store.cli ...`."""
    done = subprocess.run(
        [sys.executable, "-m", "hermes_store.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )
    return Proc(done.returncode, done.stdout, done.stderr)


def assert_process_error(proc: Proc, *fragments: str) -> None:
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# --------------------------------------------------------------------------------------
# Help text
# --------------------------------------------------------------------------------------


def test_every_command_has_help_with_an_example() -> None:
    commands = every_command()
    assert set(commands) >= {
        "upgrade",
        "current",
        "stats",
        "storage",
        "optimize",
        "check",
        "search",
        "demo",
    }
    assert "Example" in invoke("--help").stdout
    for name, command in commands.items():
        text = invoke(name, "--help").stdout
        assert "Example" in text, name
        assert f"hermes-store {name}" in text, name  # the example runs this very command
        assert (command.help or "").strip(), name
        if name in REPORTING_COMMANDS:
            assert "--db" in text, name
            assert "--json" in text, name


def test_help_in_a_real_process() -> None:
    proc = run_process("optimize", "--help")
    assert proc.returncode == 0, proc
    assert "Example" in proc.stdout
    assert "--no-vacuum" in proc.stdout
    assert proc.stdout.startswith("Usage: hermes-store optimize")


# --------------------------------------------------------------------------------------
# upgrade
# --------------------------------------------------------------------------------------


def test_upgrade_adopts_and_converts_a_legacy_store(legacy_store: Path) -> None:
    messages = scalar(legacy_store, "SELECT count(*) FROM messages")
    data = invoke_json("upgrade", "--db", legacy_store)
    assert data["from"] is None
    assert data["legacy_schema"] == 21
    assert data["to"] == HEAD
    assert data["seconds"] >= 0
    assert scalar(legacy_store, "SELECT version_num FROM alembic_version") == HEAD
    assert scalar(legacy_store, "SELECT count(*) FROM messages") == messages
    assert invoke_json("current", "--db", legacy_store)["fts_layout"] == "external"
    # Nothing left to do: the second run says so.
    text = invoke("upgrade", "--db", legacy_store).stdout
    assert text.startswith(f"already at {HEAD}: nothing to do")
    assert text.splitlines()[0].endswith(" s)")


def test_upgrade_text_names_the_legacy_schema(legacy_store: Path) -> None:
    result = invoke("upgrade", "--db", legacy_store)
    assert result.stdout.startswith(f"legacy schema 21 (unversioned) -> {HEAD} in ")
    assert result.stderr == ""  # no progress when not attached to a terminal


def test_upgrade_creates_a_store_step_by_step(tmp_path: Path) -> None:
    path = tmp_path / "new" / "state.db"
    assert invoke("upgrade", "--db", path, "--revision", "21", "--create").stdout.startswith(
        "(new store) -> 21 in "
    )
    assert scalar(path, "SELECT version_num FROM alembic_version") == "21"
    assert invoke_json("current", "--db", path)["revision"] == "21"
    data = invoke_json("upgrade", "--db", path)
    assert (data["from"], data["to"], data["legacy_schema"]) == ("21", HEAD, None)


def test_upgrade_resolves_the_default_store_in_hermes_home(isolated_home: Path) -> None:
    invoke("upgrade", "--create")
    assert scalar(isolated_home / "state.db", "SELECT version_num FROM alembic_version") == HEAD


def test_upgrade_to_an_unknown_revision_is_one_line(head_store: Path) -> None:
    before = fingerprint(head_store)
    result = invoke("upgrade", "--db", head_store, "--revision", "nonesuch", expect=None)
    assert_one_line_error(result, "nonesuch")
    assert fingerprint(head_store)[0] == before[0]


# --------------------------------------------------------------------------------------
# current / stats
# --------------------------------------------------------------------------------------


def test_current_json_matches_the_database(head_store: Path) -> None:
    data = invoke_json("current", "--db", head_store)
    assert data["revision"] == scalar(head_store, "SELECT version_num FROM alembic_version")
    assert data["revision"] == data["head"] == HEAD
    assert data["legacy_schema"] == scalar(head_store, "SELECT version FROM schema_version")
    assert data["fts_layout"] == "external"
    assert data["fts_indexes"] == dict.fromkeys(FTS_INDEXES, "external")
    sql = scalar(head_store, "SELECT sql FROM sqlite_master WHERE name = 'messages_fts'")
    assert "content='messages_fts_source'" in sql.replace(" ", "")


def test_current_on_a_legacy_store(legacy_store: Path) -> None:
    data = invoke_json("current", "--db", legacy_store)
    assert data["revision"] is None
    assert data["legacy_schema"] == 21
    assert data["fts_layout"] == "inline"
    assert data["fts_indexes"] == dict.fromkeys(FTS_INDEXES, "inline")
    text = invoke("current", "--db", legacy_store).stdout
    assert "unversioned" in text
    assert re.search(r"app_schema +21", text)
    assert re.search(r"search_layout +inline", text)
    csv_lines = invoke("current", "--db", legacy_store, "--csv").stdout.splitlines()
    assert csv_lines[0] == "revision,head,app_schema,search_layout"
    assert csv_lines[1].endswith(",21,inline")


def test_stats_json_matches_the_database(head_store: Path) -> None:
    data = invoke_json("stats", "--db", head_store)
    assert data["sessions"] == scalar(head_store, "SELECT count(*) FROM sessions")
    assert data["messages"] == scalar(head_store, "SELECT count(*) FROM messages") == 200
    by_source = dict(query(head_store, "SELECT source, count(*) FROM sessions GROUP BY source"))
    assert data["sessions_by_source"] == by_source
    assert set(by_source) == set(SOURCES[: data["sessions"]])
    assert data["file_bytes"] == head_store.stat().st_size
    assert data["wal_bytes"] == 0
    text = invoke("stats", "--db", head_store).stdout
    assert re.search(rf"messages +{data['messages']}\n", text)
    assert "KiB" in text or "MiB" in text


def test_db_accepts_a_url_and_the_environment(
    head_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert invoke_json("stats", "--db", f"sqlite:///{head_store}")["messages"] == 200
    monkeypatch.setenv("HERMES_STORE_URL", str(head_store))
    assert invoke_json("stats")["messages"] == 200


def test_default_store_is_hermes_home_state_db(head_store: Path, isolated_home: Path) -> None:
    shutil.copy(head_store, isolated_home / "state.db")
    assert invoke_json("current")["revision"] == HEAD


def test_a_url_of_another_database_is_refused() -> None:
    result = invoke("stats", "--db", "mysql://localhost/hermes", expect=None)
    assert_one_line_error(result, "runs on SQLite")


# --------------------------------------------------------------------------------------
# storage
# --------------------------------------------------------------------------------------


def owners(path: Path) -> dict[str, str]:
    return {name: table for name, table in query(path, "SELECT name, tbl_name FROM sqlite_master")}


def test_storage_adds_up_to_the_file_size(head_store: Path) -> None:
    # Free some pages, so that the free list is part of the sum.
    with closing(sqlite3.connect(head_store)) as conn:
        conn.execute("DELETE FROM messages WHERE id % 2 = 0")
        conn.commit()
    _no_wal(head_store)
    data = invoke_json("storage", "--db", head_store)
    size = head_store.stat().st_size
    assert data["freelist_pages"] == scalar(head_store, "PRAGMA freelist_count") > 0
    assert data["file_bytes"] == data["page_size"] * data["page_count"] == size
    assert data["free_bytes"] == data["freelist_pages"] * data["page_size"]
    assert set(data["groups"]) == set(GROUPS)
    assert sum(data["groups"].values()) + data["free_bytes"] == size
    assert sum(data["objects"].values()) == sum(data["groups"].values())
    assert data["layout"] == "external"
    assert data["groups"][FTS_COPIES] == data["reclaimable_bytes"] == 0
    # Each group is the objects of its tables, measured independently with dbstat.
    dbstat = dict(query(head_store, "SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
    assert data["objects"] == dbstat
    owner = owners(head_store)
    messages = sum(size for name, size in dbstat.items() if owner.get(name) == "messages")
    assert data["groups"][MESSAGE_DATA] == messages
    fts = sum(
        size
        for name, size in dbstat.items()
        if owner.get(name, "").startswith("messages_fts") and owner[name] != "messages_fts_source"
    )
    assert data["groups"][FTS_INDEX] == fts


def test_storage_shows_what_upgrading_an_inline_store_reclaims(legacy_store: Path) -> None:
    data = invoke_json("storage", "--db", legacy_store)
    assert data["layout"] == "inline"
    copies = [f"{index}_content" for index in FTS_INDEXES]
    owner = owners(legacy_store)
    content_objects = {name for name, table in owner.items() if table in copies}
    assert content_objects >= set(copies)
    expected = sum(size for name, size in data["objects"].items() if name in content_objects)
    marks = ",".join("?" for _ in content_objects)
    measured = scalar(
        legacy_store, f"SELECT sum(pgsize) FROM dbstat WHERE name IN ({marks})", [*content_objects]
    )
    assert data["reclaimable_bytes"] == data["groups"][FTS_COPIES] == expected == measured > 0
    assert sum(data["groups"].values()) + data["free_bytes"] == legacy_store.stat().st_size

    text = invoke("storage", "--db", legacy_store).stdout
    assert "layout: inline" in text
    assert "would reclaim" in text
    assert "redundant FTS text copies" in text
    assert "messages_fts_content" in text
    assert "KiB" in text

    # The promise holds: after the upgrade and optimize, the copies are gone for good.
    invoke("upgrade", "--db", legacy_store)
    invoke("optimize", "--db", legacy_store, "--vacuum")
    after = invoke_json("storage", "--db", legacy_store)
    assert after["layout"] == "external"
    assert after["reclaimable_bytes"] == 0
    assert not content_objects & set(after["objects"])
    assert after["file_bytes"] < data["file_bytes"]
    assert "would reclaim" not in invoke("storage", "--db", legacy_store).stdout


# --------------------------------------------------------------------------------------
# optimize
# --------------------------------------------------------------------------------------


def test_optimize_reports_sizes_that_match_the_file(head_store: Path) -> None:
    with closing(sqlite3.connect(head_store)) as conn:
        conn.execute("DELETE FROM messages WHERE id > 40")
        conn.commit()
    size_before = head_store.stat().st_size
    data = invoke_json("optimize", "--db", head_store, "--vacuum")
    assert data["bytes_before"] == size_before
    assert data["bytes_after"] == head_store.stat().st_size
    assert data["reclaimed"] == data["bytes_before"] - data["bytes_after"] > 0
    assert data["indexes"] == FTS_INDEXES
    assert data["vacuumed"] is True
    assert scalar(head_store, "PRAGMA freelist_count") == 0
    wal = head_store.with_name(head_store.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    assert invoke_json("check", "--db", head_store)["ok"] is True

    text = invoke("optimize", "--db", head_store, "--vacuum").stdout
    assert " -> " in text
    assert "reclaimed" in text
    assert "merged 2 index(es)" in text


def test_optimize_no_vacuum_keeps_free_pages(head_store: Path) -> None:
    with closing(sqlite3.connect(head_store)) as conn:
        conn.execute("DELETE FROM messages WHERE id > 40")
        conn.commit()
    free = scalar(head_store, "PRAGMA freelist_count")
    data = invoke_json("optimize", "--db", head_store, "--no-vacuum")
    assert data["vacuumed"] is False
    assert data["indexes"] == FTS_INDEXES
    assert scalar(head_store, "PRAGMA freelist_count") >= free > 0


class _Usage(NamedTuple):
    total: int
    used: int
    free: int


def test_optimize_refuses_without_the_space_vacuum_needs(
    head_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def nearly_full(_path: object) -> _Usage:
        return _Usage(total=10 << 30, used=(10 << 30) - 4096, free=4096)

    monkeypatch.setattr(shutil, "disk_usage", nearly_full)
    before = fingerprint(head_store)
    result = invoke("optimize", "--db", head_store, "--vacuum", expect=None)
    assert_one_line_error(result, "VACUUM needs", "free", "without --vacuum")
    assert fingerprint(head_store) == before
    wal = head_store.with_name(head_store.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # nothing was written
    # Without VACUUM there is nothing to refuse.
    assert invoke_json("optimize", "--db", head_store, "--no-vacuum")["vacuumed"] is False
    assert invoke_json("optimize", "--db", head_store)["vacuumed"] is False


def test_progress_only_on_a_terminal_and_never_with_json(
    head_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert invoke("optimize", "--db", head_store).stderr == ""  # piped: nothing extra
    monkeypatch.setattr(progress, "interactive", lambda: True)
    drawn = invoke("optimize", "--db", head_store, "--vacuum").stderr
    assert "merging messages_fts" in drawn
    assert "vacuuming" in drawn
    result = invoke("optimize", "--db", head_store, "--json")
    assert result.stderr == ""
    json.loads(result.stdout)


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------


def test_check_passes_on_healthy_stores(head_store: Path, legacy_store: Path) -> None:
    for path in (head_store, legacy_store):
        data = invoke_json("check", "--db", path)
        assert data == {
            "ok": True,
            "checked": ["PRAGMA integrity_check", *FTS_INDEXES],
            "problems": {},
            "skipped": {},
            # The FTS5 checks ran on a private copy: the store's write lock was never taken.
            "fts_checked_on": "snapshot",
            "longest_write_lock_s": 0.0,
        }
    text = invoke("check", "--db", head_store, "--quick").stdout
    assert text.splitlines()[1].split() == ["PRAGMA", "quick_check", "ok"]
    records = invoke("check", "--db", head_store, "--nl").stdout.splitlines()
    assert [json.loads(line)["item"] for line in records] == [
        "PRAGMA integrity_check",
        *FTS_INDEXES,
    ]
    csv_lines = invoke("check", "--db", head_store, "--csv").stdout.splitlines()
    assert csv_lines[0] == "item,status,detail"
    assert csv_lines[1] == "PRAGMA integrity_check,ok,"


def damage_word_index(path: Path) -> None:
    """Remove a message's tokens from messages_fts under the wrong text: the index lies."""
    victim = scalar(path, "SELECT min(id) FROM messages WHERE content LIKE '% %'")
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "INSERT INTO messages_fts(messages_fts, rowid, content) "
            "VALUES ('delete', ?, 'wrong text')",
            (victim,),
        )
        conn.commit()


def test_check_detects_a_damaged_fts_index(head_store: Path) -> None:
    damage_word_index(head_store)
    result = invoke("check", "--db", head_store, expect=1)
    stderr = result.stderr.strip().splitlines()
    assert len(stderr) == 1
    assert stderr[0].startswith("broken: messages_fts (")
    assert "messages_fts_trigram" not in stderr[0]  # the other index is fine
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert "BROKEN" in lines["messages_fts"]
    assert lines["messages_fts_trigram"].rstrip().endswith("ok")

    result = invoke("check", "--db", head_store, "--json", expect=1)
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert list(data["problems"]) == ["messages_fts"]


def test_check_detects_a_damaged_btree_index(head_store: Path) -> None:
    """An index whose entries no longer match its declaration: integrity_check names it."""
    with closing(sqlite3.connect(head_store)) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(
            "UPDATE sqlite_master SET sql = 'CREATE INDEX idx_sessions_source ON "
            "sessions(started_at)' WHERE name = 'idx_sessions_source'"
        )
        conn.commit()
    result = invoke("check", "--db", head_store, expect=1)
    assert "idx_sessions_source" in result.stderr
    assert result.stderr.startswith("broken: database (")
    data = json.loads(invoke("check", "--db", head_store, "--json", expect=1).stdout)
    assert "idx_sessions_source" in data["problems"]["database"]


def test_check_damage_in_a_real_process(head_store: Path) -> None:
    damage_word_index(head_store)
    proc = run_process("check", "--db", head_store)
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("broken: messages_fts (")
    assert "BROKEN" in proc.stdout


# --------------------------------------------------------------------------------------
# search
# --------------------------------------------------------------------------------------


def message_rows(path: Path) -> dict[int, dict[str, Any]]:
    rows = query(
        path,
        "SELECT m.id, m.session_id, m.role, m.timestamp, s.source, m.active = 1 OR "
        "m.compacted = 1, coalesce(m.content, '') || ' ' || coalesce(m.tool_name, '') || ' ' "
        "|| coalesce(m.tool_calls, '') FROM messages m JOIN sessions s ON s.id = m.session_id",
    )
    keys = ("id", "session_id", "role", "timestamp", "source", "visible", "indexed")
    return {row[0]: dict(zip(keys, row, strict=True)) for row in rows}


def test_search_json_matches_the_database(head_store: Path) -> None:
    rows = message_rows(head_store)
    hits = invoke_json("search", "the", "--db", head_store, "--limit", "1000")
    assert hits
    for hit in hits:
        row = rows[hit["id"]]
        assert (hit["session_id"], hit["role"], hit["source"]) == (
            row["session_id"],
            row["role"],
            row["source"],
        )
        assert hit["timestamp"] == row["timestamp"]
        assert row["visible"]  # rewound messages (neither active nor compacted) are left out
        assert ">>>" in hit["snippet"]
        assert "the" in row["indexed"].lower()  # what the word index holds for it
    # The command is the library function, nothing more.
    engine = create_store_engine(head_store, create=False)
    try:
        with engine.connect() as conn:
            assert hits == json.loads(json.dumps(search_messages(conn, "the", limit=1000)))
    finally:
        engine.dispose()
    assert len(invoke_json("search", "the", "--db", head_store, "--limit", "3")) == 3


def test_search_filters_and_sorts(head_store: Path) -> None:
    rows = message_rows(head_store)
    every = invoke_json("search", "the", "--db", head_store, "--limit", "1000")
    sources = {hit["source"] for hit in every}
    assert len(sources) > 1
    source = sorted(sources)[0]
    only = invoke_json("search", "the", "--db", head_store, "--limit", "1000", "--source", source)
    assert {hit["id"] for hit in only} == {hit["id"] for hit in every if hit["source"] == source}

    users = invoke_json("search", "the", "--db", head_store, "--limit", "1000", "--role", "user")
    assert users
    assert {hit["id"] for hit in users} == {hit["id"] for hit in every if hit["role"] == "user"}

    newest = invoke_json("search", "the", "--db", head_store, "--limit", "1000", "--sort", "newest")
    oldest = invoke_json("search", "the", "--db", head_store, "--limit", "1000", "--sort", "oldest")
    stamps = [hit["timestamp"] for hit in newest]
    assert stamps == sorted(stamps, reverse=True)
    assert [hit["timestamp"] for hit in oldest] == sorted(stamps)

    with_inactive = invoke_json(
        "search", "the", "--db", head_store, "--limit", "1000", "--include-inactive"
    )
    ids = {hit["id"] for hit in with_inactive}
    assert ids > {hit["id"] for hit in every}
    assert any(not rows[i]["visible"] for i in ids)


def test_search_text_highlights_only_on_a_terminal(
    head_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    piped = invoke("search", "the", "--db", head_store, "--limit", "2").stdout
    assert "\x1b[" not in piped
    assert piped.startswith("#")
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    shown = invoke("search", "the", "--db", head_store, "--limit", "2", color=True).stdout
    assert "\x1b[1;33m" in shown
    assert ">>>" not in shown
    monkeypatch.setenv("NO_COLOR", "1")
    plain = invoke("search", "the", "--db", head_store, "--limit", "2", color=True).stdout
    assert "\x1b[1;33m" not in plain
    assert "\x1b[33m" not in plain


def test_search_without_matches(head_store: Path) -> None:
    result = invoke("search", "zzqqxxnothing", "--db", head_store)
    assert result.stdout == ""
    assert result.stderr.strip() == "no matches"
    assert invoke_json("search", "zzqqxxnothing", "--db", head_store) == []


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("error AND NOT warning", "NOT"),
        ("-error", "`-`"),
        ("what?", "`?`"),
        ("error \udcff", "UTF-8"),
    ],
)
@pytest.mark.parametrize("fmt", [(), ("--json",)])
def test_search_says_when_the_query_was_not_understood(
    head_store: Path, query: str, said: str, fmt: tuple[str, ...]
) -> None:
    """FTS5 refuses these (the library's answer is no hits): the command says why and fails,
    where it used to print "no matches"."""
    assert invoke_json("search", "error", "--db", head_store)  # the word alone has hits
    result = invoke("search", "--db", head_store, *fmt, "--", query, expect=None)
    assert_one_line_error(result, "the query was not understood", said, "search --help")
    assert result.stdout == ""


def test_search_help_documents_the_query_syntax() -> None:
    shown = " ".join(invoke("search", "--help").stdout.split())
    for fragment in (
        '"phrases"',
        "prefix*",
        "AND, OR, NOT",
        "NEAR",
        "CJK",
        "three characters",
        "trigram",
        "+ { } ( ) : ^",
        "not understood",
        '"-docker"',
    ):
        assert fragment in shown, fragment


def test_search_answers_the_same_before_and_after_the_upgrade(legacy_store: Path) -> None:
    queries = ("the", "error", "def*", "terminal OR docker", "数据库")
    before = {q: invoke_json("search", q, "--db", legacy_store, "--limit", "50") for q in queries}
    invoke("upgrade", "--db", legacy_store)
    after = {q: invoke_json("search", q, "--db", legacy_store, "--limit", "50") for q in queries}
    assert before == after
    assert any(before.values())


# --------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------


def demo_rows(out: str) -> dict[str, int]:
    """The demo's "searches before and after" table: hits per query."""
    rows = {}
    for query in demo_command.DEMO_QUERIES:
        found = re.search(rf"^{re.escape(query)}\s+(\d+)\s+identical\s*$", out, re.MULTILINE)
        assert found, (query, out[-2000:])
        rows[query] = int(found.group(1))
    return rows


def test_demo_upgrades_a_legacy_store_with_identical_searches(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    result = invoke("demo", "--messages", "300", "--dir", directory)
    out = result.stdout
    assert "DIFFERENT" not in out
    assert "layout: inline" in out
    assert "layout: external" in out
    assert "== size:" in out
    assert result.stderr == ""  # not a terminal: no progress lines
    path = directory / "demo.db"
    assert scalar(path, "SELECT version_num FROM alembic_version") == HEAD
    assert scalar(path, "SELECT count(*) FROM messages") == 300
    # Every hit is counted and compared, not a first page of 5.
    rows = demo_rows(out)
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            every = {q: len(search_messages(conn, q, limit=-1)) for q in demo_command.DEMO_QUERIES}
    finally:
        engine.dispose()
    assert rows == every
    assert max(rows.values()) > 5
    # It says where its store is and how to remove it (it made this directory).
    last = out.strip().splitlines()[-1]
    assert str(path) in last
    assert f"rm -r {directory}" in last
    # It never overwrites an earlier run.
    assert_one_line_error(
        invoke("demo", "--messages", "300", "--dir", directory, expect=None), "exists"
    )
    assert sorted(p.name for p in directory.iterdir()) == ["demo.db"]


def test_demo_without_dir_says_which_temporary_directory_it_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # read TMPDIR again
    try:
        out = invoke("demo", "--messages", "120").stdout
    finally:
        tempfile.tempdir = None
    made = [p for p in tmp_path.iterdir() if p.name.startswith("hermes-demo-")]
    assert len(made) == 1
    assert sorted(p.name for p in made[0].iterdir()) == ["demo.db"]
    last = out.strip().splitlines()[-1]
    assert f"{made[0] / 'demo.db'} (" in last
    assert last.endswith(f"remove it with `rm -r {made[0]}`")


def test_demo_into_an_existing_directory_says_to_remove_only_its_store(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("the user's own file\n")
    out = invoke("demo", "--messages", "120", "--dir", tmp_path).stdout
    assert out.strip().splitlines()[-1].endswith(f"remove it with `rm {tmp_path / 'demo.db'}`")


def test_a_failed_demo_removes_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(*_args: Any, **_kwargs: Any) -> Any:
        raise StoreError("the disk is full (a test)")

    # The demo optimizes through its store's backend: the failure is injected there.
    monkeypatch.setattr(SQLiteBackend, "optimize", full_disk)
    work = tmp_path / "work"
    work.mkdir()
    assert_one_line_error(
        invoke("demo", "--messages", "120", "--dir", work / "new" / "demo", expect=None), "full"
    )
    assert list(work.iterdir()) == []
    (work / "mine.txt").write_text("kept\n")
    assert_one_line_error(invoke("demo", "--messages", "120", "--dir", work, expect=None), "full")
    assert sorted(p.name for p in work.iterdir()) == ["mine.txt"]


# --------------------------------------------------------------------------------------
# Error paths
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", EXISTING_STORE_COMMANDS, ids=lambda c: c[0])
def test_missing_file_is_not_created(command: list[str], tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    assert_one_line_error(invoke(*command, "--db", path, expect=None), str(path), "no such")
    assert not path.exists()
    assert sidecars(path) == []


def test_missing_default_store_leaves_no_hermes_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "absent-home"
    monkeypatch.setenv("HERMES_HOME", str(home))
    for command in READ_ONLY_COMMANDS:
        assert_one_line_error(invoke(*command, expect=None), "state.db")
    assert not home.exists()


def test_missing_file_in_a_real_process(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    assert_process_error(run_process("stats", "--db", path, "--json"), "no such")
    assert not path.exists()


@pytest.mark.parametrize("command", EXISTING_STORE_COMMANDS, ids=lambda c: c[0])
def test_an_empty_file_is_not_a_store_yet(command: list[str], tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    assert_one_line_error(invoke(*command, "--db", path, expect=None), "empty")
    assert path.stat().st_size == 0


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"this is a text file, not a store\n" * 20, "not a SQLite database"),
        (b"SQLite format 3\x00" + b"\xff" * 4080, "cannot read"),
    ],
    ids=["text", "bad-header"],
)
@pytest.mark.parametrize("command", [*EXISTING_STORE_COMMANDS, ["upgrade"]], ids=lambda c: c[0])
def test_not_a_database(command: list[str], content: bytes, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    assert_one_line_error(invoke(*command, "--db", path, expect=None), fragment)
    assert path.read_bytes() == content


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    assert_one_line_error(invoke("stats", "--db", tmp_path, expect=None), "directory")


def test_not_a_database_in_a_real_process(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("hello\n")
    assert_process_error(run_process("current", "--db", path), "not a SQLite database")
    assert path.read_text() == "hello\n"


def _unknown_revision(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'f00dfeed0042'")
        conn.commit()


def _legacy_schema(version: int) -> Any:
    def edit(path: Path) -> None:
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("DROP TABLE alembic_version")
            conn.execute("UPDATE schema_version SET version = ?", (version,))
            conn.commit()

    return edit


def _foreign_database(path: Path) -> None:
    path.unlink()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        conn.commit()


UNKNOWN_SCHEMAS = {
    "unknown-revision": (_unknown_revision, "f00dfeed0042"),
    "legacy-too-new": (_legacy_schema(99), "newer"),
    "legacy-too-old": (_legacy_schema(12), "legacy schema 12"),
    "not-hermes": (_foreign_database, "not a Hermes session store"),
}


@pytest.mark.parametrize("kind", UNKNOWN_SCHEMAS)
@pytest.mark.parametrize("command", [*EXISTING_STORE_COMMANDS, ["upgrade"]], ids=lambda c: c[0])
def test_a_store_at_an_unknown_schema_is_refused(
    kind: str, command: list[str], head_store: Path
) -> None:
    edit, fragment = UNKNOWN_SCHEMAS[kind]
    edit(head_store)
    before = fingerprint(head_store)[0]
    assert_one_line_error(invoke(*command, "--db", head_store, expect=None), fragment)
    assert fingerprint(head_store)[0] == before


def test_unknown_schema_in_a_real_process(head_store: Path) -> None:
    _unknown_revision(head_store)
    before = fingerprint(head_store)[0]
    assert_process_error(run_process("upgrade", "--db", head_store), "f00dfeed0042", "newer")
    assert fingerprint(head_store)[0] == before


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Writers give up on a held lock after 150 ms instead of 30 s."""
    monkeypatch.setenv(ENV_BUSY_TIMEOUT, "150")
    return {ENV_BUSY_TIMEOUT: "150"}


def test_locked_store_refuses_writing_commands(
    legacy_store: Path, head_store: Path, short_busy_timeout: dict[str, str]
) -> None:
    with write_lock(legacy_store):
        assert_one_line_error(invoke("upgrade", "--db", legacy_store, expect=None), "locked")
    tables = {name for (name,) in query(legacy_store, "SELECT name FROM sqlite_master")}
    assert "alembic_version" not in tables  # nothing of the upgrade was committed
    assert invoke_json("current", "--db", legacy_store)["fts_layout"] == "inline"

    with write_lock(head_store):
        for command in (["optimize"], ["optimize", "--no-vacuum"]):
            result = invoke(*command, "--db", head_store, expect=None)
            # It waited, and says for how long: the truth, not a claim.
            assert_one_line_error(result, "locked", "busy timeout (0.15 s)")
            assert "broken" not in result.output  # a held lock is not damage
        # check (and --repair on a healthy store) read a snapshot: no write lock needed.
        for command in (["check"], ["check", "--repair"]):
            data = invoke_json(*command, "--db", head_store)
            assert (data["ok"], data["fts_checked_on"]) == (True, "snapshot")
        # Readers are not blocked by a writer (WAL).
        assert invoke_json("stats", "--db", head_store)["messages"] == 200
        assert invoke_json("search", "error", "--db", head_store)
    assert invoke_json("check", "--db", head_store)["ok"] is True
    # A repair has to write: past the busy timeout it fails, naming the wait.
    damage_word_index(head_store)
    with write_lock(head_store):
        result = invoke("check", "--repair", "--db", head_store, expect=None)
        assert_one_line_error(result, "locked", "busy timeout (0.15 s)")
    assert invoke_json("check", "--repair", "--db", head_store)["ok"] is True


def _segments(path: Path) -> list[int | None]:
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            return [fts.segment_count(conn, name) for name in FTS_INDEXES]
    finally:
        engine.dispose()


def test_merged_indexes_are_left_alone_without_waiting_for_the_write_lock(
    head_store: Path, short_busy_timeout: dict[str, str]
) -> None:
    assert all(count is not None and count > 1 for count in _segments(head_store))
    invoke("optimize", "--db", head_store, "--vacuum")
    assert _segments(head_store) == [1, 1]
    with write_lock(head_store):  # the agent is writing: nothing here needs its lock
        data = invoke_json("optimize", "--db", head_store, "--no-vacuum")
    assert (data["indexes"], data["vacuumed"]) == (FTS_INDEXES, False)
    assert _segments(head_store) == [1, 1]
    assert invoke_json("check", "--db", head_store)["ok"] is True


def test_locked_store_in_a_real_process(
    legacy_store: Path, short_busy_timeout: dict[str, str]
) -> None:
    with write_lock(legacy_store):
        proc = run_process("upgrade", "--db", legacy_store, env=short_busy_timeout)
    assert_process_error(proc, "locked")
    assert invoke_json("current", "--db", legacy_store)["revision"] is None


@pytest.mark.parametrize("setting", ["soon", "-1", str(2**31)])
def test_a_bad_busy_timeout_setting_is_one_line(
    setting: str, head_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2**31 ms does not fit the C int SQLite takes the busy timeout as.
    monkeypatch.setenv(ENV_BUSY_TIMEOUT, setting)
    assert_one_line_error(invoke("stats", "--db", head_store, expect=None), ENV_BUSY_TIMEOUT)


def test_json_happy_path_in_a_real_process(head_store: Path) -> None:
    proc = run_process("stats", "--db", head_store, "--json")
    assert proc.returncode == 0, proc
    assert proc.stderr == ""
    data = json.loads(proc.stdout)
    assert data["messages"] == scalar(head_store, "SELECT count(*) FROM messages")
    assert data["file_bytes"] == head_store.stat().st_size


# --------------------------------------------------------------------------------------
# the store is never touched by mistake; every migration verb
# --------------------------------------------------------------------------------------


def test_a_mistyped_db_creates_nothing(tmp_path: Path) -> None:
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    typo = tmp_path / "no-such-dir" / "sate.db"
    for args in (("upgrade",), ("check",), ("optimize",), ("stats",), ("downgrade", "21", "-y")):
        result = invoke(*args, "--db", typo, expect=None)
        assert_one_line_error(result, str(typo.parent))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_create_leaves_no_file(tmp_path: Path) -> None:
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    path = tmp_path / "new" / "state.db"
    result = invoke("upgrade", "--db", path, "--create", "--revision", "nonesuch", expect=None)
    assert_one_line_error(result, "nonesuch")
    assert list(tmp_path.iterdir()) == []


def test_upgrade_below_the_current_revision_points_to_downgrade(head_store: Path) -> None:
    before = fingerprint(head_store)
    result = invoke("upgrade", "--db", head_store, "--revision", "21", expect=None)
    assert_one_line_error(result, "already past 21", "hermes-store downgrade 21")
    assert fingerprint(head_store) == before


def test_backup_options_that_cannot_apply_are_refused(head_store: Path, tmp_path: Path) -> None:
    before = fingerprint(head_store)
    result = invoke("upgrade", "--db", head_store, "--backup", head_store, expect=None)
    assert_one_line_error(result, "destroy the store")
    missing = tmp_path / "missing" / "b.db"
    result = invoke("upgrade", "--db", head_store, "--backup", missing, expect=None)
    assert_one_line_error(result, "no such directory")
    result = invoke("upgrade", "--db", head_store, "--overwrite-backup", expect=None)
    assert result.exit_code == 2
    assert "--overwrite-backup only goes with --backup" in result.stderr
    assert fingerprint(head_store) == before
    assert not (tmp_path / "missing").exists()


def test_downgrade_and_upgrade_again(head_store: Path, tmp_path: Path) -> None:
    messages = scalar(head_store, "SELECT count(*) FROM messages")
    backup_path = tmp_path / "before-downgrade.db"
    data = invoke_json("downgrade", "30", "--db", head_store, "--yes", "--backup", backup_path)
    # Alembic's meaning: the merges that depend on 30; the search layout's head stays.
    assert (data["from"], data["to"]) == (HEAD, f"30, {fts_head_revision()}")
    assert backup_path.exists()
    assert scalar(backup_path, "SELECT version_num FROM alembic_version") == HEAD
    schema_before = query(head_store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    data = invoke_json("downgrade", "fts@-1", "--db", head_store, "--yes")
    # The layout's head (fts2) changes nothing on SQLite: still external, same schema.
    assert data["to"] == f"30, {FTS_EXTERNAL_REVISION}"
    assert invoke_json("current", "--db", head_store)["fts_layout"] == "external"
    assert (
        query(head_store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
        == schema_before
    )
    data = invoke_json("downgrade", "fts@-1", "--db", head_store, "--yes")  # the conversion
    assert data["to"] == "30"
    assert invoke_json("current", "--db", head_store)["fts_layout"] == "inline"
    assert scalar(head_store, "SELECT count(*) FROM messages") == messages
    assert invoke_json("upgrade", "--db", head_store)["to"] == HEAD


def test_downgrade_asks_first(head_store: Path) -> None:
    before = fingerprint(head_store)
    result = CliRunner().invoke(main, ["downgrade", "30", "--db", str(head_store)], input="n\n")
    assert result.exit_code == 1
    assert "Downgrade" in result.output
    assert fingerprint(head_store) == before


def test_downgrade_to_base_needs_both_flags(head_store: Path) -> None:
    before = fingerprint(head_store)
    result = invoke("downgrade", "base", "--db", head_store, "--yes", expect=None)
    assert_one_line_error(result, "would delete", "200 message(s)", "--i-know-this-deletes-data")
    assert fingerprint(head_store) == before
    result = invoke("downgrade", "base", "--db", head_store, "--i-know-this-deletes-data", expect=2)
    assert fingerprint(head_store) == before
    invoke("downgrade", "base", "--db", head_store, "--yes", "--i-know-this-deletes-data")
    assert query(head_store, "SELECT name FROM sqlite_master WHERE name = 'messages'") == []


def test_stamp_refuses_a_schema_the_store_does_not_have(head_store: Path) -> None:
    before = fingerprint(head_store)
    result = invoke("stamp", "21", "--db", head_store, expect=None)
    assert_one_line_error(result, "stamp 21 refused", "schema_version is 30")
    assert fingerprint(head_store) == before
    # A copy whose alembic_version was lost: stamping what it really has is accepted.
    with contextlib.closing(sqlite3.connect(head_store)) as conn:
        conn.execute("DELETE FROM alembic_version")
        conn.commit()
    assert invoke_json("stamp", "head", "--db", head_store)["to"] == HEAD
    assert scalar(head_store, "SELECT version_num FROM alembic_version") == HEAD


def test_history_lists_every_revision_and_marks_the_store(head_store: Path) -> None:
    records = [
        json.loads(line)
        for line in invoke("history", "--db", head_store, "--nl").stdout.splitlines()
    ]
    assert records[0]["revision"] == HEAD
    assert {r["revision"] for r in records} >= {"17", "21", "30", "fts1", HEAD}
    assert [r["revision"] for r in records if r["current"]] == [HEAD]
    assert "merge_30_fts1" in invoke("history").stdout


def test_offline_sql_writes_sql_or_refuses_in_one_line(tmp_path: Path) -> None:
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    alembic = [sys.executable, "-m", "alembic", "-c", str(PROJECT_ROOT / "alembic.ini")]
    ok = subprocess.run(
        [*alembic, "upgrade", "17", "--sql"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5" in ok.stdout
    assert "Traceback" not in ok.stderr
    refused = subprocess.run(
        [*alembic, "upgrade", "head", "--sql"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert refused.returncode != 0
    # Alembic logs the failure on stderr (and repeats it as `FAILED: ...` on stdout).
    errors = [line for line in refused.stderr.splitlines() if not line.startswith("INFO")]
    assert len(errors) == 1, refused.stderr
    assert "revision fts1 cannot be written as offline SQL" in errors[0]
    assert "CREATE" not in refused.stdout  # nothing written before the refusal
    assert "Traceback" not in refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_maintenance_waits_for_a_short_write_lock(head_store: Path) -> None:
    """The agent holds its write lock for 1 s: check, optimize and --repair wait, then run."""
    damage_word_index(head_store)  # so that --repair has something to write
    for args in (("optimize", "--no-vacuum"), ("check", "--repair"), ("check",)):
        locked = threading.Event()

        def agent(locked: threading.Event = locked) -> None:
            with write_lock(head_store):
                locked.set()
                time.sleep(1.0)

        holder = threading.Thread(target=agent)
        holder.start()
        try:
            assert locked.wait(10)
            result = invoke(*args, "--db", head_store, "--json")
        finally:
            holder.join()
        data = json.loads(result.stdout)
        if args[0] == "check":
            assert data["ok"] is True  # it waited, then checked (and repaired) the store
        else:
            assert data["vacuumed"] is False
            assert data["indexes"] == FTS_INDEXES
    assert invoke_json("check", "--db", head_store)["ok"] is True


def test_search_bounds_from_the_command_line(head_store: Path) -> None:
    words = " ".join(f"word{i}" for i in range(40))
    result = invoke("search", words, "--db", head_store, expect=None)
    assert_one_line_error(result, "40 distinct terms", "at most 32")
    # A query that starts with "-" goes after `--` (FTS5 then refuses it: see below); a huge
    # offset is refused, not a traceback.
    result = invoke("search", "--db", head_store, "--json", "--", "-error", expect=None)
    assert_one_line_error(result, "the query was not understood")
    result = invoke(
        "search", "error", "--db", head_store, "--offset", "99999999999999999999", expect=2
    )
    assert "Traceback" not in result.output


def test_check_runs_the_fts_checks_on_a_private_snapshot(
    head_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The FTS5 checks are INSERTs: on the live store each held the agent's write lock."""
    snapshots = tmp_path / "tmp"
    snapshots.mkdir()
    monkeypatch.setenv("TMPDIR", str(snapshots))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    damage_word_index(head_store)
    data = invoke_json("check", "--db", head_store, expect=1)
    assert data["fts_checked_on"] == "snapshot"
    assert data["longest_write_lock_s"] == 0.0
    assert "messages_fts" in data["problems"]  # the copy shows the damage the store has
    assert list(snapshots.iterdir()) == []  # the copy is gone
    # No room for a copy: the checks run live, each a short write transaction.
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: shutil._ntuple_diskusage(1, 1, 0))
    data = invoke_json("check", "--db", head_store, expect=1)
    assert data["fts_checked_on"] == "live"
    assert data["longest_write_lock_s"] > 0
    assert "messages_fts" in data["problems"]


def test_optimize_by_default_never_holds_the_write_lock_long(head_store: Path) -> None:
    """Bounded steps: the agent keeps writing. Free pages need one --vacuum first, which
    switches the store to incremental auto-vacuum; later runs return them in steps."""
    with closing(sqlite3.connect(head_store)) as conn:
        conn.execute("UPDATE messages SET content = content || ' more' WHERE id % 2 = 0")
        conn.execute("DELETE FROM messages WHERE id % 5 = 0")
        conn.commit()
    data = invoke_json("optimize", "--db", head_store)
    assert data["vacuumed"] is False
    assert data["vacuum_needed_bytes"] > 0  # only VACUUM returns them on this store
    assert "--vacuum" in invoke("optimize", "--db", head_store).stdout
    assert invoke_json("check", "--db", head_store)["ok"] is True
    invoke("optimize", "--db", head_store, "--vacuum")
    assert scalar(head_store, "PRAGMA auto_vacuum") == 2  # INCREMENTAL from now on
    with closing(sqlite3.connect(head_store)) as conn:
        conn.execute("DELETE FROM messages WHERE id > 20")
        conn.commit()
    assert scalar(head_store, "PRAGMA freelist_count") > 0
    data = invoke_json("optimize", "--db", head_store)
    assert data["vacuum_needed_bytes"] == 0
    assert scalar(head_store, "PRAGMA freelist_count") == 0  # returned, in steps
    assert data["reclaimed"] > 0
    assert invoke_json("check", "--db", head_store)["ok"] is True

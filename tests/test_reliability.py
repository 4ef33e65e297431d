"""Private data, backups and `check --repair`: what the store guarantees its owner.

Files the project creates are readable by their owner only, and existing ones are
tightened; no log line at any level carries message text; `upgrade --backup` (and
`alembic -x backup=PATH`) take a consistent online copy before anything changes; and
`check --repair` rebuilds a broken FTS index after a backup and proves it with the check.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from migration_support import back_to_inline_21
from reliability_support import (
    INDEXES,
    assert_clean_failure,
    build_corpus_store,
    cli,
    copy_store,
    drift,
    fingerprint,
    fts_problems,
    leave_free,
    probe,
    rows,
    run_cli,
    scalar,
    tmpfs,
)

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.engine import create_store_engine
from hermes_store.errors import BackupExists, UnsafePath
from hermes_store.search import search_messages
from hermes_store.sqlite import backfill, maintenance
from hermes_store.sqlite.backup import backup
from hermes_store.store import NewMessage, Store

PROJECT = Path(__file__).resolve().parent.parent
MARKER = "zq7SECRETmarker"


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A legacy store of 800 corpus messages, and the same store upgraded to head."""
    directory = tmp_path_factory.mktemp("reliability-templates")
    legacy = build_corpus_store(directory / "legacy.db", 800, seed=5)
    head = copy_store(legacy, directory / "head.db")
    migrate.upgrade(str(head))
    with contextlib.closing(sqlite3.connect(head)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {"legacy": legacy, "head": head}


@pytest.fixture
def umask_000() -> Iterator[None]:
    """The most permissive umask: nothing the project creates may rely on it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# ======================================================================================
# 5. Private data: modes 0600 / 0700, and no message text in any log
# ======================================================================================


def test_every_file_the_project_creates_is_private(
    umask_000: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "new-home"
    path = home / "state.db"
    monkeypatch.setenv("HERMES_HOME", str(home))
    migrate.upgrade(None)
    assert mode(home) == 0o700
    with Store.open(path) as store, store.engine.connect() as held:
        held.exec_driver_sql("SELECT count(*) FROM messages").scalar()  # -wal / -shm stay
        store.create_session("s", "cli")
        store.append_message("s", NewMessage("user", "hello"))
        for side in ("", "-wal", "-shm"):
            assert mode(Path(f"{path}{side}")) == 0o600, side
        taken = backup(str(path), tmp_path / "copy.db")
        assert mode(taken.path) == 0o600
    assert invoke("upgrade", "--db", path, "--backup", tmp_path / "upgrade.bak").exit_code == 0
    assert mode(tmp_path / "upgrade.bak") == 0o600
    demo = tmp_path / "demo"
    assert invoke("demo", "--messages", "30", "--dir", demo).exit_code == 0
    assert mode(demo) == 0o700
    assert mode(demo / "demo.db") == 0o600


@pytest.mark.parametrize(
    "command",
    [["current"], ["stats"], ["search", "error"], ["check"], ["upgrade"], ["optimize"]],
    ids=lambda c: c[0],
)
def test_existing_store_files_are_tightened_by_every_command(
    command: list[str], templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(templates["legacy"], tmp_path / "state.db")
    holder = sqlite3.connect(path)  # the legacy application, keeping -wal / -shm alive
    try:
        holder.execute("PRAGMA journal_mode=WAL")
        holder.execute("UPDATE sessions SET title = 'x' WHERE rowid = 1")
        holder.commit()
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        for file in files:
            file.chmod(0o644)
        result = invoke(*command, "--db", path)
        assert result.exit_code == 0, result.output
        assert [mode(f) for f in files if f.exists()] == [0o600] * len(
            [f for f in files if f.exists()]
        )
        assert mode(path) == 0o600
    finally:
        holder.close()


def test_an_overwritten_backup_is_private_again(templates: dict[str, Path], tmp_path: Path) -> None:
    path = copy_store(templates["legacy"], tmp_path / "state.db")
    dest = tmp_path / "old.bak"
    dest.write_text("an old, world-readable file")
    dest.chmod(0o644)
    result = invoke("upgrade", "--db", path, "--backup", dest, "--overwrite-backup")
    assert result.exit_code == 0, result.output
    assert mode(dest) == 0o600
    assert scalar(dest, "SELECT version FROM schema_version") == 21


@pytest.fixture
def every_logger_at_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture every record of every logger, SQLAlchemy's SQL echo included."""
    caplog.set_level(logging.DEBUG)
    for name in ["sqlalchemy", "alembic", "hermes_store", *logging.root.manager.loggerDict]:
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def _marked_store(tmp_path: Path, templates: dict[str, Path]) -> Path:
    """A drifted legacy store whose messages hold the marker (content and tool calls)."""
    path = copy_store(templates["legacy"], tmp_path / "state.db")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "UPDATE messages SET content = content || ' error ' || ? WHERE id % 5 = 0", (MARKER,)
        )
        conn.execute(
            "UPDATE messages SET tool_calls = ? WHERE id % 7 = 0",
            (json.dumps([{"function": {"arguments": MARKER}}]),),
        )
        conn.commit()
    drift(path)  # so that the upgrade re-indexes (and logs why)
    return path


def test_no_log_record_at_any_level_carries_message_text(
    every_logger_at_debug: pytest.LogCaptureFixture, templates: dict[str, Path], tmp_path: Path
) -> None:
    caplog = every_logger_at_debug
    path = _marked_store(tmp_path, templates)
    migrate.upgrade(str(path), backup_to=tmp_path / "before.bak")
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            hits = search_messages(conn, f"error {MARKER}")
            assert hits
            assert any(MARKER in (hit["snippet"] or "") for hit in hits)
            search_messages(conn, "数据库")  # the trigram and LIKE paths too
            search_messages(conn, "数据")
        with contextlib.closing(sqlite3.connect(path)) as conn:  # break, then repair
            conn.execute(
                "INSERT INTO messages_fts(messages_fts, rowid, content) VALUES "
                "('delete', (SELECT min(id) FROM messages WHERE id % 5 = 0), ?)",
                (f"wrong {MARKER}",),
            )
            conn.commit()
        assert maintenance.repair(engine).ok
        assert maintenance.repair(engine, deferred=True).ok
        maintenance.optimize(engine)
        with Store(engine) as store:
            store.create_session("log", "cli")
            store.append_message("log", NewMessage("user", f"new {MARKER}", tool_calls="{bad"))
    finally:
        engine.dispose()
    back_to_inline_21(path)
    migrate.upgrade(str(path), x={"fts_convert": "rebuild", "fts_backfill": "deferred"})
    engine = create_store_engine(path, create=False)
    try:
        backfill.run(engine, duty=1.0)
    finally:
        engine.dispose()
    records = caplog.records
    assert any(r.name.startswith("sqlalchemy.engine") for r in records)  # SQL echo was on
    assert any(r.name.startswith("alembic") for r in records)
    assert any(r.name.startswith("hermes_store") for r in records)
    for record in records:
        text = record.getMessage() + (record.exc_text or "")
        assert MARKER not in text, (record.name, text[:300])
    assert MARKER not in caplog.text


#: The CLI with every logger at DEBUG and SQL echo on, as an operator debugging it would
#: run it: each command of argv[1] (JSON) in turn, one process, exit codes on the last line.
VERBOSE_CLI = """
import json, logging, sys
logging.basicConfig(level=logging.DEBUG)
for name in ("sqlalchemy", "alembic", "hermes_store"):
    logging.getLogger(name).setLevel(logging.DEBUG)
from hermes_store.cli import main
codes = []
for args in json.loads(sys.argv[1]):
    try:
        main.main(args=args, prog_name="hermes-store")
    except SystemExit as exc:
        codes.append(exc.code or 0)
print(json.dumps(codes))
"""


def test_the_cli_never_prints_message_text_on_stderr(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    path = _marked_store(tmp_path, templates)
    commands = [
        ["upgrade", "--backup", str(tmp_path / "b.bak")],
        ["search", f"error {MARKER}", "--json"],
        ["search", "数据"],
        ["check", "--repair"],
        ["optimize"],
        ["stats"],
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            VERBOSE_CLI,
            json.dumps([["-vv", *c, "--db", str(path)] for c in commands]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0] * len(commands)
    assert ":sqlalchemy.engine.Engine.hermes_store:" in done.stderr  # SQL echo was on
    assert ":alembic.runtime.migration:" in done.stderr
    assert "DEBUG:hermes_store" in done.stderr
    assert MARKER not in done.stderr
    assert MARKER in done.stdout  # search results are output, on purpose


# ======================================================================================
# 6. Backups
# ======================================================================================


def logical(path: Path) -> tuple[Any, ...]:
    return (
        scalar(path, "SELECT version FROM schema_version"),
        rows(path, "SELECT id, session_id, content, tool_calls FROM messages ORDER BY id"),
        probe(path),
    )


def test_upgrade_backup_is_a_private_copy_of_the_store_as_it_was(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(templates["legacy"], tmp_path / "state.db")
    before = logical(path)
    dest = tmp_path / "safe" / "state-before-22.db"
    dest.parent.mkdir()
    result = invoke("upgrade", "--db", path, "--backup", dest, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["backup"] == str(dest)
    assert scalar(path, "SELECT version FROM schema_version") == 30
    # The copy: the legacy store as it was, unversioned, self-contained, intact.
    assert logical(dest) == before
    tables = {r[0] for r in rows(dest, "SELECT name FROM sqlite_master")}
    assert "alembic_version" not in tables
    assert scalar(dest, "PRAGMA journal_mode") == "delete"
    assert fts_problems(dest) == {}
    assert mode(dest) == 0o600
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]
    # A restored copy upgrades like the original.
    assert migrate.upgrade(str(dest)).after == (migrate.head_revision(),)


def test_an_existing_backup_file_is_never_overwritten_unasked(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(templates["legacy"], tmp_path / "state.db")
    dest = tmp_path / "taken.bak"
    dest.write_text("yesterday's backup")
    before = fingerprint(path)
    assert_clean_failure(cli("upgrade", "--db", path, "--backup", dest), "already exists")
    assert dest.read_text() == "yesterday's backup"
    assert fingerprint(path) == before  # the upgrade did not start
    with pytest.raises(BackupExists):
        backup(str(path), dest)
    link = tmp_path / "link.bak"
    link.symlink_to(tmp_path / "elsewhere.bak")
    with pytest.raises(UnsafePath):
        backup(str(path), link, overwrite=True)
    assert not (tmp_path / "elsewhere.bak").exists()


def test_a_new_store_has_nothing_to_back_up(tmp_path: Path) -> None:
    dest = tmp_path / "nothing.bak"
    result = invoke("upgrade", "--db", tmp_path / "new.db", "--create", "--backup", dest, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["backup"] is None
    assert not dest.exists()


def test_alembic_x_backup_takes_the_copy_before_the_revisions(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(templates["legacy"], tmp_path / "state.db")
    before = logical(path)
    dest = tmp_path / "alembic.bak"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "alembic",
            "-c",
            str(PROJECT / "alembic.ini"),
            "-x",
            f"db={path}",
            "-x",
            f"backup={dest}",
            "upgrade",
            "head",
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert logical(dest) == before
    assert scalar(path, "SELECT version FROM schema_version") == 30
    again = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(PROJECT / "alembic.ini")]
        + ["-x", f"db={path}", "-x", f"backup={dest}", "downgrade", "21"],
        capture_output=True,
        text=True,
        cwd=PROJECT,
        timeout=120,
        check=False,
    )
    assert again.returncode != 0
    assert "already exists" in again.stderr
    assert "Traceback" not in again.stderr
    assert scalar(path, "SELECT version FROM schema_version") == 30


WRITER = r"""
import sys, time
from hermes_store.store import NewMessage, Store
with Store.open(sys.argv[1]) as store:
    store.create_session("writer", "cli")
    print("ready", flush=True)
    n = 0
    while True:
        store.append_message("writer", NewMessage("user", f"written while backing up {n}"))
        n += 1
        print(time.monotonic(), flush=True)
"""


@pytest.fixture(scope="module")
def large_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_corpus_store(tmp_path_factory.mktemp("large") / "state.db", 10_000)
    migrate.upgrade(str(path))
    return path


@pytest.mark.slow
def test_a_backup_is_consistent_and_online_while_the_agent_writes(
    large_store: Path, tmp_path: Path
) -> None:
    path = copy_store(large_store, tmp_path / "state.db")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    commits: list[float] = []
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    reader = threading.Thread(target=lambda: commits.extend(map(float, writer.stdout)))  # type: ignore[arg-type]
    reader.start()
    windows = []
    try:
        for number in range(3):
            time.sleep(0.2)
            started = time.monotonic()
            taken = backup(str(path), tmp_path / f"online-{number}.bak")
            windows.append((started, time.monotonic(), taken.path))
    finally:
        writer.kill()
        _, err = writer.communicate()
        reader.join()
    assert "Traceback" not in err, err  # the writer never failed
    during = [t for t in commits for start, end, _ in windows if start < t < end]
    assert during, "no write committed while a backup was being taken"
    for _start, _end, copy in windows:
        # One snapshot: the writer's counter matches its messages, every check passes.
        counted, messages = rows(
            copy,
            "SELECT s.message_count, (SELECT count(*) FROM messages m WHERE m.session_id = s.id) "
            "FROM sessions s WHERE s.id = 'writer'",
        )[0]
        assert counted == messages
        assert fts_problems(copy) == {}


def test_a_backup_that_runs_out_of_space_leaves_nothing_and_changes_nothing(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(templates["legacy"], tmp_path / "state.db")
    before = fingerprint(path)
    with tmpfs(tmp_path / "small", 8 << 20) as disk:
        leave_free(disk, path.stat().st_size // 3)
        proc = cli("upgrade", "--db", path, "--backup", disk / "b.db")
        assert_clean_failure(proc, "disk is full")
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
    assert fingerprint(path) == before


# ======================================================================================
# 8. check --repair
# ======================================================================================


def damage(path: Path, index: str = "messages_fts") -> None:
    """Make an index lie about one message, the way a wrong 'delete' does."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        layout_sql = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (index,)
        ).fetchone()[0]
        victim = conn.execute("SELECT min(id) FROM messages WHERE content LIKE '% %'").fetchone()[0]
        if "content=" in layout_sql.replace(" ", ""):
            conn.execute(
                f"INSERT INTO {index}({index}, rowid, content) VALUES ('delete', ?, 'wrong text')",
                (victim,),
            )
        else:  # inline: its copy no longer says what the index holds
            conn.execute(f"UPDATE {index}_content SET c0 = 'wrong text' WHERE id = ?", (victim,))
        conn.commit()
    assert index in fts_problems(path)


def repaired_backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.repair-*.bak"))


@pytest.mark.parametrize("indexes", [["messages_fts"], ["messages_fts", "messages_fts_trigram"]])
def test_repair_rebuilds_a_broken_index_after_a_backup_and_proves_it(
    indexes: list[str], templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(templates["head"], tmp_path / "state.db")
    expected = probe(path)
    for index in indexes:
        damage(path, index)
    assert run_cli("check", "--db", path).returncode == 1
    proc = run_cli("check", "--db", path, "--repair")
    assert proc.returncode == 0, proc
    for index in indexes:
        assert f"{index}" in proc.stdout
        assert "rebuilt from messages_fts_source" in proc.stdout
    assert fts_problems(path) == {}
    assert probe(path) == expected
    (taken,) = repaired_backups(path)
    assert str(taken) in proc.stdout
    assert mode(taken) == 0o600
    assert set(fts_problems(taken)) == set(indexes)  # the copy is the store before the repair


def test_repair_with_a_chosen_backup_path_and_json(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(templates["head"], tmp_path / "state.db")
    damage(path, "messages_fts_trigram")
    dest = tmp_path / "kept" / "before-repair.db"
    dest.parent.mkdir()
    result = invoke("check", "--db", path, "--repair", "--backup", dest, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True
    assert data["repair"]["backup"] == str(dest)
    assert list(data["repair"]["repaired"]) == ["messages_fts_trigram"]
    assert list(data["repair"]["before"]["problems"]) == ["messages_fts_trigram"]
    assert dest.is_file()
    assert not repaired_backups(path)


def test_repair_deferred_refills_with_the_backfill(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(templates["head"], tmp_path / "state.db")
    expected = probe(path)
    damage(path)
    result = invoke("check", "--db", path, "--repair", "--deferred")
    assert result.exit_code == 0, result.output
    assert "deferred backfill" in result.stdout
    assert fts_problems(path) == {}
    assert probe(path) == expected
    assert not rows(path, "SELECT key FROM state_meta WHERE key LIKE 'messages_fts%'")
    assert len(repaired_backups(path)) == 1


def test_repair_of_a_legacy_inline_store(templates: dict[str, Path], tmp_path: Path) -> None:
    path = copy_store(templates["legacy"], tmp_path / "state.db")
    expected = probe(path)
    damage(path, "messages_fts")
    result = invoke("check", "--db", path, "--repair")
    assert result.exit_code == 0, result.output
    assert "re-indexed from messages" in result.stdout
    assert fts_problems(path) == {}
    assert probe(path) == expected
    result = invoke("check", "--db", path, "--repair", "--deferred")
    assert result.exit_code == 0  # nothing broken any more: nothing to do
    damage(path, "messages_fts")
    result = invoke("check", "--db", path, "--repair", "--deferred")
    assert result.exit_code == 1
    assert "inline layout" in result.output


def test_repair_of_a_healthy_store_does_nothing(templates: dict[str, Path], tmp_path: Path) -> None:
    path = copy_store(templates["head"], tmp_path / "state.db")
    before = fingerprint(path)
    result = invoke("check", "--db", path, "--repair")
    assert result.exit_code == 0
    assert "nothing to repair" in result.stdout
    assert not repaired_backups(path)
    assert fingerprint(path) == before


def test_repair_refuses_damage_it_cannot_fix(templates: dict[str, Path], tmp_path: Path) -> None:
    path = copy_store(templates["head"], tmp_path / "state.db")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        # A b-tree index whose entries no longer match its table: integrity_check says so.
        conn.execute("PRAGMA writable_schema=ON")
        conn.execute(
            "UPDATE sqlite_master SET sql = 'CREATE INDEX idx_sessions_source ON "
            "sessions(started_at)' WHERE name = 'idx_sessions_source'"
        )
        conn.commit()
    damage(path)  # an FTS index is broken too: still nothing is written
    assert "database" in fts_problems(path)
    before = fingerprint(path)
    result = invoke("check", "--db", path, "--repair")
    assert result.exit_code == 1
    assert "not repaired" in result.stderr
    assert "integrity_check" in result.stderr
    assert not repaired_backups(path)
    assert fingerprint(path) == before


def test_repair_options_need_repair(templates: dict[str, Path], tmp_path: Path) -> None:
    path = copy_store(templates["head"], tmp_path / "state.db")
    for option in (["--deferred"], ["--backup", str(tmp_path / "x.bak")]):
        result = invoke("check", "--db", path, *option)
        assert result.exit_code == 2
        assert "--repair" in result.output


def test_repair_indexes_every_message_again(templates: dict[str, Path], tmp_path: Path) -> None:
    """After a repair, search finds what is in the messages, not what the damage left."""
    path = copy_store(templates["head"], tmp_path / "state.db")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for name in ("messages_fts_insert", "messages_fts_trigram_insert"):
            conn.execute(f"DROP TRIGGER {name}")  # messages added without indexing
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) "
            "SELECT session_id, 'user', 'unindexedmarker 未索引的消息', 1 FROM messages LIMIT 1"
        )
        conn.commit()
    problems = fts_problems(path)
    assert set(problems) == set(INDEXES)
    engine = create_store_engine(path, create=False)
    try:
        result = maintenance.repair(engine)
        assert result.ok
        assert set(result.repaired) == set(INDEXES)
        with engine.connect() as conn:
            assert len(search_messages(conn, "unindexedmarker")) == 1
            assert len(search_messages(conn, "未索引的消息")) == 1
    finally:
        engine.dispose()

"""Faults a real store meets: kill -9 mid-upgrade, a full disk, a held lock, hostile file systems.

Each fault is produced for real where it needs to be: the upgrade runs in a child process
killed with SIGKILL; the disk is a small tmpfs; the other writer is another process; the
read-only store is a read-only mount or an immutable file (root ignores file modes). The
store is judged afterwards with the stdlib `sqlite3`, independently of the code under test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.util import CommandError
from reliability_support import (
    Snapshot,
    assert_clean_failure,
    build_corpus_store,
    cli,
    copy_store,
    drift,
    fingerprint,
    fts_problems,
    immutable,
    leave_free,
    probe,
    remount_read_only,
    rows,
    run_cli,
    scalar,
    snapshot,
    sqlite_temp_directory,
    tmpfs,
    whole_revision,
)
from sqlalchemy import Engine, event

from alembic import command as alembic_command
from hermes_store import migrate
from hermes_store.engine import (
    ENV_BUSY_TIMEOUT,
    create_store_engine,
    db_path,
    to_url,
)
from hermes_store.errors import (
    DiskFull,
    NotEnoughFreeSpace,
    StoreBusy,
    StoreReadOnly,
    UnsafePath,
)
from hermes_store.search import search_messages
from hermes_store.sqlite import backfill, maintenance
from hermes_store.sqlite import migration as sqlite_migration
from hermes_store.sqlite import optimize as sqlite_optimize
from hermes_store.sqlite.backup import backup
from hermes_store.sqlite.engine import WalUnavailableWarning
from hermes_store.sqlite.fts import LAYOUT_MARKER
from hermes_store.store import NewMessage, Store

# ======================================================================================
# 1. Interrupted upgrades: kill -9 at many points of the immediate-mode upgrade 21 -> 22
# ======================================================================================

KILL_STORE_MESSAGES = 10_000

#: A fork server: imports once, then forks one upgrade process per job (so each killed
#: process costs a fork, not an interpreter start). With `kill_at` > 0 the upgrade
#: SIGKILLs itself when SQLite starts its kill_at-th statement on the store (trace
#: callback): the kill lands exactly between two statements, FTS5's internal ones
#: included. Protocol: a job line in; {"pid"} when forked, then {"status", "report"}.
ZYGOTE = r"""
import json, os, signal, sys, time
from sqlalchemy import Engine, event
from hermes_store import migrate

state = {"n": 0, "kill_at": 0, "path": None}


def trace(_statement):
    state["n"] += 1
    if state["n"] == state["kill_at"]:
        os.kill(os.getpid(), signal.SIGKILL)


@event.listens_for(Engine, "connect")
def _trace(dbapi_connection, _record):
    files = [row[2] for row in dbapi_connection.execute("PRAGMA database_list")]
    if state["path"] in files:
        dbapi_connection.set_trace_callback(trace)


print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        state.update(n=0, kill_at=job["kill_at"], path=job["path"])
        started = time.perf_counter()
        try:
            migrate.upgrade(job["path"], x=job["x"])
            report = {"statements": state["n"], "seconds": time.perf_counter() - started}
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_end) as reader:
        report = reader.read()
    print(json.dumps({"status": status, "report": json.loads(report) if report else None}),
          flush=True)
"""


class UpgradeProcesses:
    """Upgrade processes forked on demand, each run to its end or killed with SIGKILL."""

    def __init__(self) -> None:
        self.server = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.server.stdout is not None
        line = self.server.stdout.readline()
        assert line, self.server.stderr.read() if self.server.stderr else "no output"
        return line.strip()

    def run(
        self, path: Path, x: dict[str, str], *, kill_at: int = 0, kill_after: float | None = None
    ) -> dict[str, Any] | None:
        """One upgrade in a new process: its report, or None when it was killed."""
        assert self.server.stdin is not None
        job = {"path": str(path), "x": x, "kill_at": kill_at}
        self.server.stdin.write(json.dumps(job) + "\n")
        self.server.stdin.flush()
        pid = json.loads(self._line())["pid"]
        if kill_after is not None:
            time.sleep(kill_after)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        outcome = json.loads(self._line())
        if os.WIFSIGNALED(outcome["status"]):
            assert os.WTERMSIG(outcome["status"]) == signal.SIGKILL
            return None
        assert outcome["report"] is not None, "the upgrade failed (see the server's stderr)"
        return dict(outcome["report"])

    def close(self) -> None:
        self.server.kill()
        self.server.communicate()


@pytest.fixture(scope="module")
def kill_templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """10k-message legacy stores: healthy (converts in place) and drifted (rebuilds)."""
    directory = tmp_path_factory.mktemp("kill-templates")
    healthy = build_corpus_store(directory / "healthy.db", KILL_STORE_MESSAGES, max_chars=160)
    drifted = copy_store(healthy, directory / "drifted.db")
    drift(drifted)
    return {"in-place": healthy, "rebuild": drifted}


def kill_points(statements: int, seconds: float) -> list[tuple[str, float]]:
    """At least 14 kill points: statement numbers, dense over the first hundred (adoption,
    DDL, verification, the swap) and spread over the rest (FTS5's own statements during a
    rebuild), the last one after the commit; then delays spread over the run."""
    head = min(statements, 110)
    if statements == head:  # a conversion in place: few statements, all of them ours
        numbers = {1 + (statements - 1) * i // 9 for i in range(10)}
    else:
        numbers = {1 + (head - 1) * i // 5 for i in range(6)}
        numbers |= {head + (statements - head) * i // 4 for i in range(1, 5)}
    points: list[tuple[str, float]] = [("statement", n) for n in sorted(numbers)]
    points += [("delay", seconds * (i + 0.5) / 4) for i in range(4)]
    return points


@pytest.mark.slow
@pytest.mark.parametrize("conversion", ["in-place", "rebuild"])
def test_kill_9_during_the_conversion_leaves_inline_or_external_never_between(
    conversion: str, kill_templates: dict[str, Path], tmp_path: Path
) -> None:
    template = kill_templates[conversion]
    assert scalar(template, "SELECT count(*) FROM messages") >= KILL_STORE_MESSAGES * 0.98
    at_21 = snapshot(template)
    work = tmp_path / "state.db"
    # Immediate mode (no deferred backfill), path chosen by the store; the relational schema
    # stays at 21 so that the only step is the search conversion.
    x = {"app_version": "21"}
    processes = UpgradeProcesses()
    try:
        # An uninterrupted run: the reference at 22, the statement count and the duration.
        copy_store(template, work)
        report = processes.run(work, x)
        assert report is not None
        reference = tmp_path / "reference-22.db"
        with contextlib.closing(sqlite3.connect(work)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        copy_store(work, reference)
        at_22 = snapshot(reference)
        assert at_22.answers != at_21.answers or conversion == "in-place"
        outcomes: list[tuple[str, float, str]] = []
        for kind, point in kill_points(report["statements"], report["seconds"]):
            copy_store(template, work)
            if kind == "statement":
                processes.run(work, x, kill_at=int(point))
            else:
                processes.run(work, x, kill_after=point)
            version = whole_revision(work, at_21, at_22)
            outcomes.append((kind, point, version))
            # Re-running the upgrade completes it (on every third store left at 21: each is
            # already proven identical to the template in schema, checks and answers).
            if version == "inline" and sum(v == "inline" for _, _, v in outcomes) % 3 == 1:
                assert migrate.upgrade(str(work), app_version=21).layout_after == "external"
                assert whole_revision(work, at_21, at_22) == "external"
    finally:
        processes.close()
    versions = [version for _, _, version in outcomes]
    assert len(outcomes) >= 14
    # Both outcomes occurred: the kills landed before and after the commit.
    assert "inline" in versions, outcomes
    assert "external" in versions, outcomes


# ======================================================================================
# 2. Out of space: a small tmpfs (real ENOSPC), and PRAGMA max_page_count anywhere
# ======================================================================================


@pytest.fixture(scope="module")
def small_templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """1.5k-message stores: legacy healthy, legacy drifted, at head, and deferred at head."""
    directory = tmp_path_factory.mktemp("small-templates")
    legacy = build_corpus_store(directory / "legacy.db", 1500, seed=3)
    drifted = copy_store(legacy, directory / "drifted.db")
    drift(drifted)
    head = copy_store(legacy, directory / "head.db")
    migrate.upgrade(str(head))
    deferred = copy_store(legacy, directory / "deferred.db")
    migrate.upgrade(str(deferred), x={"fts_convert": "rebuild", "fts_backfill": "deferred"})
    for path in (head, deferred):
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {"legacy": legacy, "drifted": drifted, "head": head, "deferred": deferred}


def searchable(path: Path) -> list[list[int]]:
    """Which messages the application's search finds on a store, for a few queries.

    Sorted ids: while a deferred fill is pending, the rows it has not indexed yet are
    ranked against themselves, so the order (not the set) may differ from a full index.
    """
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            return [
                sorted(hit["id"] for hit in search_messages(conn, query, limit=5000))
                for query in ("error", "docker compose", "数据库", "json")
            ]
    finally:
        engine.dispose()


def application_writes(path: Path) -> None:
    """The application appends a message and finds it: the store is usable."""
    with Store.open(path) as store:
        store.create_session("after-fault", "cli")
        store.append_message("after-fault", NewMessage("user", "zanzibarquux after the fault"))
    hits = searchable_query(path, "zanzibarquux")
    assert len(hits) == 1


def legacy_application_writes(path: Path) -> None:
    """The same, written with plain sqlite3 as the Hermes application at schema 21 does
    (the Store API writes the head schema; these stores stop at 21)."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn, conn:
        conn.execute(
            "INSERT INTO sessions (id, source, started_at) VALUES ('after-fault', 'cli', 1.0)"
        )
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) "
            "VALUES ('after-fault', 'user', 'zanzibarquux after the fault', 2.0)"
        )
    hits = searchable_query(path, "zanzibarquux")
    assert len(hits) == 1


def searchable_query(path: Path, query: str) -> list[int]:
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            return [hit["id"] for hit in search_messages(conn, query)]
    finally:
        engine.dispose()


def logical(path: Path) -> tuple[Any, ...]:
    """What the store holds and answers, independent of how pages are laid out."""
    version = scalar(path, "SELECT version FROM schema_version")
    return version, probe(path), rows(path, "SELECT id, content FROM messages ORDER BY id")[::50]


CLEAN_DISK_FULL = ("disk is full",)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["legacy", "drifted"], ids=["in-place", "rebuild"])
def test_upgrade_on_a_full_disk_fails_clearly_and_leaves_the_store_as_it_was(
    store: str, small_templates: dict[str, Path], tmp_path: Path
) -> None:
    template = small_templates[store]
    size = template.stat().st_size
    with tmpfs(tmp_path / "disk", size * 3 + (4 << 20)) as disk:
        path = disk / "state.db"
        failures = 0
        # From almost nothing left to more than the upgrade needs.
        for free in (64 << 10, 1 << 20, size // 2, 2 * size):
            copy_store(template, path)
            before = logical(path)
            filler = leave_free(disk, free)
            proc = cli("upgrade", "--db", path, "--app-version", "21")  # the conversion alone
            if proc.returncode != 0:
                failures += 1
                assert_clean_failure(proc, *CLEAN_DISK_FULL)
                # Readable while the disk is still full, and exactly as before.
                assert logical(path) == before
                assert fts_problems(path) == {}
                assert scalar(path, "SELECT version FROM schema_version") == 21
                filler.unlink()
                legacy_application_writes(path)
                assert fts_problems(path) == {}
                # With space, it completes.
                assert migrate.upgrade(str(path), app_version=21).layout_after == "external"
            else:
                filler.unlink()
                layout = "SELECT value FROM state_meta WHERE key = ?"
                assert scalar(path, layout, [LAYOUT_MARKER]) == "external"
            assert fts_problems(path) == {}
        assert failures >= 1, "the smallest free space should have made the upgrade fail"


@pytest.mark.slow
@pytest.mark.parametrize("no_vacuum", [False, True], ids=["optimize", "optimize-no-vacuum"])
def test_optimize_on_a_full_disk_fails_clearly_and_leaves_the_store_usable(
    no_vacuum: bool, small_templates: dict[str, Path], tmp_path: Path
) -> None:
    template = small_templates["head"]
    size = template.stat().st_size
    with tmpfs(tmp_path / "disk", size * 4 + (4 << 20)) as disk:
        path = disk / "state.db"
        env = {"SQLITE_TMPDIR": str(disk)}  # VACUUM's temporary copy lands here too
        outcomes = []
        for free in (32 << 10, size // 2, size + (size >> 1), 3 * size):
            copy_store(template, path)
            before = logical(path)
            filler = leave_free(disk, free)
            args = ["optimize", "--db", path, "--no-vacuum" if no_vacuum else "--vacuum"]
            # VACUUM's temporary copy goes to SQLITE_TMPDIR, which SQLite reads when the
            # process starts: that case needs a real process.
            proc = cli(*args) if no_vacuum else run_cli(*args, env=env)
            outcomes.append(proc.returncode)
            if proc.returncode != 0:
                line = assert_clean_failure(proc)
                assert "disk is full" in line or "VACUUM needs about" in line, line
            assert logical(path) == before
            assert fts_problems(path) == {}
            filler.unlink()
            application_writes(path)
            if proc.returncode != 0:  # with space, it completes
                assert cli(*args).returncode == 0
                assert fts_problems(path) == {}
        assert 1 in outcomes, outcomes
        assert 0 in outcomes, outcomes


@pytest.mark.slow
def test_a_vacuum_that_runs_out_of_space_midway_is_rolled_back(
    small_templates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The space check passed, then someone else filled the disk: VACUUM fails cleanly."""
    monkeypatch.setattr(sqlite_optimize, "check_vacuum_space", lambda _path: None)
    template = small_templates["head"]
    size = template.stat().st_size
    with tmpfs(tmp_path / "disk", size * 3 + (4 << 20)) as disk:
        path = disk / "state.db"
        for free in (64 << 10, size // 4, size // 2):
            copy_store(template, path)
            with contextlib.closing(sqlite3.connect(path)) as conn:  # pages to reclaim
                conn.execute("DELETE FROM messages WHERE id % 3 = 0")
                conn.commit()
            before = logical(path)
            filler = leave_free(disk, free)
            engine = create_store_engine(path, create=False)
            try:
                with pytest.raises(DiskFull, match="disk is full"):
                    maintenance.optimize(engine)
            finally:
                engine.dispose()
            assert logical(path) == before
            assert fts_problems(path) == {}
            filler.unlink()
            application_writes(path)


@pytest.mark.slow
def test_optimize_storage_on_a_full_disk_keeps_finished_chunks_and_resumes(
    small_templates: dict[str, Path], tmp_path: Path
) -> None:
    template = small_templates["deferred"]
    reference = tmp_path / "reference.db"
    copy_store(template, reference)
    backfill_engine = create_store_engine(reference, create=False)
    backfill.run(backfill_engine, duty=1.0)
    backfill_engine.dispose()
    expected = searchable(reference)
    size = template.stat().st_size
    with tmpfs(tmp_path / "disk", size * 2 + (4 << 20)) as disk:
        path = copy_store(template, disk / "state.db")
        assert searchable(path) == expected  # search covers pending rows meanwhile
        filler = leave_free(disk, 48 << 10)
        proc = cli("optimize-storage", "--db", path, "--chunk-rows", "50")
        assert_clean_failure(proc, *CLEAN_DISK_FULL)
        # Consistent: every check passes (pending ranges skipped), search is complete.
        assert cli("check", "--db", path).returncode == 0
        assert searchable(path) == expected
        filler.unlink()
        proc = cli("optimize-storage", "--db", path)
        assert proc.returncode == 0, proc
        assert fts_problems(path) == {}
        assert searchable(path) == expected


#: Free-space levels of the full-disk scan.
SCAN_LEVELS = 20


@pytest.fixture(scope="module")
def scan_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A legacy store whose two inline copies (2 MiB) outgrow SQLite's page cache (2,000
    KiB): the conversion's dirty pages spill to disk mid-statement, where a full disk used
    to surface as 'no such savepoint' or 'vtable constructor failed' instead."""
    return build_corpus_store(tmp_path_factory.mktemp("scan") / "legacy.db", 3000, seed=5)


@pytest.fixture(scope="module")
def scan_reference(scan_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    """The scan's store converted (revisions 21 and the search layout's head): what a
    finished `upgrade --app-version 21` gives."""
    path = copy_store(scan_template, tmp_path_factory.mktemp("scan-ref") / "state.db")
    migrate.upgrade(str(path), app_version=21)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return snapshot(path)


@pytest.mark.parametrize("up_front", [True, False], ids=["space-check", "no-space-check"])
def test_a_full_disk_at_every_free_space_level_is_named_and_changes_nothing(
    up_front: bool,
    scan_template: Path,
    scan_reference: Snapshot,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The in-place upgrade of a legacy store at 20 free-space levels, SQLite's temporary
    files on the same small file system: each attempt upgrades the store, or fails in one
    line naming the full disk, with every message there. Refused up front, saying what it
    needs, the file is byte for byte as it was. Without that check (the space ran out
    mid-statement: what the check cannot foresee), the store is wholly at its old revision;
    there the full disk used to be reported as 'no such savepoint: sa_savepoint_3' or
    'vtable constructor failed: messages_fts_trigram'."""
    template = scan_template
    original = fingerprint(template)
    at_21 = snapshot(template)
    messages = rows(template, "SELECT * FROM messages ORDER BY id")
    size = template.stat().st_size
    with (
        tmpfs(tmp_path / "disk", 3 * size + (8 << 20)) as disk,
        sqlite_temp_directory(disk / "tmp") as temp_dir,
    ):
        path = disk / "state.db"
        copy_store(template, path)
        filler = leave_free(disk, 256 << 10)
        with pytest.raises(NotEnoughFreeSpace) as refused:
            migrate.upgrade(str(path), app_version=21)
        filler.unlink()
        need = refused.value.needed
        assert refused.value.where == str(disk)
        # Schema pages only: the copies are set aside in the conversion's transaction and
        # freed afterwards step by step, which gives way to a full disk.
        assert need < size // 3
        if not up_front:
            monkeypatch.setattr(sqlite_migration, "check_upgrade_space", lambda *_a, **_k: None)
        outcomes: list[tuple[int, str]] = []
        # From almost nothing to a third more than the upgrade says it needs.
        for level in range(SCAN_LEVELS):
            free = 16 << 10 if level == 0 else need * 4 * level // (3 * (SCAN_LEVELS - 1))
            copy_store(template, path)
            filler = leave_free(disk, free)
            if level == 0:  # even opening it needs space (its -shm): reading commands too
                for reading in (["stats"], ["current"], ["check"]):
                    assert_clean_failure(cli(*reading, "--db", path), "disk is full")
            proc = cli("upgrade", "--db", path, "--app-version", "21")
            filler.unlink()
            assert rows(path, "SELECT * FROM messages ORDER BY id") == messages
            if proc.returncode == 0:
                outcomes.append((free, "upgraded"))
                assert whole_revision(path, at_21, scan_reference) == "external"
                continue
            line = assert_clean_failure(proc, "disk is full")
            if "needs about" in line:
                outcomes.append((free, "refused"))
                assert f"on {disk} (" in line, line
                assert "nothing was changed" in line
            else:
                outcomes.append((free, "failed"))
            if up_front or level == 0:
                assert fingerprint(path) == original, (free, line)
                wal = Path(f"{path}-wal")
                assert not wal.exists() or wal.stat().st_size == 0
            else:  # adopted (stamped 21) at most, the conversion rolled back whole
                assert whole_revision(path, at_21, scan_reference) == "inline", (free, line)
        assert list(temp_dir.iterdir()) == []  # SQLite removed its temporary files
    upgraded = [free for free, kind in outcomes if kind == "upgraded"]
    failed = [free for free, kind in outcomes if kind != "upgraded"]
    assert upgraded, outcomes
    assert failed, outcomes
    if up_front:
        assert {kind for _, kind in outcomes[1:]} == {"refused", "upgraded"}, outcomes
    else:
        assert {kind for _, kind in outcomes} == {"failed", "upgraded"}, outcomes
        # The need said up front is enough, and not far above what the upgrade really took.
        assert min(upgraded) <= need, outcomes
        assert max(failed) < need, outcomes
        # (or small anyway: an in-place conversion only writes schema pages)
        assert max(failed) > need * 0.6 or need < 2 << 20, outcomes


def test_a_full_temporary_directory_is_named_through_sqlite_tmpdir(
    scan_template: Path, tmp_path: Path
) -> None:
    """The store on a roomy disk, SQLITE_TMPDIR (read by a real process at start) on a full
    one: the upgrade is refused up front, naming the temporary directory's file system."""
    path = copy_store(scan_template, tmp_path / "state.db")
    with tmpfs(tmp_path / "tmp", 4 << 20) as temp_dir:
        filler = leave_free(temp_dir, 256 << 10)
        proc = run_cli(
            "upgrade", "--db", path, "--app-version", "21", env={"SQLITE_TMPDIR": str(temp_dir)}
        )
        filler.unlink()
        line = assert_clean_failure(proc, "disk is full", f"on {temp_dir} (", "temporary files")
        assert "SQLITE_TMPDIR" in line
    assert fingerprint(path) == fingerprint(scan_template)


def test_an_upgrade_without_room_is_refused_before_anything_changes(
    small_templates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The space check, without a mount: the file system says 1 MiB is free."""
    path = copy_store(small_templates["legacy"], tmp_path / "state.db")
    before = fingerprint(path)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda where: real(where)._replace(free=1 << 20))
    with pytest.raises(NotEnoughFreeSpace, match="disk is full") as refused:
        migrate.upgrade(str(path))
    assert isinstance(refused.value, DiskFull)
    assert refused.value.free == 1 << 20
    assert refused.value.needed > 1 << 20
    assert "needs about" in str(refused.value)
    assert "only 1.0 MiB is free" in str(refused.value)
    # The command line and the bare `alembic` say the same in one line.
    line = assert_clean_failure(cli("upgrade", "--db", path), "disk is full", "needs about")
    assert "nothing was changed" in line
    assert "in-place search conversion" in line
    rebuild = assert_clean_failure(cli("upgrade", "--db", path, "--rebuild-fts"), "disk is full")
    assert "rebuild search conversion" in rebuild
    with pytest.raises(CommandError, match="disk is full"):
        alembic_command.upgrade(migrate.alembic_config(x={"db": str(path)}), "head")
    assert fingerprint(path) == before
    wal = Path(f"{path}-wal")  # the read-only classification may leave it, empty
    assert not wal.exists() or wal.stat().st_size == 0
    # A backup to the same file system adds the store's size to the need.
    needed = refused.value.needed
    monkeypatch.setattr(
        shutil, "disk_usage", lambda where: real(where)._replace(free=needed + (64 << 10))
    )
    with pytest.raises(NotEnoughFreeSpace, match="the backup"):
        migrate.upgrade(str(path), backup_to=tmp_path / "backup.db")
    assert fingerprint(path) == before
    assert not (tmp_path / "backup.db").exists()
    # With the space it says, it runs.
    assert migrate.upgrade(str(path)).layout_after == "external"


def test_no_space_check_at_head(
    small_templates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At head no step is pending: nothing to check, however full the disk looks."""
    path = copy_store(small_templates["head"], tmp_path / "state.db")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda where: real(where)._replace(free=0))
    result = migrate.upgrade(str(path))
    assert result.before == result.after == (migrate.head_revision(),)


@pytest.fixture
def page_limit() -> Iterator[Callable[[int | None], None]]:
    """Cap every new connection's store at its current size plus N pages."""
    state: dict[str, int | None] = {"extra": None}

    def on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        extra = state["extra"]
        if extra is not None:
            pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
            dbapi_connection.execute(f"PRAGMA max_page_count = {pages + extra}")

    event.listen(Engine, "connect", on_connect)

    def limit(extra: int | None) -> None:
        state["extra"] = extra

    yield limit
    event.remove(Engine, "connect", on_connect)


@pytest.mark.parametrize("store", ["drifted", "head-optimize"])
def test_a_page_limit_full_store_is_reported_and_rolled_back(
    store: str,
    small_templates: dict[str, Path],
    tmp_path: Path,
    page_limit: Callable[[int | None], None],
) -> None:
    """The same guarantee without a mount: SQLite's own page limit (SQLITE_FULL)."""
    template = small_templates["drifted" if store == "drifted" else "head"]
    path = copy_store(template, tmp_path / "state.db")
    if store == "head-optimize":
        with contextlib.closing(sqlite3.connect(path)) as conn:  # segments to merge
            conn.execute("UPDATE messages SET content = content || ' more' WHERE id % 3 = 0")
            conn.commit()
    before = logical(path)
    page_limit(2)
    engine = create_store_engine(path, create=False)
    try:
        if store == "drifted":
            with pytest.raises(DiskFull, match="disk is full"):
                migrate.upgrade(str(path), app_version=21)  # the conversion alone
        else:
            with pytest.raises(DiskFull, match="disk is full"):
                # The one-transaction merge ('optimize') needs new pages; bounded steps
                # may fit in the free ones.
                maintenance.optimize(engine, vacuum=True)
    finally:
        engine.dispose()
    page_limit(None)
    assert logical(path) == before
    assert fts_problems(path) == {}
    (legacy_application_writes if store == "drifted" else application_writes)(path)


# ======================================================================================
# 3. Contention: a writer in another process; readers during every maintenance command
# ======================================================================================

HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE sessions SET title = title WHERE rowid = 1")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
print("released", flush=True)
"""


@contextlib.contextmanager
def write_transaction_in_another_process(path: Path) -> Iterator[Callable[[], None]]:
    """Another process holds a write transaction until the returned function is called."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    assert proc.stdout.readline().strip() == "locked"

    def release() -> None:
        if proc.poll() is None:
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "released"

    try:
        yield release
    finally:
        try:
            release()
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:  # never left running into later tests
                proc.kill()
                proc.wait()


def test_upgrade_against_a_held_write_lock_fails_clearly_without_changes(
    small_templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(small_templates["legacy"], tmp_path / "state.db")
    before = logical(path)
    with write_transaction_in_another_process(path):
        proc = cli("upgrade", "--db", path, env={ENV_BUSY_TIMEOUT: "300"})
        assert_clean_failure(proc, "locked", "busy timeout")
    assert logical(path) == before
    assert "alembic_version" not in {r[0] for r in rows(path, "SELECT name FROM sqlite_master")}
    assert fts_problems(path) == {}


def _waiting_on(pid: int, path: Path) -> bool:
    """The process has the store open (Linux: /proc/PID/fd)."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == str(path):
                    return True
    return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see the wait")
def test_upgrade_waits_for_a_write_lock_released_within_the_busy_timeout(
    small_templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(small_templates["legacy"], tmp_path / "state.db")
    with write_transaction_in_another_process(path) as release:
        upgrade = subprocess.Popen(
            [sys.executable, "-m", "hermes_store.cli", "upgrade", "--db", str(path), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, ENV_BUSY_TIMEOUT: "60000"},
        )
        try:
            # Once it has the store open it is past the read-only classification and is
            # waiting for the lock; let it wait a little, then let go.
            for _ in range(600):
                if _waiting_on(upgrade.pid, path) or upgrade.poll() is not None:
                    break
                time.sleep(0.05)
            time.sleep(0.5)
            assert upgrade.poll() is None, "the upgrade did not wait for the lock"
            release()
            out, err = upgrade.communicate(timeout=120)
        finally:
            if upgrade.poll() is None:
                upgrade.kill()
                upgrade.wait()
    assert upgrade.returncode == 0, err
    assert json.loads(out)["to"] == migrate.head_revision()
    assert fts_problems(path) == {}


#: A reader in its own process: a fresh read transaction per loop, busy timeout 0 (a
#: reader that would have to wait fails instead). Prints one line per read.
READER = r"""
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
while True:
    try:
        count = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        hits = [r[0] for r in conn.execute(
            "SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'error' ORDER BY rowid")]
        print(json.dumps({"count": count, "hits": len(hits)}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
"""


class Reader:
    """A reader process and what it read, collected by a thread."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READER, str(path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.reads: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._collect, daemon=True)
        self.thread.start()

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.reads.append(json.loads(line))
                self.changed.notify_all()

    def wait_for_more(self, timeout: float = 20.0) -> bool:
        """Block until the reader completed two more reads."""
        with self.changed:
            target = len(self.reads) + 2
            return self.changed.wait_for(lambda: len(self.reads) >= target, timeout)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.thread.join(timeout=10)


@contextlib.contextmanager
def readers_checked_mid_statement(path: Path) -> Iterator[dict[str, int]]:
    """While the block runs, pause its SQL statements now and then until a reader in another
    process has read twice: a maintenance step that blocked readers would stall here."""
    reader = Reader(path)
    assert reader.wait_for_more(), "the reader never started"
    stats = {"pauses": 0, "stalled": 0}

    def on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        calls = {"n": 0}

        def progress() -> int:
            calls["n"] += 1
            if calls["n"] % 200 == 1 and stats["pauses"] < 12:
                stats["pauses"] += 1
                if not reader.wait_for_more():
                    stats["stalled"] += 1
            return 0

        dbapi_connection.set_progress_handler(progress, 1000)

    event.listen(Engine, "connect", on_connect)
    try:
        yield stats
    finally:
        event.remove(Engine, "connect", on_connect)
        reader.stop()
    errors = [read for read in reader.reads if "error" in read]
    assert not errors, errors[:3]
    assert {read["count"] for read in reader.reads} == {
        scalar(path, "SELECT count(*) FROM messages")
    }
    assert stats["stalled"] == 0
    assert stats["pauses"] >= 1, "the command ran no statement long enough to pause in"


def _maintenance(command: str, path: Path) -> None:
    engine = create_store_engine(path, create=False)
    try:
        if command == "optimize":
            maintenance.optimize(engine)
        elif command == "optimize-storage":
            backfill.run(engine, duty=1.0)
        elif command == "check":
            with engine.connect() as conn:
                assert maintenance.check_store(conn).ok
        elif command == "check --repair":
            with contextlib.closing(sqlite3.connect(path)) as conn:
                conn.execute(
                    "INSERT INTO messages_fts(messages_fts, rowid, content) "
                    "VALUES ('delete', (SELECT min(id) FROM messages), 'wrong text')"
                )
                conn.commit()
            assert maintenance.repair(engine).ok
    finally:
        engine.dispose()


MAINTENANCE = [
    "upgrade",
    "upgrade-rebuild",
    "optimize",
    "optimize-storage",
    "check",
    "check --repair",
]


@pytest.mark.slow
@pytest.mark.parametrize("command", MAINTENANCE)
def test_readers_keep_reading_during_every_maintenance_command(
    command: str, small_templates: dict[str, Path], tmp_path: Path
) -> None:
    template = {
        "upgrade": "legacy",
        "upgrade-rebuild": "legacy",
        "optimize-storage": "deferred",
    }.get(command, "head")
    path = copy_store(small_templates[template], tmp_path / "state.db")
    if command == "optimize":  # give VACUUM something to reclaim
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("DELETE FROM messages WHERE id % 4 = 0")
            conn.commit()
    with readers_checked_mid_statement(path):
        if command.startswith("upgrade"):
            x = {"fts_convert": "rebuild"} if command == "upgrade-rebuild" else {}
            assert migrate.upgrade(str(path), x=x).after == (migrate.head_revision(),)
        else:
            _maintenance(command, path)
    assert fts_problems(path) == {}


# ======================================================================================
# 4. File system limits
# ======================================================================================


WRITING_COMMANDS = (["upgrade"], ["optimize"], ["optimize-storage"], ["check", "--repair"])
READING_COMMANDS = (["current"], ["stats"], ["storage"], ["search", "error"], ["check"])


@pytest.fixture
def read_only_mount(small_templates: dict[str, Path], tmp_path: Path) -> Iterator[Path]:
    """A head store (WAL, no -wal / -shm) on a file system mounted read-only."""
    with tmpfs(tmp_path / "ro", 64 << 20) as mount:
        path = copy_store(small_templates["head"], mount / "state.db")
        remount_read_only(mount)
        yield path


# Reporting commands read such a store: tests/test_read_only_store.py.
@pytest.mark.parametrize("command", WRITING_COMMANDS, ids=" ".join)
def test_a_read_only_file_system_gets_a_clear_error(
    command: list[str], read_only_mount: Path
) -> None:
    before = fingerprint(read_only_mount)
    proc = cli(*command, "--db", read_only_mount)
    assert_clean_failure(proc, "read-only")
    assert fingerprint(read_only_mount) == before


@pytest.mark.parametrize("what", ["file", "directory"])
def test_an_immutable_store_or_directory_refuses_writes_clearly(
    what: str, small_templates: dict[str, Path], tmp_path: Path
) -> None:
    for command in WRITING_COMMANDS:
        # optimize-storage gets a store with a deferred fill to do; the others a head store.
        kind = "deferred" if command == ["optimize-storage"] else "head"
        directory = tmp_path / kind / " ".join(command)
        directory.mkdir(parents=True)
        path = copy_store(small_templates[kind], directory / "state.db")
        before = fingerprint(path)
        with immutable(path if what == "file" else directory):
            result = cli(*command, "--db", path)
            assert_clean_failure(result, "read-only", "nothing was changed")
            if command == ["upgrade"]:
                with pytest.raises(StoreReadOnly):
                    migrate.upgrade(str(path), x={"fts_convert": "rebuild"})
            if what == "file":  # a reader can still open it: its directory takes -wal / -shm
                assert cli("stats", "--db", path).returncode == 0
        assert fingerprint(path) == before


def test_a_file_system_without_wal_falls_back_to_the_rollback_journal_with_a_warning(
    small_templates: dict[str, Path], tmp_path: Path
) -> None:
    """The unix-dotfile VFS has no shared memory, so SQLite refuses WAL on it exactly as it
    does on network file systems without the locking WAL needs."""
    path = copy_store(small_templates["legacy"], tmp_path / "state.db")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    url = f"sqlite:///file:{path}?vfs=unix-dotfile&uri=true"
    proc = run_cli("upgrade", "--db", url)
    assert proc.returncode == 0, proc
    assert "Traceback" not in proc.stderr
    warnings_shown = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(warnings_shown) == 1, proc.stderr
    assert warnings_shown[0].startswith("Warning: ")
    assert "refused WAL" in warnings_shown[0]
    assert "rollback journal" in warnings_shown[0]
    assert scalar(path, "PRAGMA journal_mode") == "delete"
    assert not Path(f"{path}-wal").exists()
    assert fts_problems(path) == {}
    with pytest.warns(WalUnavailableWarning):
        application_writes_url(url)


def application_writes_url(url: str) -> None:
    with Store.open(url) as store:
        store.create_session("s-nowal", "cli")
        store.append_message("s-nowal", NewMessage("user", "zanzibarquux without wal"))
        with store.engine.connect() as conn:
            assert len(search_messages(conn, "zanzibarquux")) == 1


@pytest.mark.parametrize(
    "command", [*WRITING_COMMANDS, *READING_COMMANDS, ["upgrade", "--backup", "x.db"]], ids=" ".join
)
def test_a_directory_where_the_store_should_be_is_refused(
    command: list[str], tmp_path: Path
) -> None:
    directory = tmp_path / "state.db"
    directory.mkdir()
    (directory / "keep").write_text("mine")
    assert_clean_failure(cli(*command, "--db", directory), "directory")
    assert [p.name for p in directory.iterdir()] == ["keep"]


@pytest.mark.parametrize("side", ["-wal", "-shm", "-journal"])
@pytest.mark.parametrize("command", [["upgrade"], ["stats"], ["check", "--repair"]], ids=" ".join)
def test_a_symlink_planted_at_a_side_file_is_refused_and_its_target_untouched(
    side: str, command: list[str], small_templates: dict[str, Path], tmp_path: Path
) -> None:
    path = copy_store(small_templates["head"], tmp_path / "state.db")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    Path(f"{path}{side}").symlink_to(victim)
    before = fingerprint(path)
    assert_clean_failure(cli(*command, "--db", path), "symbolic link", side)
    assert victim.read_text() == "precious\n"
    assert fingerprint(path) == before
    # Refused when SQLite first opens that side file (a write, at the latest).
    with pytest.raises(UnsafePath, match=side):
        _write_through_an_engine(path)
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("side", ["-wal", "-shm"])
@pytest.mark.parametrize("way", ["store", "engine", "backup"])
def test_a_side_file_link_planted_after_this_process_opened_the_store_is_refused(
    side: str, way: str, small_templates: dict[str, Path], tmp_path: Path
) -> None:
    """Opening looks at the side files once per process: a link planted later is refused
    by SQLite (O_NOFOLLOW) at the next use, and named as at the first opening. The store
    is in rollback-journal mode (as a restored backup is): a -wal link fails while the
    connection is set up (entering WAL), a -shm link only at the first statement."""
    path = copy_store(small_templates["head"], tmp_path / "state.db")
    with Store.open(path) as store:  # this process has now looked at its side files
        store.list_sessions()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    Path(f"{path}{side}").symlink_to(victim)
    uses: dict[str, Callable[[], object]] = {
        "store": lambda: _create_session_through_the_store(path),
        "engine": lambda: _write_through_an_engine(path),
        "backup": lambda: backup(str(path), tmp_path / "copy.db"),
    }
    with pytest.raises(UnsafePath, match=side):
        uses[way]()
    assert victim.read_text() == "precious\n"


def _create_session_through_the_store(path: Path) -> None:
    with Store.open(path) as store:
        store.create_session("planted", "cli")


def test_a_dangling_link_reached_through_dot_dot_is_not_followed_to_create_a_store(
    tmp_path: Path,
) -> None:
    (tmp_path / "sub").mkdir()
    target = tmp_path / "elsewhere" / "created-through-the-link.db"
    target.parent.mkdir()
    (tmp_path / "state.db").symlink_to(target)
    assert_clean_failure(
        cli("upgrade", "--create", "--db", f"{tmp_path}/sub/../state.db"), "symbolic link"
    )
    assert not target.exists()


def _write_through_an_engine(path: Path) -> None:
    engine = create_store_engine(path)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO state_meta (key, value) VALUES ('k', 'v')")
    finally:
        engine.dispose()


def test_a_symlinked_store_is_followed_and_its_side_files_live_next_to_the_target(
    small_templates: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    real = copy_store(small_templates["legacy"], tmp_path / "data" / "state.db")
    link = tmp_path / "home" / "state.db"
    link.parent.mkdir()
    link.symlink_to(real)
    proc = cli("upgrade", "--db", link)
    assert proc.returncode == 0, proc
    assert link.is_symlink()
    assert scalar(real, "SELECT version FROM schema_version") == 30
    assert not list(link.parent.glob("state.db-*"))
    assert fts_problems(real) == {}


def test_a_store_in_a_linked_directory_is_the_same_store_and_its_side_files_are_checked(
    small_templates: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    real = copy_store(small_templates["legacy"], tmp_path / "data" / "state.db")
    (tmp_path / "home").symlink_to(tmp_path / "data", target_is_directory=True)
    through = tmp_path / "home" / "state.db"
    assert db_path(to_url(through)) == through  # the name given, not resolved
    proc = cli("upgrade", "--db", through)
    assert proc.returncode == 0, proc
    assert scalar(real, "SELECT version FROM schema_version") == 30
    assert fts_problems(real) == {}
    # The -wal through the linked directory is the target's: a link there is refused.
    (tmp_path / "data" / "state.db-wal").symlink_to(tmp_path / "elsewhere")
    assert_clean_failure(cli("stats", "--db", through), "symbolic link")
    assert not (tmp_path / "elsewhere").exists()


def test_dot_dot_after_a_linked_directory_leads_to_the_targets_parent(
    small_templates: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "data" / "inner").mkdir(parents=True)
    real = copy_store(small_templates["legacy"], tmp_path / "data" / "state.db")
    (tmp_path / "home").symlink_to(tmp_path / "data" / "inner", target_is_directory=True)
    given = f"{tmp_path}/home/../state.db"  # read without the disk: {tmp_path}/state.db
    assert db_path(to_url(given)) == real
    proc = cli("upgrade", "--db", given)
    assert proc.returncode == 0, proc
    assert scalar(real, "SELECT version FROM schema_version") == 30
    assert not (tmp_path / "state.db").exists()


def test_a_dangling_symlink_is_not_followed_to_create_a_store(tmp_path: Path) -> None:
    link = tmp_path / "state.db"
    target = tmp_path / "elsewhere" / "created-through-the-link.db"
    target.parent.mkdir()
    link.symlink_to(target)
    for command in (["upgrade"], ["stats"]):
        assert_clean_failure(cli(*command, "--db", link), "symbolic link")
    assert not target.exists()


def test_a_held_lock_is_a_domain_error_for_library_callers(
    small_templates: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Library callers get the same classification the CLI prints."""
    path = copy_store(small_templates["legacy"], tmp_path / "state.db")
    monkeypatch.setenv(ENV_BUSY_TIMEOUT, "100")
    with write_transaction_in_another_process(path), pytest.raises(StoreBusy, match="locked"):
        migrate.upgrade(str(path))
    assert scalar(path, "SELECT version FROM schema_version") == 21
    assert fts_problems(path) == {}


def _agent_stall_module() -> Any:
    """benchmarks/agent_stall.py: the application-like writer and reader, shared with the
    benchmark that measures the writer's waits on a large store."""
    spec = importlib.util.spec_from_file_location(
        "agent_stall", Path(__file__).resolve().parent.parent / "benchmarks" / "agent_stall.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_agent_keeps_writing_through_every_maintenance_command(
    small_templates: dict[str, Path], tmp_path: Path
) -> None:
    """An application-like writer (one commit per message, busy timeout 1 s, 15 attempts)
    and a long reader while optimize, check, check --repair and optimize-storage run in
    turn, repeatedly: no writer error, every command succeeds, nothing corrupt, every
    message written is there. (The writer's longest wait at 200k messages is measured by
    `python -m benchmarks.agent_stall`; tests assert no time.)"""
    stall = _agent_stall_module()
    path = copy_store(small_templates["head"], tmp_path / "state.db")
    seen = stall.run(path, seconds=30.0, reader_seconds=20.0)
    assert seen["writer_errors"] == 0, seen
    assert seen["writer_messages"] > 100
    assert {c["command"] for c in seen["commands"]} >= {
        "optimize",
        "check",
        "check --repair",
        "optimize-storage",
    }
    assert [c for c in seen["commands"] if c["exit"] != 0] == []
    assert fts_problems(path) == {}
    with contextlib.closing(sqlite3.connect(path)) as conn:
        written = conn.execute(
            "SELECT count(*), max(message_count) FROM messages JOIN sessions s "
            "ON s.id = session_id WHERE session_id = ?",
            (seen["writer_session"],),
        ).fetchone()
    assert written == (seen["writer_messages"], seen["writer_messages"])

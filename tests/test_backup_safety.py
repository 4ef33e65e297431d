"""A backup can never destroy the store it copies, and leaves nothing behind when killed."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store, insert_legacy_rows

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.errors import StoreNotFound, UnsafePath
from hermes_store.sqlite.backup import backup

SESSIONS = [{"id": "s1", "source": "cli", "started_at": 1.0}]
MESSAGES = [
    {"session_id": "s1", "role": "user", "content": f"message {i}", "timestamp": float(i)}
    for i in range(50)
]


def rows(path: Path) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT id, content FROM messages ORDER BY id").fetchall()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    build_legacy_store(path, 21)
    insert_legacy_rows(path, SESSIONS, MESSAGES)
    return path


@contextlib.contextmanager
def agent_holding_the_wal(path: Path) -> Iterator[None]:
    """A connection that keeps the store's -wal and -shm in place, as the running agent does."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) "
        "VALUES ('s1', 'user', 'written by the agent', 99.0)"
    )
    conn.commit()
    try:
        yield
    finally:
        conn.close()


def _itself(store: Path) -> Path:
    return store


def _wal(store: Path) -> Path:
    return store.with_name(store.name + "-wal")


def _shm(store: Path) -> Path:
    return store.with_name(store.name + "-shm")


def _hard_link(store: Path) -> Path:
    link = store.with_name("hard-link.db")
    os.link(store, link)
    return link


def _symlink(store: Path) -> Path:
    link = store.with_name("sym-link.db")
    link.symlink_to(store)
    return link


def _symlink_to_wal(store: Path) -> Path:
    link = store.with_name("sym-link-wal.db")
    link.symlink_to(_wal(store))
    return link


DESTINATIONS: dict[str, Callable[[Path], Path]] = {
    "the store": _itself,
    "its -wal": _wal,
    "its -shm": _shm,
    "a hard link to it": _hard_link,
    "a symlink to it": _symlink,
    "a symlink to its -wal": _symlink_to_wal,
}


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
@pytest.mark.parametrize("where", DESTINATIONS)
def test_a_backup_onto_the_store_is_refused_whatever_the_flags(
    store: Path, where: str, overwrite: bool
) -> None:
    with agent_holding_the_wal(store):
        before = rows(store)
        dest = DESTINATIONS[where](store)
        with pytest.raises(UnsafePath, match="destroy the store"):
            migrate.upgrade(str(store), backup_to=dest, overwrite_backup=overwrite)
        with pytest.raises(UnsafePath, match="destroy the store"):
            backup(str(store), dest, overwrite=overwrite)
        assert rows(store) == before  # every committed row is still there
    # And nothing was changed: the store is still the unversioned legacy one.
    assert migrate.inspect_file(store).kind == "legacy"


def test_the_cli_refuses_in_one_line(store: Path) -> None:
    result = CliRunner().invoke(
        main, ["upgrade", "--db", str(store), "--backup", str(store), "--overwrite-backup"]
    )
    assert result.exit_code == 1
    assert "destroy the store" in result.output
    assert "Traceback" not in result.output
    assert migrate.inspect_file(store).kind == "legacy"


def test_leftovers_of_a_killed_backup_are_removed_by_the_next(store: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backups" / "state.bak"
    dest.parent.mkdir()
    # A process that has exited: its pid is free, so its partial copy is a leftover.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    leftover = dest.with_name(f".{dest.name}.{dead.stdout.strip()}.123.partial")
    leftover.write_bytes(b"x" * 4096)
    journal = leftover.with_name(leftover.name + "-journal")
    journal.write_bytes(b"x")
    # One of a backup still running (this process) is not touched.
    running = dest.with_name(f".{dest.name}.{os.getpid()}.456.partial")
    running.write_bytes(b"y")
    unrelated = dest.with_name(f".other.bak.{dead.stdout.strip()}.1.partial")
    unrelated.write_bytes(b"z")

    backup(str(store), dest)

    assert dest.is_file()
    assert not leftover.exists()
    assert not journal.exists()
    assert running.exists()
    assert unrelated.exists()  # another destination's files are not this backup's to judge


def test_optimize_removes_the_leftovers_killed_backups_left_beside_the_store(
    store: Path,
) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    leftovers = [
        store.with_name(f".state.repair-20261130T000000Z.bak.{dead}.9.partial"),
        store.with_name(f".elsewhere.db.{dead}.8.partial-journal"),
    ]
    for leftover in leftovers:
        leftover.write_bytes(b"x" * 4096)
    running = store.with_name(f".state.bak.{os.getpid()}.7.partial")  # a backup under way
    running.write_bytes(b"y")
    migrate.upgrade(str(store))
    result = CliRunner().invoke(main, ["optimize", "--db", str(store), "--json"])
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(result.stdout)["removed_partials"]) == sorted(map(str, leftovers))
    assert not any(leftover.exists() for leftover in leftovers)
    assert running.exists()
    assert rows(store)[:50] == [(i + 1, f"message {i}") for i in range(50)]


def test_a_backup_into_a_missing_directory_is_refused_and_creates_nothing(
    store: Path, tmp_path: Path
) -> None:
    """A mistyped --backup directory is an error, not a new directory tree."""
    dest = tmp_path / "new" / "deeper" / "state.bak"
    before = store.read_bytes()
    with pytest.raises(StoreNotFound, match="no such directory"):
        backup(str(store), dest)
    assert not (tmp_path / "new").exists()
    assert store.read_bytes() == before


def test_a_backup_is_private_whatever_the_umask(store: Path, tmp_path: Path) -> None:
    dest = tmp_path / "state.bak"
    previous = os.umask(0)
    try:
        backup(str(store), dest)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600

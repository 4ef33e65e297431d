"""Reporting commands on a store they cannot write: they read it, and say how.

A WAL store is read through its -shm, which SQLite must create when it is missing; where
it cannot (a read-only file system, a directory or file the user may not write) the store
is read as immutable (`immutable=1`: the file alone, no locks, no WAL), and where the -wal
and -shm are there, with SQLite's read-only mode (`mode=ro`), which sees what the -wal
holds. Either way one `Warning: read-only: ...` line on stderr says which, and what a
-wal that could not be read left out. Commands that write keep refusing in one line.

The read-only file system is a tmpfs remounted read-only (root only, as in
tests/test_faults.py; elsewhere these tests skip and say why). A file that is read-only by
its mode binds no root process, so those tests take another user's part in this process
(`seteuid` to nobody), with the files made readable to that user.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from reliability_support import fingerprint, immutable, remount_read_only, tmpfs

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.demo import corpus

#: The reporting commands, each with what it needs to run.
READING = (
    ["current"],
    ["stats"],
    ["storage"],
    ["check"],
    ["search", "error"],
    ["history"],
)
WRITING = (["optimize"], ["check", "--repair"], ["upgrade"], ["stamp", "head"])
MESSAGES = 240


@pytest.fixture(scope="module")
def head_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WAL store at head, checkpointed: one self-contained file."""
    path = tmp_path_factory.mktemp("read-only") / "state.db"
    migrate.upgrade(str(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(MESSAGES, 11))
        conn.commit()
    assert path.read_bytes()[18:20] == b"\x02\x02"  # WAL mode
    assert not Path(f"{path}-wal").exists()
    return path


def with_uncheckpointed_wal(template: Path, target: Path, *, shm: bool) -> int:
    """``target``: the store with a -wal whose committed transaction (half the messages
    deleted) is not in the file yet, as a killed agent leaves it; with or without its
    -shm. Returns how many messages the store holds with that transaction."""
    shutil.copyfile(template, target)
    writer = sqlite3.connect(target)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("DELETE FROM messages WHERE id % 2 = 0")
        writer.commit()
        left = writer.execute("SELECT count(*) FROM messages").fetchone()[0]
        saved = {side: Path(f"{target}{side}").read_bytes() for side in ("", "-wal", "-shm")}
    finally:
        writer.close()  # its checkpoint and the removal of the side files are undone below
    for side, data in saved.items():
        if side != "-shm" or shm:
            Path(f"{target}{side}").write_bytes(data)
    assert 0 < left < MESSAGES
    return int(left)


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(arg) for arg in args])


def assert_read_with_a_note(result: Result, *fragments: str) -> str:
    """Exit 0, and one `Warning: read-only: ...` line on stderr saying how it was read."""
    assert result.exception is None, result.exception
    assert result.exit_code == 0, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Warning: read-only: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def messages_said(result: Result) -> int:
    return int(json.loads(result.stdout)["messages"])


@pytest.fixture
def read_only_fs(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs that the test fills, then remounts read-only."""
    with tmpfs(tmp_path / "ro", 64 << 20) as mount:
        yield mount


# --------------------------------------------------------------------------------------
# A read-only file system
# --------------------------------------------------------------------------------------


def on_read_only_fs(template: Path, mount: Path) -> Path:
    """The store copied onto the tmpfs, which is then remounted read-only."""
    store = mount / "state.db"
    shutil.copyfile(template, store)
    remount_read_only(mount)
    return store


@pytest.mark.parametrize("command", READING, ids=" ".join)
def test_every_reporting_command_reads_a_store_on_a_read_only_file_system(
    command: list[str], head_store: Path, read_only_fs: Path
) -> None:
    store = on_read_only_fs(head_store, read_only_fs)
    before = fingerprint(store)
    result = invoke(*command, "--db", store)
    assert_read_with_a_note(result, "read-only file system", "immutable")
    assert result.stdout.strip()
    assert fingerprint(store) == before
    assert sorted(p.name for p in read_only_fs.iterdir()) == ["state.db"]


def test_a_read_only_file_system_store_answers_what_the_store_holds(
    head_store: Path, read_only_fs: Path
) -> None:
    store = on_read_only_fs(head_store, read_only_fs)
    assert messages_said(invoke("stats", "--db", store, "--json")) == MESSAGES
    current = json.loads(invoke("current", "--db", store, "--json").stdout)
    assert current["revision"] == migrate.head_revision()
    hits = json.loads(invoke("search", "error", "--db", store, "--json").stdout)
    assert hits, "the corpus has messages about errors"
    check = json.loads(invoke("check", "--db", store, "--json").stdout)
    assert check["ok"] is True


def test_a_wal_with_its_shm_on_a_read_only_file_system_is_read_with_the_wal(
    head_store: Path, read_only_fs: Path
) -> None:
    store = read_only_fs / "state.db"
    left = with_uncheckpointed_wal(head_store, store, shm=True)
    remount_read_only(read_only_fs)
    result = invoke("stats", "--db", store, "--json")
    assert_read_with_a_note(result, "mode=ro")
    assert messages_said(result) == left  # the -wal's transaction is seen


def test_a_wal_without_its_shm_is_read_as_immutable_and_says_what_it_left_out(
    head_store: Path, read_only_fs: Path
) -> None:
    store = read_only_fs / "state.db"
    with_uncheckpointed_wal(head_store, store, shm=False)
    wal_bytes = Path(f"{store}-wal").stat().st_size
    remount_read_only(read_only_fs)
    result = invoke("stats", "--db", store, "--json")
    note = assert_read_with_a_note(result, "immutable", f"state.db-wal ({wal_bytes:,} bytes)")
    assert "not read" in note
    assert messages_said(result) == MESSAGES  # the file alone: the -wal's delete not seen


@pytest.mark.parametrize("command", WRITING, ids=" ".join)
def test_commands_that_write_refuse_a_read_only_file_system_in_one_line(
    command: list[str], head_store: Path, read_only_fs: Path
) -> None:
    store = on_read_only_fs(head_store, read_only_fs)
    before = fingerprint(store)
    result = invoke(*command, "--db", store)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert "read-only" in lines[0]
    assert fingerprint(store) == before


# --------------------------------------------------------------------------------------
# A file or a directory that may not be written
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["file", "directory"])
def test_an_immutable_file_or_directory_is_read_without_leaving_side_files(
    what: str, head_store: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "store"
    directory.mkdir()
    store = directory / "state.db"
    shutil.copyfile(head_store, store)
    before = fingerprint(store)
    with immutable(store if what == "file" else directory):
        for command in READING:
            result = invoke(*command, "--db", store)
            assert_read_with_a_note(result, "immutable")
        assert messages_said(invoke("stats", "--db", store, "--json")) == MESSAGES
        # -wal and -shm made here would stay: a read-only connection cannot remove them.
        assert sorted(p.name for p in directory.iterdir()) == ["state.db"]
    assert fingerprint(store) == before


NOBODY = 65534


@contextlib.contextmanager
def as_another_user() -> Iterator[None]:
    """The block runs as user nobody (effective ids), as an operator who is not the store's
    owner would; root ignores file modes, so this is how a mode is made to count here."""
    if os.geteuid() != 0:
        pytest.skip("needs root to take another user's part (CI runs as root)")
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def shared_directory() -> Iterator[Path]:
    """A directory another user can reach (pytest's own are private to root)."""
    directory = Path(tempfile.mkdtemp(prefix="hermes-ro-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_file_the_user_may_only_read_is_read_and_nothing_is_created_beside_it(
    head_store: Path, shared_directory: Path
) -> None:
    """A 0444 file in a directory the user may write: SQLite would create the -shm there,
    owned by this user, and leave it; the store's owner could then not open its own store."""
    shared_directory.chmod(0o777)
    store = shared_directory / "state.db"
    shutil.copyfile(head_store, store)
    store.chmod(0o444)
    with as_another_user():
        for command in READING:
            assert_read_with_a_note(invoke(*command, "--db", store), "not writable")
        counted = messages_said(invoke("stats", "--db", store, "--json"))
        refused = invoke("optimize", "--db", store)
    assert counted == MESSAGES
    assert refused.exit_code == 1
    assert "read-only" in refused.stderr
    assert sorted(p.name for p in shared_directory.iterdir()) == ["state.db"]


def test_another_users_live_store_is_read_with_its_wal(
    head_store: Path, shared_directory: Path
) -> None:
    """The agent (root here) has the store open and has committed to its -wal; an operator
    who may only read the files sees that commit (mode=ro through the agent's -shm)."""
    store = shared_directory / "state.db"
    shutil.copyfile(head_store, store)
    store.chmod(0o644)
    agent = sqlite3.connect(store)
    try:
        agent.execute("PRAGMA wal_autocheckpoint = 0")
        agent.execute("DELETE FROM messages WHERE id % 3 = 0")
        agent.commit()
        left = agent.execute("SELECT count(*) FROM messages").fetchone()[0]
        for side in ("-wal", "-shm"):
            Path(f"{store}{side}").chmod(0o644)
        with as_another_user():
            result = invoke("stats", "--db", store, "--json")
        assert_read_with_a_note(result, "mode=ro")
        assert messages_said(result) == left
    finally:
        agent.close()
    assert sorted(p.name for p in shared_directory.iterdir()) == ["state.db"]

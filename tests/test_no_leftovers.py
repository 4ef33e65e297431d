"""A command that fails leaves no file behind: not a -wal, not a -shm, not a half copy.

Each kind of broken store is put in a directory of its own, every command that opens a
store is run on it, and the directory is listed before and after. SQLite creates a WAL
store's -wal and -shm as soon as anything reads it, read-only connections included, and
only a connection that may write removes them at its close: a command that classifies a
store read-only and then refuses it used to leave both behind.
"""

from __future__ import annotations

import gc
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.demo import corpus
from hermes_store.sqlite.readonly import connect_read_only

#: Every command that opens a store, as run on the broken one (`{store}`, `{dir}`).
COMMANDS = (
    ["current"],
    ["stats"],
    ["storage"],
    ["check"],
    ["check", "--repair"],
    ["search", "error"],
    ["history"],
    ["optimize"],
    ["optimize", "--vacuum"],
    ["optimize-storage"],
    ["upgrade"],
    ["upgrade", "--backup", "{dir}/before.db"],
    ["downgrade", "21", "--yes"],
    ["stamp", "head"],
    ["copy", "--from", "{store}", "--to", "{dir}/copy.db"],
)


@pytest.fixture(scope="module")
def good_store(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a healthy WAL-mode store at head with 150 messages (no -wal beside it)."""
    path = tmp_path_factory.mktemp("leftovers") / "good.db"
    migrate.upgrade(str(path))
    with closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(150, 2))
        conn.commit()
    assert not Path(f"{path}-wal").exists()
    data = path.read_bytes()
    assert data[18:20] == b"\x02\x02", "a WAL-mode store: the one whose side files SQLite makes"
    return data


def _truncated(good: bytes) -> bytes:
    return good[: len(good) // 3]


def _header_only(good: bytes) -> bytes:
    return good[:100]


def _pages_zeroed(good: bytes) -> bytes:
    return good[:4096] + bytes(len(good) - 4096)


def _page_damaged(good: bytes) -> bytes:
    return good[: 4096 * 5] + b"\xaa" * 4096 + good[4096 * 6 :]


def _text(_good: bytes) -> bytes:
    return b"this is a text file, not a store\n" * 40


def _bad_header(_good: bytes) -> bytes:
    return b"SQLite format 3\x00" + b"\xff" * 4080


#: Stores a user may find on their disk, each broken another way.
BROKEN: dict[str, Callable[[bytes], bytes]] = {
    "truncated": _truncated,
    "header-only": _header_only,
    "pages-zeroed": _pages_zeroed,
    "page-damaged": _page_damaged,
    "text": _text,
    "bad-header": _bad_header,
}


def listing(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def store_in(directory: Path, data: bytes) -> Path:
    """A store of ``data`` alone in a new ``directory``."""
    directory.mkdir()
    store = directory / "state.db"
    store.write_bytes(data)
    return store


def run(args: list[str]) -> int:
    """The command in this process; its exit code once every object it made is gone, as
    at the end of a real process (its connections closed by then)."""
    result = CliRunner().invoke(main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    code = result.exit_code
    del result
    gc.collect()
    return code


@pytest.mark.parametrize("kind", BROKEN)
def test_every_command_on_a_broken_store_leaves_its_directory_as_it_was(
    kind: str, good_store: bytes, tmp_path: Path
) -> None:
    failed = []
    for command in COMMANDS:
        directory = tmp_path / "_".join(command).replace("/", "").replace("{", "")
        directory.mkdir()
        store = directory / "state.db"
        store.write_bytes(BROKEN[kind](good_store))
        before = listing(directory)
        args = [part.format(store=store, dir=directory) for part in command]
        code = run(args if command[0] == "copy" else [*args, "--db", str(store)])
        after = listing(directory)
        if code == 0:  # what it made on purpose (a backup, a copy) stays; no side file does
            assert not {f"state.db{side}" for side in ("-wal", "-shm")} & set(after), command
            continue
        failed.append(command[0])
        assert after == before, (kind, command)
    # Every kind is refused by most commands (a damaged page is not seen by all of them).
    assert len(failed) >= 4, failed


def test_a_refused_store_in_a_real_process_leaves_nothing(
    good_store: bytes, tmp_path: Path
) -> None:
    store = tmp_path / "work" / "state.db"
    store.parent.mkdir()
    store.write_bytes(_truncated(good_store))
    for command in (["current"], ["upgrade"]):
        done = subprocess.run(
            [sys.executable, "-m", "hermes_store.cli", *command, "--db", str(store)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 1, done
        assert listing(store.parent) == ["state.db"]


def test_a_read_only_connection_removes_only_the_side_files_it_created(
    good_store: bytes, tmp_path: Path
) -> None:
    store = store_in(tmp_path / "work", good_store)
    tmp_path = store.parent
    with closing(connect_read_only(store)) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 150
        assert Path(f"{store}-shm").exists()  # SQLite's, for as long as it reads
    assert listing(tmp_path) == ["state.db"]
    # Another connection (the agent) holds the store open: its side files stay.
    agent = sqlite3.connect(store)
    try:
        agent.execute("SELECT count(*) FROM sessions").fetchone()
        with closing(connect_read_only(store)) as conn:
            conn.execute("SELECT count(*) FROM messages").fetchone()
        assert listing(tmp_path) == ["state.db", "state.db-shm", "state.db-wal"]
        agent.execute("INSERT INTO state_meta (key, value) VALUES ('k', 'v')")
        agent.commit()
    finally:
        agent.close()
    assert listing(tmp_path) == ["state.db"]  # the agent's close, not ours, removed them


def test_side_files_that_were_there_before_are_never_removed(
    good_store: bytes, tmp_path: Path
) -> None:
    store = store_in(tmp_path / "work", good_store)
    tmp_path = store.parent
    writer = sqlite3.connect(store)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("INSERT INTO state_meta (key, value) VALUES ('committed', 'in the wal')")
    writer.commit()
    # A crash: the -wal keeps the committed row, nothing checkpointed it into the file.
    saved = {side: Path(f"{store}{side}").read_bytes() for side in ("", "-wal", "-shm")}
    writer.close()
    for side, data in saved.items():
        Path(f"{store}{side}").write_bytes(data)
    with closing(connect_read_only(store)) as conn:
        found = conn.execute("SELECT value FROM state_meta WHERE key = 'committed'").fetchall()
    assert found == [("in the wal",)]
    assert listing(tmp_path) == ["state.db", "state.db-shm", "state.db-wal"]
    assert Path(f"{store}-wal").read_bytes() == saved["-wal"]
    assert store.read_bytes() == saved[""]  # read only: nothing checkpointed

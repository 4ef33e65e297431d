"""Reading a SQLite store that cannot be written, and leaving no file behind when reading.

A store on a read-only file system, or another user's file, can still be read: SQLite's
``mode=ro`` where its WAL can be used, else ``immutable=1`` (:func:`read_only_opening`).
A read-only connection to a store that can be written removes the -wal and -shm it made
(:func:`connect_read_only`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hermes_store.errors import StoreNotFound, StoreReadOnly

if TYPE_CHECKING:
    from sqlalchemy import Engine


def writable_problem(path: Path) -> str | None:
    """Why a store (or the new one at ``path``) cannot be written, or None when it can."""
    target = path if path.exists() else path.parent
    if not target.exists():
        return None
    try:
        read_only_fs = bool(os.statvfs(target).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    if read_only_fs:
        return f"{target} is on a read-only file system"
    if path.exists() and not _may(path, os.W_OK):
        return f"{path} is not writable (read-only, immutable or another user's file)"
    if not _may(path.parent, os.W_OK | os.X_OK):
        return (
            f"its directory {path.parent} is not writable, so SQLite cannot create "
            f"{path.name}-wal, -shm or -journal next to it"
        )
    return None


def _may(path: Path, mode: int) -> bool:
    """``os.access`` as the user SQLite opens files as (the effective one, where the two
    differ: a set-user-ID program, or a test that takes another user's part)."""
    return os.access(path, mode, effective_ids=os.access in os.supports_effective_ids)


def require_writable(path: Path | None) -> None:
    """Raise StoreReadOnly, before anything is attempted, when the store cannot be written."""
    if path is None:
        return
    problem = writable_problem(path)
    if problem is not None:
        raise StoreReadOnly(
            f"the store is read-only: {problem}; nothing was changed. Remount or fix the "
            "permissions, or copy the store to a writable place and run the command there"
        )


#: Bytes 18 and 19 of a database's header (its file format versions) in WAL mode.
_WAL_FORMAT = b"\x02\x02"


def _in_wal_mode(path: Path) -> bool:
    """Whether the store's header says WAL mode (so that SQLite needs -wal and -shm to read it)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(20)[18:20] == _WAL_FORMAT
    except OSError:
        return False


def _file_uri(path: Path, options: str) -> str:
    """A sqlite3 URI of the store file with ``options`` (``mode=ro``...), the name escaped."""
    return f"{Path(os.path.abspath(path)).as_uri()}?{options}"


@dataclass(frozen=True)
class ReadOnlyOpening:
    """How a store that cannot be written is read, and the line that tells the operator."""

    uri: str
    note: str


def read_only_opening(path: Path, problem: str) -> ReadOnlyOpening:
    """How to read the store at ``path``, which cannot be written because of ``problem``.

    SQLite reads a WAL store only through its -shm, which it must create when it is missing,
    so: ``mode=ro`` (SQLite's read-only mode, with the usual locks) for a store in the
    rollback journal, or one whose -wal and -shm are there and usable; else ``immutable=1``,
    which reads the file alone, without locks or WAL. That is exact while nothing writes the
    store, as on a read-only file system; what a -wal still holds (transactions committed
    since the last checkpoint) is then not seen, and the note says how much there is.
    Creating the -shm ourselves next to a file we may not write would leave it behind, and
    owned by us, where the store's own user could then not open it.
    """
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    if not _in_wal_mode(path) or (wal.exists() and shm.exists() and _opens(path, "mode=ro")):
        return ReadOnlyOpening(
            _file_uri(path, "mode=ro"),
            f"read-only: {problem}; the store was read without writing anything (SQLite mode=ro)",
        )
    unread = _size(wal)
    left_out = (
        f"; {wal.name} ({unread:,} bytes) was not read: what was committed there since the "
        "last checkpoint is not shown. Copy the store with its -wal to a writable place to "
        "see all of it"
        if unread
        else ""
    )
    return ReadOnlyOpening(
        _file_uri(path, "mode=ro&immutable=1"),
        f"read-only: {problem}, and SQLite cannot use the store's WAL there (it needs "
        f"{shm.name}); the store was read as immutable, without locks, which is exact while "
        f"nothing writes it{left_out}",
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _opens(path: Path, options: str) -> bool:
    """Whether SQLite reads the store's schema through a connection with ``options``."""
    try:
        with contextlib.closing(sqlite3.connect(_file_uri(path, options), uri=True)) as conn:
            conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error:
        return False
    return True


class _ReadOnlyConnection(sqlite3.Connection):
    """A connection that cannot write its store, and removes, once closed, the -wal and -shm
    that SQLite created for it (see :func:`connect_read_only`)."""

    created_by_us: tuple[Path, list[str]] | None = None

    def close(self) -> None:
        super().close()
        if self.created_by_us is not None:
            path, absent = self.created_by_us
            self.created_by_us = None
            _remove_side_files_created(path, absent)


def connect_read_only(
    path: Path, *, timeout: float = 5.0, check_same_thread: bool = True
) -> sqlite3.Connection:
    """A sqlite3 connection that cannot write the store at ``path`` and leaves no file behind.

    SQLite's read-only mode (``mode=ro``) where the store can be written, else the way
    :func:`read_only_opening` chooses. A read-only connection to a WAL store creates the
    -wal and -shm it needs but cannot remove them when it closes, as the last connection
    that may write does: whatever it created and was not used since is removed when it
    closes (:func:`_remove_side_files_created`).
    """
    path = Path(os.path.realpath(path))  # a linked store: its side files are the target's
    problem = writable_problem(path)
    uri = _file_uri(path, "mode=ro") if problem is None else read_only_opening(path, problem).uri
    absent = [side for side in (f"{path}-wal", f"{path}-shm") if not os.path.lexists(side)]
    conn = sqlite3.connect(
        uri,
        uri=True,
        timeout=timeout,
        check_same_thread=check_same_thread,
        factory=_ReadOnlyConnection,
    )
    if absent and problem is None:
        conn.created_by_us = (path, absent)
    return conn


def _remove_side_files_created(path: Path, absent: list[str]) -> None:
    """Have SQLite remove the -wal and -shm a read-only connection left (``absent`` before it
    opened): a connection that may write opens the store and closes, and SQLite removes
    them as at any last close, only when no other connection has the store open. A -wal
    that holds anything was written by another connection since: its close removes it.
    """
    if not any(os.path.lexists(side) for side in absent) or _size(Path(f"{path}-wal")):
        return
    with contextlib.suppress(sqlite3.Error):
        tidy = sqlite3.connect(path, timeout=0)
        try:
            tidy.execute("PRAGMA schema_version")  # opens the WAL (a damaged store may fail)
        finally:
            tidy.close()


def open_existing(url: str, *, reading: bool) -> tuple[Engine, str | None]:
    """An engine on the existing store file of ``url``, and a note when it is read read-only.

    Never creates a file. A store that cannot be written is read anyway when the caller
    only reads (``reading``: the note says how), and refused before anything otherwise.
    """
    from hermes_store import migrate
    from hermes_store.engine import create_store_engine, db_path

    path = db_path(url)
    if path is not None and not path.exists():
        raise StoreNotFound(
            f"{path}: no such store; nothing was created. Check --db / HERMES_STORE_URL, or "
            "start a new store with `hermes-store upgrade --create`"
        )
    state = migrate.inspect_file(path)
    if state.kind == "new":
        raise StoreNotFound(
            f"{path or url}: the database is empty, not a Hermes store yet; make it one with "
            "`hermes-store upgrade`"
        )
    problem = writable_problem(path) if path is not None else None
    if problem is None or path is None:
        return create_store_engine(url, create=False, wal=False), None
    if not reading:
        require_writable(path)
    opening = read_only_opening(path, problem)
    return create_store_engine(url, create=False, wal=False, read_only=opening), opening.note

"""Consistent online copies of a store, taken with SQLite's backup API."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from hermes_store.engine import create_store_engine, db_path, resolve_url
from hermes_store.errors import BackupExists, StoreError, StoreNotFound, UnsafePath
from hermes_store.sqlite.engine import check_side_files, side_files, sqlite_errors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackupResult:
    """Where a backup was written and how large it is."""

    path: Path
    bytes: int


def backup(
    url: str | os.PathLike[str] | None, dest: str | os.PathLike[str], *, overwrite: bool = False
) -> BackupResult:
    """Copy the store at ``url`` to ``dest`` while it stays in use (see :func:`backup_from`)."""
    resolved = resolve_url(url, create_home=False)
    source = db_path(resolved)
    if source is None:
        raise StoreError("an in-memory store has no file to back up")
    if not source.is_file():
        raise StoreNotFound(f"{source}: no such store to back up")
    check_side_files(source)  # SQLite's backup API reports a link there only vaguely
    engine = create_store_engine(resolved, create=False, wal=False)
    try:
        raw = engine.raw_connection()
        try:
            driver = raw.driver_connection
            assert isinstance(driver, sqlite3.Connection)
            with sqlite_errors(Path(dest)):
                return backup_from(driver, dest, overwrite=overwrite)
        finally:
            raw.close()
    finally:
        engine.dispose()


def backup_from(
    source: sqlite3.Connection, dest: str | os.PathLike[str], *, overwrite: bool = False
) -> BackupResult:
    """Copy the database of an open connection to ``dest``, readable by its owner only.

    The copy is one step of the backup API, so it is one read transaction: a consistent
    snapshot, taken without blocking writers of a WAL store. It is written to a hidden
    file next to ``dest`` and renamed into place once complete, so ``dest`` never holds a
    partial copy. The copy uses the rollback journal: one self-contained file. An
    existing ``dest`` is refused (BackupExists) unless ``overwrite``; a symbolic link
    there is always refused.
    """
    store = _store_file(source)
    target = check_target(dest, store, overwrite=overwrite)
    _remove_leftovers(target)
    partial = target.with_name(f".{target.name}.{os.getpid()}.{time.monotonic_ns()}.partial")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        with contextlib.closing(sqlite3.connect(partial, isolation_level=None)) as copy:
            source.backup(copy)
            copy.execute("PRAGMA journal_mode=DELETE")
        os.replace(partial, target)
        _fsync_directory(target.parent)
    except BaseException:
        for leftover in (partial, *side_files(partial)):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        raise
    size = target.stat().st_size
    log.info("backup written to %s (%d bytes)", target, size)
    return BackupResult(target, size)


def _store_file(source: sqlite3.Connection) -> Path | None:
    """The file of the connection's main database (None in memory)."""
    for _seq, name, file in source.execute("PRAGMA database_list"):
        if name == "main":
            return Path(file) if file else None
    return None


def check_target(
    dest: str | os.PathLike[str], store: Path | None, *, overwrite: bool = False
) -> Path:
    """Refuse, before anything is written, a backup destination that cannot be used safely.

    Refused whatever ``overwrite`` says: the store itself, its -wal / -shm / -journal, a
    hard link or a symbolic link to any of them (renamed over the live store, a copy would
    replace the database the agent keeps writing to), a symbolic link, a directory, and a
    path in a directory that does not exist (a mistyped path must not create directories).
    An existing file is refused unless ``overwrite``. Returns the absolute target path.
    """
    target = Path(dest).expanduser().absolute()
    if store is not None:
        for protected in (store, *side_files(store)):
            same = target.resolve() == protected.resolve()
            if not same and target.exists() and protected.exists():
                same = os.path.samefile(target, protected)  # a hard link to it, too
            if same:
                raise UnsafePath(
                    f"{target} is the store's own file {protected.name}: a backup there would "
                    "destroy the store; choose a path outside it (nothing was changed)"
                )
    if not target.parent.is_dir():
        raise StoreNotFound(
            f"{target.parent}: no such directory for the backup; create it first or choose "
            "another path (nothing was changed)"
        )
    _check_destination(target, overwrite=overwrite)
    return target


#: `.{name}.{pid}.{ns}.partial`: the hidden file a backup is written to before its rename.
_PARTIAL = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.\d+\.partial(?:-journal|-wal|-shm)?")


def _remove_leftovers(target: Path) -> None:
    """Remove what a killed backup to ``target`` left: its hidden partial copies."""
    remove_partials(target.parent, name=target.name)


def remove_partials(directory: Path, *, name: str | None = None) -> list[Path]:
    """Remove the hidden partial copies killed backups left in ``directory`` (only those of
    backups to ``name`` when given); return them.

    Only files of processes that no longer run: a backup under way keeps its own.
    """
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for leftover in directory.iterdir():
        match = _PARTIAL.fullmatch(leftover.name)
        if match is None or (name is not None and match["name"] != name):
            continue
        if _running(int(match["pid"])):
            continue
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
            removed.append(leftover)
            log.info("removed %s, left by an interrupted backup", leftover)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it runs
        return True
    return True


def _check_destination(target: Path, *, overwrite: bool) -> None:
    if target.is_symlink():
        raise UnsafePath(f"{target} is a symbolic link; refusing to write a backup through it")
    if target.is_dir():
        raise StoreError(f"{target} is a directory; give the backup's file path")
    if target.exists() and not overwrite:
        raise BackupExists(
            f"{target} already exists; choose another backup path or remove it first "
            "(nothing was changed)"
        )
    check_side_files(target)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def default_backup_path(store: Path, purpose: str) -> Path:
    """``<store>.<purpose>-<UTC timestamp>.bak`` next to the store, never an existing file."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidate = store.with_name(f"{store.name}.{purpose}-{stamp}.bak")
    number = 1
    while candidate.exists() or candidate.is_symlink():
        candidate = store.with_name(f"{store.name}.{purpose}-{stamp}-{number}.bak")
        number += 1
    return candidate

"""Free disk space: where SQLite writes, how much is free there, what a step needs.

A command that knows in advance how much it will write checks it here before it changes
anything, and is refused with :class:`~hermes_store.errors.NotEnoughFreeSpace` (a
:class:`~hermes_store.errors.DiskFull`) naming the file system, what is free and what is
needed.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hermes_store.errors import NotEnoughFreeSpace

MIB = 1 << 20
#: Where SQLite's unix VFS looks for a temporary directory after its two variables; it
#: only reads their names here, to find which file system SQLite will write to.
SQLITE_TEMP_DIRS = ("/var/tmp", "/usr/tmp", "/tmp", ".")  # noqa: S108


@dataclass(frozen=True)
class Need:
    """Bytes one part of a command writes on the file system of ``directory``."""

    directory: Path
    size: int
    what: str


def mib(size: float, *, up: bool = False) -> str:
    """Bytes as MiB with one decimal, rounded up (a need) or down (what is free)."""
    tenths = size * 10 / MIB
    value = (math.ceil(tenths) if up else math.floor(tenths)) / 10
    return f"{value:,.1f} MiB"


def mount_point(path: Path) -> Path:
    """The mount point of the file system that holds ``path`` (an existing file or dir)."""
    current = path.resolve()
    while not os.path.ismount(current) and current != current.parent:
        current = current.parent
    return current


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system of ``directory``."""
    return shutil.disk_usage(directory).free


def temp_in_memory(conn: sqlite3.Connection) -> bool:
    """Whether SQLite keeps its temporary files (journals of savepoints, sorts) in memory."""
    pragma = int(conn.execute("PRAGMA temp_store").fetchone()[0])
    options = {str(row[0]) for row in conn.execute("PRAGMA compile_options")}
    built = next((int(o.split("=")[1]) for o in options if o.startswith("TEMP_STORE=")), 1)
    if built == 3:
        return True
    if built == 0:
        return False
    return pragma == 2 or (pragma == 0 and built == 2)


def sqlite_temp_dir(conn: sqlite3.Connection | None = None) -> Path | None:
    """The directory SQLite writes its temporary files to; None when they stay in memory.

    SQLite's own order (unix VFS): `PRAGMA temp_store_directory`, then ``$SQLITE_TMPDIR``,
    ``$TMPDIR``, /var/tmp, /usr/tmp, /tmp and the current directory, the first one that is
    a writable directory. (SQLite reads the two variables once, when the process starts.)
    Python's `tempfile` looks at /tmp before /var/tmp: it is not what SQLite uses.
    """
    if conn is None:
        with contextlib.closing(sqlite3.connect(":memory:")) as memory:
            return sqlite_temp_dir(memory)
    if temp_in_memory(conn):
        return None
    row = conn.execute("PRAGMA temp_store_directory").fetchone()
    if row and row[0]:
        return Path(str(row[0]))
    candidates = (os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR"))
    for candidate in (*candidates, *SQLITE_TEMP_DIRS):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return Path(candidate).resolve()
    return Path.cwd()


def require_free(needs: Iterable[Need], *, task: str, advice: str, store: Path | None) -> None:
    """Raise NotEnoughFreeSpace when a file system has less free than ``needs`` add up to.

    Needs on the same file system (the store's directory and the temporary directory are
    often one) are added up. Nothing is written.
    """
    groups: dict[int, list[Need]] = {}
    for need in needs:
        if need.size > 0:
            groups.setdefault(need.directory.stat().st_dev, []).append(need)
    problems: list[tuple[str, int, int, str]] = []
    for group in groups.values():
        total = sum(need.size for need in group)
        free = free_bytes(group[0].directory)
        if free < total:
            parts = " + ".join(f"{need.what} {mib(need.size, up=True)}" for need in group)
            where = str(mount_point(group[0].directory))
            problems.append((where, total, free, parts))
    if not problems:
        return
    prefix = f"{store}: " if store is not None else ""
    shortages = "; and ".join(
        f"about {mib(total, up=True)} free on {where} ({parts}), only {mib(free)} is free there"
        for where, total, free, parts in problems
    )
    where, total, free, _ = problems[0]
    raise NotEnoughFreeSpace(
        f"{prefix}the disk is full: {task} needs {shortages}; nothing was changed. {advice}",
        needed=total,
        free=free,
        where=where,
    )


def describe_free(path: Path | None) -> str:
    """'12.0 MiB free on /mnt' for the store's file system, and SQLite's temporary
    directory's when that is another one; '' when unknown."""
    if path is None:
        return ""
    places: dict[int, tuple[Path, str]] = {}
    for directory, role in ((path.parent, ""), (sqlite_temp_dir(), " (SQLite's temporary files)")):
        if directory is None:
            continue
        try:
            device = directory.stat().st_dev
        except OSError:
            continue
        places.setdefault(device, (directory, role))
    described = []
    for directory, role in places.values():
        try:
            free = free_bytes(directory)
        except OSError:
            continue
        described.append(f"{mib(free)} free now on {mount_point(directory)}{role}")
    return ", ".join(described)

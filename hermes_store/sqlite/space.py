"""Free disk space: where SQLite writes, how much is free there, what a step needs.

A command that knows in advance how much it will write checks it here before it changes
anything, and is refused with :class:`~hermes_store.errors.NotEnoughFreeSpace` (a
:class:`~hermes_store.errors.DiskFull`) naming the file system, what is free and what is
needed. The figures below were measured on SQLite 3.40.1 (``secure_delete`` on, as in
Python's bundled build) with the corpus stores of the tests, 1.5k to 20k messages.
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
#: Fixed part of every estimate: schema pages, freelist trunks, the WAL header and index.
SLACK = 256 << 10
#: SQLite's page cache when nothing sets `cache_size` (-2000: 2,000 KiB).
DEFAULT_CACHE_BYTES = 2000 * 1024

#: In-place conversion (revision fts1): the declarations are rewritten and the two
#: `<fts>_content` copies renamed aside (`<fts>_content_retired`): only schema pages are
#: written in its transaction. The copies' pages are freed afterwards in short steps, each
#: a transaction of its own (with secure_delete every freed page is written zeroed, so the
#: WAL takes one step's pages until the next checkpoint): a step that finds the disk full
#: is rolled back and the rest left for `optimize`, the conversion stays done. Before the
#: copies were set aside, dropping them in the conversion's own transaction grew the WAL by
#: 1.015x to 1.07x their bytes and the temporary files by 1.07x to 1.49x.
IN_PLACE_SCHEMA_PAGES = 64
WAL_FRAME_HEADER = 24
#: Rebuild (revision fts1 with `fts_convert=rebuild`, deferred or not): the inline index is
#: dropped (every page of it written zeroed) and built again from the view. Measured: the
#: WAL peaked at 1.02x to 1.09x the index's bytes, the temporary files at 1.30x to 1.50x.
REBUILD_WAL_FACTOR = 1.1
REBUILD_TEMP_FACTOR = 1.5
#: The application's schema steps 22 to 30 write indexes over `messages` and rewrite
#: `sessions` (25): measured 177 bytes of WAL and up to 123 bytes of file growth per
#: message whatever the messages' length; the estimate takes 400 bytes per message and
#: twice the `sessions` table.
RELATIONAL_BYTES_PER_MESSAGE = 400


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


def page_size(conn: sqlite3.Connection) -> int:
    """The store's page size in bytes."""
    return int(conn.execute("PRAGMA page_size").fetchone()[0])


def cache_bytes(conn: sqlite3.Connection) -> int:
    """The page cache of a connection, in bytes (`cache_size`: pages, or -KiB)."""
    size = int(conn.execute("PRAGMA cache_size").fetchone()[0])
    if size < 0:
        return -size * 1024
    return size * page_size(conn) or DEFAULT_CACHE_BYTES


def in_place_conversion(copies: Iterable[int], cache: int, page_size: int) -> tuple[int, int]:
    """(store, temp) bytes the in-place conversion writes in its transaction.

    Only schema pages (the copies are renamed, not freed there); the freeing afterwards
    goes step by step and gives way to a full disk (see IN_PLACE_SCHEMA_PAGES).
    """
    if not sum(copies):
        return 0, 0
    schema = IN_PLACE_SCHEMA_PAGES * (page_size + WAL_FRAME_HEADER)
    return schema + SLACK, min(schema, cache) + SLACK


def rebuild_conversion(index_bytes: int, cache: int) -> tuple[int, int]:
    """(store, temp) bytes the conversion writes when it rebuilds, from the inline index."""
    if not index_bytes:
        return 0, 0
    store = int(index_bytes * REBUILD_WAL_FACTOR) + SLACK
    temp = int(index_bytes * REBUILD_TEMP_FACTOR) + cache + SLACK
    return store, temp


def relational_steps(messages: int, sessions_bytes: int) -> int:
    """Store bytes the application's schema steps write, from the store's size."""
    return messages * RELATIONAL_BYTES_PER_MESSAGE + 2 * sessions_bytes + SLACK


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

"""Where the bytes go: per-table sizes from the `dbstat` virtual table, grouped."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Connection, text

from hermes_store.sqlite.fts import INDEXES, layout, retired_copy_name, retired_name, staged_name

MESSAGE_DATA = "message data"
FTS_INDEX = "FTS index data"
FTS_COPIES = "redundant FTS text copies"
OTHER = "other"
GROUPS = (MESSAGE_DATA, FTS_INDEX, FTS_COPIES, OTHER)
#: The shadow tables of an FTS5 index besides its `_content` copy, each `<index><suffix>`.
FTS_SHADOWS = ("_data", "_idx", "_docsize", "_config")


@dataclass
class StorageReport:
    """Bytes per object and per group; groups plus free pages add up to the file size."""

    page_size: int
    page_count: int
    freelist_pages: int
    layout: str
    objects: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)

    @property
    def file_bytes(self) -> int:
        """Size of the main database file (the WAL is not included)."""
        return self.page_size * self.page_count

    @property
    def free_bytes(self) -> int:
        """Bytes in free-list pages, reclaimed by VACUUM."""
        return self.page_size * self.freelist_pages

    @property
    def reclaimable_bytes(self) -> int:
        """What converting to external content and VACUUM would give back (inline copies)."""
        return self.groups.get(FTS_COPIES, 0)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the derived figures."""
        data = asdict(self)
        data.update(
            file_bytes=self.file_bytes,
            free_bytes=self.free_bytes,
            reclaimable_bytes=self.reclaimable_bytes,
        )
        return data


def classify(owner: str) -> str:
    """The group of an object, from the table that owns it (an index's table, or itself)."""
    # An index being rebuilt beside a legacy one, and a swapped-out legacy index, count too.
    for index in (*INDEXES, *map(staged_name, INDEXES), *map(retired_name, INDEXES)):
        if owner in (f"{index}_content", retired_copy_name(index)):
            return FTS_COPIES
        if owner in (index, *(index + suffix for suffix in FTS_SHADOWS)):
            return FTS_INDEX
    return MESSAGE_DATA if owner == "messages" else OTHER


def storage_report(conn: Connection) -> StorageReport:
    """Measure a store with dbstat (every page of the main file is counted once)."""
    page_size = int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())
    page_count = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one())
    freelist = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())
    owners = {
        str(name): str(table or name)
        for name, table in conn.execute(text("SELECT name, tbl_name FROM sqlite_master"))
    }
    report = StorageReport(page_size, page_count, freelist, layout(conn))
    report.groups = dict.fromkeys(GROUPS, 0)
    rows = conn.execute(
        text("SELECT name, sum(pgsize) FROM dbstat WHERE aggregate = 0 GROUP BY name")
    )
    for name, size in rows:
        report.objects[str(name)] = int(size)
        group = classify(owners.get(str(name), str(name)))
        report.groups[group] += int(size)
    return report


def btree_bytes(conn: sqlite3.Connection, names: Iterable[str]) -> dict[str, int] | None:
    """Bytes of each named table or index (its pages, overflow included), read with dbstat
    on a plain sqlite3 connection (a read-only one will do); None without dbstat.

    Only the named b-trees are walked, so this reads what they hold and nothing else.
    """
    sizes: dict[str, int] = {}
    try:
        for name in names:
            row = conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name = ?", (name,)).fetchone()
            sizes[name] = int(row[0] or 0)
    except sqlite3.OperationalError as exc:
        if "no such table: dbstat" in str(exc):
            return None
        raise
    return sizes


def human_bytes(size: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"

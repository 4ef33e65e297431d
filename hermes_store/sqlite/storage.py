"""Where the bytes go: per-table sizes from the `dbstat` virtual table, grouped."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, text

from hermes_store.maintenance import (
    FTS_COPIES,
    FTS_INDEX,
    GROUPS,
    MESSAGE_DATA,
    OTHER,
    Table,
    View,
    human_bytes,
)
from hermes_store.sqlite import backfill, fts
from hermes_store.sqlite.fts import INDEXES, layout, retired_copy_name, retired_name, staged_name

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
    #: Per index, what an unfinished deferred backfill still has to do (see
    #: :func:`backfill_status`); filled by :func:`report_of`.
    backfill: dict[str, dict[str, Any]] = field(default_factory=dict)

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

    def records(self) -> Table:
        """One record per table and index, largest first."""
        by_size = sorted(self.objects.items(), key=lambda item: -item[1])
        records = [{"object": name, "bytes": size} for name, size in by_size]
        return Table(records, ("object", "bytes"))

    def view(self) -> View:
        """The groups (with their share of the file), the reclaim an upgrade would give, the
        largest objects, and any unfinished backfill."""
        total = self.file_bytes or 1
        rows: list[dict[str, Any]] = [
            {"group": group, "size": human_bytes(size), "share": f"{size / total:.1%}"}
            for group in GROUPS
            for size in [self.groups.get(group, 0)]
        ]
        rows.append({"group": "free pages", "size": human_bytes(self.free_bytes), "share": ""})
        rows.append({"group": "file", "size": human_bytes(self.file_bytes), "share": ""})
        shown: View = [
            Table(
                rows,
                ("group", "size", "share"),
                title=f"layout: {self.layout}",
                right=("size", "share"),
            )
        ]
        if self.layout == "inline" and self.reclaimable_bytes:
            shown.append(
                f"upgrading to external content would reclaim about "
                f"{human_bytes(self.reclaimable_bytes)} "
                f"({self.reclaimable_bytes / total:.0%}) after `hermes-store optimize --vacuum`"
            )
        biggest = sorted(self.objects.items(), key=lambda item: -item[1])[:15]
        shown.append(
            Table(
                [{"object": name, "size": human_bytes(size)} for name, size in biggest],
                ("object", "size"),
                right=("size",),
            )
        )
        shown += [
            f"backfill: {index} {status['state']}, {status['rows_left']} rows left"
            for index, status in self.backfill.items()
        ]
        return shown


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


def report_of(engine: Engine) -> StorageReport:
    """The storage report of a store, with what its deferred backfill has left to do."""
    with engine.connect() as conn:
        report = storage_report(conn)
        report.backfill = backfill_status(conn)
    return report


def backfill_status(conn: Connection) -> dict[str, dict[str, Any]]:
    """Per index, what an unfinished deferred backfill still has to do.

    An index rebuilt beside its legacy table is listed under its own name, with the table
    it is built in (``"table": "messages_fts_next"``); a swapped-out legacy index whose
    pages are still being freed under its retired name.
    """
    status: dict[str, dict[str, Any]] = {}
    if fts.layout(conn) not in ("external", "staging"):  # nothing of ours to fill or drop
        items: list[backfill.Pending] = []
        filled: list[str] = []
    else:
        items, filled = backfill.pending(conn), backfill.merging(conn)
    for item in items:
        status[item.logical] = {
            "state": "filling",
            "high_water": item.high_water,
            "indexed_upto": item.indexed_upto,
            "rows_left": backfill.rows_left(conn, item),
        }
    for table in filled:
        status[fts.logical_index(table)] = {"state": "merging", "rows_left": 0}
    for index, table in fts.staged_indexes(conn).items():
        status.setdefault(index, {"state": "ready to swap in", "rows_left": 0})
        status[index]["table"] = table
    for table in fts.retired_indexes(conn):
        status[table] = {
            "state": "retired, being freed in steps (`hermes-store optimize` frees it)",
            "rows_left": backfill.retired_rows(conn, table),
        }
    if backfill.has_change_log(conn):  # see sqlite.migration.verify_ahead
        status["upgrade change log"] = {
            "state": "an upgrade is running or was interrupted; optimize, optimize-storage "
            "or the next upgrade removes it",
            "rows_left": 0,
        }
    return status


__all__ = [
    "FTS_COPIES",
    "FTS_INDEX",
    "FTS_SHADOWS",
    "GROUPS",
    "MESSAGE_DATA",
    "OTHER",
    "StorageReport",
    "backfill_status",
    "btree_bytes",
    "classify",
    "human_bytes",
    "report_of",
    "storage_report",
]

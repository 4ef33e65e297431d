"""Keeping a store small and healthy: counts, optimize (merge + checkpoint + VACUUM)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

from hermes_store.backfill import pending, rows_left
from hermes_store.engine import db_path
from hermes_store.errors import StoreBusy, StoreError
from hermes_store.fts import CheckResult, integrity_check, optimize_index, present_indexes

Progress = Callable[[str], None]


class NotEnoughSpace(StoreError):
    """VACUUM needs more free disk space than there is."""


@dataclass
class StoreStats:
    """How much a store holds."""

    sessions: int
    messages: int
    sessions_by_source: dict[str, int] = field(default_factory=dict)
    file_bytes: int = 0
    wal_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def store_stats(conn: Connection, path: Path | None) -> StoreStats:
    """Sessions, messages, sessions per source and the size on disk."""
    by_source = {
        str(source): int(count)
        for source, count in conn.execute(
            text("SELECT source, count(*) FROM sessions GROUP BY source ORDER BY count(*) DESC")
        )
    }
    messages = int(conn.execute(text("SELECT count(*) FROM messages")).scalar_one())
    stats = StoreStats(sum(by_source.values()), messages, by_source)
    if path is not None and path.exists():
        stats.file_bytes = path.stat().st_size
        wal = path.with_name(path.name + "-wal")
        stats.wal_bytes = wal.stat().st_size if wal.exists() else 0
    return stats


@dataclass
class OptimizeResult:
    """Sizes before and after `optimize`."""

    bytes_before: int
    bytes_after: int
    indexes: list[str]
    vacuumed: bool

    @property
    def reclaimed(self) -> int:
        """Bytes given back to the file system."""
        return self.bytes_before - self.bytes_after

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "reclaimed": self.reclaimed}


def _on_disk(path: Path | None) -> int:
    if path is None:
        return 0
    sizes = (p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    return sum(sizes)


def vacuum_space_needed(path: Path) -> dict[Path, int]:
    """Free bytes VACUUM needs per directory: a temp copy, then the copy written back via WAL."""
    size = path.stat().st_size
    temp_dir = Path(os.environ.get("SQLITE_TMPDIR") or tempfile.gettempdir())
    needs: dict[Path, int] = {}
    for directory in (path.parent, temp_dir):
        device = directory.stat().st_dev
        key = next((d for d in needs if d.stat().st_dev == device), directory)
        needs[key] = needs.get(key, 0) + size
    return needs


def check_vacuum_space(path: Path) -> None:
    """Refuse before VACUUM when a file system lacks the space it needs."""
    for directory, needed in vacuum_space_needed(path).items():
        free = shutil.disk_usage(directory).free
        if free < needed:
            raise NotEnoughSpace(
                f"VACUUM needs about {needed // 1_048_576} MiB free in {directory} but only "
                f"{free // 1_048_576} MiB is free; free some space (or set SQLITE_TMPDIR to a "
                "larger file system), or run with --no-vacuum"
            )


def optimize(
    engine: Engine, *, vacuum: bool = True, progress: Progress | None = None
) -> OptimizeResult:
    """Merge every FTS index, checkpoint the WAL (TRUNCATE) and VACUUM."""
    say = progress or (lambda _msg: None)
    path = db_path(str(engine.url))
    before = _on_disk(path)
    if vacuum and path is not None:
        check_vacuum_space(path)
    with engine.connect() as conn:
        with conn.begin():
            names = present_indexes(conn)
            for name in names:
                say(f"merging {name}")
                optimize_index(conn, name)
    # Checkpoint and VACUUM must run outside any transaction: use the driver directly
    # (the engine leaves it in autocommit mode; SQLAlchemy would wrap them in BEGIN).
    raw = engine.raw_connection()
    try:
        say("checkpointing the WAL")
        raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[union-attr]
        if vacuum:
            say("vacuuming")
            raw.driver_connection.execute("VACUUM")  # type: ignore[union-attr]
            raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[union-attr]
    finally:
        raw.close()
    return OptimizeResult(before, _on_disk(path), names, vacuum)


def _is_lock_error(message: str) -> bool:
    return "database is locked" in message or "database is busy" in message


def check_store(conn: Connection, *, quick: bool = False) -> CheckResult:
    """`PRAGMA integrity_check` (or quick_check) plus every FTS5 index's integrity check.

    The FTS5 check is an INSERT, so it needs the write lock: when another process held it
    for longer than the busy timeout, raise StoreBusy instead of reporting the indexes as
    broken.
    """
    skip = {
        item.index: f"deferred backfill pending ({rows_left(conn, item)} rows not indexed yet); "
        "finish it with `hermes-store optimize-storage`"
        for item in pending(conn)
    }
    result = integrity_check(conn, quick=quick, skip=skip)
    busy = [name for name, problem in result.problems.items() if _is_lock_error(problem)]
    if busy:
        raise StoreBusy(
            f"could not check {', '.join(busy)}: the store is locked by another process "
            "(waited for the busy timeout); retry when the agent is idle"
        )
    return result

"""`optimize` on SQLite: merge the FTS indexes, checkpoint the WAL, give free pages back.

Bounded by default for a store in use: every step is a short write transaction sized by
how long the last one held the lock, with pauses between; ``vacuum=True`` is the one
long VACUUM, for a store the agent is not using; ``compact`` rebuilds the indexes online
first (:mod:`hermes_store.sqlite.compaction`). See docs/operations.md, "optimize".
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine

from hermes_store.engine import db_path
from hermes_store.errors import Interrupted
from hermes_store.maintenance import (
    View,
    human_bytes,
)
from hermes_store.progress import Phase, Report, Tracker
from hermes_store.sqlite import backfill, compaction
from hermes_store.sqlite.backup import remove_partials
from hermes_store.sqlite.engine import sqlite_errors
from hermes_store.sqlite.fts import (
    begin_writing,
    optimize_index,
    present_indexes,
    retired_indexes,
    segment_count,
    staged_indexes,
)
from hermes_store.sqlite.readonly import require_writable
from hermes_store.sqlite.space import Need, require_free, sqlite_temp_dir

log = logging.getLogger(__name__)

#: A callback given one line per phase, for a person.
Progress = Callable[[str], None]


@dataclass
class OptimizeResult:
    """Sizes before and after `optimize`."""

    bytes_before: int
    bytes_after: int
    indexes: list[str]
    vacuumed: bool
    #: False when readers kept the WAL from being truncated (its bytes are in bytes_after).
    wal_truncated: bool = True
    #: Hidden partial copies of killed backups removed from the store's directory.
    removed_partials: list[str] = field(default_factory=list)
    #: The longest time one step held the store's write lock, in seconds (VACUUM holds it
    #: for its whole run: --no-vacuum keeps it to the merge).
    longest_write_lock_s: float = 0.0
    #: Bytes of free pages only a full VACUUM can return (a bounded run on a store without
    #: incremental auto-vacuum); 0 when nothing is left to return.
    vacuum_needed_bytes: int = 0
    #: Indexes rebuilt online to compact them (``compact``, or a compaction a killed run
    #: left), and those ``compact`` left as they were, with the reason.
    compacted: list[str] = field(default_factory=list)
    not_compacted: dict[str, str] = field(default_factory=dict)
    #: The FTS5 indexes' bytes (their shadow tables) before and after the compaction;
    #: None without a compaction, or where this SQLite has no dbstat.
    index_bytes_before: int | None = None
    index_bytes_after: int | None = None
    compact_seconds: float = 0.0
    compact_longest_lock_s: float = 0.0

    @property
    def reclaimed(self) -> int:
        """Bytes given back to the file system."""
        return self.bytes_before - self.bytes_after

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "reclaimed": self.reclaimed}

    def view(self) -> View:
        """What was reclaimed, and what a later run or `--vacuum` would still give back."""
        shown: View = [
            f"{human_bytes(self.bytes_before)} -> {human_bytes(self.bytes_after)} "
            f"(reclaimed {human_bytes(self.reclaimed)}; merged {len(self.indexes)} "
            f"index(es); longest write lock {self.longest_write_lock_s:.2f} s)"
        ]
        if self.compacted:
            sizes = (self.index_bytes_before or 0, self.index_bytes_after or 0)
            shown.append(
                f"compacted {', '.join(self.compacted)} online in {self.compact_seconds:.1f} s"
                + (f": {human_bytes(sizes[0])} -> {human_bytes(sizes[1])}" if all(sizes) else "")
            )
        shown += [f"not compacted {name}: {why}" for name, why in self.not_compacted.items()]
        shown += [
            f"removed {leftover}, left by an interrupted backup"
            for leftover in self.removed_partials
        ]
        if self.vacuum_needed_bytes:
            shown.append(
                f"{human_bytes(self.vacuum_needed_bytes)} of free pages can only be returned "
                "by `hermes-store optimize --vacuum`, which holds the write lock for its whole "
                "run (run it with the agent stopped); it also switches the store to "
                "incremental auto-vacuum, after which this command returns them in steps"
            )
        if not self.wal_truncated:
            shown.append(
                "the WAL was not truncated: a reader stayed open (the agent, a search, a "
                "backup); its size is counted above and it shrinks at a later checkpoint"
            )
        return shown


def _on_disk(path: Path | None) -> int:
    if path is None:
        return 0
    sizes = (p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    return sum(sizes)


def vacuum_space_needed(path: Path) -> list[Need]:
    """Free bytes VACUUM needs: a temporary copy of the store in SQLite's temporary
    directory, then every page written back through the WAL next to the store."""
    size = path.stat().st_size
    needs = [Need(path.parent, size, "its pages written back through the WAL")]
    temp_dir = sqlite_temp_dir()
    if temp_dir is not None:
        needs.append(Need(temp_dir, size, "a temporary copy of the store"))
    return needs


def check_vacuum_space(path: Path) -> None:
    """Refuse before VACUUM when a file system lacks the space it needs."""
    require_free(
        vacuum_space_needed(path),
        task="VACUUM",
        store=path,
        advice="Free some space (or set SQLITE_TMPDIR to a larger file system), or run "
        "without --vacuum (bounded steps, no VACUUM)",
    )


#: Pages of FTS5 merging of a bounded optimize's first step (FTS5 'merge', N): tens of
#: milliseconds of write lock; each next step is sized from the last one's hold (see
#: STEP_MAX_LOCK_MS), up to MAX_MERGE_PAGES. A positive N merges the levels that hold
#: enough segments to merge (FTS5's own incremental merge); a negative N (merge everything
#: into one segment) corrupted the index here after about 1,000 steps interleaved with
#: another process's writes (SQLite 3.40.1), so it is not used: one segment is what
#: --vacuum's 'optimize' gives.
MERGE_STEP_PAGES = 64
MAX_MERGE_PAGES = 4096
#: Pages a bounded optimize returns to the file system in its first step (incremental
#: vacuum); each next step is sized from the last one's hold, up to MAX_VACUUM_PAGES.
VACUUM_STEP_PAGES = 256
MAX_VACUUM_PAGES = 65_536
#: Each step of a bounded optimize is sized (``backfill.next_size``) to hold the write
#: lock for about half of this, in milliseconds.
STEP_MAX_LOCK_MS = 100.0
#: Pause between bounded steps, as a share of the time the step held the lock: writers
#: waiting on the lock get it in between.
STEP_PAUSE = 1.0


def optimize(
    engine: Engine,
    *,
    vacuum: bool | None = True,
    compact: bool = False,
    progress: Progress | None = None,
    report: Report | None = None,
) -> OptimizeResult:
    """Merge every FTS index, checkpoint the WAL, give free pages back to the file system;
    remove the hidden partial copies killed backups left in the store's directory.

    ``vacuum=True``: FTS5 'optimize' of each index in one transaction, then VACUUM, which
    holds the write lock for its whole run (the agent waits); the store is switched to
    incremental auto-vacuum on the way, so that later bounded runs can shrink it.
    ``vacuum=None`` (bounded, for a store in use): every step is a short write transaction,
    with pauses between, each sized by time (about half of STEP_MAX_LOCK_MS): the indexes'
    segments are merged a number of pages at a time (FTS5's incremental merge; not into a
    single segment), and free pages are returned a number at a time when the store uses
    incremental auto-vacuum
    (otherwise ``vacuum_needed`` says how much only a full VACUUM can return).
    ``vacuum=False``: merge and checkpoint only. ``compact``: first rebuild each FTS5
    index online, beside itself, and swap it in (:mod:`hermes_store.sqlite.compaction`:
    every step short, the current index serving until the swap), which drops the delete
    markers a bounded merge leaves; a compaction a killed run left is finished in any mode,
    with or without ``compact``. ``report`` is told each phase as it starts
    (and how far the counted ones got); ``progress``, the label of each new phase.
    Interrupted, it raises Interrupted saying what was kept and what is left.
    """
    said: list[str] = []

    def both(phase: Phase) -> None:
        if report is not None:
            report(phase)
        if progress is not None and said[-1:] != [phase.label]:
            said.append(phase.label)
            progress(phase.label)

    tracker = Tracker(both)
    try:
        return _optimize(engine, vacuum, compact, tracker)
    except KeyboardInterrupt as exc:
        raise Interrupted(_interrupted(engine, vacuum, tracker.last)) from exc


def _interrupted(engine: Engine, vacuum: bool | None, phase: Phase | None) -> str:
    """What an interrupted optimize leaves, read from the store afterwards."""
    path = db_path(str(engine.url))
    finish = "hermes-store optimize" + (f" --db {path}" if path else "")
    finish += " --vacuum" if vacuum else " --no-vacuum" if vacuum is False else ""
    doing = phase.label if phase is not None else "starting"
    kept = (
        "VACUUM was rolled back, the file keeps its size"
        if phase is not None and phase.kind == "vacuum" and vacuum
        else "the step in flight was rolled back and every finished one is kept"
    )
    with engine.connect() as conn:
        names = retired_indexes(conn)
        rows = sum(backfill.retired_rows(conn, name) for name in names)
        rebuilding = compaction.compacting(conn)
    left = f"; {rows:,} rows of {', '.join(names)} are still to free" if names else ""
    if rebuilding:
        left += (
            f"; the compaction of {', '.join(rebuilding)} is kept (the current index serves "
            "until it is swapped in) and goes on"
        )
    return f"interrupted while {doing}: {kept}{left}; run `{finish}` to finish"


def _optimize(engine: Engine, vacuum: bool | None, compact: bool, say: Tracker) -> OptimizeResult:
    path = db_path(str(engine.url))
    require_writable(path)
    before = _on_disk(path)
    if vacuum and path is not None:
        check_vacuum_space(path)
    locks: list[float] = [0.0]
    vacuum_needed = 0
    # Each step is one transaction (VACUUM is one too): a full disk rolls back the step in
    # progress and leaves the store as the previous step left it.
    with sqlite_errors(path):
        with engine.connect() as conn:
            leftover = backfill.has_change_log(conn)
            conn.rollback()
            if leftover:  # an upgrade killed between its verification and its conversion
                say(Phase("free", "removing an interrupted upgrade's change log"))
                with _writing(conn, locks):
                    backfill.remove_stale_change_log(conn)
            compacted = compaction.run(engine, conn, compact=compact, report=say)
            locks.append(compacted.longest_lock_s)
            # A legacy index being rebuilt beside itself is not merged: it is to be dropped.
            names = [name for name in present_indexes(conn) if name not in staged_indexes(conn)]
            # One segment is as merged as an index gets: nothing to do, no write lock to
            # wait for (FTS5 would only take the lock to find that out).
            unmerged = [name for name in names if segment_count(conn, name) not in (0, 1)]
            retired = retired_indexes(conn)
            conn.rollback()
            if retired:  # set aside by a conversion or a swap; dropped before the merges
                say(Phase("free", f"dropping {', '.join(retired)}"))
                _drop_retired(conn, retired, locks, whole=bool(vacuum), report=say)
            for name in unmerged:
                say(Phase("merge", f"merging {name}", item=name))
                if vacuum:
                    with _writing(conn, locks):  # waits for the agent's write lock
                        optimize_index(conn, name)
                else:
                    _merge_in_steps(conn, name, locks, say)
        # Checkpoint and VACUUM must run outside any transaction: use the driver directly
        # (the engine leaves it in autocommit mode; SQLAlchemy would wrap them in BEGIN).
        raw = engine.raw_connection()
        try:
            driver = raw.driver_connection
            assert isinstance(driver, sqlite3.Connection)
            say(Phase("checkpoint", "checkpointing the WAL"))
            truncated = truncate_wal(driver)
            if vacuum:
                say(Phase("vacuum", "vacuuming (one statement: the write lock all along)"))
                started = time.perf_counter()
                # Takes effect with this VACUUM; later bounded runs then shrink the file.
                driver.execute("PRAGMA auto_vacuum=INCREMENTAL")
                driver.execute("VACUUM")  # one transaction: the write lock, all along
                locks.append(time.perf_counter() - started)
                truncated = truncate_wal(driver)
            elif vacuum is None:
                vacuum_needed = _vacuum_in_steps(driver, locks, say)
                truncated = truncate_wal(driver)
        finally:
            raw.close()
    # A backup killed midway (kill -9, power loss) leaves a hidden partial copy, as large
    # as the store, next to where it was going: the default backup place is this directory.
    removed = [str(p) for p in remove_partials(path.parent)] if path is not None else []
    return OptimizeResult(
        before,
        _on_disk(path),
        names,
        bool(vacuum),
        truncated,
        removed,
        round(max(locks), 3),
        vacuum_needed,
        compacted.indexes,
        compacted.skipped,
        compacted.bytes_before,
        compacted.bytes_after,
        compacted.seconds,
        round(compacted.longest_lock_s, 3),
    )


@contextlib.contextmanager
def _writing(conn: Connection, locks: list[float]) -> Iterator[None]:
    """One write transaction, begun as a writer; its hold time appended to ``locks``."""
    with begin_writing(conn), timed(locks):
        yield


@contextlib.contextmanager
def timed(locks: list[float]) -> Iterator[None]:
    """Append how long the block ran (a transaction holding the write lock) to ``locks``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        locks.append(time.perf_counter() - started)


def _merge_in_steps(conn: Connection, name: str, locks: list[float], say: Report) -> None:
    """Merge an index's segments in short transactions (FTS5 'merge', MERGE_STEP_PAGES),
    until a step does no work (fewer than 2 changes) or the index's size in steps has been
    spent twice over: the agent's own writes keep adding segments, and this must end."""
    pages = conn.exec_driver_sql(f"SELECT count(*) FROM {name}_data").scalar_one()
    conn.rollback()
    most = 2 * (int(pages) // MERGE_STEP_PAGES) + 8
    size = MERGE_STEP_PAGES
    for step in range(most):
        say(Phase("merge", f"merging {name}", step, most, "steps", name))
        with _writing(conn, locks):
            before = conn.exec_driver_sql("SELECT total_changes()").scalar_one()
            conn.exec_driver_sql(f"INSERT INTO {name}({name}, rank) VALUES ('merge', {size})")
            done = conn.exec_driver_sql("SELECT total_changes()").scalar_one() - before < 2
        if done:
            return
        size = backfill.next_size(size, locks[-1] * 1000, STEP_MAX_LOCK_MS, MAX_MERGE_PAGES)
        time.sleep(locks[-1] * STEP_PAUSE)


def _drop_retired(
    conn: Connection, names: list[str], locks: list[float], *, whole: bool, report: Report
) -> None:
    """Drop swapped-out legacy indexes and set-aside copies: at once (``whole``: the full
    optimize holds the lock anyway), or in bounded steps with pauses, as the backfill does."""
    if not whole:
        locks.extend(backfill.drop_retired(conn, duty=1 / (1 + STEP_PAUSE), progress=report))
        return
    for name in names:
        with _writing(conn, locks):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")


def _vacuum_in_steps(driver: sqlite3.Connection, locks: list[float], say: Report) -> int:
    """Return free pages to the file system in short steps, when the store uses
    incremental auto-vacuum; else the bytes only a full VACUUM can return (0 when none)."""
    page_size = driver.execute("PRAGMA page_size").fetchone()[0]
    free = driver.execute("PRAGMA freelist_count").fetchone()[0]
    if not free:
        return 0
    if driver.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:  # not INCREMENTAL
        return int(free * page_size)
    total, size = free, VACUUM_STEP_PAGES
    while free:
        say(Phase("vacuum", "returning free pages in steps", total - free, total, "pages"))
        locks.append(_vacuum_step(driver, size))
        left = driver.execute("PRAGMA freelist_count").fetchone()[0]
        if left >= free:  # nothing returned (the agent freed as many meanwhile): stop
            return 0
        free = left
        size = backfill.next_size(size, locks[-1] * 1000, STEP_MAX_LOCK_MS, MAX_VACUUM_PAGES)
        time.sleep(locks[-1] * STEP_PAUSE)
    return 0


def _vacuum_step(driver: sqlite3.Connection, pages: int) -> float:
    """One write transaction returning up to ``pages`` free pages; how long it held the
    write lock. The pragma returns one page per step of its statement, and the driver's
    execute() steps a statement without result columns once: so it runs in a script,
    stepped to its end, the hold timed from a function the script calls with the lock."""
    started: list[float] = []
    driver.create_function("hermes_store_locked", 0, lambda: started.append(time.perf_counter()))
    try:
        driver.executescript(
            "BEGIN IMMEDIATE; SELECT hermes_store_locked(); "
            f"PRAGMA incremental_vacuum({int(pages)}); COMMIT;"
        )
    except BaseException:
        if driver.in_transaction:
            driver.execute("ROLLBACK")
        raise
    return time.perf_counter() - (started[0] if started else time.perf_counter())


#: How long a TRUNCATE checkpoint may wait for readers. While it waits, it keeps new
#: writers out: the agent's writes must never queue behind a long read for longer.
CHECKPOINT_WAIT_MS = 200


def truncate_wal(driver: sqlite3.Connection) -> bool:
    """Copy the WAL into the database and truncate it, waiting at most CHECKPOINT_WAIT_MS.

    When a reader keeps it from finishing, fall back to a PASSIVE checkpoint (which never
    blocks anyone) and return False: the WAL keeps its size until the next checkpoint.
    """
    (previous,) = driver.execute("PRAGMA busy_timeout").fetchone()
    # First the frames copied with writers let in: the TRUNCATE, which keeps them out
    # while it runs, then has only what was committed meanwhile to copy.
    driver.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    driver.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
    try:
        busy, _log, _done = driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            driver.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            log.warning(
                "the WAL could not be truncated: a reader was still open after %d ms; its "
                "frames are copied and the file will shrink at a later checkpoint",
                CHECKPOINT_WAIT_MS,
            )
        return not busy
    finally:
        driver.execute(f"PRAGMA busy_timeout={int(previous)}")

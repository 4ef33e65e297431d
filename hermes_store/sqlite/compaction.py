"""Online compaction of the FTS5 indexes: each rebuilt beside itself, then swapped in.

FTS5 keeps a deleted row's index entries, as delete markers, until the segments holding
them are merged. A bounded 'merge' with a positive page count only merges the levels that
hold enough segments, so after most rows of a store left it (an archive run) most of the
index's pages stay; FTS5 'optimize' in one transaction would hold the write lock for
seconds, and a negative 'merge' corrupted the index under concurrent writes (SQLite
3.40.1). A compaction rebuilds each index with the mechanism the search branch already
uses for a legacy index (see :mod:`hermes_store.sqlite.backfill`):

1. one short write transaction creates ``<index>_next`` (the head's declaration,
   renamed), its staged triggers (agent writes above the high-water mark go to both
   indexes) and the backfill keys, plus ``<index>_next.compaction``, which says that the
   index it replaces is the head's own and not one the application put there;
2. :func:`backfill.run` fills it from the view in time-sized chunks, merges it, swaps it
   in (the old index becomes ``<index>_retired``) and empties and drops the retired index
   in bounded steps, each step one short transaction with pauses between.

The current index serves every search until the swap, and the staged triggers keep the
new one exact for the agent's writes meanwhile. A kill at any instant leaves either
index serving, complete; the next `hermes-store optimize` (or archive run) goes on from
the keys in `state_meta`. The cost: one pass over the text still in the store, indexed
once more (the agent's writes are indexed twice meanwhile), and about the new index's
size of free space until the retired one is dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from hermes_store.declarations import SQLITE
from hermes_store.progress import Phase, Report
from hermes_store.sqlite import backfill
from hermes_store.sqlite.fts import (
    INDEXES,
    begin_writing,
    index_layout,
    is_application_layout,
    logical_index,
    present_indexes,
    retired_indexes,
    staged_indexes,
    staged_name,
)

log = logging.getLogger(__name__)

COMPACTION = backfill.COMPACTION
is_compaction = backfill.is_compaction
is_head_index = backfill.is_head_index


def compacting(conn: Connection) -> list[str]:
    """The indexes being compacted: their staged table exists and carries the key."""
    staged = staged_indexes(conn)
    return [index for index, table in staged.items() if is_compaction(conn, table)]


def in_progress(conn: Connection) -> bool:
    """Whether a compaction is to be finished: an index rebuilt beside itself, or its
    retired predecessor still to free."""
    return bool(compacting(conn)) or bool(retired_indexes(conn))


def why_not(conn: Connection, index: str) -> str | None:
    """Why ``index`` cannot be compacted now (None: it can)."""
    if is_application_layout(conn):
        return "the indexes are in the Hermes application's own layout (left to it)"
    if index not in present_indexes(conn):
        return "missing"
    if index_layout(conn, index) != "external" or not is_head_index(conn, index):
        return "not in this package's external layout (run `hermes-store upgrade`)"
    busy = {item.logical for item in backfill.pending(conn)}
    busy |= {logical_index(name) for name in backfill.merging(conn)}
    if index in busy or index in staged_indexes(conn):
        return "being built (`hermes-store optimize-storage` finishes it)"
    return None


def start(conn: Connection, index: str) -> bool:
    """Stage the rebuild of ``index`` in the caller's write transaction; False when the
    store has no message to index (nothing to compact)."""
    staged = staged_name(index)
    high = int(conn.execute(text("SELECT coalesce(max(id), 0) FROM messages")).scalar_one())
    if not high:
        return False
    conn.exec_driver_sql(SQLITE.staged_table(index))
    # No chunk pays for a merge: the fill merges its segments in steps of its own.
    conn.exec_driver_sql(f"INSERT INTO {staged}({staged}, rank) VALUES ('automerge', 0)")
    for key, value in (
        (backfill.HIGH_WATER.format(index=staged), high),
        (backfill.INDEXED_UPTO.format(index=staged), 0),
        (COMPACTION.format(index=staged), 1),
    ):
        conn.execute(
            text("INSERT OR REPLACE INTO state_meta (key, value) VALUES (:key, :value)"),
            {"key": key, "value": str(value)},
        )
    for ddl in SQLITE.staged_triggers(index):
        conn.exec_driver_sql(ddl)
    log.info("compaction: %s is rebuilt beside itself as %s (ids 1..%d)", index, staged, high)
    return True


def stage(conn: Connection) -> tuple[list[str], dict[str, str]]:
    """Stage the rebuild of every index that can be compacted, one short write
    transaction each; (indexes staged, index -> why it was not)."""
    staged: list[str] = []
    skipped: dict[str, str] = {}
    for index in INDEXES:
        with begin_writing(conn):
            reason = why_not(conn, index)
            if reason is None and not start(conn, index):
                reason = "empty"
        if reason is None:
            staged.append(index)
        elif index in present_indexes(conn) or reason != "missing":
            skipped[index] = reason
        conn.rollback()
    return staged, skipped


def finish(
    engine: Engine,
    *,
    max_lock_ms: float = backfill.DEFAULT_MAX_LOCK_MS,
    duty: float = backfill.DEFAULT_DUTY,
    progress: Callable[[backfill.BackfillProgress], None] | None = None,
) -> backfill.BackfillProgress:
    """Fill, merge, swap in and free: :func:`backfill.run` (every step short, paced)."""
    return backfill.run(engine, max_lock_ms=max_lock_ms, duty=duty, progress=progress)


@dataclass
class Compacted:
    """What :func:`run` did."""

    #: Indexes compacted (staged by this run, or by a killed one).
    indexes: list[str] = field(default_factory=list)
    #: Index -> why it was not compacted.
    skipped: dict[str, str] = field(default_factory=dict)
    #: The FTS5 indexes' bytes before and after (None: nothing done, or no dbstat).
    bytes_before: int | None = None
    bytes_after: int | None = None
    seconds: float = 0.0
    longest_lock_s: float = 0.0


def run(
    engine: Engine, conn: Connection, *, compact: bool, report: Report | None = None
) -> Compacted:
    """Stage the indexes' online rebuild (``compact``), then run every compaction in
    progress to its end (a killed run's too), in short paced steps."""
    result = Compacted()
    if compact:
        # A swap drops a leftover retired index in its one transaction: free it first, in
        # steps.
        if retired_indexes(conn):
            conn.rollback()
            result.longest_lock_s = max(backfill.drop_retired(conn), default=0.0)
        conn.rollback()
        _staged, result.skipped = stage(conn)
    result.indexes = compacting(conn)
    conn.rollback()
    if not result.indexes:
        return result
    started = time.perf_counter()
    result.bytes_before = index_bytes(conn)
    label = (
        f"compacting {', '.join(result.indexes)} (rebuilt beside the current index, "
        "then swapped in)"
    )

    def told(done: backfill.BackfillProgress) -> None:
        if report is not None:
            report(Phase("fill", label, done.rows_done, done.rows_total, "rows"))

    told(backfill.BackfillProgress(rows_total=0))
    done = finish(engine, progress=told)
    result.longest_lock_s = max(result.longest_lock_s, done.longest_lock)
    result.bytes_after = index_bytes(conn)
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def index_bytes(conn: Connection) -> int | None:
    """The bytes of the FTS5 indexes' shadow tables (and any staged or retired one), read
    with dbstat; None where this SQLite has none."""
    try:
        found = conn.exec_driver_sql(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name LIKE 'messages\\_fts%' "
            "ESCAPE '\\'"
        ).scalar_one()
    except DBAPIError:
        return None
    finally:
        conn.rollback()
    return int(found)

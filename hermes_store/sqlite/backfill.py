"""Online, resumable, throttled FTS index fill for stores too large to index in one lock.

The search-layout revision with `-x fts_backfill=deferred` (and `check --repair`) leaves an
index empty for the ids up to a high-water mark and records, in `state_meta`, how far it is
filled: `<index>.backfill_high_water` and `<index>.backfill_indexed_upto`. The triggers
leave the rows in between to this module. Each chunk indexes the next rows and moves the
marker in the same short `BEGIN IMMEDIATE` transaction, so a kill at any instant loses at
most the chunk in flight, and a re-run resumes from the marker. When an index is complete
its keys are deleted and its triggers behave as usual.

An index rebuilt beside a legacy one (`<index>_next`, see :func:`fts.staged_indexes`) is
filled the same way under its own name; once it is filled and merged, one short step swaps
it in (the legacy index is renamed `<index>_retired`, the new one takes its name and the
head's triggers), and later steps empty the retired index a bounded number of rows at a
time, then drop it. Every step is one transaction: a kill at any instant leaves either
index serving, complete.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from hermes_store.declarations import SQLITE
from hermes_store.engine import BEGIN_OPTION, joined_transaction
from hermes_store.errors import Interrupted
from hermes_store.progress import Phase, Report
from hermes_store.sqlite.changelog import drop_change_log
from hermes_store.sqlite.fts import (
    COMPACTION_KEY,
    INDEXES,
    SOURCE_VIEW,
    begin_writing,
    index_layout,
    is_application_layout,
    logical_index,
    normalise_sql,
    present_indexes,
    retired_indexes,
    staged_indexes,
    staged_name,
)

log = logging.getLogger(__name__)

HIGH_WATER = "{index}.backfill_high_water"
INDEXED_UPTO = "{index}.backfill_indexed_upto"
#: Set when the fill is done and the segments it wrote still have to be merged.
MERGING = "{index}.backfill_merging"
#: Set (on the staged table's name) while `<index>_next` rebuilds the head's own index to
#: compact it (:mod:`hermes_store.sqlite.compaction`): only then may :func:`swap_in`
#: replace an index that is already in the external layout.
COMPACTION = COMPACTION_KEY
#: FTS5's default 'automerge'; the fill turns it off so that no chunk pays for a merge.
DEFAULT_AUTOMERGE = 4
MERGE_PAGES = 16
DEFAULT_CRISISMERGE = 16
FILL_CRISISMERGE = 1000
#: FTS5's default 'usermerge'; the fill merges 16 segments at a time (FTS5's maximum):
#: fewer merge levels, so each byte of the index is rewritten fewer times.
DEFAULT_USERMERGE = 4
FILL_USERMERGE = 16
FIRST_CHUNK_BYTES = 32_768
MAX_CHUNK_BYTES = 1 << 30
DEFAULT_CHUNK_ROWS = 2000
DEFAULT_MAX_LOCK_MS = 100.0
DEFAULT_DUTY = 0.5
#: Rows of a retired index's shadow tables deleted by the first step (then adapted).
FIRST_RETIRE_ROWS = 256
MAX_RETIRE_ROWS = 1 << 20
#: The first rows of an FTS5 `_data` table (averages, structure): kept until the retired
#: index is dropped, which reads them.
_RESERVED_DATA_ROWS = 10
#: Each step is sized to hold the lock for this share of max_lock_ms, so that the slow
#: ones (denser text, a busy CPU) still stay under it ...
STEP_TARGET = 0.5
#: ... and is at most this many times the previous step of its kind.
STEP_GROWTH = 1.5


@dataclass(frozen=True)
class Pending:
    """An index whose rows in (indexed_upto, high_water] are not indexed yet."""

    #: The table being filled: the index, or the table it is rebuilt in beside itself.
    index: str
    high_water: int
    indexed_upto: int

    @property
    def logical(self) -> str:
        """The index this fill is for (``messages_fts`` for ``messages_fts_next``)."""
        return logical_index(self.index)


@dataclass
class BackfillProgress:
    """What a run did so far; passed to the progress callback after every chunk."""

    rows_total: int
    rows_done: int = 0
    chunks: int = 0
    lock_seconds: float = 0.0
    longest_lock: float = 0.0
    paused_seconds: float = 0.0
    #: WAL checkpoints run between steps (they do not hold the write lock).
    checkpoint_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    #: What the last step did: "indexing", "merging", "swapping in", "freeing <table>".
    phase: str = "indexing"

    @property
    def eta_seconds(self) -> float | None:
        """Expected time left at the pace so far (pauses included)."""
        if not self.rows_done:
            return None
        elapsed = time.perf_counter() - self.started
        return elapsed / self.rows_done * (self.rows_total - self.rows_done)


def _meta(conn: Connection) -> dict[str, str]:
    return {
        str(key): str(value)
        for key, value in conn.execute(
            text("SELECT key, value FROM state_meta WHERE key LIKE 'messages_fts%'")
        )
    }


def _fillable() -> tuple[str, ...]:
    """Every table a backfill may fill: the indexes, then the tables they are rebuilt in."""
    return (*INDEXES, *(staged_name(index) for index in INDEXES))


def merging(conn: Connection) -> list[str]:
    """Indexes whose fill is done but whose segments are not merged yet."""
    rows = _meta(conn)
    return [index for index in _fillable() if MERGING.format(index=index) in rows]


def pending(conn: Connection) -> list[Pending]:
    """Indexes with an unfinished deferred backfill (rows not indexed yet)."""
    rows = _meta(conn)
    result = []
    for index in _fillable():
        high = rows.get(HIGH_WATER.format(index=index))
        if high is not None:
            upto = int(rows.get(INDEXED_UPTO.format(index=index)) or 0)
            result.append(Pending(index, int(high), upto))
    return result


def rows_left(conn: Connection, item: Pending) -> int:
    """Messages still to index for one pending index."""
    return int(
        conn.execute(
            text("SELECT count(*) FROM messages WHERE id > :lo AND id <= :hi"),
            {"lo": item.indexed_upto, "hi": item.high_water},
        ).scalar_one()
    )


def start(conn: Connection, index: str) -> Pending:
    """Empty `index` and mark every current row as waiting for the backfill (repair path).

    Runs inside the caller's transaction; after it commits, search covers the marked rows
    by scanning them until `run` has indexed them.
    """
    if index not in present_indexes(conn) and index not in staged_indexes(conn).values():
        raise ValueError(f"{index} does not exist in this store")
    high = int(conn.execute(text("SELECT coalesce(max(id), 0) FROM messages")).scalar_one())
    conn.exec_driver_sql(f"INSERT INTO {index}({index}) VALUES ('delete-all')")
    conn.exec_driver_sql(f"INSERT INTO {index}({index}, rank) VALUES ('automerge', 0)")
    _set(conn, HIGH_WATER.format(index=index), high)
    _set(conn, INDEXED_UPTO.format(index=index), 0)
    return Pending(index, high, 0)


def _set(conn: Connection, key: str, value: int) -> None:
    conn.execute(
        text("INSERT OR REPLACE INTO state_meta (key, value) VALUES (:key, :value)"),
        {"key": key, "value": str(value)},
    )


# The next ids of the range, at most :n rows and (past the first) at most :bytes of text:
# indexing costs about the same per byte, whatever the number of rows.
_CHUNK_BOUNDARY = text(
    """
    SELECT max(id), count(*), coalesce(max(total), 0) FROM (
        SELECT id, sum(size) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING) AS total
        FROM (
            SELECT id, length(CAST(content AS BLOB)) AS size FROM messages_fts_source
            WHERE id > :lo AND id <= :hi ORDER BY id LIMIT :n
        )
    ) WHERE total <= :bytes OR total = (
        SELECT length(CAST(content AS BLOB)) FROM messages_fts_source
        WHERE id > :lo AND id <= :hi ORDER BY id LIMIT 1
    )
    """
)


def _chunk(conn: Connection, item: Pending, rows: int, budget: int) -> tuple[int, int, int]:
    """Index the next messages of one index, within `rows` and `budget` bytes.

    Returns (new indexed_upto, rows indexed, bytes indexed); the first row is always taken.
    """
    boundary, count, size = conn.execute(
        _CHUNK_BOUNDARY,
        {"lo": item.indexed_upto, "hi": item.high_water, "n": rows, "bytes": budget},
    ).one()
    upto = item.high_water if boundary is None else int(boundary)
    inserted = conn.execute(
        text(
            f"INSERT INTO {item.index}(rowid, content) SELECT id, content FROM {SOURCE_VIEW} "
            "WHERE id > :lo AND id <= :hi"
        ),
        {"lo": item.indexed_upto, "hi": upto},
    ).rowcount
    if upto >= item.high_water:
        conn.execute(
            text("DELETE FROM state_meta WHERE key IN (:a, :b)"),
            {"a": HIGH_WATER.format(index=item.index), "b": INDEXED_UPTO.format(index=item.index)},
        )
        _set(conn, MERGING.format(index=item.index), 1)
        # The final merges go down to FTS5's usual shape (fewer than 4 segments a level).
        _configure(conn, item.index, "usermerge", DEFAULT_USERMERGE)
    else:
        _set(conn, INDEXED_UPTO.format(index=item.index), upto)
    del count
    return upto, int(inserted or 0), int(size)


def run(
    engine: Engine,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    max_lock_ms: float = DEFAULT_MAX_LOCK_MS,
    duty: float = DEFAULT_DUTY,
    progress: Callable[[BackfillProgress], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> BackfillProgress:
    """Fill every pending index in chunks until none is left; safe to interrupt and re-run.

    Each step is one `BEGIN IMMEDIATE` transaction on one index: a chunk of at most
    `chunk_rows` rows while filling, then a bounded 'merge' of the segments the fill wrote
    (16 at a time), and once every index is filled, bounded merges until no level holds 4
    segments. Step sizes adapt so that each holds the write lock for about half of
    `max_lock_ms`, the slowest ones about all of it. Between steps the run checkpoints the
    WAL (which does not block writers) and pauses so that it holds the lock for about
    `duty` of the time (0.5: as long as it held it), letting other writers in.
    """
    if not 0 < duty <= 1:
        raise ValueError("duty must be in (0, 1]")
    if chunk_rows < 1 or max_lock_ms <= 0:
        raise ValueError("chunk_rows and max_lock_ms must be positive")
    writer = engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
    with engine.connect() as conn:
        started = {item.index: rows_left(conn, item) for item in pending(conn)}
        stale = has_change_log(conn)
    report = BackfillProgress(rows_total=max(started.values(), default=0))
    try:
        _run_steps(writer, report, started, stale, chunk_rows, max_lock_ms, duty, progress, sleep)
    except KeyboardInterrupt as exc:
        raise Interrupted(_interrupted(engine, report)) from exc
    log.info(
        "backfill done: %d rows in %d chunks, longest lock %.1f ms, %.1f s locked, "
        "%.1f s checkpointing",
        report.rows_done,
        report.chunks,
        report.longest_lock * 1000,
        report.lock_seconds,
        report.checkpoint_seconds,
    )
    return report


def _interrupted(engine: Engine, report: BackfillProgress) -> str:
    """What an interrupted backfill leaves, read from the store afterwards."""
    with engine.connect() as conn:
        to_index = sum(rows_left(conn, item) for item in pending(conn))
        to_free = sum(retired_rows(conn, name) for name in retired_indexes(conn))
        unmerged = merging(conn) or list(staged_indexes(conn))
    left = []
    if to_index:
        left.append(f"{to_index:,} rows left to index")
    if unmerged:
        left.append(f"{', '.join(unmerged)} to merge and swap in")
    if to_free:
        left.append(f"{to_free:,} rows of swapped-out indexes and set-aside copies to free")
    return (
        f"interrupted while {report.phase}: that step was rolled back, every finished one is "
        f"kept ({report.rows_done:,} rows indexed and {report.chunks} steps done by this run); "
        + (
            f"{'; '.join(left)}: run `hermes-store optimize-storage` to resume"
            if left
            else "nothing is left to do"
        )
    )


def _run_steps(
    writer: Engine,
    report: BackfillProgress,
    started: dict[str, int],
    stale: bool,
    chunk_rows: int,
    max_lock_ms: float,
    duty: float,
    progress: Callable[[BackfillProgress], None] | None,
    sleep: Callable[[float], None],
) -> None:
    """The steps of :func:`run`, until none is left."""
    # Start small and let next_size find the byte budget that fits in max_lock_ms.
    sizes = dict.fromkeys(_fillable(), FIRST_CHUNK_BYTES)
    pages = dict.fromkeys(_fillable(), MERGE_PAGES)
    filled = dict.fromkeys(_fillable(), 0)
    retire_rows: dict[str, int] = {}
    turn = 0
    with writer.connect() as conn:
        if stale:
            remove_stale_change_log(conn)
        # Each step is resumable, so losing the last steps to a power cut costs nothing:
        # NORMAL skips the fsync of every commit (WAL stays consistent either way).
        raw: Any = conn.connection.driver_connection
        raw.execute("PRAGMA synchronous=NORMAL")
        # SQLite runs the automatic checkpoint inside COMMIT but after the write lock is
        # released: it would count as lock time here and shrink the steps for nothing. It
        # runs between the steps instead.
        raw.execute("PRAGMA wal_autocheckpoint=0")
        while True:
            # One short write transaction per step, one index per step, round robin.
            with conn.begin():
                t0 = time.perf_counter()  # BEGIN IMMEDIATE returned: the lock is held
                todo = pending(conn)
                if todo and turn % 2 == 0:
                    item = todo[(turn // 2) % len(todo)]
                    report.phase = f"indexing {item.index}"
                    if not filled[item.index]:  # no crisis merge inside a chunk, ever
                        _configure(conn, item.index, "crisismerge", FILL_CRISISMERGE)
                        _configure(conn, item.index, "usermerge", FILL_USERMERGE)
                    _upto, rows, size = _chunk(conn, item, chunk_rows, sizes[item.index])
                    filled[item.index] += rows
                    adapt, limits, key, done = sizes, MAX_CHUNK_BYTES, item.index, size
                elif todo:  # merge the segments the fill writes as it goes, in bounded steps
                    key = todo[(turn // 2) % len(todo)].index
                    report.phase = f"merging {key}"
                    done = _merge_step(conn, key, pages[key])
                    adapt, limits = pages, MERGE_PAGES * 64
                elif indexes := merging(conn):
                    key = indexes[turn % len(indexes)]
                    report.phase = f"merging {key}"
                    done = _merge_step(conn, key, pages[key])
                    if done < 2:
                        _finish_merge(conn, key)
                    adapt, limits = pages, MERGE_PAGES * 64
                elif staged := staged_indexes(conn):  # filled and merged: swap it in
                    key = next(iter(staged))
                    report.phase = f"swapping {staged[key]} in for {key}"
                    done = swap_in(conn, key)
                    adapt, limits = {key: 1}, 1
                elif retired := retired_indexes(conn):  # free the swapped-out index's pages
                    key = retired[0]
                    report.phase = f"freeing {key}"
                    retire_rows.setdefault(key, FIRST_RETIRE_ROWS)
                    done = retire_step(conn, key, retire_rows[key])
                    adapt, limits = retire_rows, MAX_RETIRE_ROWS
                else:
                    break
            held = time.perf_counter() - t0
            turn += 1
            amount = done if adapt is sizes else adapt[key]
            resized = next_size(max(amount, 1), held * 1000, max_lock_ms, limits)
            if adapt is sizes or done >= adapt[key] or resized < adapt[key]:
                adapt[key] = resized  # a merge that ran out of work is no reason to grow
            report.chunks += 1
            report.lock_seconds += held
            report.longest_lock = max(report.longest_lock, held)
            report.rows_done = min((filled[i] for i in started), default=0)
            if progress is not None:
                progress(report)
            checkpoint = _checkpoint(raw)
            report.checkpoint_seconds += checkpoint
            pause = held * (1 - duty) / duty - checkpoint  # writers get in meanwhile
            if pause > 0:
                report.paused_seconds += pause
                sleep(pause)


def remove_stale_change_log(conn: Connection) -> bool:
    """Remove the change log an upgrade killed between its verification and its conversion
    left (its triggers would go on logging every write of the agent); True if there was one.

    Safe against an upgrade still running: without its log it verifies in full.
    """
    with joined_transaction(conn):
        if not has_change_log(conn):
            return False
        drop_change_log(conn)
    log.info("removed the change log of an interrupted upgrade")
    return True


def has_change_log(conn: Connection) -> bool:
    """Whether an upgrade's change log is in the store (see sqlite.migration.verify_ahead)."""
    return _exists(conn, SQLITE.change_log.table)


def swap_in(conn: Connection, index: str) -> int:
    """Make the fully built `<index>_next` the index; keep the legacy one as retired.

    Runs in the caller's write transaction: drops the legacy and staged triggers, renames
    (FTS5 renames the shadow tables with them; nothing is copied or freed), creates the
    head's triggers. Returns 1 (one step of work).
    """
    head = SQLITE.index(index)
    staged, retired = staged_name(index), index + SQLITE.retired_suffix
    if any(item.index == staged for item in pending(conn)) or staged in merging(conn):
        raise ValueError(f"{staged} is not complete yet: it cannot replace {index}")
    compaction = is_compaction(conn, staged)
    replaced = (
        not is_head_index(conn, index) if compaction else index_layout(conn, index) == "external"
    )
    if is_application_layout(conn) or replaced:
        # Someone else (the Hermes application moving to its own layout) replaced the
        # legacy index (or, for a compaction, the head's own) meanwhile: its table is not
        # ours to retire. The staged one goes.
        for trigger in SQLITE.staged_trigger_names(index):
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trigger}")
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {staged}")
        _forget_compaction(conn, staged)
        log.warning(
            "backfill: %s was replaced by another layout while %s was built; %s dropped, "
            "%s left as it is",
            index,
            staged,
            staged,
            index,
        )
        return 1
    for trigger in (*head.trigger_names, *SQLITE.staged_trigger_names(index)):
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trigger}")
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {retired}")  # a leftover of an earlier swap
    if index in present_indexes(conn):
        conn.exec_driver_sql(f"ALTER TABLE {index} RENAME TO {retired}")
    conn.exec_driver_sql(f"ALTER TABLE {staged} RENAME TO {index}")
    for ddl in head.triggers:
        conn.exec_driver_sql(ddl)
    _forget_compaction(conn, staged)
    what = "its compacted rebuild" if compaction else "the legacy index"
    log.info("backfill: %s swapped in for %s %s (now %s)", staged, what, index, retired)
    return 1


def is_compaction(conn: Connection, staged: str) -> bool:
    """Whether the staged table ``staged`` (``messages_fts_next``) is a compaction of the
    head's own index (its :data:`COMPACTION` key is set)."""
    return COMPACTION.format(index=staged) in _meta(conn)


def is_head_index(conn: Connection, index: str) -> bool:
    """Whether ``index`` is declared exactly as this package's head declares it."""
    declaration = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"), {"t": index}
    ).scalar()
    if declaration is None:
        return False
    return normalise_sql(str(declaration)) == normalise_sql(SQLITE.index(index).external_sql)


def _forget_compaction(conn: Connection, staged: str) -> None:
    conn.execute(
        text("DELETE FROM state_meta WHERE key = :key"), {"key": COMPACTION.format(index=staged)}
    )


def retire_step(conn: Connection, retired: str, rows: int) -> int:
    """Delete up to `rows` rows of a retired index's shadow tables; drop it once emptied.

    Deleting rows frees their pages a bounded number at a time, so no step holds the write
    lock for long; the final DROP TABLE then only has the empty tables to free.
    """
    declaration = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"), {"t": retired}
    ).scalar()
    if declaration is None:  # dropped meanwhile (another optimize, say): nothing to do
        return 0
    try:
        return _retire_rows(conn, retired, rows, str(declaration))
    except OperationalError as exc:
        if "may not be modified" not in str(exc.orig):
            raise
        # A SQLite in defensive mode refuses writes to FTS5 shadow tables: drop it whole
        # (one longer lock, once).
        log.warning("backfill: %s dropped in one step (this SQLite refuses %s)", retired, exc.orig)
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {retired}")
        return 1


#: What a retired FTS5 index is emptied of, in order: (shadow table suffix, key, rows).
#: The first `_data` rows (averages, structure) stay until the DROP, which reads them.
_SHADOW_PARTS = (
    ("_data", "id", f"id > {_RESERVED_DATA_ROWS}"),
    ("_idx", "segid, term", "1"),
    ("_docsize", "id", "1"),
    ("_content", "id", "1"),
)


def _retire_rows(conn: Connection, retired: str, rows: int, declaration: str) -> int:
    if declaration.upper().startswith("CREATE VIRTUAL"):
        parts = [(retired + suffix, key, where) for suffix, key, where in _SHADOW_PARTS]
        what = "retired index"
    else:  # a text copy set aside by an in-place conversion: a plain rowid table
        parts = [(retired, "rowid", "1")]
        what = "set-aside copy"
    deleted = 0
    for table, key, where in parts:
        if deleted >= rows or not _exists(conn, table):
            continue
        deleted += int(
            conn.exec_driver_sql(
                f"DELETE FROM {table} WHERE ({key}) IN "
                f"(SELECT {key} FROM {table} WHERE {where} LIMIT {int(rows - deleted)})"
            ).rowcount
            or 0
        )
    if deleted < rows:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {retired}")
        log.info("backfill: the %s %s is dropped", what, retired)
        deleted += 1
    return deleted


def retired_tables(conn: Connection, retired: str) -> list[str]:
    """The tables whose rows :func:`retire_step` deletes for a retired index or copy."""
    declaration = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"), {"t": retired}
    ).scalar()
    if declaration is None:
        return []
    if not str(declaration).upper().startswith("CREATE VIRTUAL"):
        return [retired]
    parts = (retired + suffix for suffix, _key, _where in _SHADOW_PARTS)
    return [table for table in parts if _exists(conn, table)]


def retired_rows(conn: Connection, retired: str) -> int:
    """The rows a retired index or set-aside copy still holds (each is read: a scan of
    what is left, as long as freeing it takes to read)."""
    return sum(
        int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())
        for table in retired_tables(conn, retired)
    )


def _exists(conn: Connection, name: str) -> bool:
    """Whether the schema has an object of that name."""
    found = conn.execute(text("SELECT 1 FROM sqlite_master WHERE name = :n"), {"n": name})
    return found.first() is not None


def drop_retired(
    conn: Connection,
    *,
    max_lock_ms: float = DEFAULT_MAX_LOCK_MS,
    duty: float = DEFAULT_DUTY,
    sleep: Callable[[float], None] = time.sleep,
    progress: Report | None = None,
) -> list[float]:
    """Free the pages of every retired index and set-aside copy in short write transactions.

    Each step deletes a number of rows sized to hold the write lock for about half of
    `max_lock_ms` (see :func:`next_size`), then pauses so that the agent's writes get in.
    Safe to interrupt: each step is one transaction, and the next run goes on. Returns how
    long each step held the lock, in seconds. ``progress`` is told the rows freed of each
    (counted first, one read of what is to free).
    """
    locks: list[float] = []
    with joined_transaction(conn):
        names = retired_indexes(conn)
        totals = {name: retired_rows(conn, name) for name in names} if progress else {}
    for name in names:
        rows, freed = FIRST_RETIRE_ROWS, 0
        while True:
            if progress is not None:
                total = totals[name]
                progress(Phase("free", f"freeing {name}", min(freed, total), total, "rows", name))
            with begin_writing(conn):
                started = time.perf_counter()
                deleted = retire_step(conn, name, rows)
            locks.append(time.perf_counter() - started)
            freed += deleted
            if deleted < rows:
                break
            rows = next_size(rows, locks[-1] * 1000, max_lock_ms, MAX_RETIRE_ROWS)
            sleep(locks[-1] * (1 - duty) / duty)
    return locks


def _merge_step(conn: Connection, index: str, pages: int) -> int:
    """Merge about `pages` pages of `index`'s segments; the rows it changed (< 2: no work).

    Only a level holding 'usermerge' segments is merged. (A negative 'merge', which merges
    every level down to one segment, starts over whenever another writer adds a segment:
    with the agent writing meanwhile it would never finish.)
    """
    before = conn.exec_driver_sql("SELECT total_changes()").scalar_one()
    conn.exec_driver_sql(f"INSERT INTO {index}({index}, rank) VALUES ('merge', {int(pages)})")
    after = conn.exec_driver_sql("SELECT total_changes()").scalar_one()
    return int(after - before)


def _checkpoint(raw: Any) -> float:
    """A PASSIVE WAL checkpoint outside any transaction (never waits); its duration."""
    started = time.perf_counter()
    try:
        raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    except sqlite3.OperationalError as exc:  # best effort: the next step tries again
        log.debug("backfill: checkpoint skipped (%s)", exc)
    return time.perf_counter() - started


def _configure(conn: Connection, index: str, option: str, value: int) -> None:
    """Set one FTS5 configuration option (stored in the index's _config table)."""
    conn.exec_driver_sql(f"INSERT INTO {index}({index}, rank) VALUES ('{option}', {int(value)})")


def _finish_merge(conn: Connection, index: str) -> None:
    _configure(conn, index, "automerge", DEFAULT_AUTOMERGE)
    _configure(conn, index, "crisismerge", DEFAULT_CRISISMERGE)
    _configure(conn, index, "usermerge", DEFAULT_USERMERGE)
    conn.execute(
        text("DELETE FROM state_meta WHERE key = :key"), {"key": MERGING.format(index=index)}
    )


def next_size(size: int, held_ms: float, max_lock_ms: float, ceiling: int) -> int:
    """Size the next step so that it holds the lock for about half of `max_lock_ms`.

    Proportional to the last step's rate, growing at most 1.5x per step so that one fast
    step (a cache hit) cannot make the next one overshoot by much.
    """
    target = STEP_TARGET * max_lock_ms
    scaled = size * target / max(held_ms, 0.01)
    return max(1, min(ceiling, int(min(scaled, size * STEP_GROWTH))))

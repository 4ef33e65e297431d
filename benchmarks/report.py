"""Measure every layout at several corpus sizes and write a Markdown report and a PNG chart.

    python -m benchmarks.report [--sizes 1000,10000,50000] [--out benchmarks/results]

Everything is timed directly with ``time.perf_counter`` (no pytest): each figure is the
median of repeated runs, the layouts interleaved round by round so that drift of the
machine (page cache, disk, other load) spreads over all of them alike. Every figure is
stated next to its ratio to ``inline``; the issue's targets are checked at the largest
size and reported PASS or MISS. Writes ``report.md``, ``report.json`` and, when matplotlib
is importable (the ``chart`` extra), ``report.png`` under ``--out``; prints the Markdown.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import event

from benchmarks import floor, layouts, many_writers, many_writers_render, workloads
from benchmarks.layouts import (
    ALL_LAYOUTS,
    EXTERNAL,
    EXTERNAL_21,
    INLINE,
    INLINE_21,
    LAYOUTS,
    REBUILD,
    VARIANTS,
)
from hermes_store import prepared
from hermes_store.search import accept_search_objects
from hermes_store.sqlite import storage
from hermes_store.store import Store

DEFAULT_SIZES = (1_000, 10_000, 50_000)
DEFAULT_OUT = Path(__file__).resolve().parent / "results"

SIZE_GROUPS = (storage.MESSAGE_DATA, storage.FTS_INDEX, storage.FTS_COPIES, storage.OTHER)

# The targets, checked at the largest size.
SIZE_TOLERANCE = 0.02  # total size within 2 percentage points of the physical limit
SEARCH_MAX_RATIO = 1.10  # every query class's median latency
APPEND_MIN_RATIO = 0.95  # append throughput, one per transaction and batched
FLAG_MIN_SPEEDUP = 5.0  # flag updates (active, compacted), on stores at schema 21
CONVERSION_MIN_SPEEDUP = 10.0  # in place versus the rebuild path


def log(message: str) -> None:
    """Progress on stderr (stdout carries the table)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def p95(values: Sequence[float]) -> float:
    """95th percentile (nearest rank)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, -(-95 * len(ordered) // 100) - 1))
    return float(ordered[rank])


def rotated(items: Sequence[str], shift: int) -> list[str]:
    """``items`` starting at ``shift``: each round begins with another layout."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def written_bytes() -> float:
    """Bytes this process has sent to storage so far (Linux /proc/self/io), else 0."""
    try:
        with open("/proc/self/io", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("write_bytes:"):
                    return float(line.split(":", 1)[1])
    except OSError:
        pass
    return 0.0


class SqlTimer:
    """Sum the time an engine spends executing SQL statements (BEGIN and COMMIT left out).

    Statements reach SQLite two ways: through a SQLAlchemy Connection (its cursor events)
    and, for the Store's own methods, through ``hermes_store.prepared.Driver.run``, which
    no event sees: the timers wrap that method, once, and charge each engine's timer.
    What remains of a write's wall time is the pool checkout, COMMIT with its fsyncs and
    any checkpoint.
    """

    #: By the id of what lends a Driver its connection (Driver.owner): an engine, or the
    #: connections a store opened with Store.open keeps of its own.
    _by_owner: ClassVar[dict[int, SqlTimer]] = {}

    def __init__(self, engine: Any, *owners: object) -> None:
        self.total = 0.0
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        for owner in (engine, *owners):
            SqlTimer._by_owner[id(owner)] = self
        _time_prepared_statements()

    @classmethod
    def of_store(cls, store: Store) -> SqlTimer:
        """The timer of a store's engine and of its own connections."""
        return cls(store.engine, store._connections)

    @staticmethod
    def _counted(statement: str) -> bool:
        return not statement.lstrip()[:6].upper().startswith(("BEGIN", "COMMIT"))

    def _before(self, conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self._counted(statement):
            conn.info["hermes_bench_t0"] = time.perf_counter()

    def _after(self, conn: Any, *_args: Any) -> None:
        start = conn.info.pop("hermes_bench_t0", None)
        if start is not None:
            self.total += time.perf_counter() - start


def _time_prepared_statements() -> None:
    """Wrap Driver.run (once per process) so that SqlTimer sees the Store's statements."""
    original = prepared.Driver.run
    if getattr(original, "hermes_bench_timed", False):
        return

    def run(driver: prepared.Driver, sql: str, params: Sequence[Any] = ()) -> Any:
        timer = SqlTimer._by_owner.get(id(driver.owner))
        if timer is None or not SqlTimer._counted(sql):
            return original(driver, sql, params)
        start = time.perf_counter()
        try:
            return original(driver, sql, params)
        finally:
            timer.total += time.perf_counter() - start

    run.hermes_bench_timed = True  # type: ignore[attr-defined]
    prepared.Driver.run = run  # type: ignore[method-assign]


# --------------------------------------------------------------------------------------
# Measuring one corpus size
# --------------------------------------------------------------------------------------


class SizeRun:
    """All measurements at one corpus size."""

    def __init__(
        self,
        size: int,
        directory: Path,
        repeat: int,
        heavy_repeat: int,
        seed: int,
        floor_rounds: int = floor.ROUNDS,
    ):
        self.size = size
        self.floor_rounds = floor_rounds
        self.directory = directory
        self.repeat = repeat
        self.heavy_repeat = heavy_repeat
        self.seed = seed
        self.stores = layouts.StoreSet(directory / "base", size, seed)
        self.work = directory / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.figures: dict[str, dict[str, float]] = {layout: {} for layout in ALL_LAYOUTS}
        self.samples: dict[str, dict[str, list[float]]] = {layout: {} for layout in ALL_LAYOUTS}
        self.data: dict[str, Any] = {"size": size}

    def record(self, layout: str, key: str, samples: list[float], value: float) -> None:
        self.samples[layout][key] = samples
        self.figures[layout][key] = value

    def run(self, *, pathological: bool, floor_only: bool = False) -> dict[str, Any]:
        if floor_only:
            self.build((INLINE, EXTERNAL))
            self.measure_floor()
            return self.data
        self.build(ALL_LAYOUTS)
        self.measure_storage()
        self.measure_parity(pathological=pathological)
        self.measure_search()
        self.measure_writes()
        self.measure_floor()
        self.measure_conversion()
        self.measure_optimize()
        self.data["figures"] = self.figures
        self.data["samples"] = self.samples
        return self.data

    # -- stores -----------------------------------------------------------------------

    def build(self, which: Sequence[str] = LAYOUTS) -> None:
        log(f"{self.size}: generating the corpus and building {len(which)} layouts")
        corpus = self.stores.corpus
        roles: dict[str, int] = {}
        for message in corpus.messages:
            roles[str(message["role"])] = roles.get(str(message["role"]), 0) + 1
        self.data["corpus"] = {
            "sessions": len(corpus.sessions),
            "messages": len(corpus.messages),
            "content_bytes": corpus.content_bytes,
            "roles": roles,
        }
        builds = {}
        for layout in which:
            self.stores.base(layout)
            info = self.stores.builds[layout]
            builds[layout] = round(info.seconds, 3)
            log(f"{self.size}: built {layout} in {info.seconds:.1f} s")
        self.data["build_seconds"] = builds

    # -- storage ----------------------------------------------------------------------

    def measure_storage(self) -> None:
        reports = {layout: workloads.storage_of(self.stores.base(layout)) for layout in LAYOUTS}
        for layout, report in reports.items():
            figures = self.figures[layout]
            figures["size.total"] = report.file_bytes
            for group in SIZE_GROUPS:
                figures[f"size.{group}"] = report.groups.get(group, 0)
        inline = reports[INLINE]
        self.data["physical_limit"] = workloads.physical_limit(inline)
        self.data["objects"] = {layout: r.objects for layout, r in reports.items()}

    # -- parity -----------------------------------------------------------------------

    def measure_parity(self, *, pathological: bool) -> None:
        regular, slow = workloads.split_parity_queries(workloads.load_parity_queries())
        log(f"{self.size}: parity, {len(regular)} queries on every layout")
        reference = workloads.parity_answers(self.stores.base(INLINE), regular)
        parity: dict[str, Any] = {}
        for layout in LAYOUTS[1:]:
            answers = workloads.parity_answers(self.stores.base(layout), regular)
            result = workloads.compare_answers(reference, answers)
            parity[layout] = {
                "queries": result.queries,
                "differing": len(result.differing),
                "with_hits": result.with_hits,
                "examples": [_describe_query(regular[i]) for i in result.differing[:6]],
            }
        self.data["parity"] = parity
        if pathological and slow:
            log(f"{self.size}: {len(slow)} pathological queries on inline and external")
            timings: dict[str, Any] = {}
            answers_by_layout = {}
            for layout in (INLINE, EXTERNAL):
                start = time.perf_counter()
                answers_by_layout[layout] = workloads.parity_answers(self.stores.base(layout), slow)
                timings[layout] = time.perf_counter() - start
            same = answers_by_layout[INLINE] == answers_by_layout[EXTERNAL]
            self.data["pathological"] = {
                "queries": [_describe_query(q) for q in slow],
                "seconds": timings,
                "identical": same,
            }

    # -- search -----------------------------------------------------------------------

    def measure_search(self) -> None:
        rounds = self.repeat * 2
        log(f"{self.size}: search latency, {rounds} rounds of every query on every layout")
        engines = {layout: workloads.engine_for(self.stores.base(layout)) for layout in LAYOUTS}
        conns = {layout: engine.connect() for layout, engine in engines.items()}
        for layout in VARIANTS:  # deliberately not this package's trigram index
            accept_search_objects(conns[layout])
        wall: dict[str, dict[str, list[float]]] = {layout: {} for layout in LAYOUTS}
        cpu: dict[str, dict[str, list[float]]] = {layout: {} for layout in LAYOUTS}
        hits: dict[str, dict[str, int]] = {layout: {} for layout in LAYOUTS}
        queries = [(c, q) for c, qs in workloads.QUERY_CLASSES.items() for q in qs]
        try:
            for layout in LAYOUTS:  # warm-up: page cache, statement compilation
                for _query_class, query in queries:
                    hits[layout][query] = len(workloads.measure_search(conns[layout], query)[2])
            for round_no in range(rounds):
                with workloads.Quiet():
                    # Each query runs on every layout back to back (the order rotating), so
                    # a burst of load on this shared machine hits all layouts alike.
                    for index, (query_class, query) in enumerate(queries):
                        for layout in rotated(LAYOUTS, round_no + index):
                            seconds, cpu_seconds, _ = workloads.measure_search(conns[layout], query)
                            wall[layout].setdefault(query_class, []).append(seconds * 1000)
                            cpu[layout].setdefault(query_class, []).append(cpu_seconds * 1000)
        finally:
            for conn in conns.values():
                conn.close()
            for engine in engines.values():
                engine.dispose()
        for layout in LAYOUTS:
            for query_class, ms in wall[layout].items():
                self.record(layout, f"search.{query_class}.median", ms, median(ms))
                self.figures[layout][f"search.{query_class}.p95"] = p95(ms)
                cpu_ms = cpu[layout][query_class]
                self.record(layout, f"search.{query_class}.cpu", cpu_ms, median(cpu_ms))
        self.data["search_hits"] = hits

    # -- writes through Store -----------------------------------------------------------

    def measure_writes(self) -> None:
        log(f"{self.size}: appends, flag updates, edits and deletes ({self.repeat} rounds)")
        paths = {
            layout: self.stores.copy(layout, self.work / f"{layout}.db") for layout in ALL_LAYOUTS
        }
        stores = {layout: Store.open(path) for layout, path in paths.items()}
        self.sql_timers = {layout: SqlTimer.of_store(store) for layout, store in stores.items()}
        self.fsync_ms: list[float] = []
        try:
            self._appends(stores)
            self._flags(stores, paths)
            self._edits(stores, paths)
            self._deletes(stores, paths)
        finally:
            for store in stores.values():
                store.close()
        self.data["fsync_ms"] = {
            "median": median(self.fsync_ms),
            "p90": sorted(self.fsync_ms)[int(0.9 * (len(self.fsync_ms) - 1))],
            "samples": len(self.fsync_ms),
        }
        problems = {layout: workloads.fts_problems(path) for layout, path in paths.items()}
        self.data["integrity_after_writes"] = problems
        bad = {layout: p for layout, p in problems.items() if p}
        if bad:
            raise RuntimeError(f"indexes damaged by the write benchmarks: {bad}")
        for path in paths.values():
            path.unlink()

    def _probe_fsync(self) -> None:
        """Time one 4 KiB write + fsync: how slow the disk is right now (a diagnostic)."""
        target = self.work / "fsync-probe"
        with target.open("ab") as handle:
            start = time.perf_counter()
            handle.write(b"\0" * 4096)
            handle.flush()
            os.fsync(handle.fileno())
            self.fsync_ms.append((time.perf_counter() - start) * 1000)

    def _interleaved(
        self, operations: Sequence[Any], run: Any, shift: int, which: Sequence[str] = LAYOUTS
    ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """Each operation on every layout back to back; (wall s, SQL-only s, bytes written).

        ``run(layout, operation)`` does one timed unit of work. Interleaving at the finest
        grain keeps bursts of load from other processes from landing on one layout only;
        ``os.sync()`` before each operation (untimed) makes every operation pay for its
        own writes only, not for what the previous layout's checkpoint left dirty.
        """
        wall = dict.fromkeys(which, 0.0)
        sql = dict.fromkeys(which, 0.0)
        written = dict.fromkeys(which, 0.0)
        self._probe_fsync()
        with workloads.Quiet():
            for index, operation in enumerate(operations):
                for layout in rotated(which, shift + index):
                    timer = self.sql_timers[layout]
                    os.sync()
                    before = timer.total
                    bytes_before = written_bytes()
                    start = time.perf_counter()
                    run(layout, operation)
                    wall[layout] += time.perf_counter() - start
                    sql[layout] += timer.total - before
                    written[layout] += written_bytes() - bytes_before
        return wall, sql, written

    def _record_pair(
        self,
        key: str,
        wall: dict[str, list[float]],
        sql: dict[str, list[float]],
        written: dict[str, list[float]],
    ) -> None:
        for layout in wall:
            self.record(layout, key, wall[layout], median(wall[layout]))
            self.record(layout, f"{key}.sql", sql[layout], median(sql[layout]))
            self.record(layout, f"{key}.io", written[layout], median(written[layout]))

    def _appends(self, stores: dict[str, Store]) -> None:
        rounds = self.repeat + 1  # the first is a warm-up
        size = workloads.APPEND_BATCH_SIZE
        plans = {
            "single": workloads.append_plan(workloads.APPEND_SINGLE, rounds, self.seed),
            "batched": workloads.append_plan(
                workloads.APPEND_BATCHES * size, rounds, self.seed + 1
            ),
        }
        for kind, plan in plans.items():
            rates: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
            sql_rates: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
            per_message: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
            for round_no, batch in enumerate(plan):
                for layout in LAYOUTS:
                    workloads.prepare_session(stores[layout], batch)
                sid = batch.session_id
                units: list[Any]
                if kind == "single":
                    units = batch.messages

                    def run(layout: str, message: Any, sid: str = sid) -> None:
                        stores[layout].append_message(sid, message)

                else:
                    units = [
                        batch.messages[i : i + size] for i in range(0, len(batch.messages), size)
                    ]

                    def run(layout: str, messages: Any, sid: str = sid) -> None:
                        stores[layout].append_messages(sid, messages)

                wall, sql, written = self._interleaved(units, run, round_no)
                n = len(batch.messages)
                for layout in LAYOUTS:
                    stored = workloads.message_count(stores_path(stores[layout]), sid)
                    if stored != n:
                        raise RuntimeError(f"{layout}: {stored} of {n} messages stored")
                    if round_no:
                        rates[layout].append(n / wall[layout])
                        sql_rates[layout].append(n / sql[layout])
                        per_message[layout].append(written[layout] / n)
            self._record_pair(f"append.{kind}", rates, sql_rates, per_message)

    def _flags(self, stores: dict[str, Store], paths: dict[str, Path]) -> None:
        # Ids of the corpus (the base store), which every layout's copy holds: the appends
        # before this went to the main layouts' copies only.
        ids = workloads.flag_ids(self.stores.base(INLINE))
        self.data["flag_rows"] = len(ids)

        def run(layout: str, flags: dict[str, bool]) -> None:
            changed = stores[layout].set_message_flags(ids, **flags)
            if changed != len(ids):
                raise RuntimeError(f"{layout}: {flags} changed {changed} rows")

        # Every layout, and the schema-21 pair whose inline triggers fire on flag updates.
        which = ALL_LAYOUTS
        for flag, values in (("active", (False, True)), ("compacted", (True, False))):
            timings: dict[str, list[float]] = {layout: [] for layout in which}
            sql_timings: dict[str, list[float]] = {layout: [] for layout in which}
            io: dict[str, list[float]] = {layout: [] for layout in which}
            for round_no in range(self.repeat):
                for value in values:  # set, then restore: two samples per round
                    wall, sql, written = self._interleaved([{flag: value}], run, round_no, which)
                    for layout in which:
                        timings[layout].append(wall[layout] * 1000)
                        sql_timings[layout].append(sql[layout] * 1000)
                        io[layout].append(written[layout])
            self._record_pair(f"flags.{flag}", timings, sql_timings, io)

    def _edits(self, stores: dict[str, Store], paths: dict[str, Path]) -> None:
        ids = workloads.edit_ids(paths[INLINE])
        timings: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        sql_timings: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        io: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}

        def run(layout: str, edit: tuple[int, str]) -> None:
            stores[layout].edit_message(*edit)

        for round_no in range(self.repeat):
            edits = [(i, workloads.edited_text(paths[INLINE], i, round_no)) for i in ids]
            wall, sql, written = self._interleaved(edits, run, round_no)
            for layout in LAYOUTS:
                timings[layout].append(wall[layout] * 1000 / len(edits))
                sql_timings[layout].append(sql[layout] * 1000 / len(edits))
                io[layout].append(written[layout] / len(edits))
        self._record_pair("edit", timings, sql_timings, io)

    def _deletes(self, stores: dict[str, Store], paths: dict[str, Path]) -> None:
        candidates = workloads.delete_candidates(paths[INLINE], self.repeat)
        self.data["delete_sessions"] = [count for _sid, count in candidates]
        timings: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        sql_timings: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        io: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        for round_no, (session_id, count) in enumerate(candidates):

            def run(layout: str, sid: str, count: int = count) -> None:
                deleted = stores[layout].delete_session(sid)
                if deleted != count:
                    raise RuntimeError(f"{layout}: deleted {deleted} messages, not {count}")

            wall, sql, written = self._interleaved([session_id], run, round_no)
            for layout in LAYOUTS:
                timings[layout].append(wall[layout] * 1000)
                sql_timings[layout].append(sql[layout] * 1000)
                io[layout].append(written[layout])
        self._record_pair("delete", timings, sql_timings, io)

    # -- the data layer against raw sqlite3 ----------------------------------------------

    def measure_floor(self) -> None:
        log(
            f"{self.size}: the data layer against raw sqlite3, {len(floor.OPERATIONS)} "
            f"operations, {self.floor_rounds} interleaved rounds"
        )
        directory = self.work / "floor"
        with floor.Floor(directory, self.stores.base(EXTERNAL), self.floor_rounds, self.seed) as f:
            comparisons = f.compare(log=log)
        shutil.rmtree(directory, ignore_errors=True)
        self.data["floor"] = {c.name: c.as_dict() for c in comparisons}

    # -- conversion ---------------------------------------------------------------------

    def measure_conversion(self) -> None:
        log(f"{self.size}: conversion to head, {self.heavy_repeat} timed runs per path + probe")
        source = self.stores.base(INLINE)
        runs: dict[str, list[float]] = {"in place": [], "rebuild": []}
        locks: dict[str, float] = {}
        counter = itertools.count()
        for round_no in range(self.heavy_repeat + 1):
            probe = round_no == self.heavy_repeat  # the last run: lock probe, untimed
            for name in rotated(list(runs), round_no):
                target = layouts.copy_store(source, self.work / f"convert-{next(counter)}.db")
                with workloads.Quiet():
                    conversion = workloads.convert(target, rebuild=name == "rebuild", probe=probe)
                if probe:
                    locks[name] = float(conversion.lock_seconds or 0.0)
                else:
                    runs[name].append(conversion.seconds)
                target.unlink()
        per_10k = 10_000 / self.size
        self.data["conversion"] = {
            name: {
                "samples": values,
                "seconds": median(values),
                "seconds_per_10k": median(values) * per_10k,
                "lock_seconds": locks[name],
                "lock_seconds_per_10k": locks[name] * per_10k,
            }
            for name, values in runs.items()
        }

    # -- optimize -----------------------------------------------------------------------

    def measure_optimize(self) -> None:
        log(f"{self.size}: optimize, {self.heavy_repeat} runs per layout")
        timings: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        after: dict[str, int] = {}
        for round_no in range(self.heavy_repeat):
            for layout in rotated(LAYOUTS, round_no):
                target = self.stores.copy(layout, self.work / f"optimize-{layout}.db")
                with workloads.Quiet():
                    seconds, result = workloads.optimize(target)
                timings[layout].append(seconds)
                after[layout] = result.bytes_after
                target.unlink()
        for layout, values in timings.items():
            self.record(layout, "optimize", values, median(values))
            self.figures[layout]["size.after_optimize"] = after[layout]


def stores_path(store: Store) -> Path:
    """The database file behind a Store."""
    database = store.engine.url.database
    if not database:
        raise ValueError("an in-memory store has no file")
    return Path(database)


def _describe_query(kwargs: dict[str, Any]) -> str:
    query = kwargs.get("query")
    text = repr(query) if not isinstance(query, str) or len(query) <= 40 else repr(query[:20])
    if isinstance(query, str) and len(query) > 40:
        text += f"... ({len(query)} chars)"
    extra = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k != "query")
    return text + (f" [{extra}]" if extra else "")


# --------------------------------------------------------------------------------------
# Figures, ratios, targets
# --------------------------------------------------------------------------------------


#: (key, label, unit, higher is better)
def figure_rows() -> list[tuple[str, str, str, bool]]:
    rows: list[tuple[str, str, str, bool]] = [
        ("size.total", "total size after VACUUM", "bytes", False),
        (f"size.{storage.MESSAGE_DATA}", "  message data", "bytes", False),
        (f"size.{storage.FTS_INDEX}", "  FTS index data", "bytes", False),
        (f"size.{storage.FTS_COPIES}", "  redundant FTS text copies", "bytes", False),
        (f"size.{storage.OTHER}", "  other", "bytes", False),
    ]
    for key, label, unit, higher in (
        ("append.single", "append, one transaction per message", "msg/s", True),
        ("append.batched", "append, batched (50 per transaction)", "msg/s", True),
        ("flags.active", "flag update: active (100 rows)", "ms", False),
        ("flags.compacted", "flag update: compacted (100 rows)", "ms", False),
        ("edit", "text edit (one message)", "ms", False),
        ("delete", "delete a whole session", "ms", False),
    ):
        rows.append((key, label, unit, higher))
        rows.append((f"{key}.sql", f"  {label}: SQL statements only", unit, higher))
        per = "per message" if key.startswith("append") else "per operation"
        rows.append((f"{key}.io", f"  {label}: bytes written {per}", "bytes", False))
    for query_class in workloads.QUERY_CLASSES:
        rows.append((f"search.{query_class}.median", f"search {query_class}, median", "ms", False))
        rows.append((f"search.{query_class}.p95", f"search {query_class}, p95", "ms", False))
        rows.append(
            (f"search.{query_class}.cpu", f"search {query_class}, CPU-time median", "ms", False)
        )
    rows.append(("optimize", "optimize (merge + VACUUM)", "s", False))
    rows.append(("size.after_optimize", "size after optimize", "bytes", False))
    return rows


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "bytes":
        return storage.human_bytes(value)
    if unit == "msg/s":
        return f"{value:,.0f} msg/s"
    if unit == "s":
        return f"{value:.2f} s"
    if value >= 100:
        return f"{value:,.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0×"
    return f"{value:.3f}×" if 0.1 <= value < 10 else f"{value:.3g}×"


def cell(figures: dict[str, dict[str, float]], layout: str, key: str, unit: str) -> str:
    value = figures[layout].get(key)
    reference = figures[INLINE].get(key)
    text = fmt_value(value, unit)
    if layout == INLINE or value is None:
        return text
    return f"{text} ({fmt_ratio(ratio(value, reference))})"


def check_targets(size_data: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, external versus inline, at one size."""
    figures = size_data["figures"]
    inline, external = figures[INLINE], figures[EXTERNAL]
    targets: list[dict[str, Any]] = []

    size_ratio = external["size.total"] / inline["size.total"]
    limit = size_data["physical_limit"]
    gap = size_ratio - limit
    targets.append(
        {
            "target": "total size within 2 percentage points of the physical limit",
            "measured": f"{size_ratio:.4f}× of inline; limit {limit:.4f}× "
            f"(inline minus both *_content copies); gap {gap * 100:+.2f} pp",
            "pass": abs(gap) <= SIZE_TOLERANCE,
        }
    )
    for query_class in workloads.QUERY_CLASSES:
        key = f"search.{query_class}.median"
        value = external[key] / inline[key]
        cpu_key = f"search.{query_class}.cpu"
        cpu_ratio = external[cpu_key] / inline[cpu_key]
        targets.append(
            {
                "target": f"search median, {query_class}: at most {SEARCH_MAX_RATIO:.2f}×",
                "measured": f"{value:.3f}× ({external[key]:.2f} ms vs {inline[key]:.2f} ms); "
                f"CPU time {cpu_ratio:.3f}×",
                "pass": value <= SEARCH_MAX_RATIO,
                "keys": [key],
            }
        )
    for kind, label in (("single", "one per transaction"), ("batched", "batched")):
        key = f"append.{kind}"
        value = external[key] / inline[key]
        targets.append(
            {
                "target": f"append throughput, {label}: at least {APPEND_MIN_RATIO:.2f}×",
                "measured": f"{value:.3f}× ({external[key]:,.0f} vs {inline[key]:,.0f} msg/s); "
                f"SQL statements only {external[key + '.sql'] / inline[key + '.sql']:.3f}×",
                "pass": value >= APPEND_MIN_RATIO,
                "keys": [key],
            }
        )
    # Flag updates are compared where conversion changes them: on a store at schema 21,
    # whose inline update triggers (17 to 29) re-index a message on every update. At 30 the
    # application's own triggers skip flag updates, so there both layouts do the same work.
    before, after = figures.get(INLINE_21, {}), figures.get(EXTERNAL_21, {})
    for flag in ("active", "compacted"):
        key = f"flags.{flag}"
        if key not in before or key not in after:
            targets.append(
                {
                    "target": f"flag update ({flag}) at least {FLAG_MIN_SPEEDUP:.0f}× faster "
                    "(schema 21: `external-21` vs `inline-21`)",
                    "measured": "not measured: these results have no schema-21 stores "
                    "(written by an older report); run the report again",
                    "pass": False,
                }
            )
            continue
        speedup = before[key] / after[key]
        targets.append(
            {
                "target": f"flag update ({flag}) at least {FLAG_MIN_SPEEDUP:.0f}× faster "
                "(schema 21: `external-21` vs `inline-21`)",
                "measured": f"{speedup:.2f}× faster ({after[key]:.2f} ms vs "
                f"{before[key]:.2f} ms per {size_data.get('flag_rows', 100)} rows); "
                f"SQL statement only {before[key + '.sql'] / after[key + '.sql']:.2f}× "
                f"faster ({after[key + '.sql']:.2f} ms vs {before[key + '.sql']:.2f} ms); "
                f"at schema 30 `external` vs `inline` {inline[key] / external[key]:.2f}×",
                "pass": speedup >= FLAG_MIN_SPEEDUP,
                "keys": [key],
                "layouts": [EXTERNAL_21, INLINE_21],
            }
        )
    conversion = size_data["conversion"]
    in_place, rebuild = conversion["in place"], conversion["rebuild"]
    speedup = rebuild["seconds"] / in_place["seconds"]
    lock_speedup = rebuild["lock_seconds"] / max(in_place["lock_seconds"], 1e-9)
    targets.append(
        {
            "target": f"in-place conversion at least {CONVERSION_MIN_SPEEDUP:.0f}× faster "
            "than the rebuild path",
            "measured": f"{speedup:.2f}× faster ({in_place['seconds']:.2f} s vs "
            f"{rebuild['seconds']:.2f} s wall); longest write-lock hold "
            f"{in_place['lock_seconds']:.2f} s vs {rebuild['lock_seconds']:.2f} s "
            f"({lock_speedup:.1f}×)",
            "pass": speedup >= CONVERSION_MIN_SPEEDUP,
        }
    )
    return targets


def check_floor(floor_data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every operation with a target: data layer / raw sqlite3 CPU time at most MAX_RATIO."""
    return [
        {
            "operation": name,
            "target": f"{name}: CPU time at most {floor.MAX_RATIO:.2f}× raw sqlite3",
            "measured": f"{data['ratio']['cpu']:.3f}× CPU, {data['ratio']['wall']:.3f}× wall",
            "pass": data["ratio"]["cpu"] <= floor.MAX_RATIO,
        }
        for name, data in floor_data.items()
        if data["target"]
    ]


def _floor_cell(samples: list[float]) -> str:
    """Median in ms, with the range when the samples are noisy."""
    mid = median(samples)
    text = fmt_value(mid * 1000, "ms")
    if (max(samples) - min(samples)) / mid > floor.NOISY_SPREAD:
        text += f" ({min(samples) * 1000:.3g}–{max(samples) * 1000:.3g})"
    return text


def render_floor(size: int, floor_data: dict[str, Any]) -> list[str]:
    """The data layer against raw sqlite3 at one size: the headline and the table."""
    targets = check_floor(floor_data)
    missed = [t["operation"] for t in targets if not t["pass"]]
    rounds = len(next(iter(floor_data.values()))["samples"][floor.RAW]["cpu"])
    lines = [
        f"## The data layer against raw sqlite3 at {_label(size)} messages",
        "",
        f"**All {len(targets)} operations within {floor.MAX_RATIO:.2f}× of raw sqlite3 (CPU).**"
        if not missed
        else f"**{len(targets) - len(missed)} of {len(targets)} operations within "
        f"{floor.MAX_RATIO:.2f}× of raw sqlite3 (CPU); MISSED: {'; '.join(missed)}.**",
        "",
        f"`external` store, one copy per side; each operation on both sides back to back, "
        f"the side that goes first alternating, {rounds} rounds after a warm-up; medians per "
        f"sample (what a sample does: `benchmarks/floor.py`), in ms, with the range "
        f"(min–max) where it is wider than {floor.NOISY_SPREAD:.0%} of the median.",
        "",
    ]
    rows = []
    for name, data in floor_data.items():
        samples = data["samples"]
        ratio_cpu, ratio_wall = data["ratio"]["cpu"], data["ratio"]["wall"]
        result = "—"
        if data["target"]:
            result = "PASS" if ratio_cpu <= floor.MAX_RATIO else "**MISS**"
        rows.append(
            [
                name,
                data["sample"],
                _floor_cell(samples[floor.DATA_LAYER]["cpu"]),
                _floor_cell(samples[floor.RAW]["cpu"]),
                fmt_ratio(ratio_cpu),
                _floor_cell(samples[floor.DATA_LAYER]["wall"]),
                _floor_cell(samples[floor.RAW]["wall"]),
                fmt_ratio(ratio_wall),
                result,
            ]
        )
    lines += _table(
        [
            "operation",
            "sample",
            "data layer CPU",
            "raw CPU",
            "CPU ratio",
            "data layer wall",
            "raw wall",
            "wall ratio",
            "result",
        ],
        rows,
    )
    return lines


# --------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------


def _label(size: int) -> str:
    return f"{size // 1000}k" if size % 1000 == 0 else str(size)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _floor_sections(results: dict[str, Any]) -> list[str]:
    """The data layer against raw sqlite3, largest size first."""
    lines: list[str] = []
    for size in sorted((int(s) for s in results["sizes"]), reverse=True):
        if "floor" in results["sizes"][str(size)]:
            lines += ["", *render_floor(size, results["sizes"][str(size)]["floor"])]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    sizes = sorted(int(s) for s in results["sizes"])
    largest = str(sizes[-1])
    meta = results["meta"]
    if meta.get("floor_only"):
        header = [
            "# hermes-store: the data layer against raw sqlite3",
            "",
            f"Generated {meta['date']} on {meta['platform']}, Python {meta['python']}, "
            f"SQLite {meta['sqlite']}, {meta['cpus']} CPUs; commit {meta['commit']}. "
            f"Corpus: `hermes_store.demo.corpus.generate(n, seed={meta['seed']})`.",
        ]
        return "\n".join(header + _floor_sections(results)) + "\n"
    lines: list[str] = [
        "# hermes-store search layouts: benchmark report",
        "",
        f"Generated {meta['date']} on {meta['platform']}, Python {meta['python']}, "
        f"SQLite {meta['sqlite']}, {meta['cpus']} CPUs; commit {meta['commit']}. "
        f"Corpus: `hermes_store.demo.corpus.generate(n, seed={meta['seed']})`; "
        f"{meta['repeat']} rounds per figure ({meta['heavy_repeat']} for conversion and "
        "optimize), medians unless stated.",
        "",
        "## Layouts",
        "",
    ]
    lines += _table(
        ["layout", "what it is", "migration target"],
        [
            [
                f"`{layout}`",
                layouts.DESCRIPTIONS[layout],
                "yes"
                if layout in layouts.MIGRATION_TARGETS or layout == EXTERNAL_21
                else ("reference" if layout in (INLINE, INLINE_21) else "no (comparison only)"),
            ]
            for layout in ALL_LAYOUTS
        ],
    )

    # Targets
    targets = results["targets"]
    passed = sum(1 for t in targets if t["pass"])
    lines += [
        "",
        f"## Targets at {_label(int(largest))} messages: `external` versus `inline` "
        "(flag updates: `external-21` versus `inline-21`)",
        "",
        f"**All {len(targets)} targets pass.**"
        if passed == len(targets)
        else f"**{passed} of {len(targets)} targets pass; {len(targets) - passed} MISSED: "
        + "; ".join(t["target"] for t in targets if not t["pass"])
        + ".**",
        "",
    ]
    lines += _table(
        ["target", "measured", "result"],
        [[t["target"], t["measured"], "PASS" if t["pass"] else "**MISS**"] for t in targets],
    )
    samples = results["sizes"][largest]["samples"]
    for target in targets:
        if target["pass"]:
            continue
        for key in [k for base in target.get("keys", []) for k in (base, f"{base}.sql")]:
            lines += [
                "",
                f"MISS detail, `{key}` samples (every round, in order): "
                + "; ".join(
                    f"`{layout}` " + ", ".join(f"{v:.3g}" for v in samples[layout].get(key, []))
                    for layout in target.get("layouts", (EXTERNAL, INLINE))
                ),
            ]
        if not target.get("keys", [""])[0].startswith("flags."):
            continue
        key = target["keys"][0]
        figures = results["sizes"][largest]["figures"]
        new, old = target["layouts"]
        overhead = {
            layout: figures[layout][key] - figures[layout][f"{key}.sql"] for layout in (new, old)
        }
        lines += [
            "",
            f"Why `{key}` misses: the UPDATE statement itself (with its triggers) takes "
            f"{figures[new][key + '.sql']:.2f} ms on `{new}` against "
            f"{figures[old][key + '.sql']:.2f} ms on `{old}`; the rest of each call "
            f"({overhead[new]:.2f} ms on `{new}`, {overhead[old]:.2f} ms on `{old}`) "
            "is the write transaction around it: BEGIN IMMEDIATE, COMMIT and its fsync. That "
            "fixed cost bounds the ratio through the API and depends on the disk's fsync "
            "latency at the time (see the per-size note on fsync).",
        ]
    if results.get("analysis"):
        lines += ["", *results["analysis"]]
    lines += _floor_sections(results)

    # Per-size tables
    for size in sizes:
        data = results["sizes"][str(size)]
        corpus = data["corpus"]
        figures = data["figures"]
        lines += [
            "",
            f"## {_label(size)} messages",
            "",
            f"{corpus['sessions']} sessions, {corpus['messages']} messages "
            f"({', '.join(f'{k} {v}' for k, v in sorted(corpus['roles'].items()))}), "
            f"{storage.human_bytes(corpus['content_bytes'])} of content, tool calls and "
            f"reasoning. Physical size limit for `external`: "
            f"{data['physical_limit']:.4f}× of inline. Disk during the write benchmarks: "
            f"one 4 KiB write + fsync took {data['fsync_ms']['median']:.1f} ms (median; p90 "
            f"{data['fsync_ms']['p90']:.1f} ms). Cells: absolute value (ratio to "
            "`inline`; for msg/s higher is better, for everything else lower).",
            "",
        ]
        rows = []
        for key, label, unit, _higher in figure_rows():
            rows.append([label, *(cell(figures, layout, key, unit) for layout in LAYOUTS)])
        lines += _table(["figure", *(f"`{layout}`" for layout in LAYOUTS)], rows)
        conversion = data["conversion"]
        lines += ["", f"Conversion 30 -> head, revision fts1 ({_label(size)} messages):", ""]
        lines += _table(
            ["path", "wall time", "per 10k messages", "longest write-lock hold", "per 10k"],
            [
                [
                    name,
                    f"{c['seconds']:.3f} s",
                    f"{c['seconds_per_10k']:.3f} s",
                    f"{c['lock_seconds']:.3f} s",
                    f"{c['lock_seconds_per_10k']:.3f} s",
                ]
                for name, c in conversion.items()
            ]
            + [
                [
                    "rebuild / in place",
                    fmt_ratio(conversion["rebuild"]["seconds"] / conversion["in place"]["seconds"]),
                    "",
                    fmt_ratio(
                        conversion["rebuild"]["lock_seconds"]
                        / max(conversion["in place"]["lock_seconds"], 1e-9)
                    ),
                    "",
                ]
            ],
        )
        parity = data["parity"]
        lines += ["", f"Search results versus `inline` ({_label(size)} messages):", ""]
        lines += _table(
            ["layout", "queries", "differing", "changes results"],
            [
                [
                    f"`{layout}`",
                    str(p["queries"]),
                    str(p["differing"]),
                    ("**yes**: " + "; ".join(p["examples"][:4])) if p["differing"] else "no",
                ]
                for layout, p in parity.items()
            ],
        )
        if "pathological" in data:
            path = data["pathological"]
            lines += [
                "",
                f"Pathological queries ({'; '.join(path['queries'])}), left out of the parity "
                f"runs above {_label(sizes[0])}: inline {path['seconds'][INLINE]:.1f} s, "
                f"external {path['seconds'][EXTERNAL]:.1f} s, answers "
                f"{'identical' if path['identical'] else '**DIFFERENT**'}.",
            ]

    # Growth
    lines += [
        "",
        f"## Growth from {_label(sizes[0])} to {_label(sizes[-1])} messages "
        f"({sizes[-1] / sizes[0]:g}× the messages)",
        "",
    ]
    growth_rows = []
    by_size = [results["sizes"][str(s)]["figures"] for s in sizes]
    for key, label, unit, _higher in figure_rows():
        row = [label.strip()]
        for layout in (INLINE, EXTERNAL):
            values = [figures[layout].get(key) for figures in by_size]
            row.append(" → ".join(fmt_value(v, unit) for v in values))
            row.append(fmt_ratio(ratio(values[-1], values[0])))
        row.append(
            " → ".join(
                fmt_ratio(ratio(figures[EXTERNAL].get(key), figures[INLINE].get(key)))
                for figures in by_size
            )
        )
        growth_rows.append(row)
    for name in ("in place", "rebuild"):
        for field, label in (("seconds", "wall"), ("lock_seconds", "write-lock hold")):
            values = [results["sizes"][str(s)]["conversion"][name][field] for s in sizes]
            growth_rows.append(
                [
                    f"conversion to head {name}, {label}",
                    "",
                    "",
                    " → ".join(f"{v:.3f} s" for v in values),
                    fmt_ratio(ratio(values[-1], values[0])),
                    "",
                ]
            )
    steps = " → ".join(_label(s) for s in sizes)
    lines += _table(
        [
            "figure",
            f"`inline` ({steps})",
            "growth",
            f"`external` ({steps})",
            "growth",
            "external / inline",
        ],
        growth_rows,
    )
    lines += ["", "## How it was measured", ""]
    lines += [f"- {note}" for note in METHOD_NOTES]
    if results.get("chart"):
        lines += ["", f"![chart]({results['chart']})"]
    return "\n".join(lines) + "\n"


METHOD_NOTES = (
    "One corpus per size; the inline store is written as schema 30 (Alembic up to 30, then "
    "`alembic_version` dropped: an unversioned legacy store), one session per transaction "
    "so the FTS5 indexes grow incrementally; every other layout is a copy of it converted "
    "(`migrate.upgrade`, in place or with `fts_convert=rebuild`) or, for the comparison-only "
    "variants, a copy of `external` whose trigram index the benchmark recreates "
    "(`benchmarks/layouts.py`, then 'rebuild' + 'optimize'). Every store is VACUUMed once "
    "built; sizes are `storage_report` groups from dbstat.",
    "The variants' trigram indexes are freshly built and merged (one segment), like "
    "`external-rebuild`; `inline` and `external` keep the incrementally built index. "
    "Compare a variant's search latency with `external-rebuild` rather than with `inline`.",
    "Flag updates are also measured on the same corpus written at schema 21 (`inline-21`) "
    "and on a copy of it converted in place with the schema kept at 21 (`external-21`, "
    "`migrate.upgrade(app_version=21)`), interleaved with the other layouts. The flag-update "
    "targets compare that pair: up to schema 29 the application's inline update triggers "
    "fire on every update of a message and re-index its text, a flag change included; at "
    "schema 30 they fire only when the indexed columns or `role` change, so `inline` and "
    "`external` do the same work for a flag and measure about 1× (shown beside each target).",
    "Writes go through `hermes_store.store.Store` (its own pooled connections, WAL, "
    "synchronous=FULL by default, BEGIN IMMEDIATE): `append_message` per message "
    "(new session each round, messages from another generated corpus), `append_messages` in "
    "batches of 50, `set_message_flags` on 100 consecutive ids (set then restore: two "
    "samples per round), `edit_message` (time per edit, 20 edits per round), "
    "`delete_session` on sessions of median length (one per round). Every operation runs "
    "on every layout back to back (rotating order), so an fsync stall or a burst of load "
    "from other processes lands on all layouts alike; dirty pages are synced and the "
    "garbage collector is off while timing. Throughput is per round (messages / summed "
    "time), the figure the median round. Each operation is preceded by an untimed "
    "`os.sync()`, so it pays for its own writes, not for what the previous layout's "
    "checkpoint left dirty. 'SQL statements only' is the time inside the statements "
    "(SQLAlchemy cursor events and the Store's prepared statements, BEGIN and COMMIT left "
    "out): the triggers' work, without taking a connection, COMMIT's fsyncs and any "
    "checkpoint. 'Bytes written' is the growth of `write_bytes` in "
    "/proc/self/io (WAL frames, the checkpoint into the database file, the WAL file "
    "itself): what the operation sends to the disk, free of timing noise. FTS5 "
    "'integrity-check' (rank 1) of every store passed after all the writes.",
    "Search: `search_messages(conn, query)` (limit 20, snippets and context) on an open "
    "connection, one read transaction per search; per query class the median and p95 over "
    "all its queries and rounds, after one warm-up pass, each query run on every layout "
    "back to back (rotating order). Wall time (`perf_counter`) is the figure; the CPU-time "
    "median (`thread_time`) is given beside it because this machine is shared (other "
    "sessions' test runs): CPU time leaves out the waits for a core. Classes and queries are "
    "in `benchmarks/workloads.py` (`QUERY_CLASSES`).",
    "Parity: every query of `tests/parity_queries.py` on every layout, the full answer "
    "(rows, order, snippets, context) compared with `inline`'s.",
    "Conversion: wall time of `migrate.upgrade(copy, 'head')` (adoption of the unversioned "
    "store plus revision 22, Alembic start-up included) on a fresh copy of the inline store, "
    "median of the timed runs; `per 10k` scales it linearly. Longest write-lock hold: a "
    "separate run while a second process polls `BEGIN IMMEDIATE` with busy_timeout 0 every "
    "0.5 ms; the longest stretch it was refused (resolution about 1 ms). Revision 22 runs in "
    "one transaction, so that is essentially the revision's duration.",
    "Optimize: `maintenance.optimize(engine)` ('optimize' of every FTS index, WAL "
    "checkpoint, VACUUM) on a fresh copy of each layout.",
)


# --------------------------------------------------------------------------------------
# Chart
# --------------------------------------------------------------------------------------


def render_chart(results: dict[str, Any], target: Path) -> bool:
    """Write the PNG chart; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = sorted(int(s) for s in results["sizes"])
    largest = results["sizes"][str(sizes[-1])]
    figures = largest["figures"]
    short = {
        INLINE: "inline",
        EXTERNAL: "external",
        REBUILD: "ext-rebuild",
        layouts.NOTOOL: "notool",
        layouts.DETAIL_COLUMN: "detail=col",
        layouts.NO_TRIGRAM: "no-trigram",
    }
    names = [short[layout] for layout in LAYOUTS]
    fig, axes = plt.subplots(2, 3, figsize=(18, 10))
    fig.suptitle(f"hermes-store search layouts at {_label(sizes[-1])} messages", fontsize=14)

    ax = axes[0][0]
    bottom = [0.0] * len(LAYOUTS)
    for group in SIZE_GROUPS:
        values = [figures[layout][f"size.{group}"] / 2**20 for layout in LAYOUTS]
        ax.bar(names, values, bottom=bottom, label=group)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_title("size after VACUUM (MiB)")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", rotation=30)

    ax = axes[0][1]
    classes = list(workloads.QUERY_CLASSES)
    width = 0.8 / len(LAYOUTS)
    for index, layout in enumerate(LAYOUTS):
        values = [
            figures[layout][f"search.{c}.median"] / figures[INLINE][f"search.{c}.median"]
            for c in classes
        ]
        ax.bar([i + index * width for i in range(len(classes))], values, width, label=short[layout])
    ax.axhline(SEARCH_MAX_RATIO, color="red", linestyle="--", linewidth=1, label="target 1.10×")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(classes))], classes, rotation=30)
    ax.set_yscale("log")
    ax.set_title("search median latency, ratio to inline (log)")
    ax.legend(fontsize=7)

    ax = axes[0][2]
    for index, kind in enumerate(("single", "batched")):
        values = [figures[layout][f"append.{kind}"] for layout in LAYOUTS]
        ax.bar([i + index * 0.4 for i in range(len(LAYOUTS))], values, 0.4, label=kind)
    ax.set_xticks([i + 0.2 for i in range(len(LAYOUTS))], names, rotation=30)
    ax.set_yscale("log")
    ax.set_title("append throughput (msg/s, log)")
    ax.legend(fontsize=8)

    ax = axes[1][0]
    keys = ("flags.active", "flags.compacted", "edit", "delete")
    width = 0.8 / len(keys)
    for index, key in enumerate(keys):
        values = [figures[layout][key] for layout in LAYOUTS]
        ax.bar([i + index * width for i in range(len(LAYOUTS))], values, width, label=key)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(LAYOUTS))], names, rotation=30)
    ax.set_yscale("log")
    ax.set_title("updates and deletes (ms, log)")
    ax.legend(fontsize=8)

    ax = axes[1][1]
    for name in ("in place", "rebuild"):
        for field, style in (("seconds", "-o"), ("lock_seconds", "--x")):
            values = [results["sizes"][str(s)]["conversion"][name][field] for s in sizes]
            label = f"{name}, {'wall' if field == 'seconds' else 'lock hold'}"
            ax.plot(sizes, values, style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages")
    ax.set_title("conversion 30 -> head (s)")
    ax.legend(fontsize=8)

    ax = axes[1][2]
    for layout in LAYOUTS:
        values = [results["sizes"][str(s)]["figures"][layout]["size.total"] / 2**20 for s in sizes]
        ax.plot(sizes, values, "-o", label=short[layout])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages")
    ax.set_title("total size (MiB)")
    ax.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_sizes(text: str) -> list[int]:
    sizes = sorted({int(part.replace("_", "").strip()) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < 200:
        raise argparse.ArgumentTypeError("sizes must be at least 200 messages each")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=list(DEFAULT_SIZES),
        help="comma-separated corpus sizes in messages (default 1000,10000,50000)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    parser.add_argument(
        "--repeat", type=int, default=10, help="rounds per figure (default 10; search: twice)"
    )
    parser.add_argument(
        "--heavy-repeat",
        type=int,
        default=2,
        help="timed runs of each conversion path and of optimize (default 2)",
    )
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the stores go (default: a temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    parser.add_argument(
        "--floor-only",
        action="store_true",
        help="measure only the data layer against raw sqlite3 (on the external store)",
    )
    parser.add_argument(
        "--floor-rounds",
        type=int,
        default=floor.ROUNDS,
        help=f"interleaved rounds of the raw sqlite3 comparison (default {floor.ROUNDS})",
    )
    parser.add_argument(
        "--many-writers",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also run the many-writers benchmark (benchmarks/many_writers.py), SECONDS per "
        "cell, on SQLite and PostgreSQL ($HERMES_BENCH_PG_URL); default: not run",
    )
    parser.add_argument(
        "--many-writers-counts",
        type=many_writers.parse_writers,
        default=many_writers.DEFAULT_WRITERS,
        help="its writer counts (default 1,2,4,8)",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="measure nothing: rewrite report.md / report.png from --out's report.json",
    )
    args = parser.parse_args(argv)
    if args.render_only:
        return render(json.loads((args.out / "report.json").read_text("utf-8")), args.out)
    if args.repeat < 1 or args.heavy_repeat < 1:
        parser.error("--repeat and --heavy-repeat must be at least 1")

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hermes-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    workloads.isolate_environment(workdir / "hermes-home")
    started = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "commit": _commit(),
            "seed": args.seed,
            "repeat": args.repeat,
            "heavy_repeat": args.heavy_repeat,
            "sizes": args.sizes,
            "floor_only": args.floor_only,
        },
        "sizes": {},
    }
    try:
        for index, size in enumerate(args.sizes):
            run = SizeRun(
                size,
                workdir / str(size),
                args.repeat,
                args.heavy_repeat,
                args.seed,
                floor_rounds=args.floor_rounds,
            )
            results["sizes"][str(size)] = run.run(
                pathological=index == 0, floor_only=args.floor_only
            )
            if not args.keep:
                shutil.rmtree(workdir / str(size), ignore_errors=True)
        if args.many_writers > 0:
            options = many_writers.Options(
                writers=args.many_writers_counts,
                seconds=args.many_writers,
                pg_url=os.environ.get(many_writers.PG_URL_ENV) or many_writers.DEFAULT_PG_URL,
            )
            results["many_writers"] = many_writers.run(options, workdir / "many-writers")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    results["meta"]["seconds"] = round(time.perf_counter() - started, 1)

    return render(results, args.out)


def render(results: dict[str, Any], out: Path) -> int:
    """Write report.md, report.json and report.png (when matplotlib is there); print the table."""
    out.mkdir(parents=True, exist_ok=True)
    largest = max(results["sizes"], key=int)
    floor_data = results["sizes"][largest].get("floor")
    results["floor_targets"] = check_floor(floor_data) if floor_data else []
    if results["meta"].get("floor_only"):
        return _write(results, out)
    results["targets"] = check_targets(results["sizes"][largest])
    results.pop("chart", None)
    if render_chart(results, out / "report.png"):
        results["chart"] = "report.png"
    else:
        log("matplotlib is not installed (pip install 'hermes-store[chart]'): no chart")
    return _write(results, out)


def _write(results: dict[str, Any], out: Path) -> int:
    markdown = render_markdown(results)
    if results.get("many_writers"):
        many_writers_render.attach_chart(results["many_writers"], out)
        section = many_writers_render.render_markdown(results["many_writers"], heading="##")
        markdown += "\n" + section
    (out / "report.md").write_text(markdown, encoding="utf-8")
    (out / "report.json").write_text(json.dumps(results, indent=1, default=str), "utf-8")
    print(markdown)
    log(f"wrote {out / 'report.md'} ({results['meta'].get('seconds', '?')} s of measuring)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The processes of one many-writers cell (``benchmarks/many_writers.py``), and their figures.

Each runs in a process of its own (started with 'spawn', so this module is what the
child imports), opens a ``Store`` of its own, waits at the cell's barrier, runs its loop
for the warm-up plus the measured window, and puts a JSON-ready report on the queue: its
latencies, its errors by kind (with a few examples, never message content) and, for a
writer, the ids it was given, which the parent checks against the store, and how it kept
to its schedule when paced. :func:`summarize` turns the reports into the cell's figures,
next to the code that writes them, so the reports' keys live in one module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError

from hermes_store.engine import ENV_BUSY_TIMEOUT
from hermes_store.errors import StoreBusy
from hermes_store.store import NewMessage, Store

#: A writer starts a new session after this many messages (the agent's sessions end).
SESSION_LENGTH = 200
#: Every REWIND_EVERY appends, a writer rewinds (active=0) its last REWIND_LAST messages.
REWIND_EVERY = 20
REWIND_LAST = 3
#: A paced writer behind schedule runs at most this many appends beyond the one due back to
#: back; older slots are dropped (and counted), so a stall is not followed by a burst.
CATCH_UP = 3
#: A paced cell's writers kept up when they made at least this share of the appends asked.
KEPT_UP = 0.95

#: Errors by kind: a lock or busy timeout (or a transaction the server gave up on), else other.
BUSY = "busy"
OTHER = "other"
#: PostgreSQL's SQLSTATEs of a lock wait that ran out or a transaction retried away.
_PG_BUSY_STATES = frozenset({"55P03", "40001", "40P01", "57014"})
#: Distinct error messages kept per process, as examples.
SAMPLES = 5


def log(message: str) -> None:
    """Progress on stderr (stdout carries the table)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def error_kind(exc: BaseException) -> str:
    """``"busy"`` for a lock that could not be had in time (either database), else ``"other"``."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, StoreBusy):
            return BUSY
        if getattr(error, "sqlstate", None) in _PG_BUSY_STATES:
            return BUSY
        if isinstance(error, sqlite3.OperationalError):
            lowered = str(error).lower()
            if "locked" in lowered or "busy" in lowered:
                return BUSY
        nested = error.orig if isinstance(error, DBAPIError) else None
        error = nested if isinstance(nested, BaseException) else error.__cause__
    return OTHER


def describe(exc: BaseException) -> str:
    """One line naming an error (its type and first line)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:200]


class _Errors:
    """Error counts by kind, with a few examples."""

    def __init__(self) -> None:
        self.counts = {BUSY: 0, OTHER: 0}
        self.samples: list[str] = []

    def add(self, exc: BaseException) -> None:
        self.counts[error_kind(exc)] += 1
        line = describe(exc)
        if len(self.samples) < SAMPLES and line not in self.samples:
            self.samples.append(line)


@dataclasses.dataclass(frozen=True)
class Timing:
    """The window every process of a cell runs for, from the barrier on."""

    warmup: float
    seconds: float


def open_store(url: str) -> Store:
    """The store as a process of the application opens it, with the legacy busy timeout.

    ``Store.open`` (the application's entry point) with no timeout override in the
    environment (each process drops ``$HERMES_STORE_BUSY_TIMEOUT_MS`` first): the
    engine's default, :data:`BUSY_TIMEOUT_MS`.
    """
    return Store.open(url)


def _fail(queue: Any, barrier: Any, role: str, index: int) -> None:
    """Report a process's crash to the parent and release everyone waiting at the barrier."""
    queue.put({"role": role, "index": index, "fatal": traceback.format_exc(limit=8)})
    with contextlib.suppress(Exception):
        barrier.abort()


class _Writer:
    """One writer process's loop and what it saw."""

    def __init__(self, store: Store, index: int, messages: Sequence[NewMessage]) -> None:
        self.store = store
        self.index = index
        self.messages = messages
        self.sessions: dict[str, list[int]] = {}
        self.session: str | None = None
        self.rewound: list[int] = []
        self.latencies: list[float] = []
        self.rewind_latencies: list[float] = []
        self.errors = _Errors()
        self.rewind_errors = _Errors()
        self.session_errors = _Errors()
        self.appends = 0  # successful appends in all (warm-up included)

    def new_session(self) -> None:
        session_id = f"mw-{self.index}-{len(self.sessions)}"
        try:
            self.store.create_session(session_id, "cli", model="bench-model")
        except Exception as exc:
            self.session_errors.add(exc)
            return
        self.sessions[session_id] = []
        self.session = session_id

    def step(self, measuring: bool) -> None:
        """One append (and, every REWIND_EVERY appends, one rewind)."""
        if self.session is None or len(self.sessions[self.session]) >= SESSION_LENGTH:
            self.new_session()
            if self.session is None or len(self.sessions[self.session]) >= SESSION_LENGTH:
                return
        session = self.session
        message = self.messages[self.appends % len(self.messages)]
        started = time.perf_counter()
        try:
            message_id = self.store.append_message(session, message)
        except Exception as exc:
            if measuring:
                self.errors.add(exc)
            return
        if measuring:
            self.latencies.append(time.perf_counter() - started)
        self.sessions[session].append(message_id)
        self.appends += 1
        if self.appends % REWIND_EVERY == 0:
            last = self.sessions[session][-REWIND_LAST:]
            started = time.perf_counter()
            try:
                self.store.set_message_flags(last, active=False)
            except Exception as exc:
                if measuring:
                    self.rewind_errors.add(exc)
                return
            if measuring:
                self.rewind_latencies.append(time.perf_counter() - started)
            self.rewound += last

    def report(self) -> dict[str, Any]:
        return {
            "role": "writer",
            "index": self.index,
            "sessions": self.sessions,
            "rewound": self.rewound,
            "latencies": self.latencies,
            "rewind_latencies": self.rewind_latencies,
            "errors": self.errors.counts,
            "error_samples": self.errors.samples,
            "rewind_errors": self.rewind_errors.counts,
            "session_errors": self.session_errors.counts,
            "other_samples": self.rewind_errors.samples + self.session_errors.samples,
        }


@dataclasses.dataclass
class Paced:
    """What a paced (open-loop) writer saw of its schedule in the measured window.

    ``behind``: for each slot it came to, how long after the slot's due time that was (the
    whole lag, before any slot was dropped); ``missed``: the slots it dropped.
    """

    behind: list[float] = dataclasses.field(default_factory=list)
    missed: int = 0


def _run_window(
    timing: Timing,
    step: Callable[[bool], None],
    rate: float | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> Paced | None:
    """Call ``step(measuring)`` until the window ends; measuring once the warm-up is over.

    Without ``rate``, a closed loop: the next step as soon as one returns, so the load is
    whatever the database lets through. With ``rate`` (steps per second), an open loop:
    step k is due at ``start + k / rate`` whatever the earlier ones took, so every database
    is asked for the same load; a step counts as measured when its slot falls in the
    window. Behind schedule, it runs at most :data:`CATCH_UP` + 1 steps back to back and
    drops the older slots (counted in the returned :class:`Paced`): a stall is not
    followed by a burst that no application would send.
    """
    start = clock()
    measure_from = start + timing.warmup
    end = measure_from + timing.seconds
    if rate is None:
        while True:
            now = clock()
            if now >= end:
                return None
            step(now >= measure_from)
    interval = 1.0 / rate
    paced = Paced()
    slot = 0
    while True:
        due = start + slot * interval
        if due >= end:
            return paced
        now = clock()
        if now < due:
            sleep(due - now)
            now = clock()
        late = now - due
        behind = int(late / interval)
        if behind > CATCH_UP:
            dropped = range(slot, slot + behind - CATCH_UP)
            paced.missed += sum(measure_from <= start + k * interval < end for k in dropped)
            slot = dropped.stop
            due = start + slot * interval
            if due >= end:
                return paced
        measuring = due >= measure_from
        if measuring:
            paced.behind.append(late)
        step(measuring)
        slot += 1


def writer_main(
    url: str,
    index: int,
    messages: Sequence[NewMessage],
    timing: Timing,
    barrier: Any,
    queue: Any,
    rate: float | None = None,
) -> None:
    """A writer process: its own Store, its own sessions, one transaction per message;
    as fast as it can, or ``rate`` appends a second (see :func:`_run_window`)."""
    os.environ.pop(ENV_BUSY_TIMEOUT, None)
    try:
        store = open_store(url)
        writer = _Writer(store, index, messages)
        writer.new_session()  # connected, and a session ready, before the clock starts
        barrier.wait()
        paced = _run_window(timing, writer.step, rate)
        store.close()
        report = writer.report()
        report["paced"] = None if paced is None else dataclasses.asdict(paced)
        queue.put(report)
    except Exception:
        _fail(queue, barrier, "writer", index)


def searcher_main(
    url: str, queries: Sequence[str], timing: Timing, barrier: Any, queue: Any
) -> None:
    """The searcher process: ``Store.search`` over ``queries`` in turn, as fast as it can."""
    os.environ.pop(ENV_BUSY_TIMEOUT, None)
    try:
        store = open_store(url)
        errors = _Errors()
        for query in queries:  # compiled statements and caches warm before the clock starts
            with contextlib.suppress(Exception):
                store.search(query)
        latencies: list[float] = []
        by_query: dict[str, list[float]] = {}
        hits = 0
        turn = 0

        def step(measuring: bool) -> None:
            nonlocal hits, turn
            query = queries[turn % len(queries)]
            turn += 1
            started = time.perf_counter()
            try:
                found = store.search(query)
            except Exception as exc:
                if measuring:
                    errors.add(exc)
                return
            if measuring:
                latencies.append(time.perf_counter() - started)
                by_query.setdefault(query, []).append(latencies[-1])
                hits += len(found)

        barrier.wait()
        _run_window(timing, step)
        store.close()
        queue.put(
            {
                "role": "searcher",
                "index": 0,
                "latencies": latencies,
                "hits": hits,
                "by_query": by_query,
                "errors": errors.counts,
                "error_samples": errors.samples,
            }
        )
    except Exception:
        _fail(queue, barrier, "searcher", 0)


# --------------------------------------------------------------------------------------
# What the reports say
# --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The nearest-rank percentile, or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, -(-int(pct * len(ordered)) // 100) - 1))
    return float(ordered[rank])


def _sum(reports: Sequence[dict[str, Any]], key: str) -> dict[str, int]:
    total = {BUSY: 0, OTHER: 0}
    for report in reports:
        for kind, count in report[key].items():
            total[kind] += count
    return total


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def pace(
    writers: int, timing: Timing, rate: float | None, reports: Sequence[dict[str, Any]]
) -> dict[str, Any] | None:
    """A paced cell's load: asked (``rate`` per writer), achieved, and whether the writers
    kept up (achieved at least :data:`KEPT_UP` of asked); None for a closed loop."""
    if rate is None:
        return None
    writer_reports = [r for r in reports if r["role"] == "writer"]
    appends = sum(len(r["latencies"]) for r in writer_reports)
    paced = [r.get("paced") or {} for r in writer_reports]
    behind = [x for p in paced for x in p.get("behind", [])]
    share = appends / (rate * writers * timing.seconds)
    return {
        "rate_per_writer": rate,
        "asked_per_s": round(rate * writers, 1),
        "achieved_share": round(share, 3),
        "kept_up": share >= KEPT_UP,
        "missed": sum(int(p.get("missed", 0)) for p in paced),
        "behind_p99_ms": _ms(percentile(behind, 99)),
        "behind_max_ms": _ms(max(behind) if behind else None),
    }


def summarize(
    backend: str,
    writers: int,
    timing: Timing,
    reports: Sequence[dict[str, Any]],
    rate: float | None = None,
) -> dict[str, Any]:
    """The cell's figures from its processes' reports (``rate``: see :func:`pace`)."""
    writer_reports = [r for r in reports if r["role"] == "writer"]
    latencies = [x for r in writer_reports for x in r["latencies"]]
    rewinds = [x for r in writer_reports for x in r["rewind_latencies"]]
    per_writer = [len(r["latencies"]) for r in writer_reports]
    samples = sorted({s for r in writer_reports for s in r["error_samples"] + r["other_samples"]})
    cell: dict[str, Any] = {
        "backend": backend,
        "writers": writers,
        "seconds": timing.seconds,
        "appends": len(latencies),
        "appends_per_s": round(len(latencies) / timing.seconds, 1),
        "appends_per_writer": per_writer,
        "append_p50_ms": _ms(percentile(latencies, 50)),
        "append_p99_ms": _ms(percentile(latencies, 99)),
        "append_max_ms": _ms(max(latencies) if latencies else None),
        "errors": _sum(writer_reports, "errors"),
        "rewinds": len(rewinds),
        "rewind_p50_ms": _ms(percentile(rewinds, 50)),
        "rewind_errors": _sum(writer_reports, "rewind_errors"),
        "session_errors": _sum(writer_reports, "session_errors"),
        "error_samples": samples[:SAMPLES],
        "pace": pace(writers, timing, rate, reports),
        "search": None,
    }
    for report in reports:
        if report["role"] == "searcher":
            found = report["latencies"]
            cell["search"] = {
                "searches": len(found),
                "per_s": round(len(found) / timing.seconds, 1),
                "p50_ms": _ms(percentile(found, 50)),
                "p99_ms": _ms(percentile(found, 99)),
                "hits": report["hits"],
                "p50_ms_by_query": {
                    query: _ms(percentile(times, 50))
                    for query, times in report.get("by_query", {}).items()
                },
                "errors": report["errors"],
                "error_samples": report["error_samples"],
            }
    return cell

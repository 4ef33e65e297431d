"""The processes of one many-writers cell (``benchmarks/many_writers.py``): writers, searcher.

Each runs in a process of its own (started with 'spawn', so this module is what the
child imports), opens a ``Store`` of its own, waits at the cell's barrier, runs its loop
for the warm-up plus the measured window, and puts a JSON-ready report on the queue: its
latencies, its errors by kind (with a few examples, never message content) and, for a
writer, the ids it was given, which the parent checks against the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import sys
import time
import traceback
from collections.abc import Sequence
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


def _run_window(timing: Timing, step: Any) -> None:
    """Call ``step(measuring)`` until the window ends; measuring once the warm-up is over."""
    start = time.perf_counter()
    measure_from = start + timing.warmup
    end = measure_from + timing.seconds
    while True:
        now = time.perf_counter()
        if now >= end:
            return
        step(now >= measure_from)


def writer_main(
    url: str, index: int, messages: Sequence[NewMessage], timing: Timing, barrier: Any, queue: Any
) -> None:
    """A writer process: its own Store, its own sessions, one transaction per message."""
    os.environ.pop(ENV_BUSY_TIMEOUT, None)
    try:
        store = open_store(url)
        writer = _Writer(store, index, messages)
        writer.new_session()  # connected, and a session ready, before the clock starts
        barrier.wait()
        _run_window(timing, writer.step)
        store.close()
        queue.put(writer.report())
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

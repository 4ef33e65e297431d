"""Many writers side by side: N processes append, one searches, on SQLite and PostgreSQL.

    python -m benchmarks.many_writers --seconds 10 --writers 1,2,4,8 --out DIR

Each cell of the run is one database and one writer count N. It starts from a copy of the
same seeded store (``--seed-messages`` generated messages, written through the Store API):
a file in WAL for SQLite, a database created from a template for PostgreSQL. Then N writer
processes and one searcher, each started with the 'spawn' method and opening a ``Store``
of its own, meet at a barrier and run for the warm-up plus ``--seconds``:

- a writer appends messages to sessions of its own the way the application does, one
  transaction per message (``Store.append_message``, waiting for the write lock up to the
  engine's busy timeout, :data:`hermes_store.engine.BUSY_TIMEOUT_MS`), starts a new session
  every :data:`SESSION_LENGTH` messages, and every :data:`REWIND_EVERY` appends rewinds its
  last :data:`REWIND_LAST` messages (``Store.set_message_flags(..., active=False)``). It
  appends as fast as it can (a closed loop): the figures are what the database sustains,
  not what one agent asks of it;
- the searcher runs :data:`SEARCH_QUERIES` in turn through ``Store.search``.

Only what starts after the warm-up counts. Each process sends its latencies, error counts
and the ids it was given back to the parent, which then checks the store: every id a
writer was given is in its sessions (no lost row), no other row is, the sessions' counters
agree, and the rewound rows are inactive. Written under ``--out``: ``many_writers.json``,
``many_writers.md`` (printed too) and, with matplotlib installed (the ``chart`` extra),
``many_writers.png``.

PostgreSQL is the server at ``--pg`` (default ``$HERMES_BENCH_PG_URL``, else
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``): the run creates and drops
databases of its own there. When the server does not answer, or the Store API does not
work on it, its cells are reported "not measured" with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import multiprocessing
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from sqlalchemy import Table, create_engine, select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError

from benchmarks import layouts, workloads
from hermes_store import migrate
from hermes_store.demo import corpus
from hermes_store.engine import BUSY_TIMEOUT_MS, ENV_BUSY_TIMEOUT, create_store_engine, to_url
from hermes_store.errors import StoreBusy
from hermes_store.models import AgentSession, Message
from hermes_store.store import NewMessage, Store

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
BACKENDS = (SQLITE, POSTGRESQL)
LABELS = {SQLITE: "SQLite", POSTGRESQL: "PostgreSQL"}

DEFAULT_WRITERS = (1, 2, 4, 8)
DEFAULT_SECONDS = 10.0
DEFAULT_WARMUP = 2.0
DEFAULT_SEED_MESSAGES = 5_000
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
PG_URL_ENV = "HERMES_BENCH_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SEED = 13

#: A writer starts a new session after this many messages (the agent's sessions end).
SESSION_LENGTH = 200
#: Every REWIND_EVERY appends, a writer rewinds (active=0) its last REWIND_LAST messages.
REWIND_EVERY = 20
REWIND_LAST = 3
#: Issue 26's target: with this many writers, PostgreSQL's search p50 at most this many
#: times SQLite's, in the same run.
TARGET_WRITERS = 8
SEARCH_P50_MAX_RATIO = 2.0
#: Messages per writer, appended in turn (generated once, each writer its own slice).
POOL = 300
#: The searcher's queries, in turn: words, a phrase, a prefix, OR, and CJK.
SEARCH_QUERIES = ("error", '"import os"', "pyth*", "error OR exception", "数据库")

#: Errors by kind: a lock or busy timeout (or a transaction the server gave up on), else other.
BUSY = "busy"
OTHER = "other"
#: PostgreSQL's SQLSTATEs of a lock wait that ran out or a transaction retried away.
_PG_BUSY_STATES = frozenset({"55P03", "40001", "40P01", "57014"})
#: Distinct error messages kept per process, as examples.
_SAMPLES = 5
#: How long the parent waits for every process to reach the barrier (imports, connects).
START_TIMEOUT_S = 180.0

_sessions = cast(Table, AgentSession.__table__)
_messages = cast(Table, Message.__table__)


def log(message: str) -> None:
    """Progress on stderr (stdout carries the table)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The nearest-rank percentile, or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, -(-int(pct * len(ordered)) // 100) - 1))
    return float(ordered[rank])


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
        if len(self.samples) < _SAMPLES and line not in self.samples:
            self.samples.append(line)


# --------------------------------------------------------------------------------------
# The processes
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# One cell
# --------------------------------------------------------------------------------------


class CellFailed(RuntimeError):
    """A process of the cell crashed or never reached the barrier."""


def writer_pools(writers: int, seed: int = SEED) -> list[list[NewMessage]]:
    """Each writer's messages: realistic ones, stamped when appended (timestamp None)."""
    plan = workloads.append_plan(POOL, writers, seed)
    return [[dataclasses.replace(m, timestamp=None) for m in batch.messages] for batch in plan]


def run_processes(
    url: str,
    writers: int,
    timing: Timing,
    *,
    search: bool = True,
    queries: Sequence[str] = SEARCH_QUERIES,
) -> list[dict[str, Any]]:
    """Start the writers (and the searcher), run the window, return every process's report."""
    ctx = multiprocessing.get_context("spawn")
    parties = writers + (1 if search else 0)
    barrier = ctx.Barrier(parties + 1)
    queue = ctx.Queue()
    processes = [
        ctx.Process(
            target=writer_main,
            args=(url, index, pool, timing, barrier, queue),
            name=f"writer-{index}",
        )
        for index, pool in enumerate(writer_pools(writers))
    ]
    if search:
        processes.append(
            ctx.Process(
                target=searcher_main,
                args=(url, tuple(queries), timing, barrier, queue),
                name="searcher",
            )
        )
    for process in processes:
        process.start()
    reports: list[dict[str, Any]] = []
    try:
        try:
            barrier.wait(timeout=START_TIMEOUT_S)
        except threading.BrokenBarrierError as exc:
            raise CellFailed(_fatal_text(queue) or f"the processes did not start: {exc!r}") from exc
        deadline = time.monotonic() + timing.warmup + timing.seconds + START_TIMEOUT_S
        while len(reports) < parties:
            reports.append(queue.get(timeout=max(1.0, deadline - time.monotonic())))
        fatal = [r["fatal"] for r in reports if "fatal" in r]
        if fatal:
            raise CellFailed(fatal[0])
        for process in processes:
            process.join(60)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(10)
    return reports


def _fatal_text(queue: Any) -> str | None:
    with contextlib.suppress(Exception):
        while True:
            report = queue.get(timeout=5)
            if "fatal" in report:
                return str(report["fatal"])
    return None


def verify(url: str, reports: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Check the store against what the writers were told: no lost row, no stray one.

    Returns counts: ``expected`` rows, ``lost`` (an id a writer was given that is not in
    its session), ``unexpected`` (a row in a writer's session it was not given),
    ``counters_wrong`` (sessions whose message_count differs from their rows) and
    ``rewind_wrong`` (rewound rows still active).
    """
    given: dict[str, set[int]] = {}
    rewound: set[int] = set()
    for report in reports:
        if report["role"] == "writer":
            for session, ids in report["sessions"].items():
                given[session] = set(ids)
            rewound.update(report["rewound"])
    found: dict[str, set[int]] = {session: set() for session in given}
    inactive: set[int] = set()
    counters: dict[str, int] = {}
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            sessions = sorted(given)
            for start in range(0, len(sessions), 500):
                chunk = sessions[start : start + 500]
                rows = conn.execute(
                    select(_messages.c.id, _messages.c.session_id, _messages.c.active).where(
                        _messages.c.session_id.in_(chunk)
                    )
                )
                for message_id, session_id, active in rows:
                    found[session_id].add(int(message_id))
                    if not active:
                        inactive.add(int(message_id))
                counters.update(
                    (str(session_id), int(count or 0))
                    for session_id, count in conn.execute(
                        select(_sessions.c.id, _sessions.c.message_count).where(
                            _sessions.c.id.in_(chunk)
                        )
                    )
                )
    finally:
        engine.dispose()
    return {
        "sessions": len(given),
        "expected": sum(len(ids) for ids in given.values()),
        "found": sum(len(ids) for ids in found.values()),
        "lost": sum(len(given[s] - found[s]) for s in given),
        "unexpected": sum(len(found[s] - given[s]) for s in given),
        "counters_wrong": sum(counters.get(s) != len(found[s]) for s in given),
        "rewind_wrong": len(rewound - inactive),
    }


def _sum(reports: Sequence[dict[str, Any]], key: str) -> dict[str, int]:
    total = {BUSY: 0, OTHER: 0}
    for report in reports:
        for kind, count in report[key].items():
            total[kind] += count
    return total


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def summarize(
    backend: str, writers: int, timing: Timing, reports: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The cell's figures from its processes' reports."""
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
        "error_samples": samples[:_SAMPLES],
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


def run_cell(
    target: Target, backend: str, writers: int, timing: Timing, *, search: bool = True
) -> dict[str, Any]:
    """One database and one writer count, on a fresh copy of the seeded store, verified."""
    name = f"w{writers}"
    url = target.fresh(name)
    try:
        reports = run_processes(url, writers, timing, search=search)
        cell = summarize(backend, writers, timing, reports)
        cell["verified"] = verify(url, reports)
    finally:
        target.drop(name)
    return cell


# --------------------------------------------------------------------------------------
# The databases
# --------------------------------------------------------------------------------------


def seed_store(url: str, messages: int, seed: int = SEED) -> int:
    """Write ``messages`` generated messages through the Store API; return the sessions made."""
    generated = corpus.generate(messages, seed)
    by_session: dict[str, list[NewMessage]] = {}
    for row in generated.messages:
        by_session.setdefault(str(row["session_id"]), []).append(workloads._new_message(row))
    with open_store(url) as store:
        for session in generated.sessions:
            session_id = str(session["id"])
            store.create_session(
                session_id,
                str(session["source"]),
                model=cast(str | None, session["model"]),
                started_at=float(cast(float, session["started_at"])),
            )
            if by_session.get(session_id):
                store.append_messages(session_id, by_session[session_id])
    return len(generated.sessions)


def probe(url: str) -> dict[str, str | None]:
    """Whether the Store API's writes and searches work on ``url``: None, or why not."""
    found: dict[str, str | None] = {"writes": None, "search": None}
    with open_store(url) as store:
        try:
            store.create_session("mw-probe", "cli")
            ids = [store.append_message("mw-probe", NewMessage(role="user", content="probe"))]
            store.set_message_flags(ids, active=False)
            store.delete_session("mw-probe")
        except Exception as exc:
            found["writes"] = describe(exc)
        try:
            for query in SEARCH_QUERIES:
                store.search(query)
        except Exception as exc:
            found["search"] = describe(exc)
    return found


class Target(Protocol):
    """Where a backend's cells run: a seeded template, and fresh copies of it."""

    backend: str

    def prepare(self, seed_messages: int) -> None: ...
    def fresh(self, name: str) -> str: ...
    def drop(self, name: str) -> None: ...
    def template_url(self) -> str: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class SqliteTarget:
    """SQLite files in ``directory``: a seeded store copied for each cell."""

    backend = SQLITE

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.template = directory / "seed.db"

    def template_url(self) -> str:
        return to_url(self.template)

    def prepare(self, seed_messages: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        migrate.upgrade(str(self.template))
        seed_store(self.template_url(), seed_messages)
        with contextlib.closing(sqlite3.connect(self.template)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.db"

    def fresh(self, name: str) -> str:
        return to_url(layouts.copy_store(self.template, self._path(name)))

    def drop(self, name: str) -> None:
        path = self._path(name)
        for side in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
            side.unlink(missing_ok=True)

    def describe(self) -> dict[str, Any]:
        engine = create_store_engine(self.template, create=False)
        try:
            with engine.connect() as conn:
                journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
                synchronous = conn.exec_driver_sql("PRAGMA synchronous").scalar()
        finally:
            engine.dispose()
        return {
            "version": sqlite3.sqlite_version,
            "journal_mode": journal,
            "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
                int(synchronous or 0), synchronous
            ),
            "busy_timeout_ms": BUSY_TIMEOUT_MS,
        }

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class PostgresTarget:
    """Databases of this run on a PostgreSQL server: a seeded template, cloned per cell."""

    backend = POSTGRESQL

    def __init__(self, server_url: str) -> None:
        self.server = make_url(to_url(server_url))
        self.prefix = f"hermes_mw_{os.getpid()}"
        self.template = f"{self.prefix}_seed"
        self.admin = create_engine(
            self.server, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
        )
        self.created: list[str] = []

    def _url(self, database: str) -> str:
        return cast(URL, self.server.set(database=database)).render_as_string(hide_password=False)

    def template_url(self) -> str:
        return self._url(self.template)

    def _admin(self, sql: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(sql))

    def prepare(self, seed_messages: int) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.template}"')
        self._admin(f'CREATE DATABASE "{self.template}"')
        self.created.append(self.template)
        migrate.upgrade(self.template_url())
        seed_store(self.template_url(), seed_messages)

    def fresh(self, name: str) -> str:
        database = f"{self.prefix}_{name}"
        self._admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        # No session may be connected to the template while it is copied.
        self._admin(f'CREATE DATABASE "{database}" TEMPLATE "{self.template}"')
        self.created.append(database)
        return self._url(database)

    def drop(self, name: str) -> None:
        database = f"{self.prefix}_{name}"
        self._admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        with contextlib.suppress(ValueError):
            self.created.remove(database)

    def describe(self) -> dict[str, Any]:
        with self.admin.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar()
            settings = dict(
                conn.execute(
                    text(
                        "SELECT name, setting FROM pg_settings WHERE name IN "
                        "('synchronous_commit', 'fsync', 'shared_buffers', 'max_connections')"
                    )
                ).all()
            )
        return {
            "version": version,
            "server": self.server.render_as_string(hide_password=True),
            "lock_timeout_ms": BUSY_TIMEOUT_MS,
            **settings,
        }

    def close(self) -> None:
        for database in reversed(self.created):
            with contextlib.suppress(Exception):
                self._admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        self.admin.dispose()


def server_reason(server_url: str) -> str | None:
    """None when the PostgreSQL server answers, else why not (one line)."""
    engine = create_engine(make_url(to_url(server_url)), connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        return f"no PostgreSQL server at {display(server_url)} ({describe(exc)})"
    finally:
        engine.dispose()
    return None


def display(url: str) -> str:
    return make_url(to_url(url)).render_as_string(hide_password=True)


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Options:
    """What a run measures."""

    writers: tuple[int, ...] = DEFAULT_WRITERS
    seconds: float = DEFAULT_SECONDS
    warmup: float = DEFAULT_WARMUP
    seed_messages: int = DEFAULT_SEED_MESSAGES
    backends: tuple[str, ...] = BACKENDS
    pg_url: str = DEFAULT_PG_URL


@contextlib.contextmanager
def targets(options: Options, workdir: Path) -> Iterator[dict[str, Target | str]]:
    """Each backend's prepared target, or the reason it is not measured."""
    prepared: dict[str, Target | str] = {}
    try:
        if SQLITE in options.backends:
            sqlite_target = SqliteTarget(workdir / "sqlite")
            log(f"SQLite: seeding {options.seed_messages} messages")
            sqlite_target.prepare(options.seed_messages)
            prepared[SQLITE] = sqlite_target
        if POSTGRESQL in options.backends:
            prepared[POSTGRESQL] = _prepare_postgres(options)
        yield prepared
    finally:
        for target in prepared.values():
            if not isinstance(target, str):
                target.close()


def _prepare_postgres(options: Options) -> Target | str:
    reason = server_reason(options.pg_url)
    if reason is not None:
        return reason
    target = PostgresTarget(options.pg_url)
    log(f"PostgreSQL: seeding {options.seed_messages} messages")
    try:
        target.prepare(options.seed_messages)
    except Exception as exc:
        target.close()
        return f"the Store API does not work on PostgreSQL here ({describe(exc)})"
    return target


def run(options: Options, workdir: Path) -> dict[str, Any]:
    """Measure every (database, writer count) cell; the results as a JSON-ready dict."""
    timing = Timing(options.warmup, options.seconds)
    results: dict[str, Any] = {
        "meta": _meta(options),
        "databases": {},
        "not_measured": {},
        "search_not_measured": {},
        "cells": [],
    }
    with targets(options, workdir) as prepared:
        runnable: dict[str, Target] = {}
        for backend, target in prepared.items():
            if isinstance(target, str):
                results["not_measured"][backend] = target
                log(f"{LABELS[backend]}: not measured: {target}")
                continue
            found = probe(target.template_url())
            if found["writes"] is not None:
                reason = f"the Store API's writes fail on it ({found['writes']})"
                results["not_measured"][backend] = reason
                log(f"{LABELS[backend]}: not measured: {reason}")
                continue
            if found["search"] is not None:
                reason = f"Store.search fails on it ({found['search']})"
                results["search_not_measured"][backend] = reason
                log(f"{LABELS[backend]}: searcher not run: {reason}")
            results["databases"][backend] = target.describe()
            runnable[backend] = target
        order = [b for b in BACKENDS if b in runnable]
        # The searcher takes a core of its own: where it cannot run on one database, it
        # runs on none, so that the writers of every database share the machine alike.
        search = not results["search_not_measured"]
        for backend in order:
            if not search and backend not in results["search_not_measured"]:
                results["search_not_measured"][backend] = (
                    "left out here too, so that every database's writers carry the same load"
                )
        for round_no, writers in enumerate(options.writers):
            # The database that goes first alternates, so drift of the machine spreads alike.
            for backend in order[round_no % 2 :] + order[: round_no % 2]:
                log(f"{LABELS[backend]}: {writers} writer(s), {options.seconds:g} s")
                cell = run_cell(runnable[backend], backend, writers, timing, search=search)
                results["cells"].append(cell)
                log(
                    f"  {cell['appends_per_s']:.0f} appends/s, p99 {cell['append_p99_ms']} ms, "
                    f"errors {cell['errors']}, lost {cell['verified']['lost']}"
                )
    results["meta"]["loadavg_after"] = _loadavg()
    results["crossover"] = crossover(results)
    results["ratios"] = ratios(results)
    results["search_target"] = search_target(results)
    return results


def _loadavg() -> list[float] | None:
    with contextlib.suppress(OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def _meta(options: Options) -> dict[str, Any]:
    from benchmarks.report import _commit

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "commit": _commit(),
        "loadavg_before": _loadavg(),
        "writers": list(options.writers),
        "seconds": options.seconds,
        "warmup": options.warmup,
        "seed_messages": options.seed_messages,
        "session_length": SESSION_LENGTH,
        "rewind_every": REWIND_EVERY,
        "rewind_last": REWIND_LAST,
        "search_queries": list(SEARCH_QUERIES),
    }


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------


def _cells(results: dict[str, Any], backend: str) -> dict[int, dict[str, Any]]:
    return {c["writers"]: c for c in results["cells"] if c["backend"] == backend}


def crossover(results: dict[str, Any]) -> str:
    """One sentence: from which writer count PostgreSQL's throughput passes SQLite's."""
    lite, pg = _cells(results, SQLITE), _cells(results, POSTGRESQL)
    if not lite or not pg:
        missing = results["not_measured"].get(POSTGRESQL) or results["not_measured"].get(SQLITE)
        return f"No comparison: PostgreSQL not measured ({missing})." if missing else ""
    counts = sorted(set(lite) & set(pg))
    ahead = [n for n in counts if pg[n]["appends_per_s"] > lite[n]["appends_per_s"]]

    def pair(n: int) -> str:
        return (
            f"{pg[n]['appends_per_s']:.0f} against {lite[n]['appends_per_s']:.0f} appends/s "
            f"at {n} writer{'s' if n > 1 else ''}"
        )

    if not ahead:
        best = max(counts, key=lambda n: pg[n]["appends_per_s"] / lite[n]["appends_per_s"])
        return (
            f"PostgreSQL does not overtake SQLite in append throughput at any writer count "
            f"measured; it comes closest with {pair(best)}."
        )
    first = ahead[0]
    stays = all(n in ahead for n in counts if n >= first)
    sentence = (
        f"PostgreSQL overtakes SQLite in append throughput from {first} writers: {pair(first)}"
    )
    if first == counts[0]:
        sentence = (
            "PostgreSQL is ahead of SQLite in append throughput at every writer count: "
            + pair(first)
        )
    if first != counts[-1]:
        sentence += f", and {pair(counts[-1])}"
    return sentence + ("." if stays else " (not at every count above it).")


def _searched(results: dict[str, Any]) -> bool | None:
    """Whether the cells ran a searcher (None when there are no cells)."""
    if not results["cells"]:
        return None
    return any(cell["search"] for cell in results["cells"])


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _errors(counts: dict[str, int]) -> str:
    return f"{counts[BUSY]} / {counts[OTHER]}"


def table(results: dict[str, Any]) -> list[str]:
    """The Markdown table: one row per writer count and database."""
    header = (
        "| writers | database | appends/s | append p50 (ms) | append p99 (ms) "
        "| errors busy / other | rewinds | searches/s | search p50 (ms) | search p99 (ms) "
        "| rows checked |"
    )
    lines = [header, "|" + "---|" * 11]
    backends = [b for b in BACKENDS if _cells(results, b)]
    writer_counts = sorted({c["writers"] for c in results["cells"]})
    for writers in writer_counts:
        for backend in backends:
            cell = _cells(results, backend).get(writers)
            if cell is None:
                continue
            search = cell["search"]
            checked = cell["verified"]
            ok = not (
                checked["lost"]
                or checked["unexpected"]
                or checked["counters_wrong"]
                or checked["rewind_wrong"]
            )
            lines.append(
                f"| {writers} | {LABELS[backend]} | {_num(cell['appends_per_s'], 0)} "
                f"| {_num(cell['append_p50_ms'], 2)} | {_num(cell['append_p99_ms'], 2)} "
                f"| {_errors(cell['errors'])} | {cell['rewinds']} "
                f"| {_num(search['per_s']) if search else 'not run'} "
                f"| {_num(search['p50_ms'], 2) if search else '–'} "
                f"| {_num(search['p99_ms'], 2) if search else '–'} "
                f"| {checked['expected']:,} {'none lost' if ok else 'MISMATCH'} |"
            )
    for backend, reason in results["not_measured"].items():
        lines.append(f"| all | {LABELS[backend]} | not measured: {reason} |" + " |" * 8)
    return lines


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """PostgreSQL's figures over SQLite's, per writer count measured on both."""
    lite, pg = _cells(results, SQLITE), _cells(results, POSTGRESQL)
    rows: list[dict[str, Any]] = []
    for writers in sorted(set(lite) & set(pg)):
        a, b = lite[writers], pg[writers]
        row: dict[str, Any] = {
            "writers": writers,
            "appends_per_s": _ratio(b["appends_per_s"], a["appends_per_s"]),
            "append_p50_ms": _ratio(b["append_p50_ms"], a["append_p50_ms"]),
            "append_p99_ms": _ratio(b["append_p99_ms"], a["append_p99_ms"]),
            "search_p50_ms": None,
            "search_p99_ms": None,
        }
        if a["search"] and b["search"]:
            row["search_p50_ms"] = _ratio(b["search"]["p50_ms"], a["search"]["p50_ms"])
            row["search_p99_ms"] = _ratio(b["search"]["p99_ms"], a["search"]["p99_ms"])
        rows.append(row)
    return rows


def search_target(results: dict[str, Any]) -> dict[str, Any] | None:
    """Issue 26's target: PostgreSQL's search p50 within SEARCH_P50_MAX_RATIO of SQLite's
    at TARGET_WRITERS writers, in the same run (None when that cell was not run)."""
    row = next((r for r in ratios(results) if r["writers"] == TARGET_WRITERS), None)
    if row is None:
        return None
    value = row["search_p50_ms"]
    return {
        "target": f"search p50 with {TARGET_WRITERS} writers: PostgreSQL / SQLite at most "
        f"{SEARCH_P50_MAX_RATIO:g}x",
        "value": value,
        "p99_ratio": row["search_p99_ms"],
        "passed": None if value is None else value <= SEARCH_P50_MAX_RATIO,
    }


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:,.2f}x"


def ratio_table(results: dict[str, Any]) -> list[str]:
    """PostgreSQL ÷ SQLite per writer count (latencies: above 1 is PostgreSQL slower)."""
    rows = ratios(results)
    if not rows:
        return []
    lines = [
        "| writers | appends/s | append p50 | append p99 | search p50 | search p99 |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['writers']} | {_x(row['appends_per_s'])} | {_x(row['append_p50_ms'])} "
            f"| {_x(row['append_p99_ms'])} | {_x(row['search_p50_ms'])} "
            f"| {_x(row['search_p99_ms'])} |"
        )
    target = search_target(results)
    if target is not None:
        verdict = (
            "not measured" if target["passed"] is None else ("PASS" if target["passed"] else "MISS")
        )
        lines += [
            "",
            f"Target, {target['target']}: {_x(target['value'])} (p99 "
            f"{_x(target['p99_ratio'])}): {verdict}.",
        ]
    return lines


def render_markdown(results: dict[str, Any], *, heading: str = "#") -> str:
    meta = results["meta"]
    databases = results["databases"]
    lines = [
        f"{heading} Many writers, side by side",
        "",
        f"Generated {meta['date']} on {meta['platform']}, {meta['cpus']} CPUs, Python "
        f"{meta['python']}; commit {meta['commit']}; load average before "
        f"{meta['loadavg_before']}, after {meta.get('loadavg_after')}.",
    ]
    if SQLITE in databases:
        lite = databases[SQLITE]
        lines.append(
            f"SQLite {lite['version']}: a file, journal_mode={lite['journal_mode']}, "
            f"synchronous={lite['synchronous']}, busy timeout {lite['busy_timeout_ms']} ms."
        )
    if POSTGRESQL in databases:
        pg = databases[POSTGRESQL]
        lines.append(
            f"PostgreSQL {pg['version']} on the same machine ({pg['server']}), "
            f"synchronous_commit={pg.get('synchronous_commit')}, "
            f"lock_timeout {pg['lock_timeout_ms']} ms."
        )
    lines += [
        "",
        f"Each cell: a copy of one store seeded with {meta['seed_messages']:,} generated "
        f"messages; N writer processes append one message per transaction "
        f"(`Store.append_message`) as fast as they can, a new session every "
        f"{meta['session_length']} messages, and rewind their last {meta['rewind_last']} "
        f"messages every {meta['rewind_every']} appends (`Store.set_message_flags`)"
        + (
            "; no searcher (see below). "
            if _searched(results) is False
            else f"; one more process runs `Store.search` over {len(meta['search_queries'])} "
            "queries in turn. "
        )
        + f"{meta['seconds']:g} s measured after {meta['warmup']:g} s of warm-up. Errors: "
        "busy/locked (a lock not had within the timeout) / other. Rows checked: every "
        "row a writer was given an id for is in its session afterwards, no other row is, "
        "counters and rewound flags agree.",
        "",
        *table(results),
    ]
    ratio_lines = ratio_table(results)
    if ratio_lines:
        lines += ["", "PostgreSQL ÷ SQLite, same run:", "", *ratio_lines]
    for backend, reason in results["search_not_measured"].items():
        lines += ["", f"Searcher on {LABELS[backend]}: not measured: {reason}."]
    samples = [
        f"- {LABELS[c['backend']]}, {c['writers']} writers: {s}"
        for c in results["cells"]
        for s in c["error_samples"] + (c["search"]["error_samples"] if c["search"] else [])
    ]
    if samples:
        lines += ["", "Errors seen:", "", *samples[:10]]
    if results.get("crossover"):
        lines += ["", results["crossover"]]
    if results.get("chart"):
        lines += ["", f"![many writers]({results['chart']})"]
    elif results.get("chart_note"):
        lines += ["", results["chart_note"]]
    return "\n".join(lines) + "\n"


def render_chart(results: dict[str, Any], target: Path) -> bool:
    """Write the PNG chart; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = (
        ("appends/s (all writers)", lambda c: c["appends_per_s"], False),
        ("append p99 (ms, log)", lambda c: c["append_p99_ms"], True),
        (
            "searches/s (one searcher, log)",
            lambda c: c["search"]["per_s"] if c["search"] else None,
            True,
        ),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.6))
    for ax, (title, value, log_scale) in zip(axes, panels, strict=True):
        for backend, style in ((SQLITE, "-o"), (POSTGRESQL, "-s")):
            cells = _cells(results, backend)
            points = [(n, value(c)) for n, c in sorted(cells.items()) if value(c) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=LABELS[backend])
        if not ax.lines:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("writer processes")
        ax.set_xscale("log", base=2)
        ax.set_xticks(results["meta"]["writers"], [str(n) for n in results["meta"]["writers"]])
        if log_scale:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    searcher = "no searcher" if _searched(results) is False else "one searcher"
    fig.suptitle(
        f"Many writers, {searcher} ({results['meta']['cpus']} CPUs, "
        f"{results['meta']['seconds']:g} s per cell)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(target, dpi=80)
    plt.close(fig)
    return True


CHART = "many_writers.png"


def attach_chart(results: dict[str, Any], out: Path) -> None:
    """Draw ``out/many_writers.png`` and name it in ``results``, or say why there is none."""
    results.pop("chart", None)
    results.pop("chart_note", None)
    if render_chart(results, out / CHART):
        results["chart"] = CHART
    else:
        results["chart_note"] = (
            "No chart: matplotlib is not installed (`pip install -e '.[chart]'`)."
        )
        log(results["chart_note"])


def write(results: dict[str, Any], out: Path) -> Path:
    """Write many_writers.json, .md and .png (with matplotlib) under ``out``; print the table."""
    out.mkdir(parents=True, exist_ok=True)
    attach_chart(results, out)
    markdown = render_markdown(results)
    (out / "many_writers.md").write_text(markdown, encoding="utf-8")
    (out / "many_writers.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(markdown)
    return out / "many_writers.md"


def parse_writers(value: str) -> tuple[int, ...]:
    counts = sorted({int(part) for part in value.split(",") if part.strip()})
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError("writer counts must be whole numbers, 1 or more")
    return tuple(counts)


def parse_backends(value: str) -> tuple[str, ...]:
    names = tuple(part.strip().lower() for part in value.split(",") if part.strip())
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"databases are {', '.join(BACKENDS)}; got {value!r}")
    return tuple(b for b in BACKENDS if b in names)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.many_writers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="per cell")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP, help="per cell")
    parser.add_argument(
        "--writers", type=parse_writers, default=DEFAULT_WRITERS, help="default 1,2,4,8"
    )
    parser.add_argument("--seed-messages", type=int, default=DEFAULT_SEED_MESSAGES)
    parser.add_argument(
        "--databases", type=parse_backends, default=BACKENDS, help="default sqlite,postgresql"
    )
    parser.add_argument(
        "--pg", default=os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL, help="PostgreSQL server"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite the table and chart from the JSON"
    )
    args = parser.parse_args(argv)
    if args.render_only:
        write(json.loads((args.out / "many_writers.json").read_text("utf-8")), args.out)
        return 0
    if args.seconds <= 0 or args.warmup < 0 or args.seed_messages < 1:
        parser.error("--seconds must be above 0, --warmup 0 or more, --seed-messages 1 or more")
    options = Options(
        writers=args.writers,
        seconds=args.seconds,
        warmup=args.warmup,
        seed_messages=args.seed_messages,
        backends=args.databases,
        pg_url=args.pg,
    )
    workdir = Path(tempfile.mkdtemp(prefix="hermes-many-writers-"))
    workloads.isolate_environment(workdir / "hermes-home")
    try:
        results = run(options, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    write(results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

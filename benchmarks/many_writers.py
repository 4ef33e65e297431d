"""Many writers side by side: N processes append, one searches, on SQLite and PostgreSQL.

    python -m benchmarks.many_writers --seconds 10 --writers 1,2,4,8 --out DIR
    python -m benchmarks.many_writers --seconds 10 --writers 1,8 --rate 20 --out DIR

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
  not what one agent asks of it. With ``--rate R`` it appends R messages a second instead
  (an open loop: its k-th append is due k/R s after the start, whatever the earlier ones
  took; behind schedule it makes at most :data:`CATCH_UP` + 1 back to back and drops the
  older slots, counted as missed). A closed loop loads each database with what it lets
  through (PostgreSQL's writers run in parallel and fill every core, SQLite's wait for
  its write lock), so its search figures are under different loads; paced, every
  database is asked for the same appends, and the report states per cell the appends
  asked, the appends made, whether the writers kept up (at least :data:`KEPT_UP` of the
  appends asked) and how far behind schedule they fell;
- the searcher runs :data:`SEARCH_QUERIES` in turn through ``Store.search``, as fast as it
  can (paced or not).

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

The processes' loops are in :mod:`benchmarks.many_writers_procs`, the table, ratios and
chart in :mod:`benchmarks.many_writers_render`.
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
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from sqlalchemy import Table, create_engine, select, text
from sqlalchemy.engine import URL, make_url

from benchmarks import layouts, workloads
from benchmarks.many_writers_procs import (
    CATCH_UP,
    KEPT_UP,
    REWIND_EVERY,
    REWIND_LAST,
    SESSION_LENGTH,
    Timing,
    describe,
    log,
    open_store,
    searcher_main,
    summarize,
    writer_main,
)
from benchmarks.many_writers_render import (
    BACKENDS,
    LABELS,
    POSTGRESQL,
    SQLITE,
    crossover,
    ratios,
    search_target,
    write,
)
from hermes_store import migrate
from hermes_store.demo import corpus
from hermes_store.engine import BUSY_TIMEOUT_MS, create_store_engine, to_url
from hermes_store.models import AgentSession, Message
from hermes_store.store import NewMessage

DEFAULT_WRITERS = (1, 2, 4, 8)
DEFAULT_SECONDS = 10.0
DEFAULT_WARMUP = 2.0
DEFAULT_SEED_MESSAGES = 5_000
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
PG_URL_ENV = "HERMES_BENCH_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SEED = 13

#: Messages per writer, appended in turn (generated once, each writer its own slice).
POOL = 300
#: The searcher's queries, in turn: words, a phrase, a prefix, OR, and CJK.
SEARCH_QUERIES = ("error", '"import os"', "pyth*", "error OR exception", "数据库")

#: How long the parent waits for every process to reach the barrier (imports, connects).
START_TIMEOUT_S = 180.0

_sessions = cast(Table, AgentSession.__table__)
_messages = cast(Table, Message.__table__)


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
    rate: float | None = None,
) -> list[dict[str, Any]]:
    """Start the writers (and the searcher), run the window, return every process's report.

    ``rate``: each writer's appends per second (an open loop), or None: as fast as it can.
    """
    ctx = multiprocessing.get_context("spawn")
    parties = writers + (1 if search else 0)
    barrier = ctx.Barrier(parties + 1)
    queue = ctx.Queue()
    processes = [
        ctx.Process(
            target=writer_main,
            args=(url, index, pool, timing, barrier, queue, rate),
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


def run_cell(
    target: Target,
    backend: str,
    writers: int,
    timing: Timing,
    *,
    search: bool = True,
    rate: float | None = None,
) -> dict[str, Any]:
    """One database and one writer count, on a fresh copy of the seeded store, verified;
    each writer paced to ``rate`` appends a second, or as fast as it can (None)."""
    name = f"w{writers}"
    url = target.fresh(name)
    try:
        reports = run_processes(url, writers, timing, search=search, rate=rate)
        cell = summarize(backend, writers, timing, reports, rate)
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
    #: Appends per second per writer (an open loop); None: as fast as it can.
    rate: float | None = None


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
                cell = run_cell(
                    runnable[backend], backend, writers, timing, search=search, rate=options.rate
                )
                results["cells"].append(cell)
                asked = f" of {cell['pace']['asked_per_s']:.0f} asked" if cell["pace"] else ""
                log(
                    f"  {cell['appends_per_s']:.0f} appends/s{asked}, "
                    f"p99 {cell['append_p99_ms']} ms, "
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
        "rate": options.rate,
        "kept_up_share": KEPT_UP,
        "catch_up": CATCH_UP,
    }


# --------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------


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
        "--rate",
        type=float,
        default=None,
        metavar="R",
        help="appends per second per writer, paced (default: as fast as it can)",
    )
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
    if args.rate is not None and not args.rate > 0:
        parser.error("--rate must be above 0 (appends per second per writer)")
    options = Options(
        writers=args.writers,
        seconds=args.seconds,
        warmup=args.warmup,
        seed_messages=args.seed_messages,
        backends=args.databases,
        pg_url=args.pg,
        rate=args.rate,
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

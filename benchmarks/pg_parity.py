"""PostgreSQL against SQLite on one corpus: search by query class, appends, bytes (issue 26).

    python -m benchmarks.pg_parity --sizes 50000,200000 --rounds 7 --out DIR

For each corpus size the run builds (or reuses, from ``--workdir``) the converted head
SQLite store of the corpus (``layouts.EXTERNAL``, as every other benchmark), then copies it
with the copy machinery (``hermes_store.copy.copy_store``) into PostgreSQL databases it
creates and drops on the server of ``--pg``:

- ``pg-head``: the copy at this package's head revision (what ``hermes-store copy`` makes);
- ``pg-today``: the copy at ``--today`` (default ``merge_30_fts1``, the search layout
  PostgreSQL had before the stored-words revision): the source is a copy of the SQLite
  store stamped at that revision (``migrate.stamp``; on SQLite the later search revisions
  change nothing) and the copy runs, in a process of its own, as a hermes-store whose
  head is that revision, so the target is upgraded to it and no further. When ``--today``
  is the head itself, ``pg-today`` is a template clone of ``pg-head`` (an A/A comparison:
  its ratio shows the noise of the run).

Both copies run at the same time, each in its own process. Then, on the three databases:

1. the bytes of every table and index as each database counts them (SQLite: ``dbstat``
   pages of each object, ``hermes_store.sqlite.storage``; PostgreSQL: ``pg_table_size`` of
   each table, heap and TOAST, and ``pg_relation_size`` of each index,
   ``hermes_store.postgresql.storage``);
2. every query of ``workloads.QUERY_CLASSES`` through ``Store.search``: one untimed
   warm-up round, then ``--rounds`` rounds; in each, every query runs on the databases
   searched (``--search-on``: SQLite and pg-head by default, pg-today when asked: its
   search time grows with the store) back to back, the order rotating. A class's time in
   a round is the sum of its queries'; the figure is the median over the rounds, and each
   PostgreSQL database's is stated as a ratio to SQLite's (target: at most
   :data:`SEARCH_MAX_RATIO`); queries that match nothing (:data:`FIXED_COST_QUERIES`) are
   measured the same way and shown as a row of their own, with no target: what a search
   costs before it reads a row;
3. appends: ``--append-rounds`` rounds of ``--appends`` generated messages to a new session
   of each database, ``Store.append_messages`` in batches of ``--batch``, the batches
   interleaved across the databases; the figure is the median of the rounds' totals, and
   pg-head's against pg-today's (target: at most :data:`APPEND_MAX_RATIO`). SQLite's is
   shown for information.

Writes ``pg_parity.json`` and ``pg_parity.md`` under ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from benchmarks import layouts, workloads
from hermes_store import migrate
from hermes_store.engine import create_store_engine, to_url
from hermes_store.postgresql.migration import facts
from hermes_store.postgresql.storage import server_storage_report
from hermes_store.sqlite.storage import storage_report
from hermes_store.store import Store

SQLITE = "sqlite"
PG_HEAD = "pg-head"
PG_TODAY = "pg-today"
DATABASES = (SQLITE, PG_HEAD, PG_TODAY)
LABELS = {SQLITE: "SQLite", PG_HEAD: "PostgreSQL head", PG_TODAY: "PostgreSQL today"}

DEFAULT_SIZES = (50_000, 200_000)
DEFAULT_SEARCH_ON = (SQLITE, PG_HEAD)
DEFAULT_ROUNDS = 7
DEFAULT_APPENDS = 5_000
DEFAULT_BATCH = 50
DEFAULT_APPEND_ROUNDS = 3
#: Today's PostgreSQL layout: the head of the schema before the stored-words revision.
DEFAULT_TODAY = "merge_30_fts1"
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
PG_URL_ENV = "HERMES_BENCH_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

# The targets.
SEARCH_MAX_RATIO = 2.0  # every query class, PostgreSQL head / SQLite, median of the rounds
#: Queries that match nothing on either database (a word, a prefix and a CJK one): what a
#: search costs with no row to read, its statements' round trips and the pipeline's own
#: work. Measured with the classes and shown in their table, with no target: the floor
#: under every class's time.
FIXED_COST_CLASS = "no match (fixed cost)"
FIXED_COST_QUERIES = ("zqxjvbwordless", "zqxjvb* OR wordlessq", "鑫鑫燚燚")
APPEND_MAX_RATIO = 1.15  # appends in batches, PostgreSQL head / PostgreSQL today
MIN_ROUNDS = 5


def log(message: str) -> None:
    """Progress on stderr (stdout carries the table)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rotated(items: Sequence[str], shift: int) -> list[str]:
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# --------------------------------------------------------------------------------------
# The stores
# --------------------------------------------------------------------------------------


#: What the stores a run builds depend on: a cached store is reused only while these
#: files are as they were when it was built (their digest is in its name).
CACHE_INPUTS = ("alembic/versions/*.py", "hermes_store/demo/*.py", "hermes_store/copy/*.py")


def code_digest(*extra: str) -> str:
    """Eight hex digits of the revisions, the corpus generator and the copy (and ``extra``)."""
    digest = hashlib.sha256()
    for pattern in CACHE_INPUTS:
        for path in sorted(workloads.PROJECT_ROOT.glob(pattern)):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    for item in extra:
        digest.update(item.encode())
    return digest.hexdigest()[:8]


def sqlite_store(workdir: Path, size: int, seed: int) -> tuple[Path, float, bool]:
    """The converted head store of the corpus: (path, seconds to build, reused).

    Kept in ``workdir`` under a name holding the size, the seed and :func:`code_digest`,
    with a ``.done`` file written once it is finished: a later run with the same
    ``--workdir`` reuses it (it is only ever read; the appends go to a copy).
    """
    head = migrate.head_revision()
    path = workdir / f"external-{size}-seed{seed}-{code_digest()}.db"
    done = path.with_name(path.name + ".done")
    if path.exists() and done.exists():
        return path, 0.0, True
    started = time.perf_counter()
    build = workdir / f"build-{size}"
    stores = layouts.StoreSet(build, size, seed)
    shutil.move(stores.base(layouts.EXTERNAL), path)
    shutil.rmtree(build, ignore_errors=True)
    done.write_text(json.dumps({"size": size, "seed": seed, "head": head}), "utf-8")
    return path, time.perf_counter() - started, False


def _copy_job(home: str, source: str, url: str, revision: str | None) -> float:
    """In a process of its own: copy ``source`` into ``url``; the seconds it took.

    With ``revision``, the copy runs as a hermes-store whose head is that revision (the
    source must be at it): the copy upgrades the target to the source's revision, so the
    target gets the schema and search layout of that revision and nothing later.
    """
    workloads.isolate_environment(Path(home))
    from hermes_store.copy import copy_store
    from hermes_store.copy import run as copy_run

    if revision is not None:
        copy_run.head_revision = lambda: revision  # type: ignore[attr-defined]
    started = time.perf_counter()
    copy_store(source, url, verify=False)
    return time.perf_counter() - started


#: The comment a finished cached copy carries (an interrupted one has none).
CACHE_COMMENT = "hermes-store pg_parity: complete"
#: The cached copies' names: ``hermes_parity_cache_<size>_s<seed>_<digest>_<head|today>``.
CACHE_PREFIX = "hermes_parity_cache"


class Server:
    """Databases of this run on a PostgreSQL server, created here and dropped at the end."""

    def __init__(self, server_url: str) -> None:
        self.server = make_url(to_url(server_url))
        self.prefix = f"hermes_parity_{os.getpid()}"
        self.admin = create_engine(
            self.server, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
        )
        self.created: list[str] = []

    def url(self, database: str) -> str:
        return self.server.set(database=database).render_as_string(hide_password=False)

    def _admin(self, sql: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(sql))

    def create(self, name: str, template: str | None = None) -> tuple[str, str]:
        """A new empty database (or a clone of ``template``): (name, URL)."""
        database = f"{self.prefix}_{name}"
        self._admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        clause = f' TEMPLATE "{template}"' if template else ""
        if template and self.version_num() >= 150000:
            # A file copy, not the whole template through the WAL (PostgreSQL 15's default).
            clause += " STRATEGY FILE_COPY"
        self._admin(f'CREATE DATABASE "{database}"{clause}')
        self.created.append(database)
        return database, self.url(database)

    def complete(self, database: str) -> bool:
        """Whether ``database`` exists and was marked complete (:meth:`mark_complete`)."""
        with self.admin.connect() as conn:
            found = conn.execute(
                text(
                    "SELECT shobj_description(oid, 'pg_database') FROM pg_database "
                    "WHERE datname = :name"
                ),
                {"name": database},
            ).scalar()
        return found == CACHE_COMMENT

    def create_cached(self, database: str) -> str:
        """A new empty database that outlives the run (a cached copy): its URL."""
        self._admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{database}"')
        return self.url(database)

    def mark_complete(self, database: str) -> None:
        self._admin(f"COMMENT ON DATABASE \"{database}\" IS '{CACHE_COMMENT}'")

    def version_num(self) -> int:
        with self.admin.connect() as conn:
            return int(conn.execute(text("SHOW server_version_num")).scalar() or 0)

    def version(self) -> str:
        with self.admin.connect() as conn:
            return str(conn.execute(text("SHOW server_version")).scalar())

    def drop_all(self) -> None:
        for database in reversed(self.created):
            with contextlib.suppress(Exception):
                self._admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        self.created.clear()

    def close(self) -> None:
        self.drop_all()
        self.admin.dispose()


def pg_facts(url: str) -> dict[str, Any]:
    """The revision, schema version and search layout marker of a PostgreSQL store."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            revisions, version, layout = facts(conn)
    finally:
        engine.dispose()
    return {"revision": list(revisions), "schema": version, "layout": layout}


@dataclass
class Built:
    """The three databases of one size and how they were made."""

    urls: dict[str, str]
    seconds: dict[str, float]
    facts: dict[str, dict[str, Any]]
    sqlite_reused: bool
    today_is_head: bool
    #: The PostgreSQL databases cloned from a cached copy made by an earlier run.
    pg_reused: list[str] = field(default_factory=list)


def build(
    server: Server,
    workdir: Path,
    size: int,
    seed: int,
    today: str,
    home: Path,
    *,
    cache_pg: bool = False,
) -> Built:
    """The SQLite store of ``size`` and its two PostgreSQL copies (built at the same time)."""
    path, sqlite_seconds, reused = sqlite_store(workdir, size, seed)
    log(f"{size}: SQLite head store {'reused' if reused else f'built in {sqlite_seconds:.1f} s'}")
    cache = f"{size}_s{seed}" if cache_pg else None
    built = copies(server, path, workdir, str(size), today, home, cache=cache)
    built.seconds[SQLITE] = round(sqlite_seconds, 1)
    built.sqlite_reused = reused
    return built


def copies(
    server: Server,
    path: Path,
    workdir: Path,
    label: str,
    today: str,
    home: Path,
    *,
    cache: str | None = None,
) -> Built:
    """Copy the SQLite head store at ``path`` into two new databases of ``server``: one at
    head, one at ``today`` (both copies at the same time, each in a process of its own).

    With ``cache`` (a key naming the corpus), the copies are made once into databases that
    outlive the run, ``{CACHE_PREFIX}_<cache>_<digest>_head`` and ``..._today``, reused by
    later runs while :func:`code_digest` is unchanged; each run measures template clones of
    them (``CREATE DATABASE ... TEMPLATE``), which it drops.
    """
    head = migrate.head_revision()
    today_is_head = today == head
    names = [PG_HEAD] if today_is_head else [PG_HEAD, PG_TODAY]
    if cache is None:
        targets = {name: server.create(f"{label}_{name[3:]}") for name in names}
    else:
        digest = code_digest(today)
        cached = {name: f"{CACHE_PREFIX}_{cache}_{digest}_{name[3:]}" for name in names}
        targets = {
            name: (database, server.create_cached(database))
            for name, database in cached.items()
            if not server.complete(database)
        }
    urls = {SQLITE: to_url(path)}
    seconds: dict[str, float] = {}
    scratch: list[Path] = []
    jobs: dict[str, tuple[str, str, str | None]] = {}
    for name, (_database, url) in targets.items():
        if name == PG_HEAD:
            jobs[name] = (str(path), url, None)
        else:
            source = layouts.copy_store(path, workdir / f"today-{label}.db")
            scratch.append(source)
            migrate.stamp(str(source), today)  # the later search revisions change nothing here
            jobs[name] = (str(source), url, today)
    if jobs:
        both = ", at the same time" if len(jobs) > 1 else ""
        log(f"{label}: copying into PostgreSQL ({', '.join(jobs)}{both})")
    context = multiprocessing.get_context("spawn")
    try:
        if jobs:
            with concurrent.futures.ProcessPoolExecutor(len(jobs), mp_context=context) as pool:
                futures = {n: pool.submit(_copy_job, str(home), *job) for n, job in jobs.items()}
                for name, future in futures.items():
                    seconds[name] = round(future.result(), 1)
    finally:
        for source in scratch:
            source.unlink(missing_ok=True)
    reused: list[str] = []
    if cache is not None:
        for name, database in cached.items():
            if name in jobs:
                server.mark_complete(database)
            else:
                seconds[name] = 0.0
                reused.append(name)
                log(f"{label}: {name} reused from {database}")
            started = time.perf_counter()
            _clone, urls[name] = server.create(f"{label}_{name[3:]}", template=database)
            seconds[f"{name} clone"] = round(time.perf_counter() - started, 1)
    else:
        urls.update({name: url for name, (_database, url) in targets.items()})
    if today_is_head:
        started = time.perf_counter()
        head_db = make_url(urls[PG_HEAD]).database
        _today_db, urls[PG_TODAY] = server.create(f"{label}_today", template=head_db)
        seconds[PG_TODAY] = round(time.perf_counter() - started, 1)
    found = {name: pg_facts(urls[name]) for name in (PG_HEAD, PG_TODAY)}
    for name, expected in ((PG_HEAD, head), (PG_TODAY, today)):
        if found[name]["revision"] != [expected]:
            raise RuntimeError(f"{name}: at {found[name]['revision']}, expected {expected}")
    log(
        f"{label}: copies ready ({seconds[PG_HEAD]} s head, layout {found[PG_HEAD]['layout']}; "
        f"{seconds[PG_TODAY]} s today, layout {found[PG_TODAY]['layout']})"
    )
    if today_is_head and PG_HEAD in reused:
        reused.append(PG_TODAY)
    return Built(urls, seconds, found, False, today_is_head, reused)


# --------------------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------------------


def measure_bytes(urls: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Bytes per table and index, per group and in all, as each database counts them."""
    found: dict[str, dict[str, Any]] = {}
    for name, url in urls.items():
        engine = create_store_engine(url, create=False)
        try:
            with engine.connect() as conn:
                if name == SQLITE:
                    lite = storage_report(conn)
                    conn.rollback()
                    found[name] = {
                        "objects": dict(lite.objects),
                        "kinds": {},
                        "groups": dict(lite.groups),
                        "total": lite.file_bytes - lite.free_bytes,
                        "layout": lite.layout,
                        "counted": "pages in use (dbstat), file minus free pages",
                    }
                else:
                    pg = server_storage_report(conn)
                    found[name] = {
                        "objects": dict(pg.objects),
                        "kinds": dict(pg.kinds),
                        "groups": dict(pg.groups),
                        "total": pg.total_bytes,
                        "layout": pg.layout,
                        "tsvector_columns": list(pg.tsvector_columns),
                        "stored_words": dict(pg.stored_words),
                        "database_bytes": pg.database_bytes,
                        "counted": "pg_table_size per table, pg_relation_size per index",
                    }
        finally:
            engine.dispose()
    return found


def _open(urls: dict[str, str]) -> dict[str, Store]:
    return {name: Store.open(url) for name, url in urls.items()}


def measure_search(urls: dict[str, str], rounds: int) -> dict[str, Any]:
    """Every query class through ``Store.search``, the databases interleaved query by query,
    and the queries that match nothing (FIXED_COST_QUERIES)."""
    classes = {**workloads.QUERY_CLASSES, FIXED_COST_CLASS: FIXED_COST_QUERIES}
    queries = [(c, q) for c, qs in classes.items() for q in qs]
    stores = _open(urls)
    failed: dict[str, str] = {}
    hits: dict[str, dict[str, int]] = {name: {} for name in urls}
    per_round: dict[str, dict[str, list[float]]] = {name: {} for name in urls}
    per_query: dict[str, dict[str, list[float]]] = {name: {} for name in urls}
    try:
        for name, store in stores.items():  # warm-up: caches, statements, and does it work
            try:
                for _query_class, query in queries:
                    hits[name][query] = len(store.search(query))
            except Exception as exc:
                failed[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
                log(f"search on {name} not measured: {failed[name]}")
        measured = [name for name in urls if name not in failed]
        for round_no in range(rounds):
            sums = {name: dict.fromkeys(classes, 0.0) for name in measured}
            with workloads.Quiet():
                for index, (query_class, query) in enumerate(queries):
                    for name in rotated(measured, round_no + index):
                        started = time.perf_counter()
                        stores[name].search(query)
                        seconds = time.perf_counter() - started
                        sums[name][query_class] += seconds
                        per_query[name].setdefault(query, []).append(seconds * 1000)
            for name in measured:
                for query_class, seconds in sums[name].items():
                    per_round[name].setdefault(query_class, []).append(seconds * 1000)
    finally:
        for store in stores.values():
            store.close()
    medians = {
        name: {c: median(ms) for c, ms in classes.items()} for name, classes in per_round.items()
    }
    return {
        "rounds": rounds,
        "queries": {c: list(qs) for c, qs in classes.items()},
        "median_ms": medians,
        "rounds_ms": per_round,
        "per_query_median_ms": {
            name: {q: median(ms) for q, ms in by.items()} for name, by in per_query.items()
        },
        "hits": hits,
        "failed": failed,
    }


def measure_appends(
    urls: dict[str, str], workdir: Path, *, messages: int, batch: int, rounds: int, seed: int
) -> dict[str, Any]:
    """``rounds`` rounds of ``messages`` appended in batches of ``batch`` to each database.

    SQLite's appends go to a copy of its store (the base store is reused by later runs).
    """
    names = list(urls)
    sqlite_copy = layouts.copy_store(Path(make_url(urls[SQLITE]).database or ""), workdir / "w.db")
    targets = {**urls, SQLITE: to_url(sqlite_copy)}
    stores = _open(targets)
    failed: dict[str, str] = {}
    totals: dict[str, list[float]] = {name: [] for name in names}
    batch_ms: dict[str, list[float]] = {name: [] for name in names}
    try:
        plan = workloads.append_plan(messages, rounds + 1, seed)  # the first is a warm-up
        for round_no, session in enumerate(plan):
            for name in names:
                if name not in failed:
                    try:
                        workloads.prepare_session(stores[name], session)
                    except Exception as exc:
                        failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            live = [name for name in names if name not in failed]
            chunks = [session.messages[i : i + batch] for i in range(0, messages, batch)]
            spent = dict.fromkeys(live, 0.0)
            written = dict.fromkeys(live, 0)
            with workloads.Quiet():
                for index, chunk in enumerate(chunks):
                    for name in rotated(live, round_no + index):
                        started = time.perf_counter()
                        ids = stores[name].append_messages(session.session_id, chunk)
                        seconds = time.perf_counter() - started
                        spent[name] += seconds
                        written[name] += len(ids)
                        if round_no:
                            batch_ms[name].append(seconds * 1000)
            for name in live:
                record = stores[name].get_session(session.session_id)
                counted = None if record is None else record.message_count
                if written[name] != messages or counted != messages:
                    raise RuntimeError(
                        f"{name}: {written[name]} of {messages} messages appended, "
                        f"{counted} counted by the session"
                    )
                if round_no:
                    totals[name].append(spent[name])
    finally:
        for store in stores.values():
            store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(sqlite_copy) + suffix).unlink(missing_ok=True)
    return {
        "messages": messages,
        "batch": batch,
        "rounds": rounds,
        "seconds": totals,
        "median_s": {name: median(s) for name, s in totals.items() if s},
        "batch_p50_ms": {n: median(ms) for n, ms in batch_ms.items() if ms},
        "batch_p99_ms": {n: _p99(ms) for n, ms in batch_ms.items() if ms},
        "failed": failed,
    }


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return float(ordered[max(0, min(len(ordered) - 1, -(-99 * len(ordered) // 100) - 1))])


# --------------------------------------------------------------------------------------
# Targets and rendering
# --------------------------------------------------------------------------------------


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """PASS / MISS of each target at each size (None when it was not measured)."""
    targets: list[dict[str, Any]] = []
    for size, data in results["sizes"].items():
        medians = data["search"]["median_ms"]
        for query_class in workloads.QUERY_CLASSES:
            value = ratio(
                medians.get(PG_HEAD, {}).get(query_class), medians.get(SQLITE, {}).get(query_class)
            )
            targets.append(
                {
                    "size": int(size),
                    "target": f"search {query_class}: PostgreSQL head / SQLite at most "
                    f"{SEARCH_MAX_RATIO:g}x",
                    "value": value,
                    "passed": None if value is None else value <= SEARCH_MAX_RATIO,
                }
            )
        appends = data["appends"]["median_s"]
        value = ratio(appends.get(PG_HEAD), appends.get(PG_TODAY))
        targets.append(
            {
                "size": int(size),
                "target": f"appends ({data['appends']['messages']:,} in batches of "
                f"{data['appends']['batch']}): PostgreSQL head / today at most "
                f"{APPEND_MAX_RATIO:g}x",
                "value": value,
                "passed": None if value is None else value <= APPEND_MAX_RATIO,
            }
        )
    return targets


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def _verdict(passed: bool | None) -> str:
    return "not measured" if passed is None else ("PASS" if passed else "MISS")


#: Objects below this share of the largest database's total are summed into one row of the
#: Markdown table (the JSON has every one).
BYTES_SHOWN_SHARE = 0.005


def _bytes_table(found: dict[str, dict[str, Any]]) -> list[str]:
    names = [n for n in DATABASES if n in found]
    lines = [
        "| table or index | " + " | ".join(LABELS[n] for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    floor = BYTES_SHOWN_SHARE * max(found[n]["total"] for n in names)
    objects = sorted(
        {o for n in names for o in found[n]["objects"]},
        key=lambda o: (-max(found[n]["objects"].get(o, 0) for n in names), o),
    )
    shown = [o for o in objects if max(found[n]["objects"].get(o, 0) for n in names) >= floor]
    for obj in shown:
        kind = next((found[n]["kinds"][obj] for n in names if obj in found[n]["kinds"]), "")
        label = f"{obj} ({kind})" if kind.startswith("index") else obj
        cells = [
            f"{found[n]['objects'][obj]:,}" if obj in found[n]["objects"] else "–" for n in names
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    rest = [o for o in objects if o not in shown]
    if rest:
        cells = [f"{sum(found[n]['objects'].get(o, 0) for o in rest):,}" for n in names]
        lines.append(
            f"| {len(rest)} smaller tables and indexes (each in the JSON) | "
            + " | ".join(cells)
            + " |"
        )
    for group in sorted({g for n in names for g in found[n]["groups"]}):
        cells = [f"{found[n]['groups'].get(group, 0):,}" for n in names]
        lines.append(f"| group: {group} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{found[n]['total']:,}**" for n in names) + " |")
    for name in names:
        columns = found[name].get("tsvector_columns")
        if columns:
            lines += ["", f"{LABELS[name]}: tsvector columns {', '.join(columns)}."]
        for column, size in (found[name].get("stored_words") or {}).items():
            lines += [
                "",
                f"{LABELS[name]}: stored words {column}: {size:,} bytes (lexemes and"
                " positions, within messages' bytes, filed with the search indexes).",
            ]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# PostgreSQL against SQLite (issue 26)",
        "",
        f"Generated {meta['date']} on {meta['platform']}, {meta['cpus']} CPUs, Python "
        f"{meta['python']}, SQLite {meta['sqlite']}, PostgreSQL {meta['postgresql']}; commit "
        f"{meta['commit']}; head {meta['head']}, today {meta['today']}; load average before "
        f"{meta['loadavg_before']}, after {meta.get('loadavg_after')}. "
        f"`python -m benchmarks.pg_parity {meta['argv']}`.",
        "",
        "## Targets",
        "",
        "| size | target | measured | result |",
        "|---|---|---|---|",
    ]
    for target in results["targets"]:
        lines.append(
            f"| {target['size']:,} | {target['target']} | {_x(target['value'])} "
            f"| {_verdict(target['passed'])} |"
        )
    for size, data in results["sizes"].items():
        search = data["search"]
        medians = search["median_ms"]
        lines += [
            "",
            f"## {int(size):,} messages",
            "",
            "Databases: "
            + "; ".join(
                f"{LABELS[n]} at {data['facts'][n]['revision']}, layout "
                f"{data['facts'][n]['layout']!r}, "
                + (
                    "a clone of a cached copy"
                    if n in data.get("pg_reused", ())
                    else f"copied in {data['build_seconds'][n]} s"
                )
                for n in (PG_HEAD, PG_TODAY)
            )
            + (" (a template clone of head: today is head)" if data["today_is_head"] else "")
            + f". SQLite {'reused' if data['sqlite_reused'] else 'built'} "
            f"({data['build_seconds'][SQLITE]} s).",
            "",
            f"### Search through `Store.search`, median of {search['rounds']} rounds (ms per "
            "class: the sum of its queries)",
            "",
            "| query class | queries | SQLite | PG head | PG today | head ÷ SQLite "
            "| today ÷ SQLite | head ÷ today |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for query_class, queries in search["queries"].items():
            lite, head, today = (medians.get(n, {}).get(query_class) for n in DATABASES)
            lines.append(
                f"| {query_class} | {len(queries)} | {_ms(lite)} | {_ms(head)} | {_ms(today)} "
                f"| {_x(ratio(head, lite))} | {_x(ratio(today, lite))} "
                f"| {_x(ratio(head, today))} |"
            )
        for name, reason in search["failed"].items():
            lines += ["", f"Search on {LABELS[name]}: not measured: {reason}."]
        others = [o for o in (PG_HEAD, PG_TODAY) if o in search["hits"]]
        differing = [
            q
            for q, n in search["hits"].get(SQLITE, {}).items()
            if any(search["hits"][o].get(q, n) != n for o in others)
        ]
        if differing:
            lines += ["", f"Hit counts differing from SQLite's: {', '.join(differing)}."]
        appends = data["appends"]
        med = appends["median_s"]
        lines += [
            "",
            f"### Appends: {appends['messages']:,} messages in batches of {appends['batch']} "
            f"(`Store.append_messages`), median of {appends['rounds']} rounds",
            "",
            "| database | seconds | messages/s | batch p50 (ms) | batch p99 (ms) | ÷ PG today |",
            "|---|---|---|---|---|---|",
        ]
        for name in DATABASES:
            if name not in med:
                continue
            lines.append(
                f"| {LABELS[name]} | {med[name]:.2f} | {appends['messages'] / med[name]:,.0f} "
                f"| {appends['batch_p50_ms'][name]:.2f} | {appends['batch_p99_ms'][name]:.2f} "
                f"| {_x(ratio(med[name], med.get(PG_TODAY)))} |"
            )
        for name, reason in appends["failed"].items():
            lines += ["", f"Appends on {LABELS[name]}: not measured: {reason}."]
        lines += [
            "",
            "### Bytes of each table and index",
            "",
            "SQLite: pages in use of each table and index (`dbstat`, FTS5 shadow tables by "
            "name); PostgreSQL: `pg_table_size` of each table (heap, TOAST, free-space and "
            "visibility maps), `pg_relation_size` of each index.",
            "",
            *_bytes_table(data["bytes"]),
        ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


@dataclass
class Options:
    sizes: list[int]
    rounds: int = DEFAULT_ROUNDS
    appends: int = DEFAULT_APPENDS
    batch: int = DEFAULT_BATCH
    append_rounds: int = DEFAULT_APPEND_ROUNDS
    today: str = DEFAULT_TODAY
    pg_url: str = DEFAULT_PG_URL
    seed: int = 0
    #: The databases searched: SQLite and pg-head (the targets) by default. pg-today's
    #: expression layout answers in time that grows with the store (about 2.5 s per round
    #: and 1,000 messages on this project's machine: 8 minutes a round at 200k), so
    #: searching it is asked for (``--search-on``).
    search_on: tuple[str, ...] = DEFAULT_SEARCH_ON
    #: Keep the PostgreSQL copies between runs (see :func:`copies`).
    cache_pg: bool = False


def _loadavg() -> list[float] | None:
    with contextlib.suppress(OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


@contextlib.contextmanager
def _server(url: str) -> Iterator[Server]:
    server = Server(url)
    try:
        yield server
    finally:
        server.close()


def run(options: Options, workdir: Path, argv: str = "") -> dict[str, Any]:
    """Measure every size; the results as a JSON-ready dict (with the targets checked)."""
    from benchmarks.report import _commit

    home = workdir / "hermes-home"
    workloads.isolate_environment(home)
    results: dict[str, Any] = {"meta": {}, "sizes": {}}
    with _server(options.pg_url) as server:
        results["meta"] = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "postgresql": server.version(),
            "cpus": os.cpu_count(),
            "commit": _commit(),
            "head": migrate.head_revision(),
            "today": options.today,
            "argv": argv,
            "loadavg_before": _loadavg(),
            "seed": options.seed,
        }
        started = time.perf_counter()
        for size in options.sizes:
            built = build(
                server,
                workdir,
                size,
                options.seed,
                options.today,
                home,
                cache_pg=options.cache_pg,
            )
            try:
                log(f"{size}: bytes of every table and index")
                found = measure_bytes(built.urls)
                searched = {n: u for n, u in built.urls.items() if n in options.search_on}
                log(f"{size}: search, {options.rounds} rounds on {', '.join(searched)}")
                search = measure_search(searched, options.rounds)
                log(
                    f"{size}: appends, {options.append_rounds} rounds of {options.appends} "
                    f"in batches of {options.batch}"
                )
                appends = measure_appends(
                    built.urls,
                    workdir,
                    messages=options.appends,
                    batch=options.batch,
                    rounds=options.append_rounds,
                    seed=options.seed,
                )
            finally:
                server.drop_all()
            results["sizes"][str(size)] = {
                "build_seconds": built.seconds,
                "sqlite_reused": built.sqlite_reused,
                "today_is_head": built.today_is_head,
                "pg_reused": built.pg_reused,
                "facts": built.facts,
                "bytes": found,
                "search": search,
                "appends": appends,
            }
        results["meta"]["seconds"] = round(time.perf_counter() - started, 1)
        results["meta"]["loadavg_after"] = _loadavg()
    results["targets"] = check_targets(results)
    return results


def prebuild(options: Options, workdir: Path) -> int:
    """Build every size's SQLite store and cached PostgreSQL copies; measure nothing."""
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "hermes-home"
    workloads.isolate_environment(home)
    with _server(options.pg_url) as server:
        for size in options.sizes:
            started = time.perf_counter()
            built = build(server, workdir, size, options.seed, options.today, home, cache_pg=True)
            server.drop_all()  # the clones; the cached copies stay
            log(f"{size}: ready in {time.perf_counter() - started:.1f} s ({built.seconds})")
    return 0


def write(results: dict[str, Any], out: Path) -> Path:
    """Write pg_parity.json and pg_parity.md under ``out``; print the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(results)
    (out / "pg_parity.md").write_text(markdown, encoding="utf-8")
    (out / "pg_parity.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(markdown)
    return out / "pg_parity.md"


def parse_sizes(value: str) -> list[int]:
    sizes = sorted({int(p.replace("_", "").strip()) for p in value.split(",") if p.strip()})
    if not sizes or sizes[0] < 200:
        raise argparse.ArgumentTypeError("sizes must be at least 200 messages each")
    return sizes


def parse_databases(value: str) -> tuple[str, ...]:
    names = {part.strip().lower() for part in value.split(",") if part.strip()}
    unknown = sorted(names - set(DATABASES))
    if unknown:
        raise argparse.ArgumentTypeError(f"databases are {', '.join(DATABASES)}; got {value!r}")
    return tuple(n for n in DATABASES if n in names or n == SQLITE)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pg_parity", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--sizes", type=parse_sizes, default=list(DEFAULT_SIZES), help="default 50000,200000"
    )
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="search rounds")
    parser.add_argument("--appends", type=int, default=DEFAULT_APPENDS, help="per round")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="messages per batch")
    parser.add_argument("--append-rounds", type=int, default=DEFAULT_APPEND_ROUNDS)
    parser.add_argument(
        "--today",
        default=DEFAULT_TODAY,
        help=f"revision of today's PostgreSQL layout (default {DEFAULT_TODAY})",
    )
    parser.add_argument(
        "--pg", default=os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL, help="PostgreSQL server"
    )
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument(
        "--search-on",
        type=parse_databases,
        default=DEFAULT_SEARCH_ON,
        help=f"databases searched (default {','.join(DEFAULT_SEARCH_ON)}; SQLite is always "
        f"one; add {PG_TODAY} for today's layout: its search takes about 2.5 s per round and "
        "1,000 messages)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the SQLite stores are kept and reused across runs (default: a temp dir, "
        "removed afterwards)",
    )
    parser.add_argument(
        "--cache-pg",
        action="store_true",
        help=f"keep the PostgreSQL copies as databases {CACHE_PREFIX}_* on the server and "
        "reuse them in later runs (each run measures clones of them); drop them with "
        "DROP DATABASE when done",
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build the SQLite stores and the cached PostgreSQL copies of every size, measure "
        "nothing (needs --workdir and --cache-pg): a later run with the same options reuses "
        "them",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite the Markdown from --out's JSON"
    )
    args = parser.parse_args(argv)
    if args.render_only:
        results = json.loads((args.out / "pg_parity.json").read_text("utf-8"))
        results["targets"] = check_targets(results)
        write(results, args.out)
        return 0
    if args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds must be at least {MIN_ROUNDS} (the targets are medians of 5+)")
    if args.appends < args.batch or args.batch < 1 or args.append_rounds < 1:
        parser.error("--appends must be at least --batch, --batch and --append-rounds 1 or more")
    try:
        migrate.check_revision(args.today)
    except Exception as exc:
        parser.error(f"--today: {exc}")
    options = Options(
        sizes=args.sizes,
        rounds=args.rounds,
        appends=args.appends,
        batch=args.batch,
        append_rounds=args.append_rounds,
        today=args.today,
        pg_url=args.pg,
        seed=args.seed,
        search_on=args.search_on,
        cache_pg=args.cache_pg,
    )
    if args.build_only:
        if args.workdir is None or not args.cache_pg:
            parser.error("--build-only needs --workdir and --cache-pg (where the stores stay)")
        return prebuild(options, args.workdir)
    keep = args.workdir is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hermes-pg-parity-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        results = run(options, workdir, " ".join(sys.argv[1:] if argv is None else argv))
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    write(results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Many writers side by side (``benchmarks/many_writers.py``) under pytest-benchmark.

Timed, one round per cell: each database at each writer count of ``$BENCH_MW_WRITERS``
(default 1,2,4,8) for ``$BENCH_MW_SECONDS`` (default 5) after a 1 s warm-up; the figures
(appends/s, p50/p99, errors, searches/s) go to the benchmark's ``extra_info``. With
``--benchmark-disable`` (CI's smoke run) one cell per database, 2 writers for a fraction of
a second: what it proves is that the code counts every append and loses no row. The
report's table comes from ``python -m benchmarks.many_writers``.

The other tests check the benchmark's own arithmetic and its row check, without processes.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from benchmarks import many_writers as mw
from benchmarks import many_writers_procs as procs
from benchmarks import many_writers_render as render
from hermes_store.errors import StoreBusy
from hermes_store.store import NewMessage, Store

#: The smoke run (CI, --benchmark-disable) checks that every process works, not how fast:
#: no warm-up, so each process's first step is counted. With one, a search on PostgreSQL
#: begun during the warm-up could outlast the whole window on a loaded machine and leave
#: the searcher with nothing measured (CI saw that once: 0 searches).
SMOKE = mw.Timing(warmup=0.0, seconds=0.3)
SMOKE_WRITERS = (2,)


def _timed() -> tuple[mw.Timing, tuple[int, ...]]:
    seconds = float(os.environ.get("BENCH_MW_SECONDS") or 5)
    writers = mw.parse_writers(os.environ.get("BENCH_MW_WRITERS") or "1,2,4,8")
    return mw.Timing(warmup=1.0, seconds=seconds), writers


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "writers" in metafunc.fixturenames:
        smoke = metafunc.config.getoption("benchmark_disable", default=False)
        writers = SMOKE_WRITERS if smoke else _timed()[1]
        metafunc.parametrize("writers", writers)


@pytest.fixture(scope="module")
def sqlite_target(bench_size, tmp_path_factory):
    """A seeded SQLite store, copied for each cell."""
    target = mw.SqliteTarget(tmp_path_factory.mktemp("many-writers"))
    target.prepare(bench_size)
    yield target
    target.close()


@pytest.fixture(scope="module")
def postgresql_target(bench_size, pg_server_url):
    """A seeded PostgreSQL template database, cloned for each cell. Skipped (with the
    reason) only when no server answers (``pg_server_url``; a failure with
    HERMES_REQUIRE_PG set): any other error of the setup fails the benchmark."""
    target = mw.PostgresTarget(pg_server_url)
    try:
        target.prepare(bench_size)
        yield target
    finally:
        target.close()


@pytest.fixture(params=mw.BACKENDS)
def target(request):
    return request.getfixturevalue(f"{request.param}_target")


def test_many_writers(target, writers, benchmark, request):
    smoke = request.config.getoption("benchmark_disable", default=False)
    timing = SMOKE if smoke else _timed()[0]
    search = mw.probe(target.template_url())["search"] is None

    cell = benchmark.pedantic(
        mw.run_cell,
        args=(target, target.backend, writers, timing),
        kwargs={"search": search},
        rounds=1,
        iterations=1,
    )

    checked = cell["verified"]
    assert checked["expected"] > 0, "no writer appended anything"
    assert checked["lost"] == 0, "a row a writer was given an id for is missing"
    assert checked["unexpected"] == 0, "a row no writer was given is in a writer's session"
    assert checked["counters_wrong"] == 0
    assert checked["rewind_wrong"] == 0
    assert len(cell["appends_per_writer"]) == writers
    assert sum(cell["appends_per_writer"]) == cell["appends"]
    assert cell["errors"][procs.OTHER] == 0, cell["error_samples"]
    if search:
        assert cell["search"]["searches"] > 0
        assert cell["search"]["errors"][procs.OTHER] == 0, cell["search"]["error_samples"]
    benchmark.extra_info.update(
        {
            key: cell[key]
            for key in ("appends_per_s", "append_p50_ms", "append_p99_ms", "errors", "rewinds")
        }
    )
    if cell["search"]:
        benchmark.extra_info.update(
            searches_per_s=cell["search"]["per_s"], search_p50_ms=cell["search"]["p50_ms"]
        )


@pytest.fixture(params=mw.BACKENDS)
def paced_options(request, tmp_path):
    """A one-writer run paced at PACED_RATE appends/s on one database (PostgreSQL's skipped
    without a server, as above)."""
    pg_url = request.getfixturevalue("pg_server_url") if request.param == mw.POSTGRESQL else ""
    return mw.Options(
        writers=(1,),
        seconds=PACED_SECONDS,
        warmup=0.0,
        seed_messages=200,
        backends=(request.param,),
        pg_url=pg_url or mw.DEFAULT_PG_URL,
        rate=PACED_RATE,
    )


#: The paced smoke: one writer asked for 10 appends/s for 2 s, 20 in all.
PACED_RATE = 10.0
PACED_SECONDS = 2.0


def test_a_paced_writer_makes_the_appends_asked_and_the_report_says_so(paced_options, tmp_path):
    results = mw.run(paced_options, tmp_path / "work")
    render.write(results, tmp_path / "out")

    [cell] = results["cells"]
    asked = PACED_RATE * PACED_SECONDS
    # Paced, not closed: near the 20 appends asked, far below what either database does
    # as fast as it can (over a hundred a second here); generous below for a loaded machine.
    assert 0.5 * asked <= cell["appends"] <= 1.1 * asked, cell["appends"]
    assert cell["verified"]["lost"] == 0
    pace = cell["pace"]
    assert pace["rate_per_writer"] == PACED_RATE
    assert pace["asked_per_s"] == PACED_RATE
    assert pace["achieved_share"] == pytest.approx(cell["appends"] / asked, abs=0.001)
    assert pace["kept_up"] == (pace["achieved_share"] >= mw.KEPT_UP)
    assert pace["missed"] >= 0
    assert pace["behind_max_ms"] is not None
    assert results["meta"]["rate"] == PACED_RATE

    saved = json.loads((tmp_path / "out" / "many_writers.json").read_text("utf-8"))
    assert saved["cells"][0]["pace"] == pace
    markdown = (tmp_path / "out" / "many_writers.md").read_text("utf-8")
    assert "paced at 10 appends/s per writer" in markdown
    assert "| asked appends/s | appends/s | kept up |" in markdown
    verdict = "yes" if pace["kept_up"] else "NO"
    assert f"| 10 | {cell['appends_per_s']:,.0f} | {verdict}, " in markdown


# -- the benchmark's own arithmetic ---------------------------------------------------


class _FakeClock:
    """A clock that only moves when the loop sleeps or a step takes time."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def test_a_paced_loop_keeps_its_schedule_and_does_not_burst_after_a_stall():
    clock = _FakeClock()
    started: list[float] = []

    def step(measuring: bool) -> None:
        started.append(clock.now)
        if len(started) == 6:
            clock.now += 1.0  # the 6th append waits 1 s for the lock: 10 slots of 0.1 s

    timing = procs.Timing(warmup=0.0, seconds=3.0)
    paced = procs._run_window(timing, step, 10.0, clock=clock, sleep=clock.sleep)

    assert paced is not None
    # Every slot of the window is either used or counted as missed.
    assert len(started) + paced.missed == 30
    assert paced.missed > 0
    # After the stall it catches up by a bounded burst, not by all ten slots at once.
    stall_end = started[5] + 1.0
    burst = [t for t in started if t == pytest.approx(stall_end)]
    assert 1 <= len(burst) <= procs.CATCH_UP + 1
    # How far behind it fell is recorded: 0.9 s (slot 7 was due 0.1 s after the 6th).
    assert max(paced.behind) == pytest.approx(0.9)
    # And before the stall, one step per slot, on time.
    assert started[:6] == pytest.approx([100.0 + k * 0.1 for k in range(6)])


def test_an_unpaced_loop_is_the_closed_loop_of_before():
    clock = _FakeClock()
    steps: list[bool] = []

    def step(measuring: bool) -> None:
        steps.append(measuring)
        clock.now += 0.01

    timing = procs.Timing(warmup=0.5, seconds=1.0)
    assert procs._run_window(timing, step, clock=clock, sleep=clock.sleep) is None
    assert len(steps) == pytest.approx(150, abs=1)  # back to back, 10 ms each, for 1.5 s
    assert steps.count(True) == pytest.approx(100, abs=1)


def test_errors_are_told_apart_by_kind():
    class PgLockTimeout(Exception):
        sqlstate = "55P03"

    assert procs.error_kind(sqlite3.OperationalError("database is locked")) == procs.BUSY
    assert procs.error_kind(StoreBusy("the store is locked")) == procs.BUSY
    assert procs.error_kind(PgLockTimeout("canceling statement due to lock timeout")) == procs.BUSY
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = sqlite3.OperationalError("database is busy")
    assert procs.error_kind(wrapped) == procs.BUSY
    assert procs.error_kind(sqlite3.IntegrityError("NOT NULL constraint failed")) == procs.OTHER
    assert procs.error_kind(ValueError("anything else")) == procs.OTHER


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert procs.percentile(values, 50) == 50.0
    assert procs.percentile(values, 99) == 99.0
    assert procs.percentile([3.0], 99) == 3.0
    assert procs.percentile([], 50) is None


def _writer_report(index, latencies, sessions, rewound=(), busy=0):
    return {
        "role": "writer",
        "index": index,
        "sessions": sessions,
        "rewound": list(rewound),
        "latencies": latencies,
        "rewind_latencies": [0.001] * len(rewound),
        "errors": {procs.BUSY: busy, procs.OTHER: 0},
        "error_samples": [],
        "rewind_errors": {procs.BUSY: 0, procs.OTHER: 0},
        "session_errors": {procs.BUSY: 0, procs.OTHER: 0},
        "other_samples": [],
    }


def test_a_cell_counts_only_the_appends_of_the_window_of_every_writer():
    reports = [
        _writer_report(0, [0.001] * 30, {"mw-0-0": list(range(40))}, busy=2),
        _writer_report(1, [0.002] * 10, {"mw-1-0": list(range(40, 55))}, busy=1),
        {
            "role": "searcher",
            "index": 0,
            "latencies": [0.004] * 8,
            "hits": 80,
            "errors": {procs.BUSY: 0, procs.OTHER: 1},
            "error_samples": ["X: y"],
        },
    ]
    cell = procs.summarize(mw.SQLITE, 2, mw.Timing(warmup=1, seconds=2), reports)
    assert cell["appends"] == 40  # the latencies (the window), not the ids (warm-up too)
    assert cell["appends_per_writer"] == [30, 10]
    assert cell["appends_per_s"] == 20.0
    assert cell["errors"] == {procs.BUSY: 3, procs.OTHER: 0}
    assert cell["append_p50_ms"] == 1.0
    assert cell["append_p99_ms"] == 2.0
    assert cell["search"]["searches"] == 8
    assert cell["search"]["per_s"] == 4.0
    assert cell["search"]["errors"] == {procs.BUSY: 0, procs.OTHER: 1}


def test_the_row_check_finds_a_lost_row_a_stray_one_and_a_wrong_counter(tmp_path):
    from hermes_store import migrate

    path = tmp_path / "state.db"
    migrate.upgrade(str(path))
    url = mw.to_url(path)
    with Store.open(url) as store:
        store.create_session("mw-0-0", "cli")
        ids = [
            store.append_message("mw-0-0", NewMessage(role="user", content=f"m{i}"))
            for i in range(5)
        ]
        store.set_message_flags(ids[-2:], active=False)
    told = _writer_report(0, [], {"mw-0-0": ids}, rewound=ids[-2:])
    assert mw.verify(url, [told]) == {
        "sessions": 1,
        "expected": 5,
        "found": 5,
        "lost": 0,
        "unexpected": 0,
        "counters_wrong": 0,
        "rewind_wrong": 0,
    }

    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM messages WHERE id = ?", (ids[0],))
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) "
            "VALUES ('mw-0-0', 'user', 'stray', 0)"
        )
        conn.execute("UPDATE messages SET active = 1 WHERE id = ?", (ids[-1],))
        conn.execute("UPDATE sessions SET message_count = 9 WHERE id = 'mw-0-0'")
    conn.close()
    checked = mw.verify(url, [told])
    assert (checked["lost"], checked["unexpected"]) == (1, 1)
    assert checked["counters_wrong"] == 1
    assert checked["rewind_wrong"] == 1


def _cells(backend, figures):
    return [
        {"backend": backend, "writers": n, "appends_per_s": rate} for n, rate in figures.items()
    ]


def test_the_crossover_sentence_names_the_first_count_where_postgresql_leads():
    results = {
        "not_measured": {},
        "cells": _cells(mw.SQLITE, {1: 300, 2: 250, 4: 200, 8: 150})
        + _cells(mw.POSTGRESQL, {1: 120, 2: 220, 4: 330, 8: 400}),
    }
    sentence = render.crossover(results)
    assert sentence.startswith("PostgreSQL overtakes SQLite in append throughput from 4 writers")
    assert "330 against 200 appends/s at 4 writers" in sentence
    assert "400 against 150 appends/s at 8 writers" in sentence

    results["cells"] = _cells(mw.SQLITE, {1: 300, 8: 200}) + _cells(mw.POSTGRESQL, {1: 100, 8: 150})
    assert render.crossover(results).startswith("PostgreSQL does not overtake SQLite")
    assert "150 against 200 appends/s at 8 writers" in render.crossover(results)


def test_a_database_not_measured_is_reported_with_its_reason(tmp_path: Path):
    reason = "the Store API's writes fail on it (SyntaxError: near IMMEDIATE)"
    results = {
        "meta": {
            "date": "d",
            "platform": "p",
            "cpus": 2,
            "python": "3",
            "commit": "c",
            "loadavg_before": None,
            "seed_messages": 10,
            "session_length": 200,
            "rewind_last": 3,
            "rewind_every": 20,
            "search_queries": ["a"],
            "seconds": 1,
            "warmup": 0,
            "writers": [1],
        },
        "databases": {},
        "not_measured": {mw.POSTGRESQL: reason},
        "search_not_measured": {},
        "cells": [],
    }
    results["crossover"] = render.crossover(results)
    markdown = render.render_markdown(results)
    assert f"| all | PostgreSQL | not measured: {reason} |" in markdown
    assert "No comparison: PostgreSQL not measured" in markdown


def _search_cell(backend, writers, p50, p99):
    return {
        "backend": backend,
        "writers": writers,
        "appends_per_s": 100.0,
        "append_p50_ms": 1.0,
        "append_p99_ms": 10.0,
        "search": {"p50_ms": p50, "p99_ms": p99},
    }


def test_the_ratios_state_postgresql_over_sqlite_and_the_8_writer_search_target():
    results = {
        "cells": [
            _search_cell(mw.SQLITE, 1, 2.0, 8.0),
            _search_cell(mw.POSTGRESQL, 1, 3.0, 40.0),
            _search_cell(mw.SQLITE, 8, 2.0, 10.0),
            _search_cell(mw.POSTGRESQL, 8, 5.0, 15.0),
        ]
    }
    by_writers = {row["writers"]: row for row in render.ratios(results)}
    assert by_writers[1]["search_p50_ms"] == pytest.approx(1.5)
    assert by_writers[1]["search_p99_ms"] == pytest.approx(5.0)
    target = render.search_target(results)
    assert target["value"] == pytest.approx(2.5)
    assert target["passed"] is False
    lines = render.ratio_table(results)
    assert "| 8 | 1.00x | 1.00x | 1.00x | 2.50x | 1.50x |" in lines
    assert any(line.endswith(": MISS.") for line in lines)

    results["cells"][3]["search"]["p50_ms"] = 4.0  # 2.0x: within the target
    assert render.search_target(results)["passed"] is True
    # Without an 8-writer cell on both databases there is no verdict.
    results["cells"] = results["cells"][:2]
    assert render.search_target(results) is None


def test_a_paced_cell_that_fell_behind_is_named_and_an_old_run_renders_as_before():
    def writer(index, appends, missed):
        report = _writer_report(index, [0.001] * appends, {f"mw-{index}-0": []})
        report["paced"] = {"behind": [0.0] * appends + [0.25], "missed": missed}
        return report

    timing = mw.Timing(warmup=0, seconds=2)
    kept = procs.summarize(mw.SQLITE, 2, timing, [writer(0, 20, 0), writer(1, 20, 0)], 10.0)
    fell = procs.summarize(mw.POSTGRESQL, 2, timing, [writer(0, 20, 0), writer(1, 12, 8)], 10.0)
    assert kept["pace"]["kept_up"] is True
    assert kept["pace"]["asked_per_s"] == 20.0
    assert fell["pace"]["kept_up"] is False  # 32 of 40 asked: 80%
    assert fell["pace"]["achieved_share"] == 0.8
    assert fell["pace"]["missed"] == 8
    assert fell["pace"]["behind_max_ms"] == 250.0
    results = {"meta": {"rate": 10.0, "kept_up_share": 0.95}, "not_measured": {}}
    results["cells"] = [
        {
            **cell,
            "verified": {
                "expected": 0,
                "lost": 0,
                "unexpected": 0,
                "counters_wrong": 0,
                "rewind_wrong": 0,
            },
        }
        for cell in (kept, fell)
    ]
    lines = render.table(results)
    assert any("| 2 | SQLite | 20 | 20 | yes, 100.0% |" in line for line in lines)
    assert any("| 2 | PostgreSQL | 20 | 16 | NO, 80.0%, 8 missed |" in line for line in lines)
    sentence = render.same_load(results)
    assert sentence.startswith("Not the same write load")
    assert "PostgreSQL with 2 writers made 80% of 20 appends/s (8 slots missed" in sentence
    assert "SQLite with" not in sentence

    # A run from before --rate: no "pace" in its cells, no "rate" in its meta.
    for cell in results["cells"]:
        del cell["pace"]
    del results["meta"]["rate"]
    assert render.table(results)[0].startswith("| writers | database | appends/s |")
    assert render.same_load(results) == ""

"""Cold storage's targets (``benchmarks/archive_targets.py``) under pytest-benchmark.

One round of the whole scenario: archive ``--share`` of a store while the application-like
writer writes, then search the hot store and the hot store with its archive. With
``--benchmark-disable`` (CI's smoke run) at 500 messages: what it proves is that the run
moves about the share asked, the writer loses no message, and search with the archive
finds exactly the original's messages. The figures go to the benchmark's ``extra_info``;
the docs' table comes from ``python -m benchmarks.archive_targets``.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from benchmarks import archive_targets as at
from benchmarks.agent_stall import build_store

SMOKE_SIZE = 500
SHARE = 0.8


@pytest.fixture
def size(bench_size, request):
    smoke = request.config.getoption("benchmark_disable", default=False)
    return SMOKE_SIZE if smoke else bench_size


@pytest.mark.parametrize("vacuum_first", [False, True], ids=["as-upgraded", "vacuum-first"])
def test_archive_targets(size, vacuum_first, tmp_path, benchmark, request):
    smoke = request.config.getoption("benchmark_disable", default=False)
    hot = build_store(tmp_path, size)
    result = benchmark.pedantic(
        at.run,
        args=(hot, tmp_path, SHARE, 1 if smoke else at.ROUNDS),
        kwargs={"vacuum_first": vacuum_first},
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update(json.loads(json.dumps(result)))

    archived = result["archive"]
    assert archived["messages"] == result["selected_messages"] > 0
    assert (
        result["selected_share"] >= SHARE
        or result["selected_messages"] == result["movable_messages"]
    )
    assert archived["writer_errors"] == 0
    assert archived["writer_messages"] > 0
    assert result["hits"]["all_equal"], at.markdown(result)
    assert any(q["original_hits"] for q in result["hits"]["queries"])
    assert not any(q["duplicates"] for q in result["hits"]["queries"])
    if vacuum_first:
        assert result["auto_vacuum"] == "incremental"
        assert archived["vacuum_needed_bytes"] == 0
    table = at.markdown(result)
    assert all(cls in table for cls in at.workloads.QUERY_CLASSES)


def test_cutoff_reaches_the_share(tmp_path):
    """The cutoff chosen from the data selects at least the share when the trees that can
    move hold it, and every such tree when they do not; a larger share, a later cutoff."""
    hot = build_store(tmp_path, 3 * SMOKE_SIZE)
    low = at.choose_cutoff(hot, 0.1)
    high = at.choose_cutoff(hot, 0.6)
    everything = at.choose_cutoff(hot, 0.999)
    assert low.of_messages == high.of_messages == 3 * SMOKE_SIZE
    assert low.share >= 0.1
    assert high.share >= 0.6
    assert datetime.fromisoformat(low.before) < datetime.fromisoformat(high.before)
    assert everything.messages == everything.movable < everything.of_messages

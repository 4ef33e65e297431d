"""maintenance.optimize (FTS merge + checkpoint + VACUUM) per layout."""

from __future__ import annotations

import itertools

import pytest

from benchmarks import layouts, workloads
from hermes_store.sqlite import fts

ROUNDS = 2


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_optimize(benchmark, store_set, layout, tmp_path):
    counter = itertools.count()
    copies = []

    def setup():
        target = store_set.copy(layout, tmp_path / f"work-{next(counter)}.db")
        copies.append(target)
        return (target,), {}

    seconds, result = benchmark.pedantic(workloads.optimize, setup=setup, rounds=ROUNDS)
    assert seconds > 0
    assert result.vacuumed
    expected = [
        name for name in fts.INDEXES if layout != layouts.NO_TRIGRAM or name == fts.WORD_INDEX
    ]
    assert result.indexes == expected
    # The full run switches the store to incremental auto-vacuum: its pointer-map pages
    # (one per ~1,000 pages) may outweigh what an already compact store gives back.
    assert result.bytes_after <= result.bytes_before * 1.01
    assert workloads.fts_problems(copies[-1]) == {}

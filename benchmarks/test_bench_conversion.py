"""The legacy store (schema 30) converted to head on both paths; the longest write lock of each."""

from __future__ import annotations

import itertools

import pytest

from benchmarks import layouts, workloads
from hermes_store.sqlite import storage

ROUNDS = 2
PATHS = {"in place": False, "rebuild": True}


def _check_converted(path):
    report = workloads.storage_of(path)
    assert report.layout == "external"
    assert report.groups[storage.FTS_COPIES] == 0
    assert workloads.fts_problems(path) == {}


@pytest.mark.parametrize("path_name", list(PATHS))
def test_conversion(benchmark, store_set, path_name, tmp_path):
    rebuild = PATHS[path_name]
    counter = itertools.count()
    copies = []

    def setup():
        target = store_set.copy(layouts.INLINE, tmp_path / f"legacy-{next(counter)}.db")
        copies.append(target)
        return (target,), {"rebuild": rebuild}

    conversion = benchmark.pedantic(workloads.convert, setup=setup, rounds=ROUNDS)
    assert conversion.path == path_name  # convert() checks the log of both indexes
    _check_converted(copies[-1])
    benchmark.extra_info.update(messages=store_set.n_messages)


@pytest.mark.parametrize("path_name", list(PATHS))
def test_conversion_lock_hold(store_set, path_name, tmp_path):
    target = store_set.copy(layouts.INLINE, tmp_path / "legacy.db")
    conversion = workloads.convert(target, rebuild=PATHS[path_name], probe=True)
    assert conversion.lock_seconds is not None
    # The probe saw the revision's transaction, and nothing longer than the whole upgrade.
    assert 0 < conversion.lock_seconds <= conversion.seconds + 0.05
    _check_converted(target)

"""Append throughput through Store: one transaction per message, and batched."""

from __future__ import annotations

import pytest

from benchmarks import layouts, workloads
from hermes_store.store import Store

ROUNDS = 3
SINGLE = 40  # messages per round, one transaction each
BATCHES = 4  # transactions per round ...
BATCH_SIZE = 25  # ... of this many messages


def _run(benchmark, store_set, layout, tmp_path, per_round, append):
    path = store_set.copy(layout, tmp_path / "work.db")
    before = workloads.message_count(path)
    plan = iter(workloads.append_plan(per_round, ROUNDS, seed=store_set.seed))
    used = []
    store = Store.open(path)
    try:

        def setup():
            batch = next(plan)
            workloads.prepare_session(store, batch)
            used.append(batch)
            return (store, batch), {}

        ids = benchmark.pedantic(append, setup=setup, rounds=ROUNDS)
    finally:
        store.close()
    assert len(ids) == per_round
    assert ids == sorted(ids)
    for batch in used:
        assert workloads.message_count(path, batch.session_id) == per_round
    assert workloads.message_count(path) == before + per_round * len(used)
    # The indexes took every appended row exactly (FTS5 integrity-check, rank 1).
    assert workloads.fts_problems(path) == {}
    benchmark.extra_info.update(messages_per_round=per_round)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_append_one_per_transaction(benchmark, store_set, layout, tmp_path):
    _run(benchmark, store_set, layout, tmp_path, SINGLE, workloads.append_one_by_one)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_append_batched(benchmark, store_set, layout, tmp_path):
    def append(store, batch):
        return workloads.append_batched(store, batch, BATCH_SIZE)

    _run(benchmark, store_set, layout, tmp_path, BATCHES * BATCH_SIZE, append)

"""Append throughput through Store: one transaction per message, batched, and in bulk.

The bulk test appends 20k messages with one `append_messages` call and, in the same group,
the legacy application's own writer (raw sqlite3, one INSERT and one UPDATE per message, one
transaction) on a fresh copy of the same store each round: pytest-benchmark's table then
shows the ratio of the two.
"""

from __future__ import annotations

import pytest

from benchmarks import layouts, raw, workloads
from hermes_store.store import Store, count_tool_calls

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


# -- one bulk append against the legacy application's writer ----------------------------

BULK_ROUNDS = 3
BULK_LAYOUTS = (layouts.INLINE, layouts.EXTERNAL)


@pytest.fixture(scope="module")
def bulk_batch(store_set):
    """20k realistic messages for one new session (generated once per module)."""
    [batch] = workloads.append_plan(workloads.BULK_APPEND, 1, seed=store_set.seed)
    return batch


def _fresh_store(store_set, layout, tmp_path, round_no, batch):
    """A new copy of the layout's store per round, with the batch's session created."""
    path = store_set.copy(layout, tmp_path / f"bulk-{round_no}.db")
    with Store.open(path) as store:
        workloads.prepare_session(store, batch)
    return path


def _bulk(benchmark, store_set, layout, tmp_path, batch, open_writer, append):
    """Time ``append(writer, batch)`` on a fresh store per round; check what it wrote."""
    rounds = iter(range(BULK_ROUNDS))
    opened = []
    paths = []

    def setup():
        path = _fresh_store(store_set, layout, tmp_path, next(rounds), batch)
        paths.append(path)
        opened.append(open_writer(path))
        return (opened[-1], batch), {}

    benchmark.group = f"append {len(batch.messages)} messages in one transaction, {layout}"
    try:
        ids = benchmark.pedantic(append, setup=setup, rounds=BULK_ROUNDS)
    finally:
        for writer in opened:
            writer.close()
    n = len(batch.messages)
    calls = sum(count_tool_calls(m.tool_calls) for m in batch.messages)
    assert len(ids) == n
    assert ids == list(range(ids[0], ids[0] + n))
    for path in paths:
        assert workloads.message_count(path, batch.session_id) == n
        assert workloads.session_counters(path, batch.session_id) == (n, calls)
    assert workloads.fts_problems(paths[-1]) == {}
    benchmark.extra_info.update(messages=n, layout=layout)


@pytest.mark.parametrize("layout", BULK_LAYOUTS)
def test_append_bulk_store(benchmark, store_set, layout, tmp_path, bulk_batch):
    """`Store.append_messages` of the whole batch: one call, one write transaction."""

    def append(store, batch):
        return store.append_messages(batch.session_id, batch.messages)

    _bulk(benchmark, store_set, layout, tmp_path, bulk_batch, Store.open, append)


@pytest.mark.parametrize("layout", BULK_LAYOUTS)
def test_append_bulk_legacy_sqlite3(benchmark, store_set, layout, tmp_path, bulk_batch):
    """The reference: the legacy application's per-message INSERT and UPDATE, raw sqlite3."""

    def append(conn, batch):
        return raw.append_messages(conn, batch.session_id, batch.messages)

    _bulk(benchmark, store_set, layout, tmp_path, bulk_batch, raw.connect, append)

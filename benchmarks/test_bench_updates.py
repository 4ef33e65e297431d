"""Flag updates (active, compacted), text edits and whole-session deletes through Store."""

from __future__ import annotations

import sqlite3

import pytest

from benchmarks import layouts, workloads
from hermes_store.search import search_messages
from hermes_store.store import Store

ROUNDS = 4


def _flags(path, ids, column):
    conn = sqlite3.connect(path)
    try:
        marks = ", ".join("?" for _ in ids)
        rows = conn.execute(f"SELECT {column} FROM messages WHERE id IN ({marks})", ids)
        return {int(row[0]) for row in rows}
    finally:
        conn.close()


@pytest.mark.parametrize("flag", ["active", "compacted"])
@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_flag_update(benchmark, store_set, layout, flag, tmp_path):
    path = store_set.copy(layout, tmp_path / "work.db")
    ids = workloads.flag_ids(path)
    assert len(ids) == workloads.FLAG_ROWS
    initial = {"active": True, "compacted": False}[flag]
    values = iter([not initial, initial] * ROUNDS)
    last: list[bool] = []
    store = Store.open(path)
    try:

        def setup():
            value = next(values)
            last.append(value)
            return (), {flag: value}

        def update(**flags):
            return store.set_message_flags(ids, **flags)

        changed = benchmark.pedantic(update, setup=setup, rounds=ROUNDS)
    finally:
        store.close()
    assert changed == len(ids)
    assert _flags(path, ids, flag) == {int(last[-1])}
    assert workloads.fts_problems(path) == {}
    benchmark.extra_info.update(rows=len(ids))


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_text_edit(benchmark, store_set, layout, tmp_path):
    path = store_set.copy(layout, tmp_path / "work.db")
    ids = workloads.edit_ids(path)
    assert len(ids) == workloads.EDITS
    rounds = iter(range(ROUNDS))
    store = Store.open(path)
    try:

        def setup():
            round_no = next(rounds)
            return ([(i, workloads.edited_text(path, i, round_no)) for i in ids],), {}

        def edit(edits):
            for message_id, text in edits:
                store.edit_message(message_id, text)
            return edits

        edits = benchmark.pedantic(edit, setup=setup, rounds=ROUNDS)
        with store.engine.connect() as conn:
            # The index follows the edit: the marker word is found, in the edited rows.
            marker = edits[0][1].rsplit(" ", 1)[-1].rstrip(")")
            hits = search_messages(conn, f"edited {marker}", limit=1000)
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        for message_id, text in edits:
            row = conn.execute("SELECT content FROM messages WHERE id = ?", (message_id,))
            assert row.fetchone()[0] == text
    finally:
        conn.close()
    assert {hit["id"] for hit in hits} >= {i for i, _ in edits} - _hidden(path, ids)
    assert workloads.fts_problems(path) == {}
    benchmark.extra_info.update(edits=len(ids))


def _hidden(path, ids):
    """Ids that search does not show (rewound, not compacted)."""
    conn = sqlite3.connect(path)
    try:
        marks = ", ".join("?" for _ in ids)
        rows = conn.execute(
            f"SELECT id FROM messages WHERE id IN ({marks}) AND active = 0 AND compacted = 0", ids
        )
        return {int(row[0]) for row in rows}
    finally:
        conn.close()


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_delete_session(benchmark, store_set, layout, tmp_path):
    path = store_set.copy(layout, tmp_path / "work.db")
    candidates = workloads.delete_candidates(path, ROUNDS)
    assert len(candidates) == ROUNDS
    before = workloads.message_count(path)
    queue = iter(candidates)
    done = []
    store = Store.open(path)
    try:

        def setup():
            session_id, count = next(queue)
            done.append((session_id, count))
            return (session_id,), {}

        deleted = benchmark.pedantic(store.delete_session, setup=setup, rounds=ROUNDS)
        assert deleted == done[-1][1]
        for session_id, _count in done:
            assert store.get_session(session_id) is None
    finally:
        store.close()
    assert workloads.message_count(path) == before - sum(count for _, count in done)
    assert workloads.fts_problems(path) == {}
    benchmark.extra_info.update(messages=done[-1][1])

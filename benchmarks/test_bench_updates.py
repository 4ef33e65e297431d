"""Flag updates (active, compacted), text edits and whole-session deletes through Store."""

from __future__ import annotations

import sqlite3

import pytest

from benchmarks import layouts, report, workloads
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
@pytest.mark.parametrize("layout", layouts.ALL_LAYOUTS)
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


def _index_pages(path):
    """Rows of each FTS5 index's data table: a re-indexed message adds segment data."""
    conn = sqlite3.connect(path)
    try:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}_data").fetchone()[0]
            for table in ("messages_fts", "messages_fts_trigram")
        }
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("layout", "schema", "reindexed"),
    [
        (layouts.INLINE_21, 21, True),
        (layouts.EXTERNAL_21, 21, False),
        (layouts.INLINE, 30, False),
        (layouts.EXTERNAL, 30, False),
    ],
)
def test_the_flag_pair_is_what_the_report_says(store_set, layout, schema, reindexed, tmp_path):
    """The flag-update targets compare inline-21 with external-21: a flag update re-indexes
    the messages on the first only, and at schema 30 on neither (the report's ~1x there)."""
    path = store_set.copy(layout, tmp_path / "work.db")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == schema
        declared = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts'")
        external = "content='messages_fts_source'" in declared.fetchone()[0]
        assert external is not layout.startswith("inline")
    finally:
        conn.close()
    ids = workloads.flag_ids(store_set.base(layouts.INLINE))
    before = _index_pages(path)
    with Store.open(path) as store:
        assert store.set_message_flags(ids, active=False) == len(ids)
    after = _index_pages(path)
    assert (after != before) is reindexed
    assert _flags(path, ids, "active") == {0}
    assert workloads.fts_problems(path) == {}


def test_flag_targets_compare_the_schema_21_pair():
    """The flag-update targets pass or miss on the schema-21 pair, whatever schema 30 says;
    results without that pair (an older report.json) are a miss that says to run again."""

    def figures(flags_ms):
        values = {f"flags.{flag}": flags_ms for flag in ("active", "compacted")}
        return {**values, **{f"{key}.sql": ms / 2 for key, ms in values.items()}}

    others = {"size.total": 100.0, "append.single": 300.0, "append.batched": 900.0}
    for query_class in workloads.QUERY_CLASSES:
        others |= {f"search.{query_class}.median": 5.0, f"search.{query_class}.cpu": 5.0}
    others |= {f"{key}.sql": value for key, value in list(others.items())}

    def targets(by_layout):
        size_data = {
            "figures": {
                layouts.INLINE: {**others, **figures(2.0)},
                layouts.EXTERNAL: {**others, **figures(2.0)},
                **by_layout,
            },
            "physical_limit": 0.64,
            "conversion": {
                "in place": {"seconds": 1.0, "lock_seconds": 0.1},
                "rebuild": {"seconds": 20.0, "lock_seconds": 20.0},
            },
        }
        found = report.check_targets(size_data)
        return [t for t in found if t["target"].startswith("flag update")]

    fast = targets({layouts.INLINE_21: figures(40.0), layouts.EXTERNAL_21: figures(2.0)})
    assert [t["pass"] for t in fast] == [True, True]
    assert "20.00× faster" in fast[0]["measured"]
    assert "at schema 30 `external` vs `inline` 1.00×" in fast[0]["measured"]
    slow = targets({layouts.INLINE_21: figures(4.0), layouts.EXTERNAL_21: figures(2.0)})
    assert [t["pass"] for t in slow] == [False, False]
    old = targets({})
    assert [t["pass"] for t in old] == [False, False]
    assert "run the report again" in old[0]["measured"]


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

"""The typed write/read API (`Store`, `NewMessage`) on a store created at head (revision 22)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from hermes_store import migrate
from hermes_store.errors import StoreError
from hermes_store.models import AgentSession, Message, SessionModelUsage
from hermes_store.store import MULTIMODAL_PREFIX, NewMessage, SessionNotFound, Store

FTS_TABLES = ("messages_fts", "messages_fts_trigram")
TWO_CALLS = [
    {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}},
    {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
]


@pytest.fixture(scope="session")
def head_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store upgraded to head, copied by each test (the upgrade runs once)."""
    path = tmp_path_factory.mktemp("template") / "state.db"
    assert migrate.upgrade(str(path)).after == (migrate.head_revision(),)
    return path


@pytest.fixture
def store_file(head_template: Path, tmp_path: Path) -> Path:
    """A private copy of the head store."""
    path = tmp_path / "state.db"
    shutil.copyfile(head_template, path)
    return path


@pytest.fixture
def store(store_file: Path) -> Iterator[Store]:
    """The store API over a fresh head store."""
    with Store.open(str(store_file)) as opened:
        yield opened


def _counters(store: Store, session_id: str) -> tuple[int | None, int | None]:
    row = store.get_session(session_id)
    assert row is not None
    return row.message_count, row.tool_call_count


def _message_total(store: Store) -> int:
    with store.session() as db:
        return int(db.scalar(select(func.count()).select_from(Message)) or 0)


def _fts_rowids(conn: Any, table: str, query: str) -> list[int]:
    """Rowids an FTS5 table returns for a MATCH (works on sqlite3 and DBAPI connections)."""
    cursor = conn.execute(
        f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid", (query,)
    )
    return [int(row[0]) for row in cursor.fetchall()]


def _integrity_check(conn: Any, table: str) -> None:
    """FTS5 integrity check against the content source (rank 1); raises on drift."""
    conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")


# -- create / append -----------------------------------------------------------------


def test_create_session_returns_a_loaded_row_with_zero_counters(store: Store) -> None:
    row = store.create_session("s1", "cli", model="claude", started_at=100.0, title="First")
    # The returned row is usable after its transaction: server defaults were fetched.
    assert (row.message_count, row.tool_call_count, row.input_tokens, row.archived) == (0, 0, 0, 0)
    stored = store.get_session("s1")
    assert stored is not None
    assert (stored.source, stored.model, stored.started_at, stored.title) == (
        "cli",
        "claude",
        100.0,
        "First",
    )
    assert stored.ended_at is None
    assert store.get_session("nope") is None


def test_create_session_accepts_other_columns_by_name(store: Store) -> None:
    store.create_session("s1", "telegram", chat_id="42", cwd="/srv", rewind_count=3)
    stored = store.get_session("s1")
    assert stored is not None
    assert (stored.chat_id, stored.cwd, stored.rewind_count) == ("42", "/srv", 3)
    assert time.time() - stored.started_at < 60


@pytest.mark.parametrize(
    ("tool_calls", "expected"),
    [
        pytest.param(None, 0, id="none"),
        pytest.param(TWO_CALLS, 2, id="list"),
        pytest.param(json.dumps(TWO_CALLS + TWO_CALLS[:1]), 3, id="json-string"),
        pytest.param("[]", 0, id="empty-json-list"),
        pytest.param("{not json", 0, id="invalid-json"),
        pytest.param('{"id": "c1"}', 0, id="json-object"),
    ],
)
def test_append_message_bumps_both_counters(store: Store, tool_calls: Any, expected: int) -> None:
    store.create_session("s1", "cli")
    store.append_message("s1", NewMessage("user", "hi", timestamp=1.0))
    message_id = store.append_message(
        "s1", NewMessage("assistant", "calling", tool_calls=tool_calls, timestamp=2.0)
    )
    assert _counters(store, "s1") == (2, expected)
    [stored] = [m for m in store.messages("s1") if m.id == message_id]
    # A list is stored as its JSON text; a string (even invalid JSON) as given.
    assert stored.tool_calls == (
        json.dumps(tool_calls) if isinstance(tool_calls, list) else tool_calls
    )


def test_append_to_a_missing_session_raises_and_inserts_nothing(store: Store) -> None:
    with pytest.raises(SessionNotFound, match="create_session"):
        store.append_message("ghost", NewMessage("user", "orphan text"))
    assert _message_total(store) == 0
    with store.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert _fts_rowids(raw, "messages_fts", "orphan") == []


def test_a_failing_insert_leaves_the_counters_unchanged(store: Store) -> None:
    store.create_session("s1", "cli")
    store.append_message("s1", NewMessage("user", "kept", tool_calls=TWO_CALLS))
    assert _counters(store, "s1") == (1, 2)

    bad = NewMessage(None, "role violates NOT NULL", tool_calls=TWO_CALLS)  # type: ignore[arg-type]
    with pytest.raises(IntegrityError, match=r"NOT NULL constraint failed: messages\.role"):
        store.append_message("s1", bad)
    assert _counters(store, "s1") == (1, 2)

    # A batch is one transaction: a bad row at the end takes the good ones with it.
    good = NewMessage("assistant", "would be lost", tool_calls=TWO_CALLS)
    with pytest.raises(IntegrityError):
        store.append_messages("s1", [good, good, bad])
    assert _counters(store, "s1") == (1, 2)
    assert [m.content for m in store.messages("s1")] == ["kept"]


def test_append_messages_batch_returns_ids_in_order(store: Store) -> None:
    store.create_session("s1", "cli")
    batch = [
        NewMessage("system", "be brief", timestamp=1.0),
        NewMessage("user", "list files", timestamp=2.0),
        NewMessage("assistant", None, tool_calls=TWO_CALLS, timestamp=3.0),
        NewMessage("tool", "a.txt b.txt", tool_name="terminal", tool_call_id="c1", timestamp=4.0),
        NewMessage("tool", "contents", tool_name="read_file", tool_call_id="c2", timestamp=4.0),
    ]
    ids = store.append_messages("s1", batch)
    assert ids == list(range(ids[0], ids[0] + len(batch)))
    assert _counters(store, "s1") == (5, 2)
    stored = store.messages("s1")
    assert [m.id for m in stored] == ids
    assert [(m.role, m.content, m.tool_name) for m in stored] == [
        (m.role, m.content, m.tool_name) for m in batch
    ]
    # A generator works as well, and an empty batch changes nothing.
    more = store.append_messages("s1", (NewMessage("user", f"m{i}") for i in range(3)))
    assert len(more) == 3
    assert store.append_messages("s1", []) == []
    assert _counters(store, "s1") == (8, 2)


def test_multimodal_content_is_stored_with_the_legacy_prefix(
    store: Store, store_file: Path
) -> None:
    parts = [
        {"type": "text", "text": "what is in this picture"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    store.create_session("s1", "cli")
    message_id = store.append_message("s1", NewMessage("user", parts))
    [stored] = store.messages("s1")
    assert stored.content == MULTIMODAL_PREFIX + json.dumps(parts)
    with sqlite3.connect(store_file) as raw:
        (blob,) = raw.execute(
            "SELECT CAST(content AS BLOB) FROM messages WHERE id = ?", (message_id,)
        ).fetchone()
        assert blob.startswith(b"\x00json:[")
        assert json.loads(blob[len(b"\x00json:") :]) == parts
        # The text parts are searchable and the indexes agree with the view.
        assert _fts_rowids(raw, "messages_fts", "picture") == [message_id]
        for table in FTS_TABLES:
            _integrity_check(raw, table)


# -- end / delete --------------------------------------------------------------------


def test_end_session_sets_ended_at_and_reason(store: Store) -> None:
    store.create_session("s1", "cli", started_at=10.0)
    store.create_session("s2", "cli", started_at=20.0)
    store.end_session("s1", "user_exit", ended_at=50.0)
    before = time.time()
    store.end_session("s2", "compression")
    s1, s2 = store.get_session("s1"), store.get_session("s2")
    assert s1 is not None
    assert s2 is not None
    assert (s1.ended_at, s1.end_reason) == (50.0, "user_exit")
    assert s2.end_reason == "compression"
    assert s2.ended_at is not None
    assert s2.ended_at >= before


def test_end_session_of_a_missing_session_raises(store: Store) -> None:
    with pytest.raises(SessionNotFound, match="ghost"):
        store.end_session("ghost", "user_exit")


def test_delete_session_removes_messages_usage_and_index_entries(
    store: Store, store_file: Path
) -> None:
    store.create_session("parent", "cli", started_at=1.0, title="to delete")
    store.create_session("child", "cli", started_at=2.0, parent_session_id="parent")
    store.create_session("other", "telegram", started_at=3.0)
    gone = store.append_messages(
        "parent",
        [
            NewMessage("user", "the zebrafish genome", timestamp=1.0),
            NewMessage("assistant", None, tool_calls=TWO_CALLS, timestamp=2.0),
            NewMessage("tool", "output", tool_name="quokkatool", timestamp=3.0),
            NewMessage("user", [{"type": "text", "text": "zebrafish picture"}], timestamp=4.0),
        ],
    )
    kept = store.append_message("child", NewMessage("user", "axolotl facts", timestamp=5.0))
    with store.writer() as db, db.begin():
        db.add_all(
            [
                SessionModelUsage(session_id="parent", model="m1", input_tokens=10),
                SessionModelUsage(session_id="parent", model="m2", input_tokens=20),
                SessionModelUsage(session_id="other", model="m1", input_tokens=30),
            ]
        )

    assert store.delete_session("parent") == len(gone)

    assert store.get_session("parent") is None
    child = store.get_session("child")
    assert child is not None
    assert child.parent_session_id is None
    assert [m.id for m in store.messages("child")] == [kept]
    assert store.messages("parent") == []
    with store.session() as db:
        usage = db.execute(select(SessionModelUsage.session_id, SessionModelUsage.model)).all()
    assert [tuple(row) for row in usage] == [("other", "m1")]

    with sqlite3.connect(store_file) as raw:
        for token in ("zebrafish", "quokkatool", "terminal", "genome"):
            assert _fts_rowids(raw, "messages_fts", token) == [], token
        assert _fts_rowids(raw, "messages_fts_trigram", "ebrafis") == []
        assert _fts_rowids(raw, "messages_fts", "axolotl") == [kept]
        assert _fts_rowids(raw, "messages_fts_trigram", "xolot") == [kept]
        for table in FTS_TABLES:
            _integrity_check(raw, table)
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []


def test_delete_session_of_a_missing_session_raises(store: Store) -> None:
    store.create_session("s1", "cli")
    with pytest.raises(SessionNotFound, match="ghost"):
        store.delete_session("ghost")
    assert store.get_session("s1") is not None


# -- reads ---------------------------------------------------------------------------


def test_messages_are_in_timestamp_then_id_order(store: Store) -> None:
    store.create_session("s1", "cli")
    late = store.append_message("s1", NewMessage("user", "late", timestamp=30.0))
    early = store.append_message("s1", NewMessage("user", "early", timestamp=10.0))
    tie_a, tie_b = store.append_messages(
        "s1",
        [NewMessage("user", "tie a", timestamp=20.0), NewMessage("user", "tie b", timestamp=20.0)],
    )
    assert [m.id for m in store.messages("s1")] == [early, tie_a, tie_b, late]


def test_messages_without_inactive_hide_rewound_but_keep_compacted(store: Store) -> None:
    store.create_session("s1", "cli")
    live, rewound, compacted = store.append_messages(
        "s1",
        [
            NewMessage("user", "live", timestamp=1.0),
            NewMessage("user", "rewound", timestamp=2.0),
            NewMessage("user", "compacted", timestamp=3.0),
        ],
    )
    assert store.set_message_flags([rewound], active=False) == 1
    assert store.set_message_flags([compacted], active=False, compacted=True) == 1
    assert store.set_message_flags([], active=False) == 0
    assert [m.id for m in store.messages("s1")] == [live, rewound, compacted]
    assert [m.id for m in store.messages("s1", include_inactive=False)] == [live, compacted]
    assert store.messages("other") == []


def test_edit_message_reindexes_and_missing_message_raises(store: Store, store_file: Path) -> None:
    store.create_session("s1", "cli")
    message_id = store.append_message("s1", NewMessage("user", "original wording"))
    store.edit_message(message_id, "revised wording")
    with pytest.raises(StoreError, match="no message"):
        store.edit_message(message_id + 100, "x")
    with sqlite3.connect(store_file) as raw:
        assert _fts_rowids(raw, "messages_fts", "original") == []
        assert _fts_rowids(raw, "messages_fts", "revised") == [message_id]
        for table in FTS_TABLES:
            _integrity_check(raw, table)


def test_list_sessions_newest_first_with_counts_filter_and_paging(store: Store) -> None:
    for i, source in enumerate(["cli", "telegram", "cli", "discord", "cli"]):
        store.create_session(f"s{i}", source, started_at=100.0 + i, model=f"m{i}")
    store.append_messages("s2", [NewMessage("user", "a"), NewMessage("assistant", "b")])
    store.append_message("s2", NewMessage("assistant", None, tool_calls=TWO_CALLS))
    store.end_session("s2", "done", ended_at=500.0)

    listed = store.list_sessions()
    assert [s.id for s in listed] == ["s4", "s3", "s2", "s1", "s0"]
    s2 = listed[2]
    assert (s2.source, s2.model, s2.started_at, s2.ended_at) == ("cli", "m2", 102.0, 500.0)
    assert (s2.message_count, s2.tool_call_count) == (3, 2)
    assert all(s.message_count == 0 for s in listed if s.id != "s2")

    assert [s.id for s in store.list_sessions(source="cli")] == ["s4", "s2", "s0"]
    assert store.list_sessions(source="slack") == []
    assert [s.id for s in store.list_sessions(limit=2)] == ["s4", "s3"]
    assert [s.id for s in store.list_sessions(limit=2, offset=2)] == ["s2", "s1"]
    assert [s.id for s in store.list_sessions(source="cli", limit=1, offset=1)] == ["s2"]


def test_orm_relationships_messages_parent_children(store: Store) -> None:
    store.create_session("root", "cli", started_at=1.0)
    store.create_session("c1", "cli", started_at=2.0, parent_session_id="root")
    store.create_session("c2", "cli", started_at=3.0, parent_session_id="root")
    second = store.append_message("root", NewMessage("assistant", "second", timestamp=20.0))
    first = store.append_message("root", NewMessage("user", "first", timestamp=10.0))

    with store.session() as db:
        root = db.get(AgentSession, "root")
        assert root is not None
        assert [m.id for m in root.messages] == [first, second]
        assert all(m.session is root for m in root.messages)
        assert sorted(c.id for c in root.children) == ["c1", "c2"]
        assert root.parent is None
        child = db.get(AgentSession, "c1")
        assert child is not None
        assert child.parent is root
        assert child.messages == []


def test_writer_sessions_can_write_through_the_orm(store: Store) -> None:
    store.create_session("s1", "cli")
    with store.writer() as db, db.begin():
        row = db.get(AgentSession, "s1")
        assert row is not None
        row.title = "Renamed"
    stored = store.get_session("s1")
    assert stored is not None
    assert stored.title == "Renamed"


# -- INSERT OR REPLACE and recursive_triggers ----------------------------------------

REPLACE = (
    "INSERT OR REPLACE INTO messages(id, session_id, role, content, timestamp) "
    "VALUES (?, 's1', 'user', 'replacement narwhal text', 9.0)"
)


def _seed_for_replace(store: Store) -> int:
    store.create_session("s1", "cli")
    store.append_message("s1", NewMessage("user", "other text", timestamp=1.0))
    return store.append_message("s1", NewMessage("user", "original pelican text", timestamp=2.0))


def test_insert_or_replace_on_the_engine_leaves_no_stale_index_entries(store: Store) -> None:
    message_id = _seed_for_replace(store)
    raw = store.engine.raw_connection()
    try:
        assert raw.execute("PRAGMA recursive_triggers").fetchone()[0] == 1
        raw.execute(REPLACE, (message_id,))  # autocommit: the engine's driver mode
        assert _fts_rowids(raw, "messages_fts", "pelican") == []
        assert _fts_rowids(raw, "messages_fts_trigram", "elica") == []
        assert _fts_rowids(raw, "messages_fts", "narwhal") == [message_id]
        for table in FTS_TABLES:
            _integrity_check(raw, table)
    finally:
        raw.close()
    assert [m.content for m in store.messages("s1")][-1] == "replacement narwhal text"


def test_insert_or_replace_without_recursive_triggers_corrupts_the_index(
    store: Store, store_file: Path
) -> None:
    """Why the engine sets recursive_triggers: without it the delete triggers do not fire."""
    message_id = _seed_for_replace(store)
    store.close()
    raw = sqlite3.connect(store_file)
    try:
        assert raw.execute("PRAGMA recursive_triggers").fetchone()[0] == 0
        raw.execute(REPLACE, (message_id,))
        # The old text's entries are still in the index, pointing at the replaced row...
        assert _fts_rowids(raw, "messages_fts", "pelican") == [message_id]
        # ...and the FTS5 check against the content view notices.
        for table in FTS_TABLES:
            with pytest.raises(sqlite3.DatabaseError, match="malformed"):
                _integrity_check(raw, table)
    finally:
        raw.rollback()
        raw.close()

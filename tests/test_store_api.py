"""The typed write/read API (`Store`, its records and errors) on a store created at head."""

from __future__ import annotations

import dataclasses
import json
import logging
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
from hermes_store.engine import create_store_engine
from hermes_store.errors import StoreError
from hermes_store.models import AgentSession, Base, Message, SessionModelUsage
from hermes_store.records import row_reader
from hermes_store.store import (
    MULTIMODAL_PREFIX,
    AgentSessionRecord,
    MessageRecord,
    NewMessage,
    SessionExists,
    SessionNotFound,
    SessionSummary,
    Store,
    TitleTaken,
)

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


#: Tests that look at the SQLite file or its FTS5 tables themselves: SQLite only.
_SQLITE_FIXTURES = {"store_file"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test of the API alone runs on both databases; one that reads SQLite's own
    tables (it asks for ``store_file``, or is marked ``sqlite_only``) on SQLite."""
    if "store" not in metafunc.fixturenames:
        return
    databases: list[Any] = ["sqlite"]
    sqlite_only = metafunc.definition.get_closest_marker("sqlite_only") is not None
    if not (_SQLITE_FIXTURES & set(metafunc.fixturenames)) and not sqlite_only:
        databases.append(pytest.param("postgresql", marks=pytest.mark.postgresql))
    metafunc.parametrize("store", databases, indirect=True)


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The store API over a fresh head store: a SQLite file, or a PostgreSQL database."""
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
        migrate.upgrade(url)
    else:
        url = str(request.getfixturevalue("store_file"))
    with Store.open(url) as opened:
        yield opened


def _counters(store: Store, session_id: str) -> tuple[int | None, int | None]:
    row = store.get_session(session_id)
    assert row is not None
    return row.message_count, row.tool_call_count


def _message_total(store: Store) -> int:
    with store.orm_session() as db:
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
    # The returned record is usable after its transaction: server defaults were fetched.
    assert isinstance(row, AgentSessionRecord)
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
    if store.engine.dialect.name != "sqlite":
        return  # PostgreSQL's search indexes are over messages themselves
    with store.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert _fts_rowids(raw, "messages_fts", "orphan") == []


def test_a_failing_insert_leaves_the_counters_unchanged(store: Store) -> None:
    store.create_session("s1", "cli")
    store.append_message("s1", NewMessage("user", "kept", tool_calls=TWO_CALLS))
    assert _counters(store, "s1") == (1, 2)

    bad = NewMessage(None, "private words", tool_calls=TWO_CALLS)  # type: ignore[arg-type]
    not_null = r"NOT NULL constraint failed: messages\.role|null value in column \"role\""
    with pytest.raises(IntegrityError, match=not_null) as raised:
        store.append_message("s1", bad)
    # PostgreSQL's DETAIL quotes the failing row: never in the error's text.
    assert "private words" not in str(raised.value)
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
    with store.orm_writer() as db, db.begin():
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
    with store.orm_session() as db:
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

    with store.orm_session() as db:
        root = db.get(AgentSession, "root")
        assert root is not None
        transcript = db.scalars(root.messages.select()).all()
        assert [m.id for m in transcript] == [first, second]
        assert all(m.session is root for m in transcript)
        assert [m.id for m in db.scalars(root.messages.select().limit(1))] == [first]
        assert sorted(c.id for c in root.children) == ["c1", "c2"]
        assert root.parent is None
        child = db.get(AgentSession, "c1")
        assert child is not None
        assert child.parent is root
        assert db.scalars(child.messages.select()).all() == []


def test_a_transcript_is_never_loaded_by_accident(store: Store) -> None:
    """`AgentSession.messages` is write-only: no attribute access loads a whole transcript."""
    store.create_session("s1", "cli")
    store.append_messages("s1", [NewMessage("user", f"m{i}") for i in range(3)])
    with store.orm_session() as db:
        row = db.get(AgentSession, "s1")
        assert row is not None
        with pytest.raises(TypeError, match="select"):
            list(row.messages)
        with pytest.raises(TypeError):
            len(row.messages)  # type: ignore[arg-type]
        # The session's own columns still load; the transcript only when asked for.
        assert row.message_count == 3
        assert len(db.scalars(row.messages.select()).all()) == 3


def test_writer_sessions_can_write_through_the_orm(store: Store) -> None:
    store.create_session("s1", "cli")
    with store.orm_writer() as db, db.begin():
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


@pytest.mark.sqlite_only
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


# -- the project's errors ------------------------------------------------------------


def test_the_store_errors_are_the_projects_and_importable_from_both_modules() -> None:
    from hermes_store import errors, store

    for name in ("SessionExists", "SessionNotFound", "TitleTaken", "StoreError"):
        assert getattr(store, name) is getattr(errors, name)
        assert issubclass(getattr(errors, name), errors.StoreError)
        assert name in store.__all__


def test_create_session_with_a_taken_id_raises_session_exists(store: Store) -> None:
    store.create_session("s1", "cli", title="First", started_at=1.0)
    store.append_message("s1", NewMessage("user", "kept"))
    with pytest.raises(SessionExists, match=r"session 's1' already exists: append to it"):
        store.create_session("s1", "telegram", title="Second")
    stored = store.get_session("s1")
    assert stored is not None
    assert (stored.source, stored.title, stored.message_count) == ("cli", "First", 1)
    assert [s.id for s in store.list_sessions()] == ["s1"]


def test_create_session_with_a_taken_title_raises_title_taken(store: Store) -> None:
    store.create_session("s1", "cli", title="Standup notes")
    with pytest.raises(TitleTaken, match=r"'Standup notes'.*pick another one"):
        store.create_session("s2", "cli", title="Standup notes")
    assert store.get_session("s2") is None
    # Untitled sessions never collide.
    store.create_session("s3", "cli")
    store.create_session("s4", "cli")


def test_create_session_under_a_missing_parent_raises_session_not_found(store: Store) -> None:
    with pytest.raises(SessionNotFound, match="no parent session 'ghost': create it first"):
        store.create_session("child", "cli", parent_session_id="ghost")
    assert store.get_session("child") is None
    store.create_session("parent", "cli")
    child = store.create_session("child", "cli", parent_session_id="parent")
    assert child.parent_session_id == "parent"


def test_writes_to_a_missing_session_raise_session_not_found(store: Store) -> None:
    for write in (
        lambda: store.append_messages("ghost", [NewMessage("user", "x")]),
        lambda: store.append_messages("ghost", []),
        lambda: store.end_session("ghost", "user_exit"),
        lambda: store.delete_session("ghost"),
    ):
        with pytest.raises(SessionNotFound, match="ghost"):
            write()
    assert store.get_session("ghost") is None
    assert store.messages("ghost") == []


# -- returned values outlive their session -------------------------------------------


def test_returned_records_are_usable_after_the_store_is_closed(store_file: Path) -> None:
    with Store.open(str(store_file)) as store:
        created = store.create_session("s1", "cli", model="m", started_at=5.0)
        store.append_messages(
            "s1",
            [
                NewMessage("user", "hello", timestamp=6.0),
                NewMessage("assistant", None, tool_calls=TWO_CALLS, timestamp=7.0),
            ],
        )
        fetched = store.get_session("s1")
        transcript = store.messages("s1")
        listed = store.list_sessions()
    # The store (its engine, its sessions) is gone; every value still reads.
    assert fetched is not None
    assert (created.id, created.model, created.started_at, created.message_count) == (
        "s1",
        "m",
        5.0,
        0,
    )
    assert (fetched.message_count, fetched.tool_call_count, fetched.ended_at) == (2, 2, None)
    assert [(m.role, m.content) for m in transcript] == [("user", "hello"), ("assistant", None)]
    assert all(isinstance(m, MessageRecord) for m in transcript)
    assert json.loads(transcript[1].tool_calls or "") == TWO_CALLS
    assert (transcript[0].active, transcript[0].compacted, transcript[0].compressed_summary) == (
        1,
        0,
        0,
    )
    assert listed[0].message_count == 2
    assert "AgentSessionRecord(id='s1'" in repr(fetched)
    # Records are values: nothing to load lazily, nothing to write back by mistake.
    assert not hasattr(fetched, "messages")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fetched.title = "changed"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("record", "model"),
    [pytest.param(AgentSessionRecord, AgentSession), pytest.param(MessageRecord, Message)],
)
def test_records_carry_every_column_of_their_table(record: type, model: type[Base]) -> None:
    names = {f.name for f in dataclasses.fields(record)}
    columns = {c.name.lstrip("_") for c in model.__table__.columns}
    assert names == columns


# -- the counters, whatever the write path ---------------------------------------------


def test_orm_writer_keeps_the_counters_for_added_moved_and_deleted_messages(
    store: Store,
) -> None:
    store.create_session("a", "cli")
    store.create_session("b", "cli")
    store.append_message("a", NewMessage("user", "through the API"))

    with store.orm_writer() as db, db.begin():
        a = db.get(AgentSession, "a")
        assert a is not None
        # Several new messages in one flush, three ways of attaching them.
        db.add_all(
            [
                Message(session_id="a", role="user", content="one", timestamp=1.0),
                Message(
                    session_id="a",
                    role="assistant",
                    tool_calls=json.dumps(TWO_CALLS),
                    timestamp=2.0,
                ),
            ]
        )
        a.messages.add(Message(role="tool", content="out", timestamp=3.0))
        db.add(Message(session=a, role="user", content="four", timestamp=4.0))
    assert _counters(store, "a") == (5, 2)

    with store.orm_writer() as db, db.begin():
        [calls] = db.scalars(select(Message).where(Message.tool_calls.is_not(None))).all()
        db.expire(calls)  # its old session is loaded before the change all the same
        calls.session_id = "b"  # moved: its share moves with it
    assert (_counters(store, "a"), _counters(store, "b")) == ((4, 0), (1, 2))

    with store.orm_writer() as db, db.begin():
        [calls] = db.scalars(select(Message).where(Message.session_id == "b")).all()
        calls.tool_calls = json.dumps(TWO_CALLS[:1])  # one call fewer
        [four] = db.scalars(select(Message).where(Message.content == "four")).all()
        db.delete(four)
    assert (_counters(store, "a"), _counters(store, "b")) == ((3, 0), (1, 1))

    # An expired object (its values unknown to the session) is deleted just as right, and
    # so is one moved and deleted in the same flush: its row counted for its old session.
    with store.orm_writer() as db, db.begin():
        [one] = db.scalars(select(Message).where(Message.content == "one")).all()
        db.expire(one)
        db.delete(one)
    assert _counters(store, "a") == (2, 0)
    with store.orm_writer() as db, db.begin():
        [out] = db.scalars(select(Message).where(Message.content == "out")).all()
        out.session_id = "b"
        out.tool_calls = json.dumps(TWO_CALLS)
        db.delete(out)
    assert (_counters(store, "a"), _counters(store, "b")) == ((1, 0), (1, 1))

    # A rolled-back flush takes its counter change with it.
    with store.orm_writer() as db:
        with db.begin():
            db.add(Message(session_id="a", role="user", content="undone", timestamp=9.0))
            db.flush()
            db.rollback()
    assert _counters(store, "a") == (1, 0)
    with store.orm_session() as db:
        counted = db.execute(
            select(Message.session_id, func.count()).group_by(Message.session_id)
        ).all()
    assert sorted(tuple(row) for row in counted) == [("a", 1), ("b", 1)]


def _rows(store_file: Path, session_id: str) -> list[dict[str, Any]]:
    """Every column of a session's messages, ids made relative to the first one."""
    with sqlite3.connect(store_file) as raw:
        raw.row_factory = sqlite3.Row
        rows = [
            dict(row)
            for row in raw.execute(
                "SELECT * FROM messages WHERE session_id = ? ORDER BY id", (session_id,)
            )
        ]
    for row in rows:
        row.pop("session_id")
        row["display_order"] -= row.pop("id")
    return rows


def test_append_messages_writes_what_one_by_one_appends_and_the_orm_write(
    store: Store, store_file: Path
) -> None:
    batch = [
        NewMessage("system", "be brief", timestamp=1.0),
        NewMessage("user", [{"type": "text", "text": "look"}], timestamp=2.0, token_count=3),
        NewMessage(
            "assistant",
            None,
            tool_calls=TWO_CALLS,
            timestamp=3.0,
            finish_reason="tool_calls",
            reasoning="think",
        ),
        NewMessage("tool", "a.txt", tool_name="terminal", tool_call_id="c1", timestamp=4.0),
        NewMessage("user", "edited", timestamp=5.0, platform_message_id="p-1"),
        NewMessage("assistant", "bad json", tool_calls="{not json", timestamp=6.0),
    ]
    for session_id in ("batch", "single", "orm"):
        store.create_session(session_id, "cli")
    store.append_messages("batch", batch)
    for message in batch:
        store.append_message("single", message)
    # What the ORM writes for the same values (the write path before the bulk insert).
    with store.orm_writer() as db, db.begin():
        for m in batch:
            calls = json.dumps(m.tool_calls) if isinstance(m.tool_calls, list) else m.tool_calls
            content = m.content
            if isinstance(content, list):
                content = MULTIMODAL_PREFIX + json.dumps(content)
            db.add(
                Message(
                    session_id="orm",
                    role=m.role,
                    content=content,
                    tool_calls=calls,
                    tool_name=m.tool_name,
                    tool_call_id=m.tool_call_id,
                    timestamp=m.timestamp,
                    token_count=m.token_count,
                    finish_reason=m.finish_reason,
                    reasoning=m.reasoning,
                    platform_message_id=m.platform_message_id,
                )
            )
    expected = _rows(store_file, "batch")
    assert len(expected) == len(batch)
    assert _rows(store_file, "single") == expected
    assert _rows(store_file, "orm") == expected
    assert _counters(store, "batch") == _counters(store, "single") == _counters(store, "orm")
    assert _counters(store, "batch") == (6, 2)
    with sqlite3.connect(store_file) as raw:
        for table in FTS_TABLES:
            _integrity_check(raw, table)


def test_a_large_batch_keeps_ids_in_order_across_statements(store: Store) -> None:
    """More rows than one multi-row INSERT takes: ids still follow the given order."""
    store.create_session("s1", "cli")
    store.append_message("s1", NewMessage("user", "before"))
    batch = [NewMessage("user", f"message {i}", timestamp=float(2500 - i)) for i in range(2500)]
    ids = store.append_messages("s1", batch)
    assert ids == list(range(ids[0], ids[0] + len(batch)))
    by_id = {m.id: m.content for m in store.messages("s1")}
    assert [by_id[i] for i in ids] == [m.content for m in batch]
    assert _counters(store, "s1") == (2501, 0)


# -- names, search ---------------------------------------------------------------------


def test_the_old_orm_session_names_still_work_with_a_deprecation_warning(store: Store) -> None:
    store.create_session("s1", "cli")
    with pytest.deprecated_call(match=r"orm_session\(\)"), store.session() as db:
        assert db.get(AgentSession, "s1") is not None
    with pytest.deprecated_call(match=r"orm_writer\(\)"), store.writer() as db, db.begin():
        db.add(Message(session_id="s1", role="user", content="hi", timestamp=1.0))
    assert _counters(store, "s1") == (1, 0)


def test_search_finds_messages_with_the_search_contract(store: Store) -> None:
    store.create_session("cli-1", "cli", started_at=1.0, model="m1")
    store.create_session("tg-1", "telegram", started_at=2.0)
    first = store.append_message("cli-1", NewMessage("user", "the zebrafish genome", timestamp=3.0))
    store.append_message("cli-1", NewMessage("assistant", "a reply", timestamp=4.0))
    other = store.append_message("tg-1", NewMessage("user", "zebrafish again", timestamp=5.0))
    hidden = store.append_message("tg-1", NewMessage("user", "zebrafish rewound", timestamp=6.0))
    store.set_message_flags([hidden], active=False)

    hits = store.search("zebrafish")
    assert sorted(h["id"] for h in hits) == [first, other]
    assert hits.degraded is None
    hit = next(h for h in hits if h["id"] == first)
    assert (hit["session_id"], hit["source"], hit["model"], hit["role"]) == (
        "cli-1",
        "cli",
        "m1",
        "user",
    )
    assert hit["snippet"] is not None
    assert "zebrafish" in hit["snippet"]
    assert [c["content"] for c in hit["context"]] == ["the zebrafish genome", "a reply"]
    assert [h["id"] for h in store.search("zebrafish", source_filter=["telegram"])] == [other]
    assert [h["id"] for h in store.search("zebrafish", exclude_sources=["telegram"])] == [first]
    assert store.search("zebrafish", role_filter=["assistant"]) == []
    assert len(store.search("zebrafish", include_inactive=True)) == 3
    assert len(store.search("zebrafish", limit=1)) == 1
    assert store.search("axolotl") == []


# -- the prepared hot paths --------------------------------------------------------------


def test_records_read_from_rows_are_the_records_init_makes() -> None:
    rows = [tuple(range(len(dataclasses.fields(MessageRecord)))), tuple("abcdefghi")]
    [message] = row_reader(MessageRecord)(rows[:1])
    [summary] = row_reader(SessionSummary)(rows[1:])
    for read, made in ((message, MessageRecord(*rows[0])), (summary, SessionSummary(*rows[1]))):
        assert type(read) is type(made)
        assert read == made
        assert repr(read) == repr(made)
        assert hash(read) == hash(made)
        with pytest.raises(dataclasses.FrozenInstanceError):
            read.id = "changed"  # type: ignore[misc]


def test_create_session_refuses_columns_it_does_not_know(store: Store) -> None:
    with pytest.raises(TypeError, match="'colour' is an invalid keyword argument"):
        store.create_session("s1", "cli", colour="blue")
    with pytest.raises(TypeError, match="multiple values for 'message_count'"):
        store.create_session("s1", "cli", message_count=5)
    assert store.get_session("s1") is None


def test_the_store_statements_are_logged_without_their_parameters(
    store_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Store(create_store_engine(store_file, create=False, echo=True)) as store:
        with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"):
            store.create_session("s1", "cli")
            store.append_message("s1", NewMessage("user", "secret words"))
            store.messages("s1")
    logged = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("INSERT INTO messages") for line in logged), logged
    assert any(line.startswith("SELECT id, session_id") for line in logged), logged
    assert not any("secret" in line for line in logged)

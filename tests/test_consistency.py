"""Writes on a converted (external-content) store keep both FTS5 indexes exact.

The triggers of revision 22 must 'delete' exactly the text they indexed: inserting, editing
`content`, `tool_name` or `tool_calls`, deleting messages and whole sessions, and
`INSERT OR REPLACE` must leave no stale entry and miss no new one, while flag updates
(`active`, `compacted`, `observed`) must not touch the index at all. Checked through the
Store API, the engine's connections and plain sqlite3 (what the legacy application uses),
then by a stateful hypothesis test against a naive oracle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from legacy.build import build_legacy_store
from migration_support import clone
from sqlalchemy import Connection, select, text
from sqlalchemy.dialects.postgresql import insert as insert_pg

from hermes_store import migrate
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.models import Message
from hermes_store.search import search_messages
from hermes_store.sqlite import fts
from hermes_store.store import NewMessage, Store, encode_content

WORD, TRIGRAM = "messages_fts", "messages_fts_trigram"
INDEXES = (WORD, TRIGRAM)
SHADOWS = ("_data", "_idx", "_docsize", "_config")
SESSION = "consistency"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def rowids(conn: Connection, index: str, phrase: str) -> list[int]:
    """Rowids an index returns for one quoted phrase (the index itself, no filters)."""
    quoted = '"' + phrase.replace('"', '""') + '"'
    return list(
        conn.exec_driver_sql(
            f"SELECT rowid FROM {index} WHERE {index} MATCH ? ORDER BY rowid", (quoted,)
        ).scalars()
    )


def shadow_digest(conn: Connection) -> str:
    """SHA-256 of every row of both indexes' shadow tables."""
    digest = hashlib.sha256()
    for index in INDEXES:
        for suffix in SHADOWS:
            for row in conn.exec_driver_sql(f"SELECT * FROM {index}{suffix} ORDER BY 1"):
                digest.update(repr((index, suffix, tuple(row))).encode())
    return digest.hexdigest()


def assert_exact(conn: Connection) -> None:
    """PRAGMA integrity_check and both FTS5 'integrity-check' (rank 1) pass."""
    result = fts.integrity_check(conn)
    assert result.checked == ["PRAGMA integrity_check", *INDEXES]
    assert result.ok, result.problems
    messages = conn.exec_driver_sql("SELECT count(*) FROM messages").scalar_one()
    for index in INDEXES:
        assert conn.exec_driver_sql(f"SELECT count(*) FROM {index}_docsize").scalar_one() == (
            messages
        )


@pytest.fixture(scope="module")
def converted_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A legacy store at 21 with a corpus, upgraded in place to 22."""
    path = tmp_path_factory.mktemp("consistency") / "converted.db"
    build_legacy_store(path, 21)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(500, seed=3))
    migrate.upgrade(path)
    return path


@pytest.fixture
def store_file(converted_template: Path, tmp_path: Path) -> Path:
    return clone(converted_template, tmp_path / "state.db")


@pytest.fixture
def store(store_file: Path) -> Iterator[Store]:
    with Store.open(store_file) as opened:
        with opened.engine.connect() as conn:
            assert fts.layout(conn) == "external"
        opened.create_session(SESSION, "telegram", started_at=9e9)
        yield opened


@contextlib.contextmanager
def legacy_connection(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection as the legacy application opens it (no recursive triggers)."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


OLD = {
    "content": "oldcontentzz 旧内容甲乙丙",
    "tool_name": "oldtoolnamezz",
    "tool_calls": '[{"function": {"name": "oldcallzz", "arguments": "旧调用丁戊己"}}]',
}
NEW = {
    "content": "newcontentzz 新内容庚辛壬",
    "tool_name": "newtoolnamezz",
    "tool_calls": '[{"function": {"name": "newcallzz", "arguments": "新调用癸子丑"}}]',
}
#: A word-index token and a trigram-index phrase of each column's value.
TOKENS = {
    "OLD": {
        "content": ("oldcontentzz", "旧内容甲"),
        "tool_name": ("oldtoolnamezz", "dtoolnamez"),
        "tool_calls": ("oldcallzz", "旧调用丁"),
    },
    "NEW": {
        "content": ("newcontentzz", "新内容庚"),
        "tool_name": ("newtoolnamezz", "wtoolnamez"),
        "tool_calls": ("newcallzz", "新调用癸"),
    },
}


def _append_old(store: Store) -> int:
    return store.append_message(
        SESSION,
        NewMessage(
            "assistant",
            OLD["content"],
            tool_name=OLD["tool_name"],
            tool_calls=OLD["tool_calls"],
            timestamp=9e9 + 1,
        ),
    )


def _found(conn: Connection, which: str, column: str) -> tuple[list[int], list[int]]:
    word, trigram = TOKENS[which][column]
    return rowids(conn, WORD, word), rowids(conn, TRIGRAM, trigram)


# --------------------------------------------------------------------------------------------
# One write at a time
# --------------------------------------------------------------------------------------------


def test_an_appended_message_is_indexed_from_every_column(store: Store) -> None:
    message_id = _append_old(store)
    with store.engine.connect() as conn:
        for column in OLD:
            assert _found(conn, "OLD", column) == ([message_id], [message_id])
        hits = search_messages(conn, "oldcallzz")
        assert [hit["id"] for hit in hits] == [message_id]
        assert [hit["id"] for hit in search_messages(conn, "旧内容甲乙")] == [message_id]
        assert_exact(conn)


@pytest.mark.parametrize("column", ["content", "tool_name", "tool_calls"])
@pytest.mark.parametrize("writer", ["store-api", "engine", "legacy-sqlite3"])
def test_updating_one_text_column_reindexes_exactly(
    store: Store, store_file: Path, column: str, writer: str
) -> None:
    message_id = _append_old(store)
    if writer == "store-api" and column == "content":
        store.edit_message(message_id, NEW["content"])
    elif writer in ("store-api", "engine"):
        with store.engine.begin() as conn:
            conn.exec_driver_sql(
                f"UPDATE messages SET {column} = ? WHERE id = ?", (NEW[column], message_id)
            )
    else:
        with legacy_connection(store_file) as raw:
            raw.execute(f"UPDATE messages SET {column} = ? WHERE id = ?", (NEW[column], message_id))

    with store.engine.connect() as conn:
        assert _found(conn, "OLD", column) == ([], [])
        assert _found(conn, "NEW", column) == ([message_id], [message_id])
        for other in OLD.keys() - {column}:  # the other columns stay indexed
            assert _found(conn, "OLD", other) == ([message_id], [message_id])
        assert search_messages(conn, TOKENS["OLD"][column][0]) == []
        assert [h["id"] for h in search_messages(conn, TOKENS["NEW"][column][0])] == [message_id]
        assert_exact(conn)


def test_updating_text_to_null_and_back_reindexes_exactly(store: Store) -> None:
    message_id = _append_old(store)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE messages SET content = NULL, tool_name = NULL, tool_calls = NULL WHERE id = ?",
            (message_id,),
        )
    with store.engine.connect() as conn:
        for column in OLD:
            assert _found(conn, "OLD", column) == ([], [])
        assert_exact(conn)
    store.edit_message(message_id, NEW["content"])
    with store.engine.connect() as conn:
        assert _found(conn, "NEW", "content") == ([message_id], [message_id])
        assert_exact(conn)


def test_multimodal_content_is_word_indexed_but_invisible_to_trigrams(store: Store) -> None:
    """A legacy quirk kept as is: SQLite's trigram tokenizer stops at the first NUL, and the
    multimodal prefix starts with one, so nothing of such a message (its tool columns
    included) is in the trigram index, whereas unicode61 reads past the NUL."""
    message_id = store.append_message(
        SESSION,
        NewMessage(
            "user", [{"type": "text", "text": "newcontentzz 新内容庚"}], tool_name="newtoolnamezz"
        ),
    )
    with store.engine.connect() as conn:
        assert _found(conn, "NEW", "content") == ([message_id], [])
        assert _found(conn, "NEW", "tool_name") == ([message_id], [])
        assert search_messages(conn, "新内容庚") == []
        assert_exact(conn)


def test_flag_updates_do_not_touch_the_index(store: Store, store_file: Path) -> None:
    message_id = _append_old(store)
    with store.engine.connect() as conn:
        before = shadow_digest(conn)
    word = TOKENS["OLD"]["content"][0]

    assert store.set_message_flags([message_id], active=False) == 1
    with store.engine.connect() as conn:
        assert shadow_digest(conn) == before
        assert search_messages(conn, word) == []  # rewound: hidden
        assert [h["id"] for h in search_messages(conn, word, include_inactive=True)] == [message_id]
    assert store.set_message_flags([message_id], compacted=True) == 1
    with store.engine.connect() as conn:
        assert shadow_digest(conn) == before
        assert [h["id"] for h in search_messages(conn, word)] == [message_id]  # archived

    # Plain sqlite3 counts every row a statement and its triggers change: one, the message.
    with legacy_connection(store_file) as raw:
        for assignment in ("active = 1", "compacted = 0", "observed = 1", "active = 0"):
            changes = raw.total_changes
            raw.execute(f"UPDATE messages SET {assignment} WHERE id = ?", (message_id,))
            assert raw.total_changes - changes == 1, assignment
        changes = raw.total_changes
        raw.execute("UPDATE messages SET content = content || ' x' WHERE id = ?", (message_id,))
        assert raw.total_changes - changes > 1  # a text update does go through the index
    with store.engine.connect() as conn:
        assert_exact(conn)


@pytest.mark.parametrize("writer", ["engine", "legacy-sqlite3"])
def test_deleting_messages_removes_their_entries(
    store: Store, store_file: Path, writer: str
) -> None:
    doomed = _append_old(store)
    kept = store.append_message(SESSION, NewMessage("user", "oldcontentzz stays 旧内容甲乙"))
    if writer == "engine":
        with store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM messages WHERE id = ?", (doomed,))
    else:
        with legacy_connection(store_file) as raw:
            raw.execute("DELETE FROM messages WHERE id = ?", (doomed,))
    with store.engine.connect() as conn:
        assert _found(conn, "OLD", "content") == ([kept], [kept])
        for column in ("tool_name", "tool_calls"):
            assert _found(conn, "OLD", column) == ([], [])
        assert_exact(conn)


def test_deleting_a_session_removes_every_entry_of_it(store: Store) -> None:
    ids = [
        _append_old(store),
        store.append_message(SESSION, NewMessage("tool", "oldcontentzz out", tool_name="terminal")),
    ]
    with store.engine.connect() as conn:
        assert rowids(conn, WORD, "oldcontentzz") == ids
        corpus_session = conn.exec_driver_sql(
            "SELECT session_id FROM messages WHERE session_id != ? GROUP BY session_id "
            "ORDER BY count(*) DESC LIMIT 1",
            (SESSION,),
        ).scalar_one()
        corpus_ids = (
            conn.exec_driver_sql("SELECT id FROM messages WHERE session_id = ?", (corpus_session,))
            .scalars()
            .all()
        )
    assert store.delete_session(SESSION) == 2
    assert store.delete_session(corpus_session) == len(corpus_ids)
    with store.engine.connect() as conn:
        for column in OLD:
            assert _found(conn, "OLD", column) == ([], [])
        left = set(
            conn.exec_driver_sql(f"SELECT rowid FROM {WORD} WHERE {WORD} MATCH 'the'").scalars()
        )
        assert left.isdisjoint(corpus_ids)
        assert_exact(conn)


def test_insert_or_replace_through_the_engine_leaves_no_stale_entry(store: Store) -> None:
    message_id = _append_old(store)
    with store.engine.begin() as conn:
        assert conn.exec_driver_sql("PRAGMA recursive_triggers").scalar_one() == 1
        conn.exec_driver_sql(
            "INSERT OR REPLACE INTO messages (id, session_id, role, content, timestamp) "
            "VALUES (?, ?, 'user', ?, 9e9)",
            (message_id, SESSION, NEW["content"]),
        )
    with store.engine.connect() as conn:
        for column in OLD:
            assert _found(conn, "OLD", column) == ([], [])
        assert _found(conn, "NEW", "content") == ([message_id], [message_id])
        assert_exact(conn)


# --------------------------------------------------------------------------------------------
# Stateful: random writes against a naive oracle
# --------------------------------------------------------------------------------------------

WORDS = ("alpha", "bravo", "charlie", "delta", "terminal")
CJK = ("数据库连接", "服务器配置", "テスト結果", "확인합니다")
WORD_QUERIES = ("alpha", "terminal", "function")
CJK_QUERIES = ("数据库", "テスト", "확인합")
SESSIONS = ("s0", "s1", "s2")

texts = st.lists(st.sampled_from(WORDS + CJK), max_size=4).map(" ".join)
contents = st.one_of(
    st.none(),
    texts,
    st.lists(texts, min_size=1, max_size=2).map(
        lambda parts: [{"type": "text", "text": part} for part in parts]
    ),
)
tool_names = st.one_of(st.none(), st.sampled_from(("terminal", "browser", "alpha", "服务器配置")))
tool_calls = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(WORDS + CJK), texts).map(
        lambda call: json.dumps(
            [{"type": "function", "function": {"name": call[0], "arguments": call[1]}}],
            ensure_ascii=False,
        )
    ),
)
flags = st.sampled_from([(1, 0), (0, 0), (0, 1), (1, 1)])


def indexed_expression(row: dict[str, Any]) -> str:
    return f"{row['content'] or ''} {row['tool_name'] or ''} {row['tool_calls'] or ''}"


def word_tokens(text: str) -> set[str]:
    """unicode61 on this vocabulary: runs of letters and digits, case-folded."""
    return set(re.findall(r"[^\W_]+", text.lower()))


def replaced_row(session: str, content: str | None) -> dict[str, Any]:
    """What the oracle holds for a message replaced by a bare user message."""
    return {
        "session_id": session,
        "content": content,
        "tool_name": None,
        "tool_calls": None,
        "active": 1,
        "compacted": 0,
    }


class IndexMachine(RuleBasedStateMachine):
    """Random writes through the Store API, the engine and plain sqlite3; search vs oracle."""

    template: Path | None = None
    workdir: Path | None = None
    examples = 0
    nonempty_answers = 0  # oracle answers with at least one id (the check is not vacuous)

    def __init__(self) -> None:
        super().__init__()
        assert self.template is not None
        assert self.workdir is not None
        type(self).examples += 1
        self.path = clone(self.template, self.workdir / f"machine-{self.examples}.db")
        self.store = Store.open(self.path)
        self.rows: dict[int, dict[str, Any]] = {}
        self.sessions: set[str] = set()
        self.clock = 1000.0

    def teardown(self) -> None:
        self.store.close()
        self.path.unlink()

    def _tick(self) -> float:
        self.clock += 1.0
        return self.clock

    def _pick(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(self.rows)), label="message")

    # -- rules ---------------------------------------------------------------------------

    @rule(session=st.sampled_from(SESSIONS))
    def create_session(self, session: str) -> None:
        if session not in self.sessions:
            self.store.create_session(session, "cli", started_at=self._tick())
            self.sessions.add(session)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), content=contents, tool_name=tool_names, calls=tool_calls)
    def append(self, data: st.DataObject, content: Any, tool_name: Any, calls: Any) -> None:
        session = data.draw(st.sampled_from(sorted(self.sessions)), label="session")
        message_id = self.store.append_message(
            session,
            NewMessage(
                "tool" if tool_name else "assistant",
                content,
                tool_name=tool_name,
                tool_calls=calls,
                timestamp=self._tick(),
            ),
        )
        self.rows[message_id] = {
            "session_id": session,
            "content": encode_content(content),
            "tool_name": tool_name,
            "tool_calls": calls,
            "active": 1,
            "compacted": 0,
        }

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), content=contents)
    def edit_content(self, data: st.DataObject, content: Any) -> None:
        message_id = self._pick(data)
        self.store.edit_message(message_id, content)
        self.rows[message_id]["content"] = encode_content(content)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), content=st.one_of(st.none(), texts))
    def edit_content_as_the_legacy_application(self, data: st.DataObject, content: Any) -> None:
        message_id = self._pick(data)
        with legacy_connection(self.path) as raw:
            raw.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))
        self.rows[message_id]["content"] = content

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), tool_name=tool_names)
    def edit_tool_name(self, data: st.DataObject, tool_name: Any) -> None:
        message_id = self._pick(data)
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE messages SET tool_name = ? WHERE id = ?", (tool_name, message_id)
            )
        self.rows[message_id]["tool_name"] = tool_name

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), calls=tool_calls)
    def edit_tool_calls(self, data: st.DataObject, calls: Any) -> None:
        message_id = self._pick(data)
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE messages SET tool_calls = ? WHERE id = ?", (calls, message_id)
            )
        self.rows[message_id]["tool_calls"] = calls

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), flag_values=flags)
    def set_flags(self, data: st.DataObject, flag_values: tuple[int, int]) -> None:
        message_id = self._pick(data)
        with self.store.engine.connect() as conn:
            before = shadow_digest(conn)
        active, compacted = flag_values
        self.store.set_message_flags([message_id], active=bool(active), compacted=bool(compacted))
        self.rows[message_id].update(active=active, compacted=compacted)
        with self.store.engine.connect() as conn:
            assert shadow_digest(conn) == before  # flags never touch the index

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), content=contents)
    def insert_or_replace(self, data: st.DataObject, content: Any) -> None:
        message_id = self._pick(data)
        session = self.rows[message_id]["session_id"]
        stored = encode_content(content)
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT OR REPLACE INTO messages (id, session_id, role, content, timestamp) "
                "VALUES (?, ?, 'user', ?, ?)",
                (message_id, session, stored, self._tick()),
            )
        self.rows[message_id] = replaced_row(session, stored)

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def change_id(self, data: st.DataObject) -> None:
        """The triggers fire on `UPDATE OF id` too: the entry moves to the new rowid."""
        message_id = self._pick(data)
        new_id = max(self.rows) + 7
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE messages SET id = ? WHERE id = ?", (new_id, message_id))
        self.rows[new_id] = self.rows.pop(message_id)

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def delete_message(self, data: st.DataObject) -> None:
        message_id = self._pick(data)
        with self.store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM messages WHERE id = ?", (message_id,))
        del self.rows[message_id]

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def delete_session(self, data: st.DataObject) -> None:
        session = data.draw(st.sampled_from(sorted(self.sessions)), label="session")
        gone = [i for i, row in self.rows.items() if row["session_id"] == session]
        assert self.store.delete_session(session) == len(gone)
        for message_id in gone:
            del self.rows[message_id]
        self.sessions.discard(session)

    # -- the oracle ----------------------------------------------------------------------

    @invariant()
    def search_matches_the_oracle(self) -> None:
        with self.store.engine.connect() as conn:
            stored = {
                row.id: dict(row._mapping)
                for row in conn.exec_driver_sql(
                    "SELECT id, session_id, content, tool_name, tool_calls, active, compacted "
                    "FROM messages"
                )
            }
            assert {i: {k: v for k, v in r.items() if k != "id"} for i, r in stored.items()} == (
                self.rows
            )
            visible = {
                i: indexed_expression(r)
                for i, r in stored.items()
                if r["active"] == 1 or r["compacted"] == 1
            }
            for word in WORD_QUERIES:
                expected = {i for i, text in visible.items() if word in word_tokens(text)}
                hits = search_messages(conn, word, limit=100_000)
                assert {hit["id"] for hit in hits} == expected, word
                type(self).nonempty_answers += bool(expected)
            for phrase in CJK_QUERIES:
                # The trigram tokenizer stops at a NUL (the multimodal prefix has one).
                expected = {i for i, text in visible.items() if phrase in text.split("\0")[0]}
                hits = search_messages(conn, phrase, limit=100_000)
                assert {hit["id"] for hit in hits} == expected, phrase
                assert all(">>>" in hit["snippet"] for hit in hits)  # the trigram path
                type(self).nonempty_answers += bool(expected)
            result = fts.integrity_check(conn, quick=True)
            assert result.ok, result.problems


@pytest.fixture(scope="module")
def head_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh, empty store created at head."""
    path = tmp_path_factory.mktemp("machine") / "head.db"
    migrate.upgrade(path)
    return path


def test_random_writes_keep_search_equal_to_the_oracle(head_template: Path, tmp_path: Path) -> None:
    IndexMachine.template = head_template
    IndexMachine.workdir = tmp_path
    IndexMachine.examples = IndexMachine.nonempty_answers = 0
    run_state_machine_as_test(
        IndexMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=20,
            # The same examples every run: the counts asserted below cannot flake.
            derandomize=True,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
    assert IndexMachine.examples >= 10
    assert IndexMachine.nonempty_answers >= 100


# --------------------------------------------------------------------------------------------
# The same machine on PostgreSQL: expression indexes, so search follows every write
# --------------------------------------------------------------------------------------------


class ServerIndexMachine(IndexMachine):
    """The writes above on PostgreSQL: through the Store API and the engine (there is no
    legacy application writing a PostgreSQL store, and no FTS5 shadow table to compare)."""

    url: str | None = None

    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        assert self.url is not None
        type(self).examples += 1
        engine = create_store_engine(self.url)
        with engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM messages")
            conn.exec_driver_sql("DELETE FROM sessions")
        engine.dispose()
        self.store = Store.open(self.url)
        self.rows = {}
        self.sessions = set()
        self.clock = 1000.0

    def teardown(self) -> None:
        self.store.close()

    def _update(self, data: st.DataObject, column: str, value: Any) -> None:
        """A plain UPDATE of one column through the engine (ORM-free SQL)."""
        message_id = self._pick(data)
        with self.store.engine.begin() as conn:
            conn.execute(
                text(f"UPDATE messages SET {column} = :v WHERE id = :i"),
                {"v": value, "i": message_id},
            )
        self.rows[message_id][column] = value

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), content=st.one_of(st.none(), texts))
    def edit_content_as_the_legacy_application(self, data: st.DataObject, content: Any) -> None:
        """On PostgreSQL there is no legacy application: a plain UPDATE."""
        self._update(data, "content", content)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), tool_name=tool_names)
    def edit_tool_name(self, data: st.DataObject, tool_name: Any) -> None:
        self._update(data, "tool_name", tool_name)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), calls=tool_calls)
    def edit_tool_calls(self, data: st.DataObject, calls: Any) -> None:
        self._update(data, "tool_calls", calls)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), flag_values=flags)
    def set_flags(self, data: st.DataObject, flag_values: tuple[int, int]) -> None:
        message_id = self._pick(data)
        active, compacted = flag_values
        self.store.set_message_flags([message_id], active=bool(active), compacted=bool(compacted))
        self.rows[message_id].update(active=active, compacted=compacted)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), content=contents)
    def insert_or_replace(self, data: st.DataObject, content: Any) -> None:
        """PostgreSQL's upsert: INSERT ... ON CONFLICT (id) DO UPDATE."""
        message_id = self._pick(data)
        session = self.rows[message_id]["session_id"]
        stored = encode_content(content)
        with self.store.engine.begin() as conn:
            conn.execute(
                insert_pg(Message)
                .values(
                    id=message_id,
                    session_id=session,
                    role="user",
                    content=stored,
                    timestamp=self._tick(),
                    tool_name=None,
                    tool_calls=None,
                    active=1,
                    compacted=0,
                )
                .on_conflict_do_update(
                    index_elements=[Message.id],
                    set_={
                        "session_id": session,
                        "role": "user",
                        "content": stored,
                        "tool_name": None,
                        "tool_calls": None,
                        "active": 1,
                        "compacted": 0,
                    },
                )
            )
        self.rows[message_id] = replaced_row(session, stored)

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def change_id(self, data: st.DataObject) -> None:
        message_id = self._pick(data)
        new_id = max(self.rows) + 7
        with self.store.engine.begin() as conn:
            conn.execute(
                text("UPDATE messages SET id = :n WHERE id = :i"), {"n": new_id, "i": message_id}
            )
        self.rows[new_id] = self.rows.pop(message_id)

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def delete_message(self, data: st.DataObject) -> None:
        message_id = self._pick(data)
        with self.store.engine.begin() as conn:
            conn.execute(text("DELETE FROM messages WHERE id = :i"), {"i": message_id})
        del self.rows[message_id]

    @invariant()
    def search_matches_the_oracle(self) -> None:
        with self.store.engine.connect() as conn:
            stored = {
                row.id: {
                    "session_id": row.session_id,
                    "content": row.content,
                    "tool_name": row.tool_name,
                    "tool_calls": row.tool_calls,
                    "active": row.active,
                    "compacted": row.compacted,
                }
                for row in conn.execute(
                    select(
                        Message.id,
                        Message.session_id,
                        Message.content,
                        Message.tool_name,
                        Message.tool_calls,
                        Message.active,
                        Message.compacted,
                    )
                )
            }
            assert stored == self.rows
            visible = {
                i: indexed_expression(r)
                for i, r in stored.items()
                if r["active"] == 1 or r["compacted"] == 1
            }
            for word in WORD_QUERIES:
                expected = {i for i, body in visible.items() if word in word_tokens(body)}
                hits = search_messages(conn, word, limit=100_000)
                assert {hit["id"] for hit in hits} == expected, word
                type(self).nonempty_answers += bool(expected)
            for phrase in CJK_QUERIES:
                # As SQLite's trigram tokenizer, the trigram path reads up to the first NUL.
                expected = {i for i, body in visible.items() if phrase in body.split("\0")[0]}
                hits = search_messages(conn, phrase, limit=100_000)
                assert {hit["id"] for hit in hits} == expected, phrase
                assert all(">>>" in hit["snippet"] for hit in hits)
                type(self).nonempty_answers += bool(expected)


@pytest.mark.postgresql
def test_random_writes_keep_search_equal_to_the_oracle_on_postgresql(pg_url: str) -> None:
    migrate.upgrade(pg_url)
    ServerIndexMachine.url = pg_url
    ServerIndexMachine.examples = ServerIndexMachine.nonempty_answers = 0
    run_state_machine_as_test(
        ServerIndexMachine,
        settings=settings(
            max_examples=20,
            stateful_step_count=20,
            derandomize=True,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
    assert ServerIndexMachine.examples >= 10
    assert ServerIndexMachine.nonempty_answers >= 80

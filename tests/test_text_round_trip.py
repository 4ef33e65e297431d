"""Every text a write takes comes back exactly, or is refused the same way, on both databases.

PostgreSQL text cannot hold NUL, which SQLite stores do (the multimodal prefix, binary tool
output), so the PostgreSQL side stores text in a code (``hermes_store.models``): NUL as
U+FFFE, and the few noncharacters the code uses as themselves escaped. The tests feed both
databases the same hostile texts (NUL, those noncharacters, lone surrogates, control
characters, CJK, combining marks, the multimodal prefix, huge texts) through the Store API
and the ORM models, read them back, and compare: with what was written, and database with
database. A text neither database can hold (a lone surrogate) is refused before anything
is written, with the same domain error naming the column, on both.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import URL

from hermes_store import migrate
from hermes_store.errors import TextNotStorable
from hermes_store.models import (
    NUL,
    SERVER_NUL,
    AgentSession,
    Message,
    from_server_text,
    to_server_text,
)
from hermes_store.search import search_messages
from hermes_store.store import MULTIMODAL_PREFIX, NewMessage, Store

#: Pieces the hostile texts are built from: what PostgreSQL cannot hold (NUL), the
#: characters its code uses (U+FFFE, U+FFFF, U+FDD0, U+FDD1), lone surrogates (which
#: neither database can hold), control characters, SQL and LIKE metacharacters, scripts.
PIECES = (
    "\x00",
    "\ufffe",
    "\uffff",
    "\ufdd0",
    "\ufdd1",
    "\ud800",
    "\udcff",
    "\udbff\udfff",  # a surrogate pair as two code points: still two lone surrogates
    "\x01",
    "\x1f",
    "\x7f",
    "\t",
    "\n",
    "\r",
    "数据库",
    "e\u0301",
    "\u200b",
    "\ufeff",
    "\U0001f600",
    "\U0010ffff",
    MULTIMODAL_PREFIX,
    "json:",
    "%",
    "_",
    "\\",
    "'",
    '"',
    "word",
    " ",
)
HOSTILE = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.text(st.characters(exclude_categories=()), max_size=40),  # surrogates included
)
OPTIONAL = st.none() | HOSTILE
#: Texts of a session (create_session's arguments, then end_session's reason).
SESSION_TEXTS = ("id", "source", "user_id", "model", "title", "system_prompt", "cwd")
#: Texts of a message (NewMessage's fields), and the content edit_message gives it.
MESSAGE_TEXTS = (
    "role",
    "content",
    "tool_call_id",
    "tool_calls",
    "tool_name",
    "finish_reason",
    "reasoning",
    "platform_message_id",
)
#: A text for each of them (and for the content of a message written through the models).
TEXT_STRATEGIES = {
    **dict.fromkeys(("id", "source", "end_reason", "role"), HOSTILE),
    **dict.fromkeys(
        ("user_id", "model", "title", "system_prompt", "cwd", *MESSAGE_TEXTS[1:]), OPTIONAL
    ),
    "edited": OPTIONAL,
    "orm_content": OPTIONAL,
}
#: Every hostile piece but the lone surrogates, in one text.
EVERY_PIECE = "".join(p for p in PIECES if not any(0xD800 <= ord(c) <= 0xDFFF for c in p))
#: A huge text (about a megabyte of UTF-8), written where an example says "<huge>" (so
#: that a failing example stays readable).
HUGE = "é\u0301\u0301\x00\ufffe\uffff\ufdd0数" * 50_000
#: What both databases say of a text holding a lone surrogate (the column's name only).
REFUSAL = (
    "the text for column '{column}' holds a lone surrogate (a code point from U+D800 to "
    "U+DFFF), which neither SQLite nor PostgreSQL can store: nothing was written. Pass "
    "valid Unicode (e.g. decode bytes with errors='replace')"
)


def _has_lone_surrogate(value: str | None) -> bool:
    return value is not None and any(0xD800 <= ord(c) <= 0xDFFF for c in value)


@contextlib.contextmanager
def _fresh_stores(pg_database: URL, directory: Path, name: str) -> Iterator[list[Store]]:
    """[a SQLite store, a PostgreSQL store], both new at head."""
    path = directory / "state.db"
    migrate.upgrade(str(path))
    database = f"{pg_database.database}_{name}"
    admin = create_engine(pg_database, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{database}"'))
    url = pg_database.set(database=database).render_as_string(hide_password=False)
    migrate.upgrade(url)
    opened = [Store.open(str(path)), Store.open(url)]
    try:
        yield opened
    finally:
        for store in opened:
            store.close()
            store.engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def stores(pg_database: URL, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Store]]:
    """[SQLite, PostgreSQL] stores the write tests share (each writes its own sessions)."""
    with _fresh_stores(pg_database, tmp_path_factory.mktemp("round-trip"), "round_trip") as pair:
        yield pair


_examples = itertools.count()


def _refusal(exc: TextNotStorable, candidates: dict[str, str | None]) -> tuple[str, str]:
    """("refused", the message), having checked that it names a column given a lone
    surrogate and says nothing else of the texts."""
    message = str(exc)
    columns = [c for c, value in candidates.items() if _has_lone_surrogate(value)]
    assert columns, f"refused without a lone surrogate: {message}"
    assert message in [REFUSAL.format(column=c) for c in columns]
    return ("refused", message)


def _write_and_read(store: Store, number: int, texts: dict[str, Any]) -> list[Any]:
    """Write ``texts`` through the Store API and the models and read them back: a list of
    the refusals met and what came back, each write's refusal checked to leave nothing."""
    session_id = f"{number}:{texts['id']}"
    title = None if texts["title"] is None else f"{number}:{texts['title']}"
    given = {**texts, "id": session_id, "title": title}
    try:
        store.create_session(
            session_id,
            texts["source"],
            model=texts["model"],
            user_id=texts["user_id"],
            title=title,
            started_at=1.0,
            system_prompt=texts["system_prompt"],
            cwd=texts["cwd"],
        )
    except TextNotStorable as exc:
        listed = store.list_sessions(limit=1_000_000)
        assert listed
        assert not any(s.id.startswith(f"{number}:") for s in listed)
        return [_refusal(exc, {name: given[name] for name in SESSION_TEXTS})]
    message = NewMessage(**{name: texts[name] for name in MESSAGE_TEXTS}, timestamp=2.0)
    try:
        message_id = store.append_message(session_id, message)
    except TextNotStorable as exc:
        assert store.messages(session_id) == []
        record = store.get_session(session_id)
        assert record is not None
        assert record.message_count == 0
        return [_refusal(exc, {name: texts[name] for name in MESSAGE_TEXTS})]
    outcome: list[Any] = []
    expected_session = {name: given[name] for name in SESSION_TEXTS}
    expected_session["end_reason"] = texts["end_reason"]
    expected_message = {name: texts[name] for name in MESSAGE_TEXTS}
    expected_orm = [texts["content"]]
    try:
        store.end_session(session_id, texts["end_reason"], ended_at=3.0)
    except TextNotStorable as exc:
        outcome.append(_refusal(exc, {"end_reason": texts["end_reason"]}))
        expected_session["end_reason"] = None
    try:
        store.edit_message(message_id, texts["edited"])
        expected_message["content"] = expected_orm[0] = texts["edited"]
    except TextNotStorable as exc:
        outcome.append(_refusal(exc, {"content": texts["edited"]}))
    try:
        with store.orm_writer() as db, db.begin():
            content = texts["orm_content"]
            db.add(Message(session_id=session_id, role="user", content=content, timestamp=4.0))
        expected_orm.append(texts["orm_content"])
    except TextNotStorable as exc:
        outcome.append(_refusal(exc, {"content": texts["orm_content"]}))

    record = store.get_session(session_id)
    assert record is not None
    read_session = {name: getattr(record, name) for name in expected_session}
    messages = store.messages(session_id)
    assert len(messages) == len(expected_orm)
    read_message = {name: getattr(messages[0], name) for name in MESSAGE_TEXTS}
    with store.orm_session() as db:
        orm = db.scalars(
            select(Message.content).where(Message.session_id == session_id).order_by(Message.id)
        ).all()
        orm_title = db.scalars(select(AgentSession.title).where(AgentSession.id == session_id))
        orm_titles = list(orm_title)
    listed = [s.title for s in store.list_sessions(limit=1_000_000) if s.id == session_id]
    assert read_session == expected_session
    assert read_message == expected_message
    assert orm == expected_orm
    assert listed == orm_titles == [title]
    return [*outcome, ("stored", read_session, read_message, orm)]


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(texts=st.fixed_dictionaries(TEXT_STRATEGIES))
@example(texts=dict.fromkeys(TEXT_STRATEGIES, EVERY_PIECE))
@example(texts=dict.fromkeys(TEXT_STRATEGIES, "has \ufffe inside"))
@example(
    texts={**dict.fromkeys(TEXT_STRATEGIES, "\ufffe\uffff\ufdd0\ufdd1\x00"), "edited": "\ud800"}
)
@example(texts={**dict.fromkeys(TEXT_STRATEGIES, "x"), "tool_name": "\udcff", "cwd": "\udcff"})
@example(
    texts={
        **dict.fromkeys(TEXT_STRATEGIES, "x"),
        "content": MULTIMODAL_PREFIX + '[{"type": "text", "text": "数据\ufffe库"}]',
        "tool_calls": "\uffff" * 3 + "\ufdd0\ufdd1" * 2 + "\ufffe",
        "edited": "<huge>",
    }
)
@pytest.mark.postgresql
def test_hostile_texts_come_back_exactly_or_are_refused_alike_on_both_databases(
    stores: list[Store], texts: dict[str, Any]
) -> None:
    number = next(_examples)
    texts = {name: HUGE if value == "<huge>" else value for name, value in texts.items()}
    lite, server = (_write_and_read(store, number, texts) for store in stores)
    assert lite == server


@pytest.mark.postgresql
def test_a_real_ufffe_reads_back_as_written_not_as_nul(stores: list[Store]) -> None:
    """The reported case: U+FFFE came back from PostgreSQL as NUL."""
    for store in stores:
        store.create_session("fffe", "cli", started_at=1.0)
        message_id = store.append_message("fffe", NewMessage("user", "has \ufffe inside"))
        assert [m.content for m in store.messages("fffe")] == ["has \ufffe inside"]
        store.edit_message(message_id, "\x00\ufffe\uffff")
        assert [m.content for m in store.messages("fffe")] == ["\x00\ufffe\uffff"]


@pytest.mark.postgresql
@pytest.mark.parametrize("column", ["content", "tool_name", "tool_calls", "role"])
def test_a_lone_surrogate_is_refused_naming_its_column_on_both_databases(
    stores: list[Store], column: str
) -> None:
    for store in stores:
        session_id = f"surrogate-{column}"
        store.create_session(session_id, "cli", started_at=1.0)
        fields = {"role": "user", "content": "fine", column: "secret \udcff text"}
        with pytest.raises(TextNotStorable) as raised:
            store.append_message(session_id, NewMessage(**fields))
        assert str(raised.value) == REFUSAL.format(column=column)
        assert store.messages(session_id) == []
        record = store.get_session(session_id)
        assert record is not None
        assert record.message_count == 0


@pytest.mark.postgresql
def test_a_lone_surrogate_through_the_models_is_refused_naming_its_column(
    stores: list[Store],
) -> None:
    for store in stores:
        with store.orm_writer() as db:
            db.begin()
            db.add(AgentSession(id="orm-surrogate", source="cli", started_at=1.0))
            db.add(Message(session_id="orm-surrogate", role="user", content="secret \ud800"))
            with pytest.raises(TextNotStorable) as raised:
                db.commit()
        assert str(raised.value) == REFUSAL.format(column="content")
        assert store.get_session("orm-surrogate") is None


@pytest.mark.postgresql
def test_nul_as_earlier_versions_stored_it_still_reads_as_nul(stores: list[Store]) -> None:
    """A PostgreSQL store written before the code escaped noncharacters holds NUL as a lone
    U+FFFE (and a U+FFFF as itself): both read back as before."""
    server = stores[1]
    server.create_session("old", "cli", started_at=1.0)
    with server.engine.begin() as conn:  # the row as the earlier version wrote it
        conn.execute(
            text(
                "INSERT INTO messages (session_id, role, content, timestamp) "
                "VALUES ('old', 'user', :content, 1.0)"
            ),
            {"content": "\ufffejson:[] and \ufffe again, \uffff alone"},
        )
    assert [m.content for m in server.messages("old")] == [
        "\x00json:[] and \x00 again, \uffff alone"
    ]


# -- the code itself ----------------------------------------------------------------------

CODE_PIECES = st.lists(
    st.sampled_from(["\x00", "\ufffe", "\uffff", "\ufdd0", "\ufdd1", "a", "数", " "]),
    max_size=10,
).map("".join)


@settings(max_examples=500, deadline=None, database=None)
@given(value=CODE_PIECES | st.text(st.characters(exclude_categories=())))
def test_the_server_code_round_trips_and_holds_no_nul(value: str) -> None:
    stored = to_server_text(value)
    assert NUL not in stored
    assert from_server_text(stored) == value


@settings(max_examples=1000, deadline=None, database=None)
@given(haystack=CODE_PIECES, needle=CODE_PIECES.filter(bool))
def test_search_on_stored_text_answers_as_on_the_text_itself(haystack: str, needle: str) -> None:
    """PostgreSQL searches the stored text (LIKE, strpos, the trigram index) and reads it up
    to its first NUL with split_part(text, U+FFFE, 1): both must answer as the text itself
    would. So U+FFFE stands for NUL alone, and no escape is found inside another."""
    stored, pattern = to_server_text(haystack), to_server_text(needle)
    assert (pattern in stored) == (needle in haystack)
    before_nul = haystack.split(NUL, 1)[0]
    assert from_server_text(stored.split(SERVER_NUL, 1)[0]) == before_nul
    assert (pattern in stored.split(SERVER_NUL, 1)[0]) == (needle in before_nul)


# -- search over such texts, on both databases ---------------------------------------------

#: Noncharacters before the words searched: the trigram path and the LIKE scan read a text
#: up to its first NUL, and a real U+FFFE is none.
SEARCHED = (
    "before \ufffe\uffff wordmarker after",
    "前\ufffe面 数据库很好 \ufdd0",
    "\ufffe\uffff\ufdd0\ufdd1" * 20 + " 中文 " + "尾" * 200,
    "前 \x00 数据库之后",
)
#: Each query and the messages (indexes into SEARCHED) it finds, on both databases.
FOUND = {
    "wordmarker": [0],
    "数据库": [1],  # the trigram path: the fourth holds it after its NUL only
    "中文": [2],  # the LIKE scan (two characters), whose snippet counts characters
    "很好": [1],
    "之后": [],  # after a NUL: neither the LIKE scan nor the trigram path reads it
}


@pytest.fixture(scope="module")
def searched(pg_database: URL, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Store]]:
    """[SQLite, PostgreSQL] stores holding SEARCHED alone (ids 1 to 4 on both)."""
    with _fresh_stores(pg_database, tmp_path_factory.mktemp("searched"), "searched") as pair:
        for store in pair:
            store.create_session("searched", "cli", started_at=1.0)
            for number, body in enumerate(SEARCHED):
                store.append_message("searched", NewMessage("user", body, timestamp=10.0 + number))
        yield pair


@pytest.mark.postgresql
@pytest.mark.parametrize("query", FOUND)
def test_search_reads_past_a_real_noncharacter_as_on_sqlite(
    searched: list[Store], query: str
) -> None:
    answers = []
    for store in searched:
        with store.engine.connect() as conn:
            hits = search_messages(conn, query, limit=-1)
        assert sorted(hit["id"] - 1 for hit in hits) == FOUND[query]
        answers.append(
            sorted(
                (hit["id"], hit["snippet"], [c["content"] for c in hit["context"]]) for hit in hits
            )
        )
    assert answers[1] == answers[0]

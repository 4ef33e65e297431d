"""The typed read/write API the application uses, over the ORM models.

Design, in three rules:

- **Plain values in and out.** Store methods take and return the frozen dataclasses of
  :mod:`hermes_store.records` (:class:`NewMessage`, :class:`AgentSessionRecord`,
  :class:`MessageRecord`, :class:`SessionSummary`), copies taken inside the call's own
  transaction, never ORM objects: whatever a method returns stays usable after the store
  is closed and never loads anything behind the caller's back.
- **"Session" means an agent session** (a conversation, the `sessions` table, the
  :class:`~hermes_store.models.AgentSession` model) everywhere in this API:
  ``create_session``, ``get_session``, ``end_session``, ... The two ways to an SQLAlchemy
  ORM session say so in their names: :meth:`Store.orm_session` (reads) and
  :meth:`Store.orm_writer` (writes).
- **The session counters are kept in one place.** ``sessions.message_count`` and
  ``tool_call_count`` move only through :func:`_bump_counters`: ``append_messages``
  calls it, and so does a flush hook of every ORM session the store hands out, for the
  :class:`Message` objects the flush inserts, deletes or moves. The counters are not a
  database trigger: the legacy application, which keeps writing these stores, updates
  them in its own code, and a trigger would count its messages twice.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    Column,
    ColumnClause,
    Connection,
    Engine,
    Integer,
    Select,
    Table,
    TableClause,
    bindparam,
    column,
    delete,
    event,
    func,
    insert,
    literal_column,
    select,
    table,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, UOWTransaction, sessionmaker
from sqlalchemy.orm.attributes import History

from hermes_store.engine import (
    BEGIN_OPTION,
    create_store_engine,
    default_busy_timeout_ms,
    prepare_store_file,
)
from hermes_store.errors import SessionExists, SessionNotFound, StoreError, TitleTaken
from hermes_store.models import AgentSession, Message
from hermes_store.prepared import (
    Connections,
    PooledConnections,
    Prepared,
    StoreConnections,
    driver,
    fetch,
)
from hermes_store.records import (
    AgentSessionRecord,
    MessageRecord,
    NewMessage,
    SessionSummary,
    row_reader,
)
from hermes_store.search import SearchOptions, SearchResults
from hermes_store.search.archives import Searched, opening, require_archive, search_stores

__all__ = [
    "MULTIMODAL_PREFIX",
    "AgentSessionRecord",
    "MessageRecord",
    "NewMessage",
    "SessionExists",
    "SessionNotFound",
    "SessionSummary",
    "Store",
    "StoreError",
    "TitleTaken",
    "count_tool_calls",
    "encode_content",
]

#: How the legacy application marks content that is a JSON list of multimodal parts.
MULTIMODAL_PREFIX = "\x00json:"

_sessions = cast(Table, AgentSession.__table__)
_messages = cast(Table, Message.__table__)

#: Record fields whose column has another name.
_RENAMED = {"compressed_summary": "_compressed_summary"}


def _record_columns(record: type[Any], table: Table) -> tuple[Column[Any], ...]:
    """The columns of ``table`` in the order of ``record``'s fields (one per field)."""
    return tuple(table.c[_RENAMED.get(f.name, f.name)] for f in fields(record))


_SESSION_COLUMNS = _record_columns(AgentSessionRecord, _sessions)
_MESSAGE_COLUMNS = _record_columns(MessageRecord, _messages)

# The ORM flush hook's counter update (a Core statement on the flush's connection).
_BUMP_COUNTERS = (
    update(_sessions)
    .where(_sessions.c.id == bindparam("b_session_id"))
    .values(
        message_count=func.coalesce(_sessions.c.message_count, 0)
        + bindparam("b_messages", type_=Integer),
        tool_call_count=func.coalesce(_sessions.c.tool_call_count, 0)
        + bindparam("b_tool_calls", type_=Integer),
    )
)


# -- the hot paths' statements, compiled once (hermes_store.prepared) --------------------


def _plain(source: Table) -> TableClause:
    """``source`` without the models' Python-side column defaults (each equal to the DDL's
    server default), so that a prepared INSERT names exactly the columns it is given."""
    return table(source.name, *(column(c.name, c.type) for c in source.c))


_plain_sessions = _plain(_sessions)
_plain_messages = _plain(_messages)
_s = _plain_sessions.c
_m = _plain_messages.c
#: The columns a new message is written with (the table's order, which the compiled
#: INSERT follows), in the order of :func:`_message_row`.
_NEW_MESSAGE_COLUMNS = (
    "session_id",
    "role",
    "content",
    "tool_call_id",
    "tool_calls",
    "tool_name",
    "timestamp",
    "token_count",
    "finish_reason",
    "reasoning",
    "platform_message_id",
)
_INSERT_MESSAGE = Prepared.of(
    insert(_plain_messages)
    .values({name: bindparam(name) for name in _NEW_MESSAGE_COLUMNS})
    .returning(_m.id)
)
assert _INSERT_MESSAGE.names == _NEW_MESSAGE_COLUMNS, "_message_row's order"
_VALUES_ROW = "(" + ", ".join("?" * len(_NEW_MESSAGE_COLUMNS)) + ")"
_INSERT_HEAD, _, _INSERT_TAIL = _INSERT_MESSAGE.sql.partition(_VALUES_ROW)
#: Rows per multi-row INSERT (11 parameters each, far below SQLite's limit of 32766).
_INSERT_CHUNK = 1000


@functools.lru_cache(maxsize=128)
def _insert_messages_sql(rows: int, server: bool = False) -> str:
    """The prepared INSERT with ``rows`` rows of values: ``VALUES (...), (...) RETURNING id``.

    One statement for many rows costs SQLite about half what one statement per row does
    (every statement runs the FTS and display triggers' programs anew).
    """
    if server:  # PostgreSQL's marks carry casts (%s::BIGINT): the row as compiled
        head, _, rest = _INSERT_MESSAGE.on_server.sql.partition(" VALUES ")
        row, _, tail = rest.partition(" RETURNING ")
        return f"{head} VALUES {', '.join([row] * rows)} RETURNING {tail}"
    return _INSERT_HEAD + ", ".join([_VALUES_ROW] * rows) + _INSERT_TAIL


_ADD_TO_COUNTERS = Prepared.of(
    update(_plain_sessions)
    .where(_s.id == bindparam("session_id"))
    .values(
        message_count=func.coalesce(_s.message_count, 0) + bindparam("messages"),
        tool_call_count=func.coalesce(_s.tool_call_count, 0) + bindparam("tool_calls"),
    )
)
_SESSION_EXISTS = Prepared.of(select(literal_column("1")).where(_s.id == bindparam("id")))
_TITLE_TAKEN = Prepared.of(
    select(literal_column("1")).where(_s.title == bindparam("title")).limit(1)
)


def _select_record(source: Table, columns: Sequence[Column[Any]]) -> Select[*tuple[Any, ...]]:
    """SELECT of a record's columns from one table, by their bare names.

    A connection parses a statement the first time it runs it, and a store that was just
    opened reads on a new connection: SQLite parses the 62 names of a session qualified
    with their table in about 10 us more than the bare ones (a sixth of that first read).
    """
    return select(*(column(c.name) for c in columns)).select_from(table(source.name))


_SELECT_SESSION = Prepared.of(
    _select_record(_sessions, _SESSION_COLUMNS).where(column("id") == bindparam("id"))
)
_END_SESSION = Prepared.of(
    update(_plain_sessions)
    .where(_s.id == bindparam("id"))
    .values(ended_at=bindparam("ended_at"), end_reason=bindparam("end_reason"))
)
_EDIT_MESSAGE = Prepared.of(
    update(_plain_messages).where(_m.id == bindparam("id")).values(content=bindparam("content"))
)
_UNPARENT_CHILDREN = Prepared.of(
    update(_plain_sessions)
    .where(_s.parent_session_id == bindparam("id"))
    .values(parent_session_id=None)
)
_DELETE_MESSAGES = Prepared.of(delete(_plain_messages).where(_m.session_id == bindparam("id")))
_DELETE_SESSION = Prepared.of(delete(_plain_sessions).where(_s.id == bindparam("id")))
_MESSAGES = _select_record(_messages, _MESSAGE_COLUMNS).where(
    column("session_id") == bindparam("session_id")
)
_ORDER: tuple[ColumnClause[Any], ...] = (column("timestamp"), column("id"))
#: A session's messages: every one, or those the UI shows (rewound ones hidden).
_SELECT_MESSAGES = {
    True: Prepared.of(_MESSAGES.order_by(*_ORDER)),
    False: Prepared.of(
        _MESSAGES.where((column("active") == 1) | (column("compacted") == 1)).order_by(*_ORDER)
    ),
}
_SUMMARY = select(
    _s.id,
    _s.source,
    _s.title,
    _s.model,
    _s.started_at,
    _s.ended_at,
    func.coalesce(_s.message_count, 0),
    func.coalesce(_s.tool_call_count, 0),
    _s.parent_session_id,
)
_PAGE: tuple[BindParameter[int], BindParameter[int]] = (bindparam("limit"), bindparam("offset"))
#: Sessions newest first: all of them, or those of one source.
_LIST_SESSIONS = {
    False: Prepared.of(
        _SUMMARY.order_by(_s.started_at.desc(), _s.id).limit(_PAGE[0]).offset(_PAGE[1])
    ),
    True: Prepared.of(
        _SUMMARY.where(_s.source == bindparam("source"))
        .order_by(_s.started_at.desc(), _s.id)
        .limit(_PAGE[0])
        .offset(_PAGE[1])
    ),
}
#: Flag updates by the flags they set (an ``IN`` list of any length).
_SET_FLAGS: dict[tuple[str, ...], Prepared] = {
    flags: Prepared.of(
        update(_plain_messages)
        .where(_m.id.in_(bindparam("ids", expanding=True)))
        .values({flag: bindparam(flag) for flag in flags})
    )
    for flags in (("active",), ("compacted",), ("active", "compacted"))
}


@functools.lru_cache(maxsize=32)
def _insert_session(names: tuple[str, ...]) -> Prepared:
    """INSERT of a session with these columns, returning every column of its record."""
    return Prepared.of(
        insert(_plain_sessions)
        .values({name: bindparam(name) for name in names})
        .returning(*(_s[c.name] for c in _SESSION_COLUMNS))
    )


_read_sessions = row_reader(AgentSessionRecord)
_read_messages = row_reader(MessageRecord)
_read_summaries = row_reader(SessionSummary)


def encode_content(content: str | list[Any] | None) -> str | None:
    """Store text as is and a list of parts the way the legacy application does."""
    if isinstance(content, list):
        return MULTIMODAL_PREFIX + json.dumps(content, ensure_ascii=False)
    return content


def count_tool_calls(tool_calls: str | list[Any] | None) -> int:
    """Number of calls in a tool_calls value (a JSON list); anything else counts as 0."""
    if tool_calls is None:
        return 0
    if isinstance(tool_calls, str):
        try:
            tool_calls = json.loads(tool_calls)
        except ValueError:
            return 0
    return len(tool_calls) if isinstance(tool_calls, list) else 0


# -- the session counters ----------------------------------------------------------------

#: Per agent session: [messages, tool calls] to add (negative to take away).
_Deltas = dict[str, list[int]]


def _add(deltas: _Deltas, session_id: str | None, messages: int, tool_calls: str | None) -> None:
    if session_id is None:
        return
    counts = deltas.setdefault(session_id, [0, 0])
    counts[0] += messages
    counts[1] += messages * count_tool_calls(tool_calls)


def _bump_counters(conn: Connection, deltas: Mapping[str, Sequence[int]]) -> int:
    """Add ``deltas`` to the sessions' message and tool-call counters; one prepared UPDATE.

    The one place that changes ``sessions.message_count`` and ``tool_call_count`` (a NULL
    counter counts as 0). Returns the number of sessions updated.
    """
    if not deltas:
        return 0
    params = [
        {"b_session_id": session_id, "b_messages": counts[0], "b_tool_calls": counts[1]}
        for session_id, counts in deltas.items()
    ]
    return int(conn.execute(_BUMP_COUNTERS, params).rowcount)


class _StoreSession(Session):
    """The ORM session of a Store: every flush keeps the session counters right.

    Message objects inserted or deleted by a flush, or moved to another session (or given
    other ``tool_calls``), update the counters in the flush's transaction. Statements run
    through ``execute()`` (``insert(Message)``, ``delete(Message)``, raw SQL) bypass the
    unit of work and the counters with it, as any SQL the legacy application runs does.
    """


_DELETED_SHARE = "hermes_store.deleted_message_share"


def _history_values(history: History) -> tuple[Any, Any]:
    """(value before the flush, value after it) of one column attribute."""
    before = [*history.deleted, *history.unchanged]
    after = [*history.added, *history.unchanged]
    return (before[0] if before else None, after[0] if after else None)


@event.listens_for(_StoreSession, "before_flush")
def _count_deleted_messages(session: Session, _flush: UOWTransaction, _objects: Any) -> None:
    # What a deleted message counted for is what its row holds: read it while the row
    # still exists (loading what has expired), and keep it for after the flush.
    deltas: _Deltas = {}
    for obj in session.deleted:
        if isinstance(obj, Message):
            unloaded = sa_inspect(obj).unloaded & {"session_id", "tool_calls"}
            if unloaded:
                session.refresh(obj, sorted(unloaded))
            attrs = sa_inspect(obj).attrs
            old_session, _ = _history_values(attrs.session_id.history)
            old_calls, _ = _history_values(attrs.tool_calls.history)
            _add(deltas, old_session, -1, old_calls)
    session.info[_DELETED_SHARE] = deltas


@event.listens_for(_StoreSession, "after_flush")
def _count_flushed_messages(session: Session, _flush: UOWTransaction) -> None:
    # session.new / dirty and attribute history still show the state before the flush,
    # with foreign keys set from relationships (message.session = ...) already synced.
    deltas: _Deltas = session.info.pop(_DELETED_SHARE, {})
    for obj in session.new:
        if isinstance(obj, Message):
            _add(deltas, obj.session_id, 1, obj.tool_calls)
    for obj in session.dirty:
        if not isinstance(obj, Message):
            continue
        attrs = sa_inspect(obj).attrs
        moved, calls = attrs.session_id.history, attrs.tool_calls.history
        if moved.has_changes() or calls.has_changes():
            old_session, new_session = _history_values(moved)
            old_calls, new_calls = _history_values(calls)
            _add(deltas, old_session, -1, old_calls)
            _add(deltas, new_session, 1, new_calls)
    changed = {sid: counts for sid, counts in deltas.items() if any(counts)}
    if changed:
        _bump_counters(session.connection(), changed)


# -- the store ---------------------------------------------------------------------------


class Store:
    """A session store: agent sessions, their messages, and the writes the agent makes.

    Every method runs in its own transaction (writes take the write lock at BEGIN) and
    returns plain records (see the module docstring). Open it with :meth:`open`; the store
    must already be at head (``migrate.upgrade``).
    """

    def __init__(self, engine: Engine | StoreConnections) -> None:
        """A store over ``engine``'s pool, or over a store file's own connections."""
        self._connections: Connections
        if isinstance(engine, Engine):
            self._connections = PooledConnections(engine)
        else:
            self._connections = engine
        #: The archives :meth:`search` reads too (:meth:`open`'s ``archives``), in order.
        self._archives: tuple[tuple[str, Store], ...] = ()

    @property
    def archives(self) -> tuple[str, ...]:
        """The archives the store searches besides itself, as messages name them."""
        return tuple(name for name, _store in self._archives)

    @property
    def engine(self) -> Engine:
        """The store's SQLAlchemy engine (a store opened by :meth:`open` makes it on first use)."""
        return self._connections.engine

    # The ORM session factories, made on first use: the Store's own methods run prepared
    # statements, and opening a store should not pay for what it may never use.
    @functools.cached_property
    def _read(self) -> sessionmaker[Session]:
        return sessionmaker(self.engine, class_=_StoreSession, expire_on_commit=False)

    @functools.cached_property
    def _write(self) -> sessionmaker[Session]:
        writes = self.engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        return sessionmaker(writes, class_=_StoreSession, expire_on_commit=False)

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | None = None,
        *,
        create: bool = False,
        archives: Sequence[str | os.PathLike[str]] = (),
    ) -> Store:
        """Open a store at ``url`` (resolved like every entry point); it must be at head.

        The revision is not checked here: run ``migrate.upgrade`` first. The file is
        checked (and created) as :func:`~hermes_store.engine.create_store_engine` does;
        the store's methods then run on sqlite3 connections of its own, and the engine
        (:attr:`engine`, the ORM sessions) is created when first used.

        ``archives`` (paths or URLs, SQLite or PostgreSQL): stores at head holding
        sessions moved out of this one, which :meth:`search` reads too (docs/search.md,
        "Searching archives"); the other methods read and write this store only. Each is
        checked first, read-only: one that is missing, not a store or not at head raises
        :class:`~hermes_store.errors.ArchiveRefused` naming it, and nothing is opened.
        """
        names = [require_archive(archive) for archive in archives]
        store = cls._open(url, create=create)
        opened: list[tuple[str, Store]] = []
        try:
            for name, archive in zip(names, archives, strict=True):
                with opening(name):
                    opened.append((name, cls._open(archive, create=False)))
        except BaseException:
            for _name, archive_store in opened:
                archive_store.close()
            store.close()
            raise
        store._archives = tuple(opened)
        return store

    @classmethod
    def _open(cls, url: str | os.PathLike[str] | None, *, create: bool) -> Store:
        busy_timeout_ms = default_busy_timeout_ms()
        resolved, path = prepare_store_file(url, create=create)
        if path is None:  # in memory: one database per connection, so the engine's only
            return cls(
                create_store_engine(resolved, create=create, busy_timeout_ms=busy_timeout_ms)
            )
        return cls(StoreConnections(resolved, path, busy_timeout_ms=busy_timeout_ms, create=create))

    def close(self) -> None:
        """Close the store's connections, and its archives' (the store stays usable: it
        reconnects)."""
        self._connections.close()
        for _name, archive in self._archives:
            archive.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ORM access ------------------------------------------------------------------

    def orm_session(self) -> Session:
        """A new SQLAlchemy ORM session for queries over the models (reads start DEFERRED).

        Use it as a context manager. Objects it loads belong to it: read what you need
        before it closes. ``AgentSession.messages`` is write-only, so a transcript is read
        explicitly, e.g. ``db.scalars(row.messages.select().limit(50))``.
        """
        return self._read()

    def orm_writer(self) -> Session:
        """A new SQLAlchemy ORM session whose transactions take the write lock at BEGIN.

        Use ``with store.orm_writer() as db, db.begin(): ...``. Message objects it adds or
        deletes (``db.add(Message(...))``, ``row.messages.add(...)``, ``db.delete(m)``)
        keep the session counters right. Bulk statements run with ``db.execute()`` and raw
        SQL do not: they write the table as they are told, like the legacy application.
        """
        return self._write()

    def session(self) -> Session:
        """Deprecated name of :meth:`orm_session`."""
        warnings.warn(
            "Store.session() is renamed Store.orm_session()", DeprecationWarning, stacklevel=2
        )
        return self.orm_session()

    def writer(self) -> Session:
        """Deprecated name of :meth:`orm_writer`."""
        warnings.warn(
            "Store.writer() is renamed Store.orm_writer()", DeprecationWarning, stacklevel=2
        )
        return self.orm_writer()

    # -- writes ----------------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        source: str,
        *,
        model: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        started_at: float | None = None,
        title: str | None = None,
        **columns: Any,
    ) -> AgentSessionRecord:
        """Create an agent session and return it as stored (with the server defaults).

        Other `sessions` columns may be passed by name. Raises :class:`SessionExists` when
        the id is taken, :class:`TitleTaken` when another session has ``title``, and
        :class:`SessionNotFound` when ``parent_session_id`` names no session.
        """
        values = {
            "id": session_id,
            "source": source,
            "model": model,
            "user_id": user_id,
            "parent_session_id": parent_session_id,
            "started_at": time.time() if started_at is None else started_at,
            "title": title,
            "message_count": 0,
            "tool_call_count": 0,
        }
        for name in columns:
            if name in values:
                raise TypeError(f"create_session() got multiple values for {name!r}")
            if name not in _sessions.c:
                raise TypeError(f"{name!r} is an invalid keyword argument for AgentSession")
        values.update(columns)
        with driver(self._connections, write=True) as db:
            if db.execute(_SESSION_EXISTS, id=session_id).fetchone():
                raise SessionExists(
                    f"session {session_id!r} already exists: append to it with "
                    "append_messages(), or create the new session under another id"
                )
            if parent_session_id is not None and not (
                db.execute(_SESSION_EXISTS, id=parent_session_id).fetchone()
            ):
                raise SessionNotFound(
                    f"no parent session {parent_session_id!r}: create it first, or pass "
                    "parent_session_id=None"
                )
            if title is not None and db.execute(_TITLE_TAKEN, title=title).fetchone():
                raise TitleTaken(
                    f"another session is already titled {title!r}: session titles are "
                    "unique, pick another one (or none)"
                )
            created = db.execute(_insert_session(tuple(values)), **values).fetchall()
        return _read_sessions(created)[0]

    def append_message(self, session_id: str, message: NewMessage) -> int:
        """Append one message and bump the session's counters in the same transaction."""
        return self.append_messages(session_id, [message])[0]

    def append_messages(self, session_id: str, messages: Iterable[NewMessage]) -> list[int]:
        """Append messages in one write transaction; return their ids in order.

        The rows go in as multi-row ``INSERT ... RETURNING id`` statements (1000 rows a
        statement) and the session's counters move once, by the batch's totals. Raises
        :class:`SessionNotFound` when the session does not exist; a row the schema refuses
        rolls the whole batch back.
        """
        rows: list[tuple[Any, ...]] = []
        tool_calls = 0
        for message in messages:
            rows.append(_message_row(session_id, message))
            tool_calls += count_tool_calls(message.tool_calls)
        with driver(self._connections, write=True) as db:
            bumped = db.execute(
                _ADD_TO_COUNTERS, session_id=session_id, messages=len(rows), tool_calls=tool_calls
            )
            if bumped.rowcount == 0:
                raise SessionNotFound(
                    f"no session {session_id!r}: create it with create_session() first"
                )
            ids: list[int] = []
            for start in range(0, len(rows), _INSERT_CHUNK):
                chunk = rows[start : start + _INSERT_CHUNK]
                flat = [value for row in chunk for value in row]
                sql = _insert_messages_sql(len(chunk), db.server)
                ids += (i for (i,) in db.run(sql, flat, columns=_NEW_MESSAGE_COLUMNS))
        # RETURNING does not promise an order, but AUTOINCREMENT hands out increasing ids
        # in insertion order, which is the order of `rows`: sorted, they match.
        ids.sort()
        return ids

    def end_session(
        self, session_id: str, end_reason: str, *, ended_at: float | None = None
    ) -> None:
        """Mark a session ended with a reason."""
        ended = time.time() if ended_at is None else ended_at
        with driver(self._connections, write=True) as db:
            result = db.execute(_END_SESSION, id=session_id, ended_at=ended, end_reason=end_reason)
            if result.rowcount == 0:
                raise SessionNotFound(f"no session {session_id!r} to end")

    def set_message_flags(
        self,
        message_ids: Sequence[int],
        *,
        active: bool | None = None,
        compacted: bool | None = None,
    ) -> int:
        """Rewind (active=False) or archive (compacted=True) messages; return rows changed.

        The session counters do not change: they count every message appended, hidden
        or not, as the legacy application does.
        """
        values: dict[str, int] = {}
        if active is not None:
            values["active"] = int(active)
        if compacted is not None:
            values["compacted"] = int(compacted)
        ids = list(message_ids)
        if not values or not ids:
            return 0
        with driver(self._connections, write=True) as db:
            return db.execute(_SET_FLAGS[tuple(values)], ids=ids, **values).rowcount

    def edit_message(self, message_id: int, content: str | list[Any] | None) -> None:
        """Replace a message's text (the FTS triggers re-index it)."""
        with driver(self._connections, write=True) as db:
            result = db.execute(_EDIT_MESSAGE, id=message_id, content=encode_content(content))
            if result.rowcount == 0:
                raise StoreError(f"no message with id {message_id}")

    def delete_session(self, session_id: str) -> int:
        """Delete a session and its messages; its child sessions are kept, unparented.

        Returns the number of messages deleted. Per-model usage rows go with the session
        (ON DELETE CASCADE).
        """
        with driver(self._connections, write=True) as db:
            if not db.execute(_SESSION_EXISTS, id=session_id).fetchone():
                raise SessionNotFound(f"no session {session_id!r} to delete")
            db.execute(_UNPARENT_CHILDREN, id=session_id)
            deleted = db.execute(_DELETE_MESSAGES, id=session_id).rowcount
            db.execute(_DELETE_SESSION, id=session_id)
            return deleted

    # -- reads -----------------------------------------------------------------------

    def get_session(self, session_id: str) -> AgentSessionRecord | None:
        """One agent session, every column, or None when there is none with this id."""
        rows = fetch(self._connections, _SELECT_SESSION, id=session_id)
        return _read_sessions(rows)[0] if rows else None

    def messages(self, session_id: str, *, include_inactive: bool = True) -> list[MessageRecord]:
        """A session's messages in conversation order (timestamp, then id).

        ``include_inactive=False`` hides rewound messages (active=0) but keeps compacted
        ones (active=0, compacted=1), which the UI history still shows.
        """
        rows = fetch(self._connections, _SELECT_MESSAGES[include_inactive], session_id=session_id)
        return _read_messages(rows)

    def list_sessions(
        self, *, limit: int = 50, offset: int = 0, source: str | None = None
    ) -> list[SessionSummary]:
        """Sessions newest first, with their message and tool-call counts."""
        statement = _LIST_SESSIONS[source is not None]
        rows = fetch(self._connections, statement, limit=limit, offset=offset, source=source)
        return _read_summaries(rows)

    def search(
        self,
        query: str,
        *,
        source_filter: Sequence[str] | None = None,
        exclude_sources: Sequence[str] | None = None,
        role_filter: Sequence[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        sort: str | None = None,
        include_inactive: bool = False,
    ) -> SearchResults:
        """Search message text; see :func:`hermes_store.search.search_messages`.

        The hits are plain dicts (with their context windows), ranked as the legacy
        application ranks them; ``results.degraded`` says when a damaged index made the
        search fall back to a scan. A store opened with ``archives`` searches them too:
        one list, each message once (docs/search.md, "Searching archives").
        """
        options = SearchOptions(
            query,
            source_filter,
            exclude_sources,
            role_filter,
            limit,
            offset,
            sort,
            include_inactive,
        )
        archives = [Searched(name, store._connections) for name, store in self._archives]
        return search_stores(self._connections, archives, options)


def _message_row(session_id: str, message: NewMessage) -> tuple[Any, ...]:
    """The `messages` row of a new message, in the order of _NEW_MESSAGE_COLUMNS."""
    tool_calls = message.tool_calls
    if isinstance(tool_calls, list):
        tool_calls = json.dumps(tool_calls, ensure_ascii=False)
    return (
        session_id,
        message.role,
        encode_content(message.content),
        message.tool_call_id,
        tool_calls,
        message.tool_name,
        time.time() if message.timestamp is None else message.timestamp,
        message.token_count,
        message.finish_reason,
        message.reasoning,
        message.platform_message_id,
    )

"""The raw floor: plain ``sqlite3`` running the statements the legacy application runs.

The data layer (``hermes_store.store.Store``, ``hermes_store.search.search_messages``) is
measured against this module, operation by operation (``benchmarks/floor.py``). Nothing
here uses SQLAlchemy or the data layer's statements: each function is the legacy Hermes
application's SQL for one operation, run through the stdlib driver with as little Python
around it as the application itself has.

Where the statements come from (NousResearch/hermes-agent, read, not copied):

- open, create, fetch, list: the single-file ``hermes_state.py`` ``SessionDB`` (commit
  544ac55e): ``sqlite3.connect`` then ``PRAGMA journal_mode=WAL`` and ``PRAGMA
  foreign_keys=ON``; ``INSERT INTO sessions (id, source, user_id, model, model_config,
  system_prompt, parent_session_id, started_at)``; ``SELECT * FROM messages WHERE
  session_id = ? ORDER BY timestamp, id``; ``SELECT * FROM sessions ORDER BY started_at
  DESC LIMIT ? OFFSET ?``.
- appends: its ``append_message``, per message one INSERT and one counter UPDATE, with
  the schema-21 columns (:data:`INSERT_MESSAGE`); writes run in ``BEGIN IMMEDIATE``, as
  the application's ``_execute_write`` does.
- rewind: ``UPDATE messages SET active = 0 WHERE id IN (...)`` (its rewind mixin).
- delete: ``SELECT COUNT(*)``, children unparented, messages, then the session, in one
  write transaction.
- search: the contract it answers by (docs/search.md, written from the
  application's ``search_messages``): one SELECT per query on the route's index (or the
  LIKE scan), then the context windows of all hits in one statement, shaped like its
  ``_CONTEXT_WINDOW_SQL`` (``hermes_state_search.py``, commit 02077aa7) minus the columns
  later schemas added.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hermes_store.records import NewMessage
from hermes_store.search import (
    TRIGRAM_INDEX,
    WORD_INDEX,
    contains_cjk,
    context_text,
    count_cjk,
    sanitize_query,
)
from hermes_store.store import count_tool_calls, encode_content

#: What the legacy application runs on every connection it opens (``timeout`` is the
#: driver's busy timeout).
OPEN_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA foreign_keys=ON")
BUSY_TIMEOUT_S = 30.0

INSERT_SESSION = (
    "INSERT INTO sessions (id, source, user_id, model, model_config, system_prompt, "
    "parent_session_id, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
#: What the legacy application runs for each message it appends: the row, then the
#: session's counters, in the caller's transaction.
INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name, "
    "timestamp, token_count, finish_reason, reasoning, platform_message_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
BUMP_MESSAGES = "UPDATE sessions SET message_count = message_count + 1 WHERE id = ?"
BUMP_MESSAGES_AND_CALLS = (
    "UPDATE sessions SET message_count = message_count + 1, "
    "tool_call_count = tool_call_count + ? WHERE id = ?"
)
SELECT_SESSION = "SELECT * FROM sessions WHERE id = ?"
SELECT_MESSAGES = "SELECT * FROM messages WHERE session_id = ? ORDER BY timestamp, id"
LIST_SESSIONS = "SELECT * FROM sessions ORDER BY started_at DESC LIMIT ? OFFSET ?"
COUNT_SESSION = "SELECT COUNT(*) FROM sessions WHERE id = ?"
UNPARENT_CHILDREN = "UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id = ?"
DELETE_MESSAGES = "DELETE FROM messages WHERE session_id = ?"
DELETE_SESSION = "DELETE FROM sessions WHERE id = ?"

SNIPPET = "snippet({index}, 0, '>>>', '<<<', '...', 40)"
LIKE_SNIPPET = "substr(m.content, max(1, instr(m.content, ?) - 40), 120)"
LIKE_TOKEN = (
    "(m.content LIKE ? ESCAPE '\\' OR m.tool_name LIKE ? ESCAPE '\\' "
    "OR m.tool_calls LIKE ? ESCAPE '\\')"
)
SEARCH = (
    "SELECT m.id, m.session_id, m.role, {snippet} AS snippet, m.timestamp, m.tool_name, "
    "s.source, s.model, s.started_at AS session_started "
    "FROM {source} JOIN sessions s ON s.id = m.session_id "
    "WHERE {where} {order} LIMIT ? OFFSET ?"
)
ORDER = {None: "ORDER BY rank", "newest": "ORDER BY m.timestamp DESC, rank"}
ORDER["oldest"] = "ORDER BY m.timestamp ASC, rank"
CONTEXT_WINDOWS = """WITH target AS (
    SELECT session_id, timestamp, id FROM messages WHERE id IN ({ids})
)
SELECT t.id, m.role, m.content
FROM target t JOIN messages m ON m.id IN (
    t.id,
    (SELECT p.id FROM messages p
     WHERE p.session_id = t.session_id AND (p.timestamp, p.id) < (t.timestamp, t.id)
     ORDER BY p.timestamp DESC, p.id DESC LIMIT 1),
    (SELECT n.id FROM messages n
     WHERE n.session_id = t.session_id AND (n.timestamp, n.id) > (t.timestamp, t.id)
     ORDER BY n.timestamp, n.id LIMIT 1)
)
ORDER BY t.id, m.timestamp, m.id"""
RESULT_KEYS = (
    "id",
    "session_id",
    "role",
    "snippet",
    "timestamp",
    "tool_name",
    "source",
    "model",
    "session_started",
)


def connect(path: Path) -> sqlite3.Connection:
    """Open a store as the legacy application does (autocommit: transactions are explicit)."""
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    for pragma in OPEN_PRAGMAS:
        conn.execute(pragma)
    return conn


@contextlib.contextmanager
def writing(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, begun as a writer (``BEGIN IMMEDIATE``)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# -- writes ------------------------------------------------------------------------------


def create_session(
    conn: sqlite3.Connection, session_id: str, source: str, started_at: float
) -> None:
    """Create a session row."""
    with writing(conn):
        conn.execute(INSERT_SESSION, (session_id, source, None, None, None, None, None, started_at))


def _insert_message(conn: sqlite3.Connection, session_id: str, m: NewMessage) -> int:
    tool_calls = m.tool_calls
    if isinstance(tool_calls, list):
        tool_calls = json.dumps(tool_calls, ensure_ascii=False)
    cursor = conn.execute(
        INSERT_MESSAGE,
        (
            session_id,
            m.role,
            encode_content(m.content),
            m.tool_call_id,
            tool_calls,
            m.tool_name,
            time.time() if m.timestamp is None else m.timestamp,
            m.token_count,
            m.finish_reason,
            m.reasoning,
            m.platform_message_id,
        ),
    )
    calls = count_tool_calls(m.tool_calls)
    if calls:
        conn.execute(BUMP_MESSAGES_AND_CALLS, (calls, session_id))
    else:
        conn.execute(BUMP_MESSAGES, (session_id,))
    return int(cursor.lastrowid or 0)


def append_messages(
    conn: sqlite3.Connection, session_id: str, messages: Sequence[NewMessage]
) -> list[int]:
    """Append messages in one write transaction: per message an INSERT and a counter UPDATE."""
    with writing(conn):
        return [_insert_message(conn, session_id, m) for m in messages]


def append_message(conn: sqlite3.Connection, session_id: str, message: NewMessage) -> int:
    """Append one message in its own write transaction."""
    with writing(conn):
        return _insert_message(conn, session_id, message)


def set_active(conn: sqlite3.Connection, message_ids: Sequence[int], active: bool) -> int:
    """Rewind (active=0) or restore (active=1) messages; return the rows changed."""
    marks = ",".join("?" * len(message_ids))
    with writing(conn):
        sql = f"UPDATE messages SET active = {int(active)} WHERE id IN ({marks})"
        return conn.execute(sql, message_ids).rowcount


def delete_session(conn: sqlite3.Connection, session_id: str) -> int:
    """Delete a session and its messages, children unparented; the messages deleted."""
    with writing(conn):
        if conn.execute(COUNT_SESSION, (session_id,)).fetchone()[0] == 0:
            return 0
        conn.execute(UNPARENT_CHILDREN, (session_id,))
        deleted = conn.execute(DELETE_MESSAGES, (session_id,)).rowcount
        conn.execute(DELETE_SESSION, (session_id,))
        return deleted


# -- reads -------------------------------------------------------------------------------


def get_session(conn: sqlite3.Connection, session_id: str) -> tuple[Any, ...] | None:
    """One session row, every column."""
    row: tuple[Any, ...] | None = conn.execute(SELECT_SESSION, (session_id,)).fetchone()
    return row


def messages(conn: sqlite3.Connection, session_id: str) -> list[tuple[Any, ...]]:
    """A session's messages in conversation order, every column."""
    return conn.execute(SELECT_MESSAGES, (session_id,)).fetchall()


def list_sessions(conn: sqlite3.Connection, limit: int = 50, offset: int = 0) -> list[Any]:
    """Sessions newest first."""
    return conn.execute(LIST_SESSIONS, (limit, offset)).fetchall()


def open_store(path: Path, session_id: str) -> tuple[Any, ...] | None:
    """Open a store, read one session, close it: what starting up costs."""
    conn = connect(path)
    try:
        return get_session(conn, session_id)
    finally:
        conn.close()


# -- search ------------------------------------------------------------------------------


def _escape_like(token: str) -> str:
    return token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _route(sanitized: str) -> tuple[str | None, str, list[str]]:
    """(index or None for the LIKE scan, MATCH expression, LIKE tokens) of a query."""
    if not contains_cjk(sanitized):
        return WORD_INDEX, sanitized, []
    raw = sanitized.strip('"').strip()
    tokens = raw.split()
    terms = [t for t in tokens if t.upper() not in ("AND", "OR", "NOT")]
    like = terms or [raw]
    if count_cjk(raw) >= 3 and all(count_cjk(t) >= 3 for t in terms if contains_cjk(t)):
        match = " ".join(
            t if t.upper() in ("AND", "OR", "NOT") else '"' + t.replace('"', '""') + '"'
            for t in tokens
        )
        return TRIGRAM_INDEX, match, like
    return None, "", like


def search(
    conn: sqlite3.Connection,
    query: str,
    *,
    source_filter: Sequence[str] | None = None,
    exclude_sources: Sequence[str] | None = None,
    role_filter: Sequence[str] | None = None,
    limit: int = 20,
    offset: int = 0,
    sort: str | None = None,
    include_inactive: bool = False,
) -> list[dict[str, Any]]:
    """The legacy search: one SELECT on the route's index or the LIKE scan, then the context
    windows of every hit in one statement; hits as dicts with their ``context``."""
    sanitized = sanitize_query(query)
    if not sanitized:
        return []
    index, match, like = _route(sanitized)
    where: list[str] = []
    params: list[Any] = []
    if index is not None:
        snippet, source = (
            SNIPPET.format(index=index),
            f"{index} JOIN messages m ON m.id = {index}.rowid",
        )
        where.append(f"{index} MATCH ?")
        params.append(match)
        if not include_inactive:
            where.append("(m.active = 1 OR m.compacted = 1)")
        order = ORDER.get(sort)
    else:
        snippet, source = LIKE_SNIPPET, "messages m"
        params.append(like[0])
        where.append("(" + " OR ".join(LIKE_TOKEN for _ in like) + ")")
        for token in like:
            params += [f"%{_escape_like(token)}%"] * 3
        order = "ORDER BY m.timestamp DESC"
    for values, test in (
        (source_filter, "s.source IN"),
        (exclude_sources, "s.source NOT IN"),
        (role_filter or None, "m.role IN"),
    ):
        if values is not None:
            where.append(f"{test} ({','.join('?' * len(values))})")
            params += values
    sql = SEARCH.format(snippet=snippet, source=source, where=" AND ".join(where), order=order)
    try:
        rows = conn.execute(sql, (*params, limit, offset)).fetchall()
    except sqlite3.OperationalError:
        return []
    hits = [dict(zip(RESULT_KEYS, row, strict=True)) for row in rows]
    if not hits:
        return hits
    contexts: dict[int, list[dict[str, str]]] = {hit["id"]: [] for hit in hits}
    windows = CONTEXT_WINDOWS.format(ids=",".join("?" * len(contexts)))
    for hit_id, role, content in conn.execute(windows, list(contexts)):
        contexts[hit_id].append({"role": role, "content": context_text(content)})
    for hit in hits:
        hit["context"] = contexts[hit["id"]]
    return hits

"""A hot store whose sessions cover every rule of the archive's selection, and readers of
what two stores hold between them."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from hermes_store import migrate
from hermes_store.archive.rows import OWNED_TABLES
from hermes_store.store import NewMessage, Store

DAY = 86400.0
NOW = time.time()
OLD = NOW - 200 * DAY
RECENT = NOW - 1 * DAY
#: Put into message text: it must never reach a log, an error or the report.
SECRET = "zq7ARCHIVEsecret"

#: The sessions an `--older-than 90d` run moves, and those it keeps.
MOVED_BY_AGE = {"r1", "r1-cont", "r1-sub", "d1", "d2", "l2"}
KEPT_BY_AGE = {"o1", "o1-open", "d3", "n1", "u1", "a1", "l1", "m1", "m1-child", "g1"}
#: What `--archived` moves.
MOVED_ARCHIVED = {"a1"}
#: The prompt only moved sessions use (goes), and the one a kept session shares (stays).
OWN_PROMPT = "hash-own"
SHARED_PROMPT = "hash-shared"


def _messages(store: Store, sid: str, at: float, count: int = 3) -> None:
    store.append_messages(
        sid,
        [
            NewMessage(
                role="user" if i % 2 == 0 else "assistant",
                content=f"{SECRET} message {i} of {sid} about docker compose \x00 and 数据库",
                timestamp=at + i,
            )
            for i in range(count)
        ],
    )


def _session(
    store: Store, sid: str, at: float, *, ended: bool = True, parent: str | None = None, **kw: Any
) -> None:
    source = kw.pop("source", "cli")
    store.create_session(sid, source, started_at=at, parent_session_id=parent, **kw)
    _messages(store, sid, at + 10)
    if ended:
        store.end_session(sid, "done", ended_at=at + 100)


def build_hot(path: Path) -> Path:
    """A store at head holding the sessions of :data:`MOVED_BY_AGE` and :data:`KEPT_BY_AGE`."""
    migrate.upgrade(str(path))
    with Store.open(str(path)) as store:
        # A tree: root, its compression continuation and a subagent, all old and ended.
        _session(store, "r1", OLD, title="old root", system_prompt_hash=OWN_PROMPT)
        _session(store, "r1-cont", OLD + 200, parent="r1", system_prompt_hash=SHARED_PROMPT)
        _session(store, "r1-sub", OLD + 300, parent="r1", source="subagent")
        # Old, but a child is still open: the whole tree stays.
        _session(store, "o1", OLD)
        _session(store, "o1-open", OLD + 50, parent="o1", ended=False)
        # Linked by a finished delegation only: they move together.
        _session(store, "d1", OLD)
        _session(store, "d2", OLD + 10)
        # A running delegation: stays.
        _session(store, "d3", OLD)
        # Recent, not ended, archived but recent, leased, locked (expired), routed.
        _session(store, "n1", RECENT, system_prompt_hash=SHARED_PROMPT)
        _session(store, "u1", OLD, ended=False)
        _session(store, "a1", RECENT, archived=1)
        _session(store, "l1", OLD)
        _session(store, "l2", OLD)
        _session(store, "g1", OLD)
        # An old root whose child was active recently: the tree is as young as its child.
        _session(store, "m1", OLD)
        _session(store, "m1-child", OLD + 20, parent="m1", last_activity_at=RECENT)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executemany(
            "INSERT INTO system_prompts (hash, prompt) VALUES (?, ?)",
            [(OWN_PROMPT, f"{SECRET} own prompt"), (SHARED_PROMPT, "shared prompt")],
        )
        conn.executemany(
            "INSERT INTO session_model_usage (session_id, model, input_tokens, "
            "estimated_cost_usd) VALUES (?, ?, ?, ?)",
            [("r1", "gpt", 10, 0.5), ("r1-sub", "claude", 3, 1e-300), ("n1", "gpt", 1, 0.0)],
        )
        delegation = (
            "INSERT INTO async_delegations (delegation_id, origin_session, parent_session_id, "
            "state, dispatched_at, completed_at, updated_at, origin_session_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        conn.execute(delegation, ("del-1", "d1", "d2", "done", OLD, OLD + 5, OLD + 5, "d1"))
        conn.execute(delegation, ("del-3", "d3", None, "running", OLD, None, OLD, "d3"))
        conn.execute(
            "INSERT INTO session_turn_leases VALUES ('l1', 'pid=1', ?, ?)", (NOW, NOW + 3600)
        )
        conn.execute("INSERT INTO compression_locks VALUES ('l2', 'pid=2', ?, ?)", (OLD, OLD + 60))
        conn.execute(
            "INSERT INTO gateway_routing (scope, session_key, entry_json, updated_at) "
            "VALUES ('', 'telegram:42', ?, ?)",
            (json.dumps({"session_id": "g1", "platform": "telegram"}), NOW),
        )
        conn.commit()
    return path


#: Every table whose rows belong to sessions, and the shared prompts.
ROW_TABLES = (*OWNED_TABLES, "system_prompts")


def rows(path: Path, table: str) -> set[tuple[Any, ...]]:
    """Every row of ``table`` in the store at ``path``."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return set(conn.execute(f"SELECT * FROM {table}"))


def session_ids(path: Path) -> set[str]:
    return {row[0] for row in rows_of(path, "SELECT id FROM sessions")}


def rows_of(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return list(conn.execute(sql))


def snapshot(path: Path) -> dict[str, set[tuple[Any, ...]]]:
    """The session rows and prompts of a store, by table."""
    return {table: rows(path, table) for table in ROW_TABLES}


def union_equals(before: dict[str, set[Any]], hot: Path, archive: Path) -> None:
    """Each session row is in exactly one of the two stores, unchanged; a prompt is in at
    least one, and in the hot store while a hot session refers to it."""
    for table in OWNED_TABLES:
        here, there = rows(hot, table), rows(archive, table) if archive.exists() else set()
        assert not here & there, (table, sorted(here & there)[:3])
        assert here | there == before[table], table
    prompts_hot = rows(hot, "system_prompts")
    prompts_archive = rows(archive, "system_prompts") if archive.exists() else set()
    assert prompts_hot | prompts_archive == before["system_prompts"]
    referred = {r[0] for r in rows_of(hot, "SELECT system_prompt_hash FROM sessions")} - {None}
    assert referred <= {row[0] for row in prompts_hot}
    assert_whole_trees(hot, archive)


def assert_whole_trees(hot: Path, archive: Path) -> None:
    """No parent link and no delegation crosses the two stores."""
    for one, other in ((hot, archive), (archive, hot)):
        if not one.exists() or not other.exists():
            continue
        there = session_ids(other)
        parents = rows_of(one, "SELECT parent_session_id FROM sessions")
        assert not {p for (p,) in parents} & there
        links = rows_of(one, "SELECT origin_session, parent_session_id FROM async_delegations")
        assert not {sid for link in links for sid in link} & there


def message_ids(path: Path) -> set[int]:
    return {row[0] for row in rows_of(path, "SELECT id FROM messages")}


#: The session of :func:`add_big_tree`: more messages than one chunk of the hot store.
BIG = "big-old"


def add_big_tree(path: Path, messages: int = 1000) -> None:
    """An old, ended session with ``messages`` messages (it enters and leaves the hot
    store in chunks)."""
    with Store.open(str(path)) as store:
        store.create_session(BIG, "cli", started_at=OLD)
        store.append_messages(
            BIG,
            [
                NewMessage(role="user", content=f"big {i} {SECRET} docker", timestamp=OLD + i)
                for i in range(messages)
            ],
        )
        store.end_session(BIG, "done", ended_at=OLD + messages + 1)


def hot_copy(template: Path, tmp_path: Path) -> Path:
    """A private copy of a template hot store (mode 0600), for one test to change."""
    path = tmp_path / "state.db"
    path.write_bytes(template.read_bytes())
    path.chmod(0o600)
    return path

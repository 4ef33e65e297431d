"""The rows that belong to a set of sessions, table by table: read, written, deleted.

Every table of the models is one of three kinds (a test holds each table to one):

- **owned** rows belong to one session and move with it: ``sessions`` itself, ``messages``,
  ``session_model_usage``, ``compression_locks`` (by ``session_id``),
  ``session_turn_leases`` (by ``conversation_id``, the root session of a compression
  chain), and ``async_delegations`` (by any of the sessions it names: the one that
  delegated, its parent, its UI session);
- **shared** rows are stored once and referred to from sessions: ``system_prompts`` (by
  ``sessions.system_prompt_hash``). They are copied with the sessions that refer to them
  and deleted from a store only when no session left there refers to them;
- **kept** rows describe the store, the gateway or a conversation key, never one session:
  they stay where they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Table,
    exists,
    false,
    or_,
    select,
)

from hermes_store.archive.shape import has
from hermes_store.archive.shape import table as copied_table
from hermes_store.copy.tablesum import TableChecksum
from hermes_store.copy.write import insert_rows as _insert_copied

__all__ = [
    "DELEGATION_LINKS",
    "KEPT_TABLES",
    "OWNED_TABLES",
    "SHARED_TABLES",
    "BatchRows",
    "delete_rows",
    "insert_rows",
    "owned_condition",
    "present",
    "prompt_condition",
    "read_batch",
    "row_bytes",
    "session_of",
    "write_batch",
]

#: Owned tables, parents first (the order rows are inserted in; deleted in reverse).
OWNED_TABLES = (
    "sessions",
    "messages",
    "session_model_usage",
    "async_delegations",
    "compression_locks",
    "session_turn_leases",
)
SHARED_TABLES = ("system_prompts",)
KEPT_TABLES = (
    "state_meta",
    "gateway_routing",
    "gateway_hygiene_state",
    "conversation_generations",
    "gateway_heartbeats",
    "schema_version",
)
#: The columns of ``async_delegations`` that name a session.
DELEGATION_LINKS = (
    "origin_session",
    "origin_session_id",
    "parent_session_id",
    "origin_ui_session_id",
)
#: The column of each owned table (but delegations) that names its session.
_SESSION_COLUMN = {
    "sessions": "id",
    "messages": "session_id",
    "session_model_usage": "session_id",
    "compression_locks": "session_id",
    "session_turn_leases": "conversation_id",
}


def _in(column: Any, values: Sequence[Any]) -> ColumnElement[bool]:
    if not values:
        return false()
    found: ColumnElement[bool] = column.in_(list(values))  # one expanding parameter
    return found


def present(names: Sequence[str]) -> list[str]:
    """The tables of ``names`` the run moves (those the hot store has)."""
    return [name for name in names if has(name)]


def owned_condition(table: Table, ids: Sequence[str]) -> ColumnElement[bool]:
    """The rows of an owned table that belong to the sessions ``ids``."""
    if table.name == "async_delegations":
        links = [name for name in DELEGATION_LINKS if name in table.c]
        return or_(*(_in(table.c[name], ids) for name in links))
    return _in(table.c[_SESSION_COLUMN[table.name]], ids)


def session_of(name: str, row: Any, ids: Sequence[str]) -> str:
    """The session of ``ids`` a row of the owned table ``name`` belongs to."""
    if name == "async_delegations":
        named = [getattr(row, link, None) for link in DELEGATION_LINKS]
        return next((str(sid) for sid in named if sid in ids), str(named[0]))
    return str(getattr(row, _SESSION_COLUMN[name]))


def prompt_condition(hashes: Sequence[str]) -> ColumnElement[bool]:
    """The system prompts of these hashes."""
    if not has("system_prompts"):
        return false()
    return _in(copied_table("system_prompts").c.hash, hashes)


def insert_rows(conn: Connection, table: Table, rows: Sequence[Row[Any]]) -> None:
    """Insert ``rows`` as they are; messages without a display order column get the one
    the store's trigger gives them (the hot store's application has none)."""
    if table.name == "messages" and "display_order" not in table.c:
        conn.execute(table.insert(), [dict(row._mapping) for row in rows])
        return
    _insert_copied(conn, table, rows)


def row_bytes(row: Sequence[Any]) -> int:
    """The bytes a row's values take (text as UTF-8): what a dry run counts."""
    total = 0
    for value in row:
        if isinstance(value, str):
            total += len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            total += len(bytes(value))
        elif value is not None:
            total += 8
    return total


@dataclass
class BatchRows:
    """Every row of a batch of session trees, as one store holds them."""

    ids: list[str]
    #: Owned table -> rows (sessions parents first).
    owned: dict[str, list[Row[Any]]] = field(default_factory=dict)
    #: The system prompts the sessions refer to.
    prompts: list[Row[Any]] = field(default_factory=list)

    @property
    def hashes(self) -> list[str]:
        return sorted({str(row.hash) for row in self.prompts})

    def count(self, table: str) -> int:
        return len(self.owned.get(table, []))

    def bytes(self) -> int:
        return sum(row_bytes(row) for rows in self.owned.values() for row in rows)

    def sums(self) -> dict[str, tuple[int, str]]:
        """(rows, checksum) of each owned table's rows and of the prompts."""
        found: dict[str, tuple[int, str]] = {}
        for name in OWNED_TABLES:
            rows = self.owned.get(name, [])
            found[name] = _sum(name, rows)
        found["system_prompts"] = _sum("system_prompts", self.prompts)
        return found


def _sum(name: str, rows: Sequence[Row[Any]]) -> tuple[int, str]:
    """(rows, checksum) of rows of the table ``name``; a table the hot store lacks holds
    none."""
    if not has(name):
        return (0, f"{0:064x}")
    check = TableChecksum(copied_table(name))
    for row in rows:
        check.add(row)
    return (check.rows, check.hexdigest())


def _parents_first(rows: Iterable[Row[Any]]) -> list[Row[Any]]:
    """Sessions ordered so that a parent comes before its children."""
    by_id = {row.id: row for row in rows}

    def depth(row: Row[Any]) -> int:
        seen, level, parent = {row.id}, 0, row.parent_session_id
        while parent in by_id and parent not in seen:
            seen.add(parent)
            level += 1
            parent = by_id[parent].parent_session_id
        return level

    return sorted(by_id.values(), key=lambda row: (depth(row), row.id))


def read_batch(conn: Connection, ids: Sequence[str]) -> BatchRows:
    """Every row the sessions ``ids`` own in the store of ``conn``, and their prompts."""
    batch = BatchRows(sorted(ids))
    for name in OWNED_TABLES:
        if not has(name):
            batch.owned[name] = []
            continue
        table = copied_table(name)
        key = list(table.primary_key.columns)
        query = select(*table.columns).where(owned_condition(table, batch.ids)).order_by(*key)
        rows = list(conn.execute(query))
        batch.owned[name] = _parents_first(rows) if name == "sessions" else rows
    if not has("system_prompts") or "system_prompt_hash" not in copied_table("sessions").c:
        return batch
    hashes = sorted({row.system_prompt_hash for row in batch.owned["sessions"]} - {None})
    prompts = copied_table("system_prompts")
    batch.prompts = list(
        conn.execute(
            select(*prompts.columns).where(prompt_condition(hashes)).order_by(prompts.c.hash)
        )
    )
    return batch


def write_batch(conn: Connection, batch: BatchRows) -> None:
    """Insert a batch's rows as they are (ids kept), parents first; a prompt the store
    already holds is kept as it is."""
    if batch.prompts:
        prompts = copied_table("system_prompts")
        held = set(conn.scalars(select(prompts.c.hash).where(prompt_condition(batch.hashes))))
        missing = [row for row in batch.prompts if row.hash not in held]
        if missing:
            insert_rows(conn, prompts, missing)
    for name in OWNED_TABLES:
        rows = batch.owned.get(name, [])
        if rows:
            insert_rows(conn, copied_table(name), rows)


def delete_rows(conn: Connection, ids: Sequence[str], hashes: Sequence[str]) -> dict[str, int]:
    """Delete what the sessions ``ids`` own, children first, then the prompts of
    ``hashes`` no session left in the store refers to. Returns the rows deleted by table."""
    deleted: dict[str, int] = {}
    for name in reversed(OWNED_TABLES):
        if not has(name):
            deleted[name] = 0
            continue
        table = copied_table(name)
        if name == "sessions":
            # Children first: the parent link is checked at each statement.
            rows = read_batch_sessions(conn, ids)
            total = 0
            for row in reversed(rows):
                total += conn.execute(table.delete().where(table.c.id == row.id)).rowcount
            deleted[name] = total
            continue
        deleted[name] = conn.execute(table.delete().where(owned_condition(table, ids))).rowcount
    sessions = copied_table("sessions")
    if not has("system_prompts") or "system_prompt_hash" not in sessions.c:
        deleted["system_prompts"] = 0
        return deleted
    prompts = copied_table("system_prompts")
    referred = exists().where(sessions.c.system_prompt_hash == prompts.c.hash)
    deleted["system_prompts"] = conn.execute(
        prompts.delete().where(prompt_condition(hashes), ~referred)
    ).rowcount
    return deleted


def read_batch_sessions(conn: Connection, ids: Sequence[str]) -> list[Row[Any]]:
    """The sessions ``ids`` (id and parent), parents first."""
    table = copied_table("sessions")
    query = select(table.c.id, table.c.parent_session_id).where(owned_condition(table, ids))
    return _parents_first(conn.execute(query))

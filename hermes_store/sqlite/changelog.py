"""Verifying legacy inline indexes ahead of the conversion's write lock.

The upgrade verifies the legacy indexes under a read snapshot while the agent keeps
writing: it first installs a change log and its triggers (one short write), then reads,
then records each verdict in `state_meta`. Every id written, edited or deleted after the
log exists is logged, through `messages` and through the legacy copies `<index>_content`
themselves. In its write lock the conversion revision then re-checks only the logged ids,
and trusts a verdict only with the very log (its random id) that ran since its snapshot.

The revision keeps its own copy of this protocol (revisions import nothing of the
library); tests/test_declarations.py proves the two recognise each other's log.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from sqlalchemy import Connection, bindparam, text

from hermes_store.declarations import SQLITE, SQLiteLayout


def _watched(conn: Connection, layout: SQLiteLayout) -> list[str]:
    """The tables whose writes the change log records: messages and the legacy copies."""
    copies = [f"{index.name}_content" for index in layout.indexes]
    found = {
        str(row[0])
        for row in conn.execute(
            text("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN :n").bindparams(
                bindparam("n", expanding=True)
            ),
            {"n": copies},
        )
    }
    return ["messages", *(name for name in copies if name in found)]


def change_triggers(tables: Sequence[str], layout: SQLiteLayout = SQLITE) -> dict[str, str]:
    """Trigger name -> DDL: each insert, update and delete of ``tables`` logs its ids."""
    table_name = layout.change_log.table
    log_id = f"INSERT OR IGNORE INTO {table_name}(id) VALUES"
    triggers = {}
    for table in tables:
        for event, body in (
            ("INSERT", f"{log_id} (new.id);"),
            ("UPDATE", f"{log_id} (old.id); {log_id} (new.id);"),
            ("DELETE", f"{log_id} (old.id);"),
        ):
            name = f"{table_name}__{table}_{event.lower()}"
            triggers[name] = f"CREATE TRIGGER {name} AFTER {event} ON {table} BEGIN {body} END"
    return triggers


def start_change_log(conn: Connection, layout: SQLiteLayout = SQLITE) -> str:
    """Install the change log and its triggers afresh (in the caller's write transaction);
    return its id."""
    drop_change_log(conn, layout)
    conn.exec_driver_sql(f"CREATE TABLE {layout.change_log.table} (id INTEGER PRIMARY KEY)")
    for ddl in change_triggers(_watched(conn, layout), layout).values():
        conn.exec_driver_sql(ddl)
    log_id = secrets.token_hex(8)
    conn.execute(
        text("INSERT INTO state_meta (key, value) VALUES (:key, :value)"),
        {"key": layout.change_log.id_key, "value": log_id},
    )
    return log_id


def drop_change_log(conn: Connection, layout: SQLiteLayout = SQLITE) -> None:
    """Remove the change log, its triggers, its id and the recorded verdicts."""
    log = layout.change_log
    triggers = conn.execute(
        text("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE :p"),
        {"p": f"{log.table}%"},
    ).scalars()
    for name in list(triggers):
        conn.exec_driver_sql(f'DROP TRIGGER IF EXISTS "{name}"')
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {log.table}")
    conn.execute(
        text("DELETE FROM state_meta WHERE key = :id OR key LIKE :verdicts"),
        {"id": log.id_key, "verdicts": log.verified_key.format(name="%")},
    )


def current_log_id(conn: Connection, layout: SQLiteLayout = SQLITE) -> str | None:
    """The id of the change log, when it and its triggers on `messages` and on each legacy
    copy still in place are as installed; else None."""
    log = layout.change_log
    found = {
        str(name): " ".join(str(sql).split())
        for name, sql in conn.execute(
            text("SELECT name, sql FROM sqlite_master WHERE name LIKE :p"),
            {"p": f"{log.table}%"},
        )
    }
    expected = change_triggers(_watched(conn, layout), layout)
    if found.pop(log.table, None) is None or any(
        found.get(name) != ddl for name, ddl in expected.items()
    ):
        return None
    log_id = conn.execute(
        text("SELECT value FROM state_meta WHERE key = :key"), {"key": log.id_key}
    ).scalar()
    return None if log_id is None else str(log_id)


def verify_inline(conn: Connection, name: str, layout: SQLiteLayout = SQLITE) -> str | None:
    """Why the inline index ``name`` cannot be reused as is, or None when it can.

    Reads every row of its copy: O(messages).
    """
    found = conn.execute(
        text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :name"),
        {"name": f"{name}_content"},
    ).first()
    if found is None:
        return "its content copy is missing"
    messages = int(conn.exec_driver_sql("SELECT count(*) FROM messages").scalar() or 0)
    copies = int(conn.exec_driver_sql(f"SELECT count(*) FROM {name}_content").scalar() or 0)
    docs = int(conn.exec_driver_sql(f"SELECT count(*) FROM {name}_docsize").scalar() or 0)
    if not messages == copies == docs:
        return f"it holds {copies} rows ({docs} sized) for {messages} messages"
    matched, differing = conn.exec_driver_sql(
        f"SELECT count(*), coalesce(sum(c.c0 IS NOT {layout.indexed_expression('m')}), 0) "
        f"FROM {name}_content AS c JOIN messages AS m ON m.id = c.id"
    ).one()
    if matched != messages:
        return f"{messages - int(matched)} message ids are not in it"
    if differing:
        return f"{int(differing)} rows differ from their messages"
    return None


def record_verdict(conn: Connection, index: str, log_id: str | None, verdict: str) -> None:
    """Record the verdict on ``index`` reached under the snapshot of log ``log_id``."""
    conn.execute(
        text("INSERT OR REPLACE INTO state_meta (key, value) VALUES (:key, :value)"),
        {"key": SQLITE.change_log.verified_key.format(name=index), "value": f"{log_id} {verdict}"},
    )


__all__ = [
    "change_triggers",
    "current_log_id",
    "drop_change_log",
    "record_verdict",
    "start_change_log",
    "verify_inline",
]

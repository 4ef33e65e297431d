"""FTS5 layout introspection, integrity checks and index maintenance."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from hermes_store.engine import translate_error

log = logging.getLogger(__name__)

WORD_INDEX = "messages_fts"
TRIGRAM_INDEX = "messages_fts_trigram"
INDEXES = (WORD_INDEX, TRIGRAM_INDEX)
SOURCE_VIEW = "messages_fts_source"
TRIGGERS = (
    "messages_fts_insert",
    "messages_fts_delete",
    "messages_fts_update",
    "messages_fts_trigram_insert",
    "messages_fts_trigram_delete",
    "messages_fts_trigram_update",
)


def _declaration(conn: Connection, name: str) -> str | None:
    row = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"),
        {"name": name},
    ).first()
    return None if row is None else str(row[0])


def index_layout(conn: Connection, name: str) -> str:
    """'external', 'inline' or 'none' for one FTS5 table."""
    sql = _declaration(conn, name)
    if sql is None:
        return "none"
    compact = sql.replace(" ", "").lower()
    return "external" if f"content='{SOURCE_VIEW}'" in compact else "inline"


#: This package's record of the search layout in `state_meta` (written by the FTS branch).
LAYOUT_MARKER = "hermes_store.fts_layout"
#: The Hermes application's own newer search layout: its view and its layout marker.
APPLICATION_VIEW = "messages_fts_src"
APPLICATION_MARKER = "fts_storage_version"


def is_application_layout(conn: Connection) -> bool:
    """True when the Hermes application moved the indexes to its own layout (left alone).

    Recognised as the application itself does: its word index declares a `tool_name`
    column (every layout of its own; the legacy one and this package's have one column),
    its view `messages_fts_src` exists, or its `fts_storage_version` marker is set.
    """
    word = _declaration(conn, WORD_INDEX)
    if word is not None and "tool_name" in word.lower():
        return True
    names = {
        str(row[0])
        for row in conn.execute(
            text("SELECT name FROM sqlite_master WHERE name IN (:view, 'state_meta')"),
            {"view": APPLICATION_VIEW},
        )
    }
    if APPLICATION_VIEW in names:
        return True
    if "state_meta" not in names:  # a new, empty store
        return False
    marker = conn.execute(
        text("SELECT 1 FROM state_meta WHERE key = :marker"), {"marker": APPLICATION_MARKER}
    ).first()
    return marker is not None


def layout(conn: Connection) -> str:
    """The store's search layout: 'external', 'inline', 'application' or 'none'.

    'application' is the Hermes application's own external layout (its view
    `messages_fts_src`), which this package recognises and leaves as it is.
    """
    if is_application_layout(conn):
        return "application"
    return index_layout(conn, WORD_INDEX)


def set_layout_marker(conn: Connection, value: str | None) -> None:
    """Record (or, with None, forget) the layout in `state_meta` under this package's key."""
    conn.execute(text("DELETE FROM state_meta WHERE key = :key"), {"key": LAYOUT_MARKER})
    if value is not None:
        conn.execute(
            text("INSERT INTO state_meta (key, value) VALUES (:key, :value)"),
            {"key": LAYOUT_MARKER, "value": value},
        )


def present_indexes(conn: Connection) -> list[str]:
    """The FTS5 indexes this store has, word index first."""
    return [name for name in INDEXES if _declaration(conn, name) is not None]


@dataclass
class CheckResult:
    """Outcome of the integrity checks: what was checked and what is broken."""

    checked: list[str] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    #: Indexes not checked because a deferred backfill has not filled them yet.
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return not self.problems


def check_index(conn: Connection, name: str) -> str | None:
    """Run FTS5 'integrity-check' with rank 1 (index versus its content); return the error.

    The check is an INSERT, so it needs write access: a held lock, a read-only store or a
    full disk says nothing about the index and is raised as its domain error instead.
    """
    savepoint = conn.begin_nested() if conn.in_transaction() else conn.begin()
    try:
        conn.exec_driver_sql(f"INSERT INTO {name}({name}, rank) VALUES ('integrity-check', 1)")
    except DBAPIError as exc:
        translated = translate_error(exc)
        if translated is not None:
            raise translated from exc
        return str(exc.orig)
    finally:
        savepoint.rollback()
    return None


def integrity_check(
    conn: Connection, *, quick: bool = False, skip: Mapping[str, str] | None = None
) -> CheckResult:
    """`PRAGMA integrity_check` (or quick_check) plus the FTS5 check of every index.

    ``skip`` maps indexes that must not be checked (an unfinished backfill) to the reason.
    """
    result = CheckResult()
    pragma = "quick_check" if quick else "integrity_check"
    rows = [str(r[0]) for r in conn.exec_driver_sql(f"PRAGMA {pragma}")]
    result.checked.append(f"PRAGMA {pragma}")
    if rows != ["ok"]:
        result.problems["database"] = "; ".join(rows[:10])
    for name in present_indexes(conn):
        if skip and name in skip:
            result.skipped[name] = skip[name]
            continue
        result.checked.append(name)
        error = check_index(conn, name)
        if error is not None:
            result.problems[name] = error
    return result


def optimize_index(conn: Connection, name: str) -> None:
    """Merge an index's segments into one (FTS5 'optimize')."""
    conn.exec_driver_sql(f"INSERT INTO {name}({name}) VALUES ('optimize')")


def rebuild_index(conn: Connection, name: str) -> None:
    """Refill an index from its content (FTS5 'rebuild'), then merge it."""
    conn.exec_driver_sql(f"INSERT INTO {name}({name}) VALUES ('rebuild')")
    optimize_index(conn, name)


#: What each message contributes to both indexes (the view's `content`, the triggers' text).
INDEXED_EXPRESSION = (
    "COALESCE(content, '') || ' ' || COALESCE(tool_name, '') || ' ' || COALESCE(tool_calls, '')"
)


def reindex_from_messages(conn: Connection, name: str) -> None:
    """Re-create an inline index empty and fill it from `messages`, then merge it.

    An inline index cannot be emptied reliably once damaged, so its table is dropped and
    declared again as it was; the triggers on `messages` keep working.
    """
    declaration = _declaration(conn, name)
    if declaration is None:
        raise ValueError(f"{name} does not exist in this store")
    conn.exec_driver_sql(f"DROP TABLE {name}")
    conn.exec_driver_sql(declaration)
    conn.exec_driver_sql(
        f"INSERT INTO {name}(rowid, content) SELECT id, {INDEXED_EXPRESSION} FROM messages"
    )
    optimize_index(conn, name)


def repair_index(conn: Connection, name: str) -> str:
    """Rebuild a broken index from what it indexes; return how, for the log and the report."""
    if index_layout(conn, name) == "external":
        rebuild_index(conn, name)
        return f"rebuilt from {SOURCE_VIEW}"
    reindex_from_messages(conn, name)
    return "re-indexed from messages (inline layout)"

"""Write legacy Hermes store files (schema 17 to 21) from the frozen DDL in `ddl`.

Only the stdlib `sqlite3` is used, so these fixtures stay independent of the SQLAlchemy models
and revisions they are meant to check.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import ddl

__all__ = [
    "LEGACY_VERSIONS",
    "build_legacy_store",
    "insert_legacy_rows",
    "write_sessions_json",
]

#: The schema versions `build_legacy_store` can write.
LEGACY_VERSIONS: tuple[int, ...] = (17, 18, 19, 20, 21)

StrPath = str | os.PathLike[str]


def build_legacy_store(
    path: StrPath,
    version: int,
    *,
    drift: bool = True,
    fts: bool = True,
    trigram: bool = True,
    fresh_order: bool = False,
) -> None:
    """Create a legacy store at `path` stamped `version`, as the legacy application left it.

    By default the file looks long-lived: the v17 tables, then the drift set and the v18
    columns appended by `ALTER TABLE ... ADD COLUMN`, then the later tables and indexes.
    `drift=False` leaves the drift set out (only possible below 21: the v21 schema includes
    it). `fresh_order=True` (v21 only) writes a store created fresh at 21, columns in
    declaration order. `fts=False` is a SQLite without FTS5: no FTS tables, no triggers.
    `trigram=False` is a SQLite without the trigram tokenizer: no `messages_fts_trigram`
    and none of its three triggers.
    """
    if version not in LEGACY_VERSIONS:
        raise ValueError(f"legacy version must be one of {LEGACY_VERSIONS}, got {version!r}")
    if fresh_order and version != 21:
        raise ValueError("fresh_order=True builds a store created fresh at v21; use version=21")
    if not drift and version == 21:
        raise ValueError(
            "the v21 schema includes the drift set; drift=False is only for versions 17 to 20"
        )
    target = Path(path)
    if target.exists():
        raise FileExistsError(f"refusing to build a legacy store over existing file {target}")
    target.parent.mkdir(parents=True, exist_ok=True)

    statements = (
        _fresh_v21_statements(fts=fts, trigram=trigram)
        if fresh_order
        else _long_lived_statements(version, drift=drift, fts=fts, trigram=trigram)
    )
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in statements:
            conn.execute(statement)
        conn.execute(ddl.SCHEMA_VERSION_INSERT, (version,))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _fts_statements(*, fts: bool, trigram: bool) -> list[str]:
    """The inline FTS tables and triggers that this SQLite build would have had."""
    if not fts:
        return []
    return [*ddl.FTS_WORD, *(ddl.FTS_TRIGRAM if trigram else ())]


def _long_lived_statements(version: int, *, drift: bool, fts: bool, trigram: bool) -> list[str]:
    """A store opened by every application build from v17 up to `version`."""
    statements: list[str] = [*ddl.V17_TABLES, *ddl.V17_INDEXES]
    statements += _fts_statements(fts=fts, trigram=trigram)
    if drift:
        statements += [*ddl.DRIFT_COLUMNS, *ddl.DRIFT_INDEXES]
    if version >= 18:
        statements += ddl.V18_COLUMNS
    if version >= 19:
        statements += ddl.V19_TABLES
    if version >= 20:
        statements += [*ddl.V20_TABLES, *ddl.V20_INDEXES]
    if version >= 21:
        statements += [*ddl.V21_TABLES, *ddl.V21_INDEXES]
    return statements


def _fresh_v21_statements(*, fts: bool, trigram: bool) -> list[str]:
    """A store created by the v21 application on an empty file."""
    return [
        *ddl.FRESH_V21_TABLES,
        *ddl.FRESH_V21_INDEXES,
        *_fts_statements(fts=fts, trigram=trigram),
    ]


def _quote_identifier(name: str) -> str:
    """Quote a column or table name for SQLite."""
    return '"' + name.replace('"', '""') + '"'


def _insert(conn: sqlite3.Connection, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
    """Plain INSERT of each row, its columns taken from its keys."""
    for row in rows:
        if not row:
            raise ValueError(f"empty row for table {table}")
        columns = ", ".join(_quote_identifier(column) for column in row)
        marks = ", ".join("?" for _ in row)
        conn.execute(
            f"INSERT INTO {_quote_identifier(table)} ({columns}) VALUES ({marks})",
            tuple(row.values()),
        )


def insert_legacy_rows(
    path: StrPath,
    sessions: Sequence[Mapping[str, Any]],
    messages: Sequence[Mapping[str, Any]],
) -> None:
    """Insert `sessions` then `messages` with plain INSERTs (legacy triggers fire) and commit.

    Column names come from each dict's keys; rows may use different keys. Foreign keys are
    not enforced (SQLite's default, like most legacy connections), so a test can also write
    orphaned rows.
    """
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"no legacy store at {target}")
    conn = sqlite3.connect(target)
    try:
        with conn:
            _insert(conn, "sessions", sessions)
            _insert(conn, "messages", messages)
    finally:
        conn.close()


def write_sessions_json(hermes_home: StrPath, data: Mapping[str, Any] | str | bytes) -> Path:
    """Write the gateway index `<hermes_home>/sessions/sessions.json` and return its path.

    A mapping is serialised as JSON; a `str` or `bytes` is written verbatim, so tests can
    write malformed or non-UTF-8 files.
    """
    target = Path(hermes_home) / "sessions" / "sessions.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        target.write_bytes(data)
    elif isinstance(data, str):
        target.write_text(data, encoding="utf-8")
    else:
        target.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return target

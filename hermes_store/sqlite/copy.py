"""A copy's endpoints on SQLite: a source file opened read-only, a target file written.

The copy's algorithm (``hermes_store.copy``) reaches these through the SQLite backend: how
a source file is opened so that it cannot be written and reads one snapshot, what a target
path must be, and the ``sqlite_sequence`` row that decides the next message id.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.pool import NullPool

from hermes_store import migrate
from hermes_store.engine import create_store_engine, db_path, display_url, to_url
from hermes_store.errors import CopyRefused, StoreNotFound
from hermes_store.sqlite.readonly import connect_read_only


def _read_only_engine(path: Path) -> Engine:
    """An engine that can only read ``path`` (``mode=ro``): SQLite refuses every write.

    Text is decoded with ``errors="surrogateescape"``: a value that is not UTF-8 (a writer
    that stored bytes as TEXT) reads as text holding lone surrogates, which the copy's
    checks name by table, column and key, where the driver's own error would quote it.
    """

    def connect() -> sqlite3.Connection:
        conn = connect_read_only(path, timeout=30, check_same_thread=False)
        conn.isolation_level = None  # SQLAlchemy's BEGIN below starts the read transaction
        conn.text_factory = functools.partial(str, encoding="utf-8", errors="surrogateescape")
        return conn

    engine = create_engine(
        "sqlite://",
        creator=connect,
        poolclass=NullPool,
        hide_parameters=True,
        logging_name="hermes_store",  # the logger whose fetched rows are never logged
    )

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def open_source(url: str) -> Engine:
    """The source file, read-only (``mode=ro``); refuses a missing file or another kind."""
    path = db_path(url)
    if path is None or not path.exists() or path.stat().st_size == 0:
        raise StoreNotFound(f"--from {path or url}: no such store; nothing was changed")
    migrate.inspect_file(path)  # read-only: refuses what is not a SQLite Hermes store
    return _read_only_engine(path)


def same_database(a: str, b: str) -> bool:
    """Whether two SQLite URLs name one file (the same inode, or the same resolved path)."""
    first, second = db_path(a), db_path(b)
    if first is None or second is None:
        return False
    if first.exists() and second.exists():
        return os.path.samefile(first, second)
    return first.resolve() == second.resolve()


def source_name(url: str) -> str:
    """The file by its name with every link resolved (the URL keeps a linked directory as
    given), so a resumed copy may name it either way."""
    path = db_path(url)
    return display_url(url if path is None else to_url(os.path.realpath(path)))


def fingerprint(url: str) -> dict[str, Any]:
    """The file itself (device, inode): another file moved to the same path differs."""
    path = db_path(url)
    assert path is not None  # a source is a file (see open_source)
    status = os.stat(os.path.realpath(path))
    return {"file": [status.st_dev, status.st_ino]}


def commits_seen(conn: Connection) -> int:
    """SQLite's count of commits by other connections (``PRAGMA data_version``)."""
    return int(conn.exec_driver_sql("PRAGMA data_version").scalar_one())


def inspect_target(url: str) -> bool:
    """Refuse a target path that cannot hold a store, or a store never upgraded by
    hermes-store; True when the file is new (missing or empty)."""
    path = db_path(url)
    if path is None:
        raise CopyRefused("--to: an in-memory database cannot receive a copy")
    if path.exists() and path.is_dir():
        raise CopyRefused(f"--to {path} is a directory; name the store file")
    if not path.parent.exists():
        raise CopyRefused(f"--to {path}: directory {path.parent} does not exist; create it")
    state = migrate.inspect_file(path)
    if state.kind == "new":
        return True
    if state.kind == "legacy":
        raise CopyRefused(
            f"--to {display_url(url)} is a Hermes store never upgraded by hermes-store (schema "
            f"{state.legacy_version}); nothing was changed. Copy into an empty file, or "
            "run `hermes-store upgrade` on it first"
        )
    return False


def open_target(url: str) -> Engine:
    """The target, each batch's transaction taking the write lock at BEGIN (IMMEDIATE):
    a batch waits for the lock before it writes, rather than failing halfway."""
    engine = create_store_engine(url, create=False)
    return engine.execution_options(sqlite_begin="IMMEDIATE").engine


def high_water(conn: Connection) -> int:
    """The highest message id handed out: ``sqlite_sequence`` (AUTOINCREMENT) or max(id)."""
    top = int(conn.execute(text("SELECT coalesce(max(id), 0) FROM messages")).scalar_one())
    seq = conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = 'messages'")).scalar()
    return max(top, int(seq or 0))


def raise_ids(conn: Connection, value: int) -> None:
    """Raise the messages' ``sqlite_sequence`` row to ``value`` (adding it if missing)."""
    done = conn.execute(
        text("UPDATE sqlite_sequence SET seq = :value WHERE name = 'messages' AND seq < :value"),
        {"value": value},
    )
    if done.rowcount == 0:
        conn.execute(
            text(
                "INSERT INTO sqlite_sequence (name, seq) SELECT 'messages', :value "
                "WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'messages')"
            ),
            {"value": value},
        )


def refusal_reason(error: BaseException | None) -> str:
    """SQLite's first line when it names a constraint (no value in it), else the error's
    kind: its other messages may quote a value."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return first if "constraint failed" in first else type(error).__name__


def defer_commit_sync(conn: Connection) -> bool:
    """A connection to a store in WAL mode whose commits do not wait for the WAL to reach
    the disk (``synchronous=NORMAL``): inside COMMIT that flush holds the write lock as
    long as the disk takes (seen here: a trivial commit 2.4 ms median and up to 0.135 s on
    a busy disk, against 0.1 ms). The caller then flushes the WAL itself after each
    commit (:func:`sync_log`), outside the lock, before its next step relies on the
    commit: the same durability, without the agent waiting for it. A store not in WAL
    mode keeps its setting (there NORMAL would risk more than a late commit); False."""
    raw: Any = conn.connection.driver_connection
    (mode,) = raw.execute("PRAGMA journal_mode").fetchone()
    if str(mode).lower() != "wal":
        return False
    raw.execute("PRAGMA synchronous=NORMAL")
    # Nor does a commit run the automatic checkpoint (it runs after the lock is let go, but
    # inside COMMIT, and it makes the WAL and the database file sync): sync_log runs it.
    raw.execute("PRAGMA wal_autocheckpoint=0")
    return True


def sync_log(conn: Connection, path: Path | None) -> None:
    """Flush a store's WAL to disk (fsync of the file, whichever process wrote it): every
    frame committed so far is then durable. Then a PASSIVE checkpoint on ``conn`` (no
    transaction open; it waits for no one): the WAL stays short, so the agent's own
    commits find little to checkpoint when they cross the automatic threshold (their
    checkpoint syncs the database file inside their COMMIT). Nothing without a WAL."""
    if path is None:
        return
    _fsync_wal(path)
    raw: Any = conn.connection.driver_connection
    raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def _fsync_wal(path: Path) -> None:
    wal = path.with_name(path.name + "-wal")
    try:
        fd = os.open(wal, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:  # checkpointed and removed: the database file holds it all
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

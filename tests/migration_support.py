"""Helpers shared by the conversion and parity tests: copying stores, reading the revision log."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

#: The logger the revisions write their decisions to (which conversion path ran, and why).
MIGRATION_LOGGER = "alembic.runtime.migration"


@contextlib.contextmanager
def migration_log() -> Iterator[list[str]]:
    """Collect the INFO messages of the revisions' logger, whatever logging config ran before."""
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger(MIGRATION_LOGGER)
    handler = _Collect(level=logging.INFO)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def clone(source: Path, target: Path) -> Path:
    """Copy a store with the SQLite backup API (safe whatever its journal mode)."""
    with (
        contextlib.closing(sqlite3.connect(source)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)
    return target


def back_to_inline_21(path: Path) -> None:
    """Downgrade a store at head to schema 21 with the legacy inline search layout.

    The relational chain goes back to 21, then the search branch's revisions are undone one
    step at a time: its head (fts2, which changes nothing on SQLite), then the conversion
    (fts1) back to the inline layout.
    """
    from hermes_store import migrate
    from hermes_store.revisions import FTS_EXTERNAL_REVISION, fts_head_revision

    at_21 = (migrate.head_revision(), f"21, {fts_head_revision()}")
    assert migrate.downgrade(str(path), "21") == at_21
    schema = _schema(path)
    assert migrate.downgrade(str(path), "fts@-1")[1] == f"21, {FTS_EXTERNAL_REVISION}"
    assert _schema(path) == schema, "the search layout's head changed the SQLite schema"
    assert migrate.downgrade(str(path), "fts@-1")[1] == "21"


def _schema(path: Path) -> list[tuple[str, str, str]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def legacy_corpus_store(path: Path, messages: int, seed: int, version: int = 21) -> Path:
    """A legacy store at ``version`` (inline search, never under Alembic) holding a corpus of
    ``messages`` generated messages."""
    from legacy.build import build_legacy_store

    from hermes_store.demo import corpus

    build_legacy_store(path, version)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(messages, seed))
        conn.commit()
    return path


def conversion_revision() -> ModuleType:
    """The FTS branch's conversion revision, as a module: the tests check the library's
    change log against the revision's own (the library never reads it)."""
    from hermes_store.revisions import FTS_EXTERNAL_REVISION, script_directory

    script = script_directory().get_revision(FTS_EXTERNAL_REVISION)
    assert script is not None
    return script.module

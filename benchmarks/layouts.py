"""Build every benchmarked search layout from one generated corpus.

The inline legacy store (schema 30, unversioned, as the legacy application leaves it) is
built once per corpus; every other layout starts as a copy of it:

- ``external``: ``migrate.upgrade`` to head (the in-place path, index data reused);
- ``external-rebuild``: the same upgrade with the rebuild path forced
  (``-x fts_convert=rebuild``: both indexes re-tokenized, then merged);
- comparison-only variants (never migration targets), made from a copy of ``external``
  by recreating the trigram index here, in the benchmark code:
  - ``trigram-notool``: the trigram index over a second view,
    ``messages_fts_source_notool``, that leaves out ``role = 'tool'`` rows, with
    triggers that skip those rows;
  - ``trigram-detail-column``: the trigram index declared with ``detail=column``;
  - ``no-trigram``: no trigram index at all (CJK queries fall back to LIKE scans).

Two more stores serve the flag-update comparison only (:data:`FLAG_LAYOUTS`): the same
corpus written at schema 21, whose FTS5 update triggers fire on every update of a
message, as the application's triggers did up to schema 29 (``inline-21``), and a copy of
it converted in place with the relational schema kept at 21, as ``hermes-store upgrade
--app-version 21`` leaves an operator's store (``external-21``). At schema 30 the
application's own triggers leave flag updates out of the index, so there the two layouts
do the same work for them.

Every finished store is VACUUMed and its WAL truncated, so a plain file copy is a store.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hermes_store import migrate
from hermes_store.demo import corpus as corpus_mod

INLINE = "inline"
EXTERNAL = "external"
REBUILD = "external-rebuild"
NOTOOL = "trigram-notool"
DETAIL_COLUMN = "trigram-detail-column"
NO_TRIGRAM = "no-trigram"
INLINE_21 = "inline-21"
EXTERNAL_21 = "external-21"

#: Every layout, the reference (inline) first.
LAYOUTS: tuple[str, ...] = (INLINE, EXTERNAL, REBUILD, NOTOOL, DETAIL_COLUMN, NO_TRIGRAM)
#: Layouts an upgrade can produce; the others are for comparison only.
MIGRATION_TARGETS: frozenset[str] = frozenset({EXTERNAL, REBUILD})
VARIANTS: tuple[str, ...] = (NOTOOL, DETAIL_COLUMN, NO_TRIGRAM)
#: The application schema whose FTS5 update triggers fire on every update (17 to 29 do).
BROAD_TRIGGER_SCHEMA = 21
#: The flag-update comparison's pair of stores at that schema, the reference first.
FLAG_LAYOUTS: tuple[str, ...] = (INLINE_21, EXTERNAL_21)
#: Every store a StoreSet builds.
ALL_LAYOUTS: tuple[str, ...] = LAYOUTS + FLAG_LAYOUTS

DESCRIPTIONS: dict[str, str] = {
    INLINE: "legacy schema 30: both FTS5 indexes keep an inline copy of the text",
    EXTERNAL: "head, converted in place (legacy index data reused, copies dropped)",
    REBUILD: "head, converted with the rebuild path forced (re-tokenized, then merged)",
    NOTOOL: "comparison only: external, trigram index skips role = 'tool' rows",
    DETAIL_COLUMN: "comparison only: external, trigram index with detail=column",
    NO_TRIGRAM: "comparison only: external, no trigram index (CJK uses LIKE scans)",
    INLINE_21: "flag updates only: legacy schema 21, update triggers fire on every update",
    EXTERNAL_21: "flag updates only: inline-21 converted in place, schema kept at 21",
}

TRIGRAM = "messages_fts_trigram"
NOTOOL_VIEW = "messages_fts_source_notool"
TRIGRAM_TRIGGERS = (
    "messages_fts_trigram_insert",
    "messages_fts_trigram_delete",
    "messages_fts_trigram_update",
)


def _expression(alias: str) -> str:
    """The legacy indexed expression over ``new`` / ``old`` / a table alias."""
    return (
        f"COALESCE({alias}.content, '') || ' ' || COALESCE({alias}.tool_name, '') || ' ' "
        f"|| COALESCE({alias}.tool_calls, '')"
    )


NOTOOL_DDL: tuple[str, ...] = (
    f"""CREATE VIEW {NOTOOL_VIEW} AS
        SELECT m.id AS id, {_expression("m")} AS content
        FROM messages AS m WHERE m.role IS NOT 'tool'""",
    f"""CREATE VIRTUAL TABLE {TRIGRAM} USING fts5(
        content, content='{NOTOOL_VIEW}', content_rowid='id', tokenize='trigram')""",
    f"""CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages
        WHEN new.role IS NOT 'tool'
        BEGIN
            INSERT INTO {TRIGRAM}(rowid, content) VALUES (new.id, {_expression("new")});
        END""",
    f"""CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages
        WHEN old.role IS NOT 'tool'
        BEGIN
            INSERT INTO {TRIGRAM}({TRIGRAM}, rowid, content)
            VALUES ('delete', old.id, {_expression("old")});
        END""",
    f"""CREATE TRIGGER messages_fts_trigram_update
        AFTER UPDATE OF id, role, content, tool_name, tool_calls ON messages
        BEGIN
            INSERT INTO {TRIGRAM}({TRIGRAM}, rowid, content)
            SELECT 'delete', old.id, {_expression("old")} WHERE old.role IS NOT 'tool';
            INSERT INTO {TRIGRAM}(rowid, content)
            SELECT new.id, {_expression("new")} WHERE new.role IS NOT 'tool';
        END""",
)
"""The notool variant: its own view and three triggers (the word index is left as head's)."""

DETAIL_COLUMN_DDL: tuple[str, ...] = (
    f"""CREATE VIRTUAL TABLE {TRIGRAM} USING fts5(
        content, content='messages_fts_source', content_rowid='id', tokenize='trigram',
        detail=column)""",
)
"""The detail=column variant: same view, head's triggers kept (they name the table only)."""


@dataclass
class BuildInfo:
    """How one layout's store was made."""

    layout: str
    path: Path
    seconds: float
    notes: list[str] = field(default_factory=list)


class _Collect(logging.Handler):
    """Keep the messages of a logger (the conversion path revision 22 logs)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def revision_log() -> Iterator[list[str]]:
    """Collect what revision 22 logs (which conversion path each index took)."""
    logger = logging.getLogger("alembic.runtime.migration")
    handler = _Collect()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def connect(path: Path) -> sqlite3.Connection:
    """A stdlib connection in autocommit mode (explicit BEGIN / COMMIT)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def finish(path: Path) -> None:
    """VACUUM and truncate the WAL, so the main file alone is the whole store."""
    conn = connect(path)
    try:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def copy_store(source: Path, target: Path) -> Path:
    """Copy a finished store (main file only) over ``target`` and its -wal / -shm."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            target.with_name(target.name + suffix).unlink()
    shutil.copyfile(source, target)
    return target


def build_inline(path: Path, corpus: corpus_mod.Corpus, schema: int = 30) -> float:
    """Write the legacy store: ``schema`` without alembic_version, one session per commit.

    Schema 30 in the legacy inline layout is what most real stores are (the application
    converts search only when asked), and it leaves the search layout the only difference
    from the upgraded store.

    Returns the seconds spent. The legacy application writes one message per transaction;
    one session per transaction keeps the build fast while still growing the FTS5 indexes
    incrementally (many segments, automerged), not in one bulk load.
    """
    start = time.perf_counter()
    migrate.upgrade(str(path), str(schema))
    conn = connect(path)
    try:
        conn.execute("DROP TABLE alembic_version")
        conn.execute("PRAGMA synchronous=OFF")  # building only: no crash safety needed
        by_session: dict[object, list[corpus_mod.Row]] = {}
        for message in corpus.messages:
            by_session.setdefault(message["session_id"], []).append(message)
        for session in corpus.sessions:
            transcript = corpus_mod.Transcript(session, by_session.pop(session["id"], []))
            corpus_mod.populate(conn, [transcript])
        if by_session:
            raise RuntimeError(f"{len(by_session)} sessions of the corpus have no session row")
    finally:
        conn.close()
    finish(path)
    return time.perf_counter() - start


def upgrade(path: Path, *, rebuild: bool = False, app_version: int | None = None) -> list[str]:
    """Upgrade a legacy copy (in place, or the rebuild path); return the revision log.

    Without ``app_version`` the store goes to head; with it, the relational schema stays at
    that application version and only the search layout is converted.
    """
    x = {"fts_convert": "rebuild"} if rebuild else None
    with revision_log() as messages:
        if app_version is None:
            result = migrate.upgrade(str(path), "head", x=x)
        else:
            result = migrate.upgrade(str(path), app_version=app_version, x=x)
    if app_version is None:
        arrived = result.after == (migrate.head_revision(),)
    else:
        arrived = result.schema_after == app_version
    if not arrived or result.layout_after != "external":
        raise RuntimeError(
            f"{path}: upgrade ended at {result.to_revision!r}, schema {result.schema_after}, "
            f"layout {result.layout_after!r}"
        )
    return messages


def apply_variant(path: Path, layout: str) -> None:
    """Recreate the trigram index of an external store as ``layout`` needs, in one transaction."""
    conn = connect(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        if layout in (NOTOOL, NO_TRIGRAM):
            for trigger in TRIGRAM_TRIGGERS:
                conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        conn.execute(f"DROP TABLE IF EXISTS {TRIGRAM}")
        statements = {NOTOOL: NOTOOL_DDL, DETAIL_COLUMN: DETAIL_COLUMN_DDL, NO_TRIGRAM: ()}[layout]
        for statement in statements:
            conn.execute(statement)
        if statements:
            conn.execute(f"INSERT INTO {TRIGRAM}({TRIGRAM}) VALUES ('rebuild')")
            conn.execute(f"INSERT INTO {TRIGRAM}({TRIGRAM}) VALUES ('optimize')")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


class StoreSet:
    """The base store of every layout for one corpus, built on demand into ``directory``.

    Base stores are read-only by convention: a benchmark that writes works on a copy
    (:meth:`copy`).
    """

    def __init__(self, directory: Path, n_messages: int, seed: int = 0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.n_messages = n_messages
        self.seed = seed
        self._corpus: corpus_mod.Corpus | None = None
        self.builds: dict[str, BuildInfo] = {}

    @property
    def corpus(self) -> corpus_mod.Corpus:
        """The generated corpus every layout holds (generated once)."""
        if self._corpus is None:
            self._corpus = corpus_mod.generate(self.n_messages, self.seed)
        return self._corpus

    def base(self, layout: str) -> Path:
        """The finished store of ``layout`` (built on first use)."""
        if layout not in ALL_LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; known: {', '.join(ALL_LAYOUTS)}")
        info = self.builds.get(layout)
        if info is None:
            info = self._build(layout)
            self.builds[layout] = info
        return info.path

    def _path(self, layout: str) -> Path:
        return self.directory / f"{layout}-{self.n_messages}.db"

    def _build(self, layout: str) -> BuildInfo:
        path = self._path(layout)
        if path.exists():
            path.unlink()
        start = time.perf_counter()
        notes: list[str] = []
        if layout in (INLINE, INLINE_21):
            build_inline(path, self.corpus, 30 if layout == INLINE else BROAD_TRIGGER_SCHEMA)
        elif layout in (EXTERNAL, REBUILD, EXTERNAL_21):
            if layout == EXTERNAL_21:
                copy_store(self.base(INLINE_21), path)
                notes = upgrade(path, app_version=BROAD_TRIGGER_SCHEMA)
            else:
                copy_store(self.base(INLINE), path)
                notes = upgrade(path, rebuild=layout == REBUILD)
            taken = [m for m in notes if "messages_fts" in m]
            if layout != REBUILD and not all("converted in place" in m for m in taken):
                raise RuntimeError(f"{layout}: expected the in-place path, got {taken}")
            finish(path)
        else:
            copy_store(self.base(EXTERNAL), path)
            apply_variant(path, layout)
            finish(path)
        return BuildInfo(layout, path, time.perf_counter() - start, notes)

    def copy(self, layout: str, target: Path) -> Path:
        """A writable copy of a layout's base store."""
        return copy_store(self.base(layout), target)

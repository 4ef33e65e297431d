"""The seam between the databases: one :class:`Backend` per database, picked once by the URL.

What differs between SQLite and PostgreSQL lives behind this interface, in
``hermes_store/sqlite/`` and ``hermes_store/postgresql/``; the rest of the library asks the
backend instead of testing the dialect. What a database cannot do is a flag on
:class:`Features`, and a command it cannot run is refused through :meth:`Backend.require`, in
one wording. :func:`backend_for` is the only place that looks at the URL's database name.

The backends import their modules inside their methods: picking a backend costs nothing at
start-up, and a backend's code is loaded only when a command uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hermes_store.errors import NotOnThisDatabase, StoreError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path
    from typing import Any

    from sqlalchemy import Connection, Engine
    from sqlalchemy.engine import URL

    from hermes_store.maintenance import (
        CheckResult,
        IndexBuild,
        Measured,
        RepairResult,
        Shown,
        StoreStats,
    )
    from hermes_store.migrate.state import Admit, Request, Session, StoreState, Target
    from hermes_store.prepared import Connections, Driver
    from hermes_store.progress import Phase, Report
    from hermes_store.search.pipeline import SearchStatements
    from hermes_store.sqlite.readonly import ReadOnlyOpening


@dataclass
class CopyUpkeep:
    """What the end of a copy did for the target's planner and indexes (PostgreSQL's
    VACUUM (ANALYZE) of the tables it filled)."""

    #: The statement run on each table.
    statement: str
    #: The tables it ran on.
    tables: list[str]
    #: Table -> why the database refused it (one line).
    refused: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {"statement": self.statement, "tables": self.tables, "refused": self.refused}


@dataclass(frozen=True)
class Features:
    """What a database offers; a command offers what its backend's features say.

    Each flag is paired with the reason a database lacks it, so that every refusal reads the
    same way (see :meth:`Backend.require`).
    """

    #: A consistent file copy of the store before a risky step (``--backup``).
    file_backup: bool
    #: The operator chooses between converting the index in place and rebuilding it.
    fts_rebuild_choice: bool
    #: The search branch's backfill can run in paced stages while the agent writes.
    staged_backfill: bool
    #: ``optimize`` offers a choice of vacuum modes (incremental, full).
    vacuum_modes: bool
    #: ``stamp`` of an arbitrary revision on a store that was never under Alembic.
    stamp: bool
    #: A store can be read where it cannot be written (read-only files, file systems).
    read_only_opening: bool
    #: Maintenance: ``check --repair --deferred`` refills broken indexes in paced,
    #: resumable transactions instead of one rebuild.
    deferred_repair: bool
    #: engine: the store is a file hermes-store opens, checks and keeps private itself
    #: (:meth:`Backend.db_path` names it), not a database a server keeps.
    store_file: bool
    #: (migration) A primary-key column may be NULL, as the models' legacy DDL declares;
    #: where not, autogenerate's nullability difference on a key is not one to migrate.
    nullable_keys: bool


@dataclass(frozen=True)
class Unavailable:
    """Why a feature is missing: said after "is not available on <database> stores"."""

    why: str


class Backend:
    """What differs between the databases. One subclass per database, one instance each.

    Methods are grouped in sections (engine, migration, maintenance, search, copy); each
    subclass keeps the same sections in the same order.
    """

    #: The URL's database name this backend serves (``sqlite``, ``postgresql``).
    name: ClassVar[str]
    #: How the database is named to a person.
    title: ClassVar[str]
    features: ClassVar[Features]
    #: Why each missing feature is missing, by :class:`Features` field name.
    reasons: ClassVar[Mapping[str, str]] = {}

    # -- capabilities -----------------------------------------------------------------------

    def require(self, feature: str, what: str) -> None:
        """Refuse ``what`` (a command or option as typed) if this database lacks ``feature``."""
        if not getattr(self.features, feature):
            self.refuse(what, self.reasons.get(feature, ""))

    def refuse(self, what: str, why: str = "") -> None:
        """Raise the one refusal wording for something this database cannot do."""
        reason = f": {why}" if why else ""
        raise NotOnThisDatabase(
            f"{what} is not available on {self.title} stores{reason}. Nothing was changed"
        )

    # -- engine -----------------------------------------------------------------------------

    def supported_url(self, text: str, parsed: URL) -> str:
        """The store URL ``text`` (``parsed``) as the engine opens it (its driver named), or
        :class:`~hermes_store.errors.StoreError` for what the driver would refuse later."""
        raise NotImplementedError

    def db_path(self, url: str) -> Path | None:
        """The store's file, or None where the store is no file of its own (in memory, or a
        database on a server)."""
        raise NotImplementedError

    def prepare(self, url: str, *, create: bool) -> tuple[str, Path | None]:
        """Make the store of a resolved URL safe to open, before its driver sees it:
        ``(url, file or None)``. With ``create=False`` nothing is created, and a missing
        store raises :class:`~hermes_store.errors.StoreNotFound`."""
        raise NotImplementedError

    def create_engine(
        self,
        url: str,
        path: Path | None,
        *,
        busy_timeout_ms: int,
        wal: bool = True,
        echo: bool = False,
        read_only: ReadOnlyOpening | None = None,
    ) -> Engine:
        """The engine of a prepared store (:meth:`prepare`), set up as every caller needs."""
        raise NotImplementedError

    def open_existing(self, url: str, *, reading: bool) -> tuple[Engine, str | None]:
        """An engine on an existing store, creating nothing, and what the operator should be
        told about how it was opened (None when nothing). ``reading``: the caller only reads,
        so a store that cannot be written may still be opened."""
        raise NotImplementedError

    def translate_error(
        self, exc: BaseException, *, url: str | None = None, path: Path | None = None
    ) -> StoreError | None:
        """The domain error for a failure of the store at ``url`` (or the file ``path``)
        that the operator can act on, else None."""
        raise NotImplementedError

    def statement_runner(self, driver: Driver) -> Callable[[str, Sequence[Any]], Any]:
        """How ``driver`` runs one SQL text with positional parameters on its DBAPI
        connection, a driver error raised as SQLAlchemy (or the engine) raises it."""
        raise NotImplementedError

    # -- migration --------------------------------------------------------------------------

    def store_file(self, url: str) -> Path | None:
        """The file a (resolved) store URL names; None when the database is not a file."""
        raise NotImplementedError

    def side_files(self, path: Path) -> list[Path]:
        """The files the database keeps beside a store file (a write-ahead log, say): none
        where the store is not a file."""
        return []

    def classify(self, target: Target) -> StoreState:
        """Where the store is (revisions, legacy schema), read without writing anything."""
        raise NotImplementedError

    def migration_connection(
        self, request: Request, admit: Admit, report: Report
    ) -> AbstractContextManager[Session]:
        """Classify the store once, let the workflow ``admit`` it, then hold the one
        connection that the backup, the adoption and the revisions run on."""
        raise NotImplementedError

    def migration_facts(self, conn: Connection) -> tuple[tuple[str, ...], int | None, str]:
        """(revisions, application schema version, search layout) of the store."""
        raise NotImplementedError

    def around_revisions(
        self, conn: Connection, request: Request, report: Report
    ) -> AbstractContextManager[dict[str, str]]:
        """What surrounds the revisions of one command; yields notes on steps by revision."""
        raise NotImplementedError

    def after_revisions(
        self, conn: Connection, request: Request, report: Report
    ) -> tuple[dict[str, str], dict[str, int]]:
        """What every upgrade does after its revisions: (what was healed, the rows a
        deferred backfill still has to fill, by index)."""
        raise NotImplementedError

    def interruption(
        self, request: Request, phase: Phase | None, before: StoreState | None, *, created: bool
    ) -> str | None:
        """The account of an interrupted migration, read from the store; None: none to give."""
        raise NotImplementedError

    def prepare_given(self, conn: Connection) -> None:
        """Prepare a caller's own connection's store before revisions run on it."""
        raise NotImplementedError

    def reading_connection(self, target: Target) -> AbstractContextManager[Connection]:
        """A connection that reads the store, creating and adopting nothing."""
        raise NotImplementedError

    def writing_connection(self, target: Target) -> AbstractContextManager[Connection]:
        """A connection to an existing store that takes the write lock at each BEGIN."""
        raise NotImplementedError

    def describe_revision(self, conn: Connection) -> dict[str, Any]:
        """`hermes-store current`: revision, application schema, search layout and indexes."""
        raise NotImplementedError

    # -- maintenance: stats, storage report, optimize, check, repair ------------------------

    def stats(self, engine: Engine) -> StoreStats:
        """Sessions, messages, sessions per source, and the store's size as this database
        measures it (a file and its WAL, or the database)."""
        raise NotImplementedError

    def storage_report(self, engine: Engine) -> Measured:
        """Where the store's bytes go: each table and index, in the groups of
        :data:`hermes_store.maintenance.GROUPS`."""
        raise NotImplementedError

    def optimize(
        self,
        engine: Engine,
        *,
        vacuum: bool | None = None,
        compact: bool = False,
        report: Report | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Shown:
        """Give free space back and refresh the store's indexes, without locking the agent
        out unless asked. ``vacuum`` picks a mode (True: full, False: none) where
        ``features.vacuum_modes``; ``compact``: also rebuild the search indexes online
        where deleted rows leave entries behind until then (SQLite's FTS5; PostgreSQL's
        VACUUM reclaims its indexes' dead entries itself); ``report`` is told each phase,
        ``progress`` its label."""
        raise NotImplementedError

    def compaction_pending(self, engine: Engine) -> bool:
        """Whether an online rebuild of the search indexes (``optimize(compact=True)``) was
        stopped before its end: the next ``optimize`` finishes it."""
        return False

    def finish_deferred(
        self,
        engine: Engine,
        *,
        chunk_rows: int,
        max_lock_ms: float,
        duty: float,
        progress: Callable[[Any], None] | None = None,
    ) -> IndexBuild:
        """Finish a deferred index build in paced, resumable transactions
        (``optimize-storage``; needs ``features.staged_backfill``)."""
        self.require("staged_backfill", "optimize-storage")
        raise NotImplementedError

    def check(self, engine: Engine, *, quick: bool = False) -> CheckResult:
        """Check the store's integrity and every object its revisions declare (read-only)."""
        raise NotImplementedError

    def repair(
        self,
        engine: Engine,
        *,
        quick: bool = False,
        backup_to: Path | None = None,
        deferred: bool = False,
        progress: Callable[[Any], None] | None = None,
    ) -> RepairResult:
        """Check, restore what the revisions declare and rebuild what is broken, check again.
        ``backup_to`` needs ``features.file_backup``, ``deferred`` ``features.deferred_repair``
        (``progress`` is told of each chunk of a deferred refill)."""
        raise NotImplementedError

    # -- search -----------------------------------------------------------------------------

    def search_statements(self, conn: Connection) -> SearchStatements:
        """This database's part of a search (hermes_store.search.pipeline), on an open
        connection and in its transaction (search_messages)."""
        raise NotImplementedError

    def search_transaction(
        self, source: Engine | Connections
    ) -> AbstractContextManager[SearchStatements]:
        """This database's part of a search in a read transaction of its own, on a
        connection of ``source`` (search_store)."""
        raise NotImplementedError

    # -- copy endpoints ---------------------------------------------------------------------
    # What reading a copy's source and writing its target needs on this database; the
    # algorithm itself (compare, then write in batches with the marker) is hermes_store.copy.

    #: The collation that orders text by code point (the order Python compares text by), so
    #: that both sides of a copy list their keys in the same order.
    code_point_collation: ClassVar[str]

    def open_copy_source(self, url: str) -> Engine:
        """An engine that only reads the store at ``url``; refuses one that is missing."""
        raise NotImplementedError

    def copy_snapshot(self, conn: Connection) -> Connection:
        """``conn`` with each of its transactions reading one snapshot, read-only."""
        raise NotImplementedError

    def same_database(self, a: str, b: str) -> bool:
        """Whether two resolved URLs of this database name the same store."""
        raise NotImplementedError

    def copy_source_name(self, url: str) -> str:
        """How a copy's marker names its source (a name that stays the same across runs)."""
        raise NotImplementedError

    def copy_source_fingerprint(self, conn: Connection, url: str) -> dict[str, Any]:
        """What tells the source from another store later found under the same name."""
        raise NotImplementedError

    def commits_seen(self, conn: Connection) -> int | None:
        """A count that changes when another connection commits (None: cannot be known)."""
        raise NotImplementedError

    def inspect_copy_target(self, url: str) -> bool:
        """Refuse, without writing, a target that cannot receive a copy; True when it is new
        (nothing there to read), False when the copy must read what it holds."""
        raise NotImplementedError

    def refuse_foreign_copy_target(self, conn: Connection) -> None:
        """Refuse a target without revisions that holds another application's tables."""
        raise NotImplementedError

    def open_copy_target(self, url: str) -> Engine:
        """An engine whose transactions write a copy's batches."""
        raise NotImplementedError

    def defer_commit_sync(self, conn: Connection) -> bool:
        """Let this connection's commits leave the flush of their log to disk to
        :meth:`sync_commits`, run after the write lock is let go (a store whose writers
        queue behind each flush); True when they do. The caller runs
        :meth:`sync_commits` after each commit, before its next step relies on it."""
        return False

    def sync_commits(self, conn: Connection, url: str) -> None:
        """Flush to disk what the commits :meth:`defer_commit_sync` let through left in
        the store's log, on ``conn`` (out of any transaction), and keep the log short;
        nothing where commits flush themselves."""

    def message_id_high_water(self, conn: Connection) -> int:
        """The highest message id the database ever handed out (its sequence, or max(id))."""
        raise NotImplementedError

    def raise_message_ids(self, conn: Connection, value: int) -> None:
        """Make the database hand out message ids above ``value`` (never lower them)."""
        raise NotImplementedError

    def write_refusal_reason(self, error: BaseException | None) -> str:
        """Why the database refused a batch, in a few words that never quote a value."""
        raise NotImplementedError

    def finish_copy_target(
        self,
        conn: Connection,
        tables: Sequence[str],
        progress: Callable[[str, int, int], None] | None = None,
    ) -> CopyUpkeep | None:
        """After a copy wrote its rows, before it is marked complete: what the database
        needs before its first query (``progress`` hears table, done, total). None when
        it needs nothing."""
        raise NotImplementedError


_BACKENDS: dict[str, str] = {
    "sqlite": "hermes_store.sqlite.backend:SQLiteBackend",
    "postgresql": "hermes_store.postgresql.backend:PostgreSQLBackend",
}


@cache
def _load(name: str) -> Backend:
    from importlib import import_module

    target = _BACKENDS.get(name)
    if target is None:
        raise NotOnThisDatabase(
            f"hermes-store does not support {name!r} databases: use a SQLite file or a "
            "postgresql+psycopg:// URL"
        )
    module, _, attribute = target.partition(":")
    backend: Backend = getattr(import_module(module), attribute)()
    return backend


def backend_for(url: str) -> Backend:
    """The backend of a (resolved) store URL: the one place that reads the database's name."""
    from sqlalchemy.engine import make_url

    name = make_url(url).get_backend_name()
    return _load("postgresql" if name == "postgres" else name)


def backend_of(bind: Connection | Engine) -> Backend:
    """The backend of an open connection or engine."""
    return _load(bind.dialect.name)

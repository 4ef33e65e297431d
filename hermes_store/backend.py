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

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, ClassVar

from hermes_store.errors import NotOnThisDatabase

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path
    from typing import Any

    from sqlalchemy import Connection, Engine

    from hermes_store.migrate.state import Admit, Request, Session, StoreState, Target
    from hermes_store.progress import Phase, Report


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

    # -- migration --------------------------------------------------------------------------

    def store_file(self, url: str) -> Path | None:
        """The file a (resolved) store URL names; None when the database is not a file."""
        raise NotImplementedError

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
    ) -> tuple[dict[str, str], tuple[str, ...]]:
        """What every upgrade does after its revisions: (what was healed, indexes a
        deferred backfill still has to fill)."""
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

    # -- search -----------------------------------------------------------------------------

    # -- copy endpoints ---------------------------------------------------------------------


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

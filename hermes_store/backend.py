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
    from sqlalchemy import Connection, Engine
    from sqlalchemy.engine import URL

    from hermes_store.prepared import Driver
    from hermes_store.sqlite.readonly import ReadOnlyOpening


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
    #: engine: the store is a file hermes-store opens, checks and keeps private itself
    #: (:meth:`Backend.db_path` names it), not a database a server keeps.
    store_file: bool


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

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

    from sqlalchemy import Connection, Engine

    from hermes_store.prepared import Connections
    from hermes_store.search.pipeline import SearchStatements


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

    # -- maintenance: stats, storage report, optimize, check, repair ------------------------

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

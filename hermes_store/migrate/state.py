"""What the migration workflow passes around: the resolved store, its classification, results.

Kept apart from the workflow so that the planner, the adoption and each backend's migration
module share these types without importing one another.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_store.errors import StoreError
from hermes_store.progress import Report, quiet
from hermes_store.revisions import FIRST_APP_VERSION, FTS_EXTERNAL_REVISION, LAST_APP_VERSION

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from hermes_store.backend import Backend
    from hermes_store.migrate.plan import DowngradePlan
    from hermes_store.sqlite.backup import BackupResult

FIRST_LEGACY = FIRST_APP_VERSION
LAST_LEGACY = LAST_APP_VERSION
#: ``-x`` arguments the bare `alembic` command takes besides ``db``.
BACKUP_X = "backup"
BACKUP_OVERWRITE_X = "backup_overwrite"
APP_VERSION_X = "app_version"
#: `-x` option (and `downgrade(..., delete_data=True)`) that lets a downgrade to base delete
#: the conversations it holds.
DELETE_DATA_X = "i_know_this_deletes_data"
#: The revision id an earlier hermes-store gave its external-content conversion, which
#: also wrote `schema_version = 22`: the application's 22 is another change.
MISSTAMPED_REVISION = "22"
#: What a misstamped store's relational tables really are.
MISSTAMPED_REAL_VERSION = 21


def truthy(value: object) -> bool:
    """An ``-x`` flag's value read as yes or no."""
    return str(value or "").lower() in ("1", "true", "yes")


def settle(conn: Connection) -> None:
    """End the read transaction Alembic's version lookup may leave open on ``conn``.

    Each revision commits its own transaction; a transaction still open between commands
    holds only reads (or, after a no-op target, would swallow the next command's revisions
    into it), so it is committed.
    """
    if conn.in_transaction():
        conn.commit()


def deleting_data_refused(held: Mapping[str, int], how: str, backup: str = "") -> StoreError:
    """The refusal of a downgrade to base that would delete the conversations ``held``
    (SQLite's and PostgreSQL's alike; ``backup`` says how to back up, when not obvious)."""
    return StoreError(
        "a downgrade to base drops every table: it would delete "
        f"{held.get('sessions', 0)} session(s) and {held.get('messages', 0)} message(s). "
        f"Nothing was changed. If that is what you want, back up first{backup}, then run {how}"
    )


@dataclass(frozen=True)
class Target:
    """The store one command works on: its URL resolved once, the backend it picks, and
    (SQLite) the file. Everything below the entry points takes this, never a raw URL."""

    url: str
    backend: Backend
    path: Path | None = None

    @property
    def name(self) -> str:
        """The store as a person names it: the file, or the URL without its password."""
        from hermes_store.engine import display_url

        return str(self.path) if self.path is not None else display_url(self.url)

    @classmethod
    def resolve(cls, url: str | os.PathLike[str] | None, *, create_home: bool = False) -> Target:
        """Resolve ``url`` (``--db``, $HERMES_STORE_URL, the legacy default) once."""
        from hermes_store.backend import backend_for
        from hermes_store.engine import resolve_url

        resolved = resolve_url(url, create_home=create_home)
        backend = backend_for(resolved)
        return cls(resolved, backend, backend.store_file(resolved))


@dataclass(frozen=True)
class StoreState:
    """What a store holds before any migration touches it."""

    path: Path | None
    kind: str  # "new" (missing or empty), "legacy" (no alembic_version) or "alembic"
    #: The application schema the relational tables really have (`schema_version`, except
    #: for a store misstamped by an earlier hermes-store, see ``misstamped``).
    legacy_version: int | None = None
    revisions: tuple[str, ...] = ()
    tables: frozenset[str] = field(default_factory=frozenset)
    #: Upgraded by an earlier hermes-store whose search revision claimed schema 22 and
    #: revision "22": its relational schema is 21 and its search layout external.
    misstamped: bool = False

    @property
    def revision(self) -> str | None:
        """The Alembic revision(s), comma-separated, or None when unversioned."""
        return ", ".join(self.revisions) or None

    @property
    def heads(self) -> tuple[str, ...]:
        """The revisions the store is at, an unversioned one at its legacy version's."""
        if self.misstamped:
            return tuple(sorted((str(MISSTAMPED_REAL_VERSION), FTS_EXTERNAL_REVISION)))
        if self.revisions:
            return self.revisions
        return (str(self.legacy_version),) if self.legacy_version is not None else ()

    def where(self) -> str:
        """Where the store is, for a person."""
        if self.kind == "legacy":
            return f"legacy schema {self.legacy_version} (unversioned)"
        return f"revision {self.revision}" if self.revision else "no revision (empty)"


@dataclass(frozen=True)
class Prepared:
    """What the workflow did before any revision ran."""

    backup: BackupResult | None = None
    adopted: str | None = None
    restamped: bool = False


@dataclass(frozen=True)
class Request:
    """What one migration command asks, resolved before Alembic runs env.py.

    The library's entry points build it and hand it to env.py through
    ``config.attributes`` (Alembic's documented way to pass objects to env.py); the bare
    `alembic` command line gets one built from its ``-x`` options and its arguments.
    """

    target: Target
    #: "upgrade", "downgrade" or "stamp".
    verb: str
    #: The revision as typed (``fts@-1`` keeps its branch); None for the default upgrade.
    revision: str | None = None
    #: Where the relational schema stops (None: the newest); upgrades only.
    app_version: int | None = None
    #: The options revisions read with ``context.get_x_argument``.
    x: Mapping[str, str] = field(default_factory=dict)
    backup_to: str | os.PathLike[str] | None = None
    overwrite_backup: bool = False
    #: Create a store that does not exist (upgrades; refused otherwise).
    create: bool = True
    delete_data: bool = False
    #: The downgrade a person confirmed; refused when the store has moved since.
    expect: DowngradePlan | None = None
    report: Report = quiet
    #: The upgrade targets, in order (see :func:`hermes_store.migrate.plan.targets`).
    targets: tuple[str, ...] = ()
    #: The workflow plans the steps (False: Alembic's own, as its command gave them).
    own_steps: bool = True
    #: The command line that goes on with it, for the account of an interrupt (or made
    #: from the store as the interrupt left it).
    finish: str | Callable[[StoreState | None], str] = ""
    #: Called by the library: errors keep their types (the bare `alembic` shows one line).
    from_library: bool = True
    #: How the refusal to delete conversations says to go on.
    delete_how: str = ""

    @property
    def upgrading(self) -> bool:
        return self.verb == "upgrade"


@dataclass
class Session:
    """The one connection an upgrade or downgrade runs on, and what was done before."""

    conn: Connection
    state: StoreState
    prepared: Prepared = field(default_factory=Prepared)
    #: The duration of each write transaction on ``conn``, in seconds (SQLite measures).
    locks: list[float] = field(default_factory=lambda: [0.0])


#: The workflow's say, given the classification: raises when the command may not go on.
#: Its second argument refuses a downgrade that would delete conversations, given the
#: command that goes on anyway.
Admit = Callable[[StoreState, Callable[[str], None]], None]


@dataclass(frozen=True)
class UpgradeResult:
    """What one upgrade did: revisions, application schema and search layout before and after."""

    path: Path | None
    before: tuple[str, ...]
    after: tuple[str, ...]
    schema_before: int | None
    schema_after: int | None
    #: The application version the relational schema was asked to stop at (None: newest).
    app_version: int | None
    layout_before: str
    layout_after: str
    backup: BackupResult | None = None
    adopted: str | None = None
    restamped: bool = False
    #: Indexes a deferred backfill still has to fill (`hermes-store optimize-storage`).
    pending_backfill: tuple[str, ...] = ()
    #: The messages each of those indexes still has to take in.
    rows_left: dict[str, int] = field(default_factory=dict)
    #: Search objects restored and indexes rebuilt because they were damaged -> why.
    healed: dict[str, str] = field(default_factory=dict)
    #: The longest write transaction of the revisions and the steps after them, in seconds:
    #: how long the agent could not write at most.
    longest_write_lock_s: float = 0.0

    def view(self, seconds: float, *, fts_choice: bool = False) -> list[str]:
        """What the upgrade did, for a person: one line per fact (``fts_choice``: the
        operator asked for --rebuild-fts or --deferred-fts)."""
        if self.before == self.after and not self.adopted and not self.healed:
            lines = [f"already at {self.to_revision}: nothing to do ({seconds:.2f} s)"]
        else:
            if self.from_revision is not None:
                origin = self.from_revision
            elif self.adopted is not None:
                origin = f"legacy schema {self.adopted} (unversioned)"
            else:
                origin = "(new store)"
            lines = [f"{origin} -> {self.to_revision} in {seconds:.2f} s"]
        lines.append(
            f"application schema: {self.schema_before or '-'} -> {self.schema_after}; "
            f"search layout: {self.layout_before} -> {self.layout_after}"
        )
        if fts_choice and self.layout_before == "external":
            lines.append(
                "note: the search indexes were already external: --rebuild-fts / "
                "--deferred-fts had nothing to convert"
            )
        if self.restamped:
            lines.append(
                "this store had been stamped 22 by an earlier hermes-store: its versions now "
                "say what it has"
            )
        if self.layout_after == "application":
            lines.append(
                "search indexes: the Hermes application's own layout, left as it is "
                "(hermes-store search refuses it; use the agent's search)"
            )
        lines += [f"repaired {item} ({why})" for item, why in self.healed.items()]
        if self.backup is not None:
            lines.append(f"backup of the store as it was: {self.backup.path}")
        lines += [
            f"{index}: {rows} rows left to index: run `hermes-store optimize-storage`"
            for index, rows in self.rows_left.items()
        ]
        return lines

    @property
    def from_revision(self) -> str | None:
        """The revision(s) before, comma-separated; None for an unversioned or new store."""
        return ", ".join(self.before) or None

    @property
    def to_revision(self) -> str | None:
        """The revision(s) after, comma-separated."""
        return ", ".join(self.after) or None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form, for `hermes-store upgrade --json`."""
        return {
            "from": self.from_revision,
            "to": self.to_revision,
            "schema_before": self.schema_before,
            "schema_after": self.schema_after,
            "app_version": self.app_version,
            "layout_before": self.layout_before,
            "layout_after": self.layout_after,
            "backup": str(self.backup.path) if self.backup else None,
            "adopted": self.adopted,
            "legacy_schema": int(self.adopted) if self.adopted else None,
            "restamped": self.restamped,
            "pending_backfill": list(self.pending_backfill),
            "healed": self.healed,
            "longest_write_lock_s": self.longest_write_lock_s,
        }

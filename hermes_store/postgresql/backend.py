"""The PostgreSQL backend: a store is a database on a server that manages its own files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from hermes_store.backend import Backend, Features

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path
    from typing import Any

    from sqlalchemy import Connection

    from hermes_store.migrate.state import Admit, Request, Session, StoreState, Target
    from hermes_store.progress import Phase, Report

_SERVER_FILES = "the server manages its own files (use pg_dump for backups)"


class PostgreSQLBackend(Backend):
    """PostgreSQL stores: the server owns files, vacuum and backups; the project owns the schema."""

    name = "postgresql"
    title = "PostgreSQL"
    features = Features(
        file_backup=False,
        fts_rebuild_choice=False,
        staged_backfill=False,
        vacuum_modes=False,
        stamp=False,
        read_only_opening=False,
        nullable_keys=False,
    )
    reasons: ClassVar[Mapping[str, str]] = {
        "file_backup": _SERVER_FILES,
        "fts_rebuild_choice": (
            "its search indexes are built by the revisions; there is no FTS5 index to convert"
        ),
        "staged_backfill": "its search columns are filled by the revision itself",
        "vacuum_modes": "the server vacuums; optimize runs VACUUM (ANALYZE)",
        "read_only_opening": "the server decides who may read",
        "nullable_keys": "every primary-key column is NOT NULL",
        "stamp": (
            "it checks a SQLite store's schema before recording a revision; a PostgreSQL "
            "database is only ever at a revision its upgrade ran"
        ),
    }

    # -- engine -----------------------------------------------------------------------------

    # -- migration --------------------------------------------------------------------------

    def store_file(self, url: str) -> Path | None:
        return None

    def classify(self, target: Target) -> StoreState:
        from hermes_store.postgresql import migration

        return migration.classify(target.url)

    def migration_connection(
        self, request: Request, admit: Admit, report: Report
    ) -> AbstractContextManager[Session]:
        from hermes_store.postgresql import migration

        return migration.migration_connection(request, admit, report)

    def migration_facts(self, conn: Connection) -> tuple[tuple[str, ...], int | None, str]:
        from hermes_store.postgresql import migration

        return migration.facts(conn)

    def around_revisions(
        self, conn: Connection, request: Request, report: Report
    ) -> AbstractContextManager[dict[str, str]]:
        from hermes_store.postgresql import migration

        return migration.around_revisions(conn, request, report)

    def after_revisions(
        self, conn: Connection, request: Request, report: Report
    ) -> tuple[dict[str, str], tuple[str, ...]]:

        return {}, ()  # no search mechanism to heal, no backfill: the revisions build it

    def interruption(
        self, request: Request, phase: Phase | None, before: StoreState | None, *, created: bool
    ) -> str | None:
        return None  # the revision in progress was rolled back; `current` says where it is

    def prepare_given(self, conn: Connection) -> None:
        from hermes_store.postgresql import migration

        migration.refuse_foreign_database(conn)

    def reading_connection(self, target: Target) -> AbstractContextManager[Connection]:
        from hermes_store.postgresql import migration

        return migration.store_connection(target)

    def writing_connection(self, target: Target) -> AbstractContextManager[Connection]:
        from hermes_store.postgresql import migration

        return migration.store_connection(target)

    def describe_revision(self, conn: Connection) -> dict[str, Any]:
        from hermes_store.postgresql import migration

        return migration.describe(conn)

    # -- maintenance: stats, storage report, optimize, check, repair ------------------------

    # -- search -----------------------------------------------------------------------------

    # -- copy endpoints ---------------------------------------------------------------------

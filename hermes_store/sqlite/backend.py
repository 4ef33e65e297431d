"""The SQLite backend: a store is one file with its -wal and -shm beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_store.backend import Backend, Features

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path
    from typing import Any

    from sqlalchemy import Connection

    from hermes_store.migrate.state import Admit, Request, Session, StoreState, Target
    from hermes_store.progress import Phase, Report


class SQLiteBackend(Backend):
    """SQLite stores: files the project opens, backs up, vacuums and checks itself."""

    name = "sqlite"
    title = "SQLite"
    features = Features(
        file_backup=True,
        fts_rebuild_choice=True,
        staged_backfill=True,
        vacuum_modes=True,
        stamp=True,
        read_only_opening=True,
        nullable_keys=True,
    )

    # -- engine -----------------------------------------------------------------------------

    # -- migration --------------------------------------------------------------------------

    def store_file(self, url: str) -> Path | None:
        from hermes_store.engine import db_path

        return db_path(url)

    def classify(self, target: Target) -> StoreState:
        from hermes_store.migrate.adoption import inspect_file

        return inspect_file(target.path)

    def migration_connection(
        self, request: Request, admit: Admit, report: Report
    ) -> AbstractContextManager[Session]:
        from hermes_store.sqlite import migration

        return migration.migration_connection(request, admit, report)

    def migration_facts(self, conn: Connection) -> tuple[tuple[str, ...], int | None, str]:
        from hermes_store.sqlite import migration

        return migration.facts(conn)

    def around_revisions(
        self, conn: Connection, request: Request, report: Report
    ) -> AbstractContextManager[dict[str, str]]:
        from hermes_store.sqlite import migration

        return migration.around_revisions(conn, request, report)

    def after_revisions(
        self, conn: Connection, request: Request, report: Report
    ) -> tuple[dict[str, str], tuple[str, ...]]:
        from hermes_store.sqlite import migration

        return migration.after_revisions(conn, request, report)

    def interruption(
        self, request: Request, phase: Phase | None, before: StoreState | None, *, created: bool
    ) -> str | None:
        from hermes_store.sqlite import migration

        return migration.interruption(request, phase, before, created=created)

    def prepare_given(self, conn: Connection) -> None:
        from hermes_store.sqlite import migration

        migration.prepare_given(conn)

    def reading_connection(self, target: Target) -> AbstractContextManager[Connection]:
        from hermes_store.sqlite import migration

        return migration.store_connection(target, write=False)

    def writing_connection(self, target: Target) -> AbstractContextManager[Connection]:
        from hermes_store.sqlite import migration

        return migration.store_connection(target, write=True)

    def describe_revision(self, conn: Connection) -> dict[str, Any]:
        from hermes_store.sqlite import migration

        return migration.describe(conn)

    # -- maintenance: stats, storage report, optimize, check, repair ------------------------

    # -- search -----------------------------------------------------------------------------

    # -- copy endpoints ---------------------------------------------------------------------

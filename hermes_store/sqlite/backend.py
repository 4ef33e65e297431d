"""The SQLite backend: a store is one file with its -wal and -shm beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_store.backend import Backend, Features

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from sqlalchemy import Connection, Engine

    from hermes_store.prepared import Connections
    from hermes_store.search.pipeline import SearchStatements


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
    )

    # -- engine -----------------------------------------------------------------------------

    # -- migration --------------------------------------------------------------------------

    # -- maintenance: stats, storage report, optimize, check, repair ------------------------

    # -- search -----------------------------------------------------------------------------

    def search_statements(self, conn: Connection) -> SearchStatements:
        from hermes_store.sqlite.search import search_statements

        return search_statements(conn)

    def search_transaction(
        self, source: Engine | Connections
    ) -> AbstractContextManager[SearchStatements]:
        from hermes_store.sqlite.search import read_transaction

        return read_transaction(source)

    # -- copy endpoints ---------------------------------------------------------------------

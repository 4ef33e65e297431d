"""The PostgreSQL backend: a store is a database on a server that manages its own files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from hermes_store.backend import Backend, Features

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from sqlalchemy import Connection, Engine

    from hermes_store.prepared import Connections
    from hermes_store.search.pipeline import SearchStatements

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
        stamp=True,
        read_only_opening=False,
    )
    reasons: ClassVar[Mapping[str, str]] = {
        "file_backup": _SERVER_FILES,
        "fts_rebuild_choice": (
            "its search indexes are built by the revisions; there is no FTS5 index to convert"
        ),
        "staged_backfill": "its search columns are filled by the revision itself",
        "vacuum_modes": "the server vacuums; optimize runs VACUUM (ANALYZE)",
        "read_only_opening": "the server decides who may read",
    }

    # -- engine -----------------------------------------------------------------------------

    # -- migration --------------------------------------------------------------------------

    # -- maintenance: stats, storage report, optimize, check, repair ------------------------

    # -- search -----------------------------------------------------------------------------

    def search_statements(self, conn: Connection) -> SearchStatements:
        from hermes_store.postgresql.search import search_statements

        return search_statements(conn)

    def search_transaction(
        self, source: Engine | Connections
    ) -> AbstractContextManager[SearchStatements]:
        from hermes_store.postgresql.search import read_transaction

        return read_transaction(source)

    # -- copy endpoints ---------------------------------------------------------------------

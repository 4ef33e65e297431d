"""The PostgreSQL backend: a store is a database on a server that manages its own files."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hermes_store.backend import Backend, Features

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import URL

    from hermes_store.errors import StoreError
    from hermes_store.prepared import Driver
    from hermes_store.sqlite.readonly import ReadOnlyOpening

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
        store_file=False,
    )
    reasons: ClassVar[Mapping[str, str]] = {
        "file_backup": _SERVER_FILES,
        "fts_rebuild_choice": (
            "its search indexes are built by the revisions; there is no FTS5 index to convert"
        ),
        "staged_backfill": "its search columns are filled by the revision itself",
        "vacuum_modes": "the server vacuums; optimize runs VACUUM (ANALYZE)",
        "read_only_opening": "the server decides who may read",
        "store_file": "the server manages its own files (use pg_dump for backups and the "
        "server's own tools for its storage)",
    }

    # -- engine -----------------------------------------------------------------------------

    def supported_url(self, text: str, parsed: URL) -> str:
        from hermes_store.postgresql.engine import supported_url

        return supported_url(parsed)

    def db_path(self, url: str) -> Path | None:
        return None  # the server keeps its files

    def prepare(self, url: str, *, create: bool) -> tuple[str, Path | None]:
        return url, None  # nothing to make safe: the server opens its own files

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
        # WAL and read-only opening are the server's business (its own files).
        from hermes_store.postgresql.engine import create_engine

        return create_engine(url, busy_timeout_ms=busy_timeout_ms, echo=echo)

    def open_existing(self, url: str, *, reading: bool) -> tuple[Engine, str | None]:
        from hermes_store.postgresql.engine import open_existing

        return open_existing(url), None

    def translate_error(
        self, exc: BaseException, *, url: str | None = None, path: Path | None = None
    ) -> StoreError | None:
        from hermes_store.postgresql.engine import translate_server_error

        return None if url is None else translate_server_error(exc, url)

    def statement_runner(self, driver: Driver) -> Callable[[str, Sequence[Any]], Any]:
        from hermes_store.postgresql.engine import statement_runner

        return statement_runner(driver)

    # -- migration --------------------------------------------------------------------------

    # -- maintenance: stats, storage report, optimize, check, repair ------------------------

    # -- search -----------------------------------------------------------------------------

    # -- copy endpoints ---------------------------------------------------------------------

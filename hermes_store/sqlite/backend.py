"""The SQLite backend: a store is one file with its -wal and -shm beside it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_store.backend import Backend, Features

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import URL

    from hermes_store.errors import StoreError
    from hermes_store.prepared import Driver
    from hermes_store.sqlite.readonly import ReadOnlyOpening


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
        store_file=True,
    )

    # -- engine -----------------------------------------------------------------------------

    def supported_url(self, text: str, parsed: URL) -> str:
        from hermes_store.sqlite.engine import supported_url

        return supported_url(text, parsed)

    def db_path(self, url: str) -> Path | None:
        from hermes_store.sqlite.engine import db_path

        return db_path(url)

    def prepare(self, url: str, *, create: bool) -> tuple[str, Path | None]:
        from hermes_store.sqlite.engine import prepare_file

        return prepare_file(url, create=create)

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
        from hermes_store.sqlite.engine import create_engine

        return create_engine(
            url, path, busy_timeout_ms=busy_timeout_ms, wal=wal, echo=echo, read_only=read_only
        )

    def open_existing(self, url: str, *, reading: bool) -> tuple[Engine, str | None]:
        from hermes_store.sqlite.readonly import open_existing

        return open_existing(url, reading=reading)

    def translate_error(
        self, exc: BaseException, *, url: str | None = None, path: Path | None = None
    ) -> StoreError | None:
        from hermes_store.sqlite.engine import translate_error

        if path is None and url is not None:
            path = self.db_path(url)
        return translate_error(exc, path)

    def statement_runner(self, driver: Driver) -> Callable[[str, Sequence[Any]], Any]:
        from hermes_store.sqlite.engine import statement_runner

        return statement_runner(driver)

    # -- migration --------------------------------------------------------------------------

    # -- maintenance: stats, storage report, optimize, check, repair ------------------------

    # -- search -----------------------------------------------------------------------------

    # -- copy endpoints ---------------------------------------------------------------------

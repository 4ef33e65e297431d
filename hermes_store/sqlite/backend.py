"""The SQLite backend: a store is one file with its -wal and -shm beside it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_store.backend import Backend, CopyUpkeep, Features

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path
    from typing import Any

    from sqlalchemy import Connection, Engine
    from sqlalchemy.engine import URL

    from hermes_store.errors import StoreError
    from hermes_store.maintenance import (
        CheckResult,
        IndexBuild,
        Measured,
        RepairResult,
        Shown,
        StoreStats,
    )
    from hermes_store.migrate.state import Admit, Request, Session, StoreState, Target
    from hermes_store.prepared import Connections, Driver
    from hermes_store.progress import Phase, Report
    from hermes_store.search.pipeline import SearchStatements
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
        deferred_repair=True,
        store_file=True,
        nullable_keys=True,
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

    def store_file(self, url: str) -> Path | None:
        from hermes_store.engine import db_path

        return db_path(url)

    def side_files(self, path: Path) -> list[Path]:
        from hermes_store.sqlite.engine import side_files

        return side_files(path)

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
    ) -> tuple[dict[str, str], dict[str, int]]:
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

    def stats(self, engine: Engine) -> StoreStats:
        """Counts, and the file's and its WAL's bytes."""
        from hermes_store.sqlite.maintenance import stats_of

        return stats_of(engine)

    def storage_report(self, engine: Engine) -> Measured:
        """dbstat's pages per table and index, free pages, and any unfinished backfill."""
        from hermes_store.sqlite.storage import report_of

        return report_of(engine)

    def optimize(
        self,
        engine: Engine,
        *,
        vacuum: bool | None = None,
        compact: bool = False,
        report: Report | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Shown:
        """FTS5 merges (or, ``compact``, each index rebuilt online and swapped in), a WAL
        checkpoint, and free pages returned (in steps, or by VACUUM)."""
        from hermes_store.sqlite.optimize import optimize

        return optimize(engine, vacuum=vacuum, compact=compact, report=report, progress=progress)

    def compaction_pending(self, engine: Engine) -> bool:
        """An index rebuilt beside itself, or a swapped-out one, still to finish."""
        from hermes_store.sqlite.compaction import in_progress

        with engine.connect() as conn:
            return in_progress(conn)

    def finish_deferred(
        self,
        engine: Engine,
        *,
        chunk_rows: int,
        max_lock_ms: float,
        duty: float,
        progress: Callable[[Any], None] | None = None,
    ) -> IndexBuild:
        """The deferred backfill, run to its end."""
        from hermes_store.sqlite.maintenance import finish_deferred

        return finish_deferred(
            engine, chunk_rows=chunk_rows, max_lock_ms=max_lock_ms, duty=duty, progress=progress
        )

    def check(self, engine: Engine, *, quick: bool = False) -> CheckResult:
        """PRAGMA integrity_check, the declared objects, the search mechanism, FTS5 checks."""
        from hermes_store.sqlite.maintenance import check_of

        return check_of(engine, quick=quick)

    def repair(
        self,
        engine: Engine,
        *,
        quick: bool = False,
        backup_to: Path | None = None,
        deferred: bool = False,
        progress: Callable[[Any], None] | None = None,
    ) -> RepairResult:
        """A backup of the file, then the rebuilds (see sqlite.maintenance.repair)."""
        from hermes_store.sqlite.maintenance import repair_of

        return repair_of(
            engine, quick=quick, backup_to=backup_to, deferred=deferred, progress=progress
        )

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

    code_point_collation = "BINARY"

    def open_copy_source(self, url: str) -> Engine:
        from hermes_store.sqlite import copy

        return copy.open_source(url)

    def copy_snapshot(self, conn: Connection) -> Connection:
        return conn  # a SQLite read transaction reads one snapshot already

    def same_database(self, a: str, b: str) -> bool:
        from hermes_store.sqlite import copy

        return copy.same_database(a, b)

    def copy_source_name(self, url: str) -> str:
        from hermes_store.sqlite import copy

        return copy.source_name(url)

    def copy_source_fingerprint(self, conn: Connection, url: str) -> dict[str, Any]:
        from hermes_store.sqlite import copy

        return copy.fingerprint(url)

    def commits_seen(self, conn: Connection) -> int | None:
        from hermes_store.sqlite import copy

        return copy.commits_seen(conn)

    def inspect_copy_target(self, url: str) -> bool:
        from hermes_store.sqlite import copy

        return copy.inspect_target(url)

    def refuse_foreign_copy_target(self, conn: Connection) -> None:
        return None  # inspect_copy_target refused a file of another application already

    def open_copy_target(self, url: str) -> Engine:
        from hermes_store.sqlite import copy

        return copy.open_target(url)

    def defer_commit_sync(self, conn: Connection) -> bool:
        from hermes_store.sqlite import copy

        return copy.defer_commit_sync(conn)

    def sync_commits(self, conn: Connection, url: str) -> None:
        from hermes_store.sqlite import copy

        copy.sync_log(conn, self.store_file(url))

    def message_id_high_water(self, conn: Connection) -> int:
        from hermes_store.sqlite import copy

        return copy.high_water(conn)

    def raise_message_ids(self, conn: Connection, value: int) -> None:
        from hermes_store.sqlite import copy

        copy.raise_ids(conn, value)

    def write_refusal_reason(self, error: BaseException | None) -> str:
        from hermes_store.sqlite import copy

        return copy.refusal_reason(error)

    def finish_copy_target(
        self,
        conn: Connection,
        tables: Sequence[str],
        progress: Callable[[str, int, int], None] | None = None,
    ) -> CopyUpkeep | None:
        return None  # SQLite's planner needs no statistics gathered for the copied rows

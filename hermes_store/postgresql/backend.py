"""The PostgreSQL backend: a store is a database on a server that manages its own files."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

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
        deferred_repair=False,
        store_file=False,
        nullable_keys=False,
    )
    reasons: ClassVar[Mapping[str, str]] = {
        "file_backup": _SERVER_FILES,
        "fts_rebuild_choice": (
            "its search indexes are built by the revisions; there is no FTS5 index to convert"
        ),
        "staged_backfill": (
            "its search indexes are built whole by the revision; none is left to fill"
        ),
        "vacuum_modes": "the server vacuums; optimize runs VACUUM (ANALYZE)",
        "read_only_opening": "the server decides who may read",
        "deferred_repair": "a repair rebuilds indexes CONCURRENTLY, without blocking writes",
        "store_file": "the server manages its own files (use pg_dump for backups and the "
        "server's own tools for its storage)",
        "nullable_keys": "every primary-key column is NOT NULL",
        "stamp": (
            "it checks a SQLite store's schema before recording a revision; a PostgreSQL "
            "database is only ever at a revision its upgrade ran"
        ),
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
    ) -> tuple[dict[str, str], dict[str, int]]:

        return {}, {}  # no search mechanism to heal, no backfill: the revisions build it

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

    def stats(self, engine: Engine) -> StoreStats:
        """Counts, and the database's size (pg_database_size)."""
        from hermes_store.postgresql.maintenance import stats_of

        return stats_of(engine)

    def storage_report(self, engine: Engine) -> Measured:
        """Each table's and index's bytes, and whether the text is stored once."""
        from hermes_store.postgresql.storage import report_of

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
        """GIN pending lists cleaned, then VACUUM (ANALYZE) of each of the store's tables:
        no mode to pick, no lock-out. ``compact`` has nothing to add: VACUUM makes the GIN
        indexes' dead entries reusable (there is no FTS5 index to rebuild)."""
        from hermes_store.postgresql.maintenance import NOTHING_TO_COMPACT, optimize_server

        if vacuum is not None:
            self.require("vacuum_modes", "--vacuum" if vacuum else "--no-vacuum")
        if progress is not None:
            progress("GIN pending lists cleaned, then VACUUM (ANALYZE) of the store's tables")
        result = optimize_server(engine, report)
        if compact:
            result.notes.append(NOTHING_TO_COMPACT)
        return result

    def check(self, engine: Engine, *, quick: bool = False) -> CheckResult:
        """Index validity, the declared and search objects, amcheck (not with ``quick``)."""
        from hermes_store.postgresql.check import check_of

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
        """Concurrent rebuilds and re-creations from the revisions (see check.repair_server)."""
        from hermes_store.postgresql.check import repair_server

        if backup_to is not None:
            self.require("file_backup", "--backup")
        if deferred:
            self.require("deferred_repair", "--deferred")
        return repair_server(engine, quick=quick)

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

    code_point_collation = "C"

    def open_copy_source(self, url: str) -> Engine:
        from hermes_store.postgresql import copy

        return copy.open_source(url)

    def copy_snapshot(self, conn: Connection) -> Connection:
        from hermes_store.postgresql import copy

        return copy.snapshot(conn)

    def same_database(self, a: str, b: str) -> bool:
        from hermes_store.postgresql import copy

        return copy.same_database(a, b)

    def copy_source_name(self, url: str) -> str:
        from hermes_store.engine import display_url

        return display_url(url)

    def copy_source_fingerprint(self, conn: Connection, url: str) -> dict[str, Any]:
        from hermes_store.postgresql import copy

        return copy.fingerprint(conn)

    def commits_seen(self, conn: Connection) -> int | None:
        return None  # a snapshot does not tell whether others committed since

    def inspect_copy_target(self, url: str) -> bool:
        return False  # a server database: what it holds is read by the copy

    def refuse_foreign_copy_target(self, conn: Connection) -> None:
        from hermes_store.postgresql import copy

        copy.refuse_foreign_target(conn)

    def open_copy_target(self, url: str) -> Engine:
        from hermes_store.engine import create_store_engine

        return create_store_engine(url, create=False)

    def message_id_high_water(self, conn: Connection) -> int:
        from hermes_store.postgresql import copy

        return copy.high_water(conn)

    def raise_message_ids(self, conn: Connection, value: int) -> None:
        from hermes_store.postgresql import copy

        copy.raise_ids(conn, value)

    def write_refusal_reason(self, error: BaseException | None) -> str:
        from hermes_store.postgresql import copy

        return copy.refusal_reason(error)

    def finish_copy_target(
        self,
        conn: Connection,
        tables: Sequence[str],
        progress: Callable[[str, int, int], None] | None = None,
    ) -> CopyUpkeep:
        from hermes_store.postgresql import copy

        return copy.finish_target(conn, tables, progress)

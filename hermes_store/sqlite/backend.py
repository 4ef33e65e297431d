"""The SQLite backend: a store is one file with its -wal and -shm beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes_store.backend import Backend, Features

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine


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

    def message_id_high_water(self, conn: Connection) -> int:
        from hermes_store.sqlite import copy

        return copy.high_water(conn)

    def raise_message_ids(self, conn: Connection, value: int) -> None:
        from hermes_store.sqlite import copy

        copy.raise_ids(conn, value)

    def write_refusal_reason(self, error: BaseException | None) -> str:
        from hermes_store.sqlite import copy

        return copy.refusal_reason(error)

    def finish_copy_target(self, conn: Connection) -> None:
        return None  # SQLite's planner needs no statistics gathered for the copied rows

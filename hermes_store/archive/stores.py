"""The two stores of an archive run, opened and checked before anything is written.

The archive is an ordinary store at this hermes-store's head; the hot store is at head
or at an application version this package covers with the search layout at its head
(`hermes-store upgrade --app-version N`), and its tables and columns are reflected
(``shape``: a run moves those). The hot store must exist; an
archive that does not exist yet (a missing or empty file, an empty database) is created
the way `hermes-store upgrade --create` creates a store, its file private (0600), then
given incremental auto-vacuum where its database has vacuum modes, so that a restore's
deletes can be given back in steps.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, inspect

from hermes_store import migrate
from hermes_store.archive.shape import Shape, reflect
from hermes_store.backend import Backend, backend_for
from hermes_store.copy.marker import source_name
from hermes_store.copy.source import same_store
from hermes_store.copy.tables import revisions
from hermes_store.engine import create_store_engine, db_path, display_url, resolve_url, to_url
from hermes_store.errors import ArchiveRefused, NotADatabase, StoreError, StoreNotFound
from hermes_store.revisions import (
    LAST_APP_VERSION,
    fts_head_revision,
    head_revision,
    is_app_version,
    script_directory,
)

__all__ = ["Side", "open_pair"]


@dataclass
class Side:
    """One store of the run: its name, an engine to read with and one whose transactions
    take the write lock at BEGIN."""

    url: str
    name: str
    option: str
    reader: Engine
    writer: Engine
    backend: Backend
    created: bool = False
    #: The hot store's tables and columns (see ``shape``); set on the hot store's side.
    shape: Shape | None = None

    @property
    def shown(self) -> str:
        return display_url(self.url)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Connection]:
        """One read transaction, every statement in it reading the same snapshot (a
        batch's tables are read together)."""
        with self.reader.connect() as conn:
            conn = self.backend.copy_snapshot(conn)
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def writing(self) -> Iterator[Connection]:
        with self.writer.connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        self.reader.dispose()
        self.writer.dispose()


def _refuse_same(hot: str, other: str, option: str) -> None:
    """Refuse an archive that is the hot store, a link to it, or one of its side files."""
    shown = display_url(other)
    if same_store(hot, other):
        raise ArchiveRefused(
            f"{option} {shown} is the hot store itself; name another file or database. "
            "Nothing was changed"
        )
    hot_path, other_path = db_path(hot), db_path(other)
    if hot_path is None or other_path is None:
        return
    real = Path(os.path.realpath(other_path))
    for side in backend_for(hot).side_files(Path(os.path.realpath(hot_path))):
        if real == side or real == Path(os.path.realpath(side)):
            raise ArchiveRefused(
                f"{option} {shown} is {side.name}, a side file of the hot store; name another "
                "file. Nothing was changed"
            )


def _check_revision(conn: Connection, url: str, option: str) -> None:
    """Refuse a store that is not at this hermes-store's head; the hot store (``--db``)
    may instead be at an application version this package covers with the search layout
    at its head (`hermes-store upgrade --app-version N`)."""
    found = revisions(conn)
    head = head_revision()
    if found == (head,):
        return
    if option == "--db" and fts_head_revision() in found:
        apps = [rev for rev in found if rev != fts_head_revision()]
        # At 17 the search layout's head alone: its branch starts at 17.
        if not apps or (len(apps) == 1 and is_app_version(apps[0])):
            return
    shown = display_url(url)
    known = {rev.revision for rev in script_directory().walk_revisions()}
    if found and any(rev not in known for rev in found):
        raise ArchiveRefused(
            f"{option} {shown} is at revision {', '.join(found)}, which this hermes-store does "
            "not know (a newer one wrote it); upgrade hermes-store. Nothing was changed"
        )
    where = ", ".join(found) if found else "no hermes-store revision"
    if option == "--db":
        raise ArchiveRefused(
            f"--db {shown} is at {where}: the hot store must be at head ({head}), or at an "
            "application version with the search layout at its head; run `hermes-store "
            f"upgrade --db {shown} --app-version N` (N the application's version, up to "
            f"{LAST_APP_VERSION}) on it first. Nothing was changed"
        )
    raise ArchiveRefused(
        f"{option} {shown} is at {where}, not at head ({head}); run `hermes-store upgrade "
        f"--db {shown}` on it first. Nothing was changed"
    )


def _open_side(url: str, option: str, *, create: bool, missing_ok: bool = False) -> Side | None:
    backend = backend_for(url)
    created = False
    path = db_path(url)
    if path is not None and path.is_file() and path.stat().st_size:
        try:
            migrate.inspect_file(path)  # read-only: what the file is
        except NotADatabase:
            raise ArchiveRefused(
                f"{option} {path} is not a SQLite store; name another file. Nothing was changed"
            ) from None
        except StoreError:
            pass  # a legacy or newer store: refused below by its revision
    try:
        probe = create_store_engine(url, create=False)
    except StoreNotFound:
        if missing_ok:
            return None
        if not create:
            raise ArchiveRefused(
                f"{option} {display_url(url)}: no such store; nothing was changed"
            ) from None
        probe = None
    if probe is not None:
        try:
            with probe.connect() as conn:
                empty = not inspect(conn).get_table_names()
                if empty and missing_ok:
                    return None
                if not (empty and create):
                    _check_revision(conn, url, option)
        finally:
            probe.dispose()
    else:
        empty = True
    if empty and create:
        if path is not None and not path.parent.is_dir():
            raise ArchiveRefused(
                f"{option} {path}: directory {path.parent} does not exist; create it first. "
                "Nothing was changed"
            )
        migrate.upgrade(url)
        created = True
        if backend.features.vacuum_modes:
            # An empty store: switching it to incremental auto-vacuum costs nothing now.
            engine = create_store_engine(url, create=False)
            try:
                backend.optimize(engine, vacuum=True)
            finally:
                engine.dispose()
    reader = create_store_engine(url, create=False)
    writer = backend.open_copy_target(url)
    return Side(url, source_name(url), option, reader, writer, backend, created)


def open_pair(
    hot: str | None, other: str, *, other_option: str, create_other: bool, missing_ok: bool = False
) -> tuple[Side, Side | None]:
    """The hot store (--db) and the archive (``other_option``), checked; the archive
    created when ``create_other`` and it does not exist (None when ``missing_ok``)."""
    hot_url = resolve_url(hot, create_home=False)
    other_url = to_url(other)
    _refuse_same(hot_url, other_url, other_option)
    first = _open_side(hot_url, "--db", create=False)
    assert first is not None
    try:
        with first.reading() as conn:
            first.shape = reflect(conn)
    except BaseException:
        first.dispose()
        raise
    try:
        second = _open_side(
            other_url, other_option, create=create_other and not missing_ok, missing_ok=missing_ok
        )
    except BaseException:
        first.dispose()
        raise
    return first, second

"""The copy's source: opened so that it is only read, and checked before anything is written.

How a database is opened read-only and made to read one snapshot is its backend's (see the
"copy endpoints" of ``hermes_store.backend``); what a source must be to be copied (at this
hermes-store's head, with no column the models do not know, no NULL key) is the same on
both.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, func, inspect, or_, select

from hermes_store.backend import backend_for, backend_of
from hermes_store.copy.tables import copied_tables, key_columns, revisions
from hermes_store.declarations import SEARCH_COLUMNS
from hermes_store.engine import display_url, to_url
from hermes_store.errors import CopyRefused

__all__ = ["check_source", "commits_seen", "open_source", "same_store"]


def open_source(source: str) -> Engine:
    """A read-only engine on the source store (a path or URL); refuses one that is missing."""
    url = to_url(source)
    return backend_for(url).open_copy_source(url)


def same_store(source: str, target: str) -> bool:
    """Whether two resolved URLs name the same database."""
    backend = backend_for(source)
    if backend is not backend_for(target):
        return False
    return backend.same_database(source, target)


def commits_seen(conn: Connection) -> int | None:
    """A count that changes when another connection commits to the source (None when its
    database cannot tell): compared before and after a run, it says the source changed."""
    return backend_of(conn).commits_seen(conn)


def check_source(conn: Connection, url: str, head: str) -> tuple[str, ...]:
    """The source's revision; refuses a store not at head, or one whose rows cannot be paged."""
    revision = revisions(conn)
    if revision != (head,):
        raise CopyRefused(
            f"--from {display_url(url)} is at revision {', '.join(revision) or '(none)'}, not "
            f"at this hermes-store's head ({head}); nothing was changed. Run `hermes-store "
            f"upgrade --db {display_url(url)}` first (back it up with --backup)"
        )
    names = set(inspect(conn).get_table_names())
    for table in copied_tables():
        if table.name not in names:
            raise CopyRefused(f"--from: table {table.name} is missing; run `hermes-store check`")
        columns = {column["name"] for column in inspect(conn).get_columns(table.name)}
        extra = columns - set(table.columns.keys()) - SEARCH_COLUMNS
        if extra:
            raise CopyRefused(
                f"--from: {table.name} has columns hermes-store does not know "
                f"({', '.join(sorted(extra))}); they would be lost. Nothing was changed"
            )
        null_key = or_(*(column.is_(None) for column in key_columns(table)))
        if conn.execute(select(func.count()).select_from(table).where(null_key)).scalar_one():
            raise CopyRefused(
                f"--from: {table.name} has rows with a NULL primary key, which no other "
                "database accepts; nothing was changed"
            )
    return revision

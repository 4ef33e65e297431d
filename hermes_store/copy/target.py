"""The copy's target, classified before anything is written to it.

What a database must be to receive a copy at all (a file path that can hold a store, a
server database without another application's tables) is its backend's; the revision it is
at, the data and the markers it holds, and whether its users wrote to a finished copy, are
read the same way on both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, inspect

from hermes_store.backend import backend_for
from hermes_store.copy.marker import markers
from hermes_store.copy.rows import TableDiff, copied_tables, count_rows, revisions
from hermes_store.engine import create_store_engine, display_url
from hermes_store.errors import CopyRefused, SchemaTooNew
from hermes_store.revisions import script_directory

__all__ = ["Plan", "inspect_target", "refuse_written_target"]


@dataclass
class Plan:
    """What the target needs before rows are copied."""

    create: bool  # empty (or missing): bring it to the source's revision first
    markers: dict[str, str]  # hermes_store.copy.* rows found
    holds_data: bool


def _holds_data(conn: Connection) -> bool:
    names = set(inspect(conn).get_table_names())
    return any(count_rows(conn, table) for table in copied_tables() if table.name in names)


def inspect_target(url: str, revision: tuple[str, ...]) -> Plan:
    """Classify the target without writing to it; refuse what cannot receive the copy."""
    where = display_url(url)
    backend = backend_for(url)
    if backend.inspect_copy_target(url):
        return Plan(create=True, markers={}, holds_data=False)
    engine = create_store_engine(url, create=False, wal=False)
    try:
        with engine.connect() as conn:
            found = revisions(conn)
            if not found:
                backend.refuse_foreign_copy_target(conn)
            held = markers(conn)
            holds = _holds_data(conn)
    finally:
        engine.dispose()
    if not found:
        return Plan(create=True, markers={}, holds_data=False)
    if found != revision:
        known = {rev.revision for rev in script_directory().walk_revisions()}
        if any(rev not in known for rev in found):
            raise SchemaTooNew(
                f"--to {where} is at revision {', '.join(found)}, newer than the source "
                f"({', '.join(revision)}) and unknown to this hermes-store; nothing was "
                "changed. Upgrade hermes-store, or copy into an empty database"
            )
        if holds or held:
            raise CopyRefused(
                f"--to {where} is at revision {', '.join(found)}, the source at "
                f"{', '.join(revision)}; nothing was changed. Run `hermes-store upgrade --db "
                f"{where}` first"
            )
        return Plan(create=True, markers={}, holds_data=False)
    return Plan(create=False, markers=held, holds_data=holds)


def refuse_written_target(
    url: str, marker: dict[str, Any] | None, diffs: list[TableDiff], name: str
) -> None:
    """Refuse to bring up to date a finished copy the target's users have written to since:
    the copy would overwrite or delete their rows."""
    left = (marker or {}).get("sums") or {}
    changed = [
        d.table.name
        for d in diffs
        if d.table.name in left and left[d.table.name] != d.target_checksum
    ]
    if changed:
        target = display_url(url)
        raise CopyRefused(
            f"--to {target} was written to since the copy from {name} finished ("
            f"{', '.join(changed)} no longer hold what the copy left); nothing was changed: a "
            "copy never overwrites a database in use. If those writes may go, run "
            f"`hermes-store copy --from {name} --to {target} --restart`"
        )

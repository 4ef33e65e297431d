"""The indexes and triggers the revisions declare at each application schema version.

Read from a store created fresh at that version (in memory, by the revisions themselves;
see `migrate.reference_schema`), so that `check` and `--repair` on either database follow
every revision that adds one, without a list kept here. The search mechanism's objects
(`messages_fts*`: the view, the FTS5 declarations and their triggers) are the FTS branch's
and are checked by `fts.check_mechanism`; everything else the revisions create is here.
The revisions create the same indexes under the same names on PostgreSQL, from the same
DDL, and their triggers under the same names (PL/pgSQL there).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from hermes_store.revisions import is_app_version, script_directory


@dataclass(frozen=True)
class Declared:
    """One index or trigger as a store created fresh at a schema version has it."""

    kind: str  # 'index' or 'trigger'
    name: str
    table: str
    #: Its DDL as SQLite stores it (the revision's statement, `IF NOT EXISTS` dropped).
    sql: str

    @property
    def label(self) -> str:
        """How checks and repairs name it: ``"trigger messages_display_order_insert"``."""
        return f"{self.kind} {self.name}"


@functools.cache
def declared_objects(version: int) -> tuple[Declared, ...]:
    """Every index and trigger of a store created fresh at application schema ``version``,
    the search mechanism's apart; indexes first, each kind in name order."""
    # migrate imports the maintenance modules that import this one: imported when used.
    from hermes_store.migrate import reference_schema

    found = [
        Declared(kind, str(name), table, str(sql))
        for table, spec in reference_schema(str(version)).items()
        for kind, group in (("index", "indexes"), ("trigger", "triggers"))
        for name, sql in spec[group].items()
        if sql is not None
    ]
    return tuple(sorted(found, key=lambda obj: (obj.kind, obj.name)))


def app_version(heads: Iterable[str]) -> int | None:
    """The newest application schema version that the Alembic heads ``heads`` include
    (None: no revision, or none of the application's chain)."""
    wanted = tuple(revision for revision in heads if revision)
    if not wanted:
        return None
    script = script_directory()
    return newest_app_version(rev.revision for rev in script.iterate_revisions(wanted, "base"))


def newest_app_version(revisions: Iterable[str]) -> int | None:
    """The newest application schema version among ``revisions`` (None: none of them)."""
    versions = [int(revision) for revision in revisions if is_app_version(revision)]
    return max(versions) if versions else None


__all__ = ["Declared", "app_version", "declared_objects", "newest_app_version"]

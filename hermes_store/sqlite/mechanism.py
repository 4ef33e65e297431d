"""The objects of SQLite's search mechanism a store must have, from the typed snapshot.

Built from :data:`hermes_store.declarations.SQLITE` (the search layout `check` expects),
never from a revision module: the view, each index's declaration and its three triggers,
and the forms they take while an index is rebuilt beside a legacy one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from hermes_store.declarations import SQLITE

CREATED = re.compile(
    r"\s*CREATE\s+(?:VIRTUAL\s+|UNIQUE\s+)?(?:TABLE|VIEW|TRIGGER|INDEX)\s+"
    r"(?:IF\s+NOT\s+EXISTS\s+)?([\w\"'`\[\]]+)",
    re.IGNORECASE,
)
_IF_NOT_EXISTS = re.compile(
    r"^(CREATE (?:VIRTUAL |UNIQUE )?(?:TABLE|VIEW|TRIGGER|INDEX)) IF NOT EXISTS ", re.I
)


def normalise_sql(sql: str) -> str:
    """DDL as compared here: whitespace runs collapsed, no `IF NOT EXISTS`, no final `;`,
    the created name unquoted (SQLite quotes it when ALTER TABLE renames the object)."""
    sql = _IF_NOT_EXISTS.sub(r"\1 ", " ".join(sql.split()).rstrip(";").rstrip())
    match = CREATED.match(sql)
    if match is not None:
        sql = sql[: match.start(1)] + match.group(1).strip("\"'`[]") + sql[match.end(1) :]
    return sql


def created_name(sql: str) -> str:
    """The name a CREATE statement gives its object."""
    match = CREATED.match(sql)
    if match is None:
        raise ValueError(f"not a CREATE TABLE / VIEW / TRIGGER / INDEX statement: {sql[:60]!r}")
    return match.group(1).strip("\"'`[]")


@dataclass(frozen=True)
class SearchObject:
    """One object of the search mechanism, as the search layout declares it."""

    kind: str  # 'view', 'table' (an FTS5 declaration) or 'trigger'
    name: str
    sql: str
    #: The index it writes or declares; None for the view, which both indexes read.
    index: str | None = None
    #: For a trigger: the inline-layout body the legacy application gives that name.
    legacy_sql: str | None = None
    #: Only its presence is checked: a legacy index kept serving while it is rebuilt beside
    #: itself, and its triggers (their bodies vary with the application's version).
    presence_only: bool = False

    @property
    def label(self) -> str:
        """How checks and repairs name it: ``"trigger messages_fts_delete"``."""
        return f"{self.kind} {self.name}"


@functools.cache
def head_objects(
    staged: frozenset[str] = frozenset(), display_triggers: bool = False
) -> tuple[SearchObject, ...]:
    """The view, then each index's declaration and three triggers, from the snapshot.

    For an index in ``staged`` (being rebuilt beside itself): the legacy table and its
    legacy triggers (presence only; ``display_triggers``: the application's schema with
    display triggers, whose update trigger is its narrow one), then the staged declaration
    and triggers.
    """
    layout = SQLITE
    objects = [SearchObject("view", layout.view, layout.view_sql)]
    for index in layout.indexes:
        name = index.name
        if name in staged:
            objects.append(SearchObject("table", name, index.inline_sql, name, None, True))
            for sql in index.legacy_triggers_at(display_triggers):
                objects.append(SearchObject("trigger", created_name(sql), sql, name, None, True))
            objects.append(
                SearchObject("table", name + layout.staged_suffix, layout.staged_table(name), name)
            )
            for sql in layout.staged_triggers(name):
                objects.append(SearchObject("trigger", created_name(sql), sql, name))
            continue
        objects.append(SearchObject("table", name, index.external_sql, name))
        for trigger, sql, legacy in zip(
            index.trigger_names, index.triggers, index.legacy_triggers, strict=True
        ):
            objects.append(SearchObject("trigger", trigger, sql, name, legacy))
    return tuple(objects)


__all__ = ["SearchObject", "created_name", "head_objects", "normalise_sql"]

"""Checks of a copy's source rows: every value must be one any target can hold as it is.

Each value of its column's type (SQLite keeps text in a REAL column; PostgreSQL refuses
it), text valid UTF-8, NOT NULL columns set, and each foreign key the models declare
naming a row the source holds. The checks are the same for every target, so a copy that
passes them can be copied back. A problem is named by table, column and key, never by its
value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Float, Integer, LargeBinary, Row, String, Table

from hermes_store.copy.tables import key_positions, shown_key
from hermes_store.errors import CopyRefused

__all__ = ["Problem", "RowChecks"]

#: Text that did not decode as UTF-8 reaches Python as lone surrogates (the source is read
#: with ``errors="surrogateescape"``); valid UTF-8 never decodes to one.
_UNPAIRED = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Problem:
    """A source value no target can hold as it is."""

    table: str
    column: str
    key: str
    what: str

    def __str__(self) -> str:
        return f"{self.table}.{self.column} of {self.key} {self.what}"


def _kind(column: Column[Any]) -> tuple[str, tuple[type, ...]]:
    """The column's SQL type as a word, and the Python types its values may have."""
    kind = column.type
    if isinstance(kind, LargeBinary):
        return "BLOB", (bytes, memoryview)
    if isinstance(kind, Float):
        return "REAL", (float, int)
    if isinstance(kind, Integer):
        return "INTEGER", (int,)
    if isinstance(kind, String):
        return "TEXT", (str,)
    return "ANY", (object,)


_VALUE_KINDS = {str: "text", int: "an integer", float: "a real number", bytes: "a blob"}


def _value_kind(value: Any) -> str:
    for kind, word in _VALUE_KINDS.items():
        if isinstance(value, kind):
            return word
    return type(value).__name__


def _column_check(column: Column[Any]) -> Callable[[Any], str | None]:
    word, accepted = _kind(column)
    nullable = column.nullable or column.primary_key

    def check(value: Any) -> str | None:
        if value is None:
            return None if nullable else "is NULL in a NOT NULL column"
        if not isinstance(value, accepted) or isinstance(value, bool):
            article = "an" if word[0] in "AEIOU" else "a"
            return f"holds {_value_kind(value)} in {article} {word} column"
        if isinstance(value, str) and not value.isascii() and _UNPAIRED.search(value):
            return "is not valid UTF-8 text"
        return None

    return check


class RowChecks:
    """Checks every source row of a copy; collects what no target could hold."""

    #: Problems named in the refusal (all are counted).
    NAMED = 3

    def __init__(self, tables: Sequence[Table]) -> None:
        self.problems: list[Problem] = []
        self.count = 0
        self.referenced = {fk.column.table.name for t in tables for fk in t.foreign_keys}
        self.keys: dict[str, set[Any]] = {}

    def add(self, problem: Problem) -> None:
        self.count += 1
        if len(self.problems) < self.NAMED:
            self.problems.append(problem)

    def for_table(self, table: Table) -> Callable[[Row[Any]], None]:
        """The check of one row of ``table`` (tables must come in foreign-key order)."""
        checks = [(column.name, _column_check(column)) for column in table.columns]
        positions = key_positions(table)
        outward = [
            (fk.parent.name, fk.column.table.name)
            for fk in table.foreign_keys
            if fk.column.table is not table and fk.column.table.name in self.keys
        ]
        kept: set[Any] | None = None
        if table.name in self.referenced and len(positions) == 1:
            kept = self.keys.setdefault(table.name, set())

        def check(row: Row[Any]) -> None:
            shown: str | None = None
            for (name, column_check), value in zip(checks, row, strict=True):
                what = column_check(value)
                if what is not None:
                    shown = shown or shown_key(table, [row[i] for i in positions])
                    self.add(Problem(table.name, name, shown, what))
            mapping = row._mapping
            for name, parent in outward:
                value = mapping[name]
                if value is not None and value not in self.keys[parent]:
                    shown = shown or shown_key(table, [row[i] for i in positions])
                    what = f"names {parent} {value!r}, which the source does not hold"
                    self.add(Problem(table.name, name, shown, what))
            if kept is not None:
                kept.add(row[positions[0]])

        return check

    def refusal(self) -> CopyRefused | None:
        """The one-line refusal naming the problems found, or None."""
        if not self.count:
            return None
        named = "; ".join(str(problem) for problem in self.problems)
        more = f" (and {self.count - len(self.problems)} more)" if self.count > self.NAMED else ""
        return CopyRefused(
            f"--from: {self.count} value(s) no database can take as they are: {named}{more}; "
            "nothing was changed. Fix those rows in the source (the right type, valid UTF-8 "
            "text, an existing parent), then run the same command again"
        )

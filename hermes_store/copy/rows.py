"""What a copy must write: one table of the source and of the target compared row by row.

Both sides are read in key order, each row reduced to its ``hermes_store.copy.tablesum``
digest, and the two streams merged: a source row the target lacks is to be inserted, one
the target holds with other values updated, a target row the source no longer holds
deleted. Text keys are ordered by code point on both databases (SQLite's BINARY,
PostgreSQL's "C" collation: the order of Python's own comparison), so the merge pairs the
same keys whatever collation a database sorts text by. Consecutive source keys to write
are kept as a :class:`Run` (its first and last key), so a first copy of millions of rows
holds two keys in memory, and a final pass after a live copy writes only what changed.

Every source row is checked on the way, before anything is written
(``hermes_store.copy.checks``). The tables, their keys and how each side is read (one
snapshot, keys in code point order) are ``hermes_store.copy.tables``; this module re-exports
the names the rest of the copy uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, Table, and_, select, tuple_

from hermes_store.copy.checks import Problem, RowChecks
from hermes_store.copy.tables import (
    MARKER_PREFIX,
    REVISION_TABLES,
    copied_table,
    copied_tables,
    count_rows,
    is_own_key,
    key_columns,
    key_positions,
    ordered_key,
    own_filter,
    read_only,
    read_snapshot,
    revisions,
    self_references,
    shown_key,
    unique_columns,
    written_by_key,
)
from hermes_store.copy.tablesum import RowHasher, TableChecksum
from hermes_store.errors import CopyRefused

__all__ = [
    "MARKER_PREFIX",
    "REVISION_TABLES",
    "CopyProgress",
    "CopyRefused",
    "Problem",
    "RowChecks",
    "Run",
    "TableDiff",
    "compare_table",
    "copied_table",
    "copied_tables",
    "count_rows",
    "is_own_key",
    "key_columns",
    "key_condition",
    "ordered_key",
    "own_filter",
    "parents_first",
    "read_only",
    "read_snapshot",
    "revisions",
    "rows_by_keys",
    "run_batches",
    "self_references",
    "shown_key",
    "unique_columns",
]

#: Rows fetched at a time from either side.
FETCH_ROWS = 2000
#: Tables whose triggers on the target rewrite other rows than the one written, and the
#: column that bounds those rows: the display triggers (application schema 30) set the
#: display_order / display_identity of a message's peers in its session when a message
#: changes or goes. The copy compares those sessions again after writing.
PEER_TRIGGERS = {"messages": "session_id"}


@dataclass(frozen=True)
class CopyProgress:
    """Where a copy is: after each committed batch, and every few thousand rows read.

    ``step`` is ``comparing`` (both sides read to find what differs), ``copying``,
    ``deleting``, ``vacuuming`` (the target's upkeep after the writes, counted in tables
    rather than rows), ``verifying`` (the checksums) or ``searching`` (the sample
    searches, counted in searches).
    """

    table: str
    table_rows: int
    table_total: int
    rows: int
    total: int
    batches: int
    step: str = "copying"


def _greater(order: list[ColumnElement[Any]], key: Sequence[Any]) -> ColumnElement[bool]:
    if len(order) == 1:
        single: ColumnElement[bool] = order[0] > key[0]
        return single
    greater: ColumnElement[bool] = tuple_(*order) > tuple_(*key)
    return greater


def _between(order: list[ColumnElement[Any]], run: Run) -> ColumnElement[bool]:
    if len(order) == 1:
        return and_(order[0] >= run.first[0], order[0] <= run.last[0])
    return and_(tuple_(*order) >= tuple_(*run.first), tuple_(*order) <= tuple_(*run.last))


# --------------------------------------------------------------------------------------
# Comparing one table
# --------------------------------------------------------------------------------------


@dataclass
class Run:
    """Consecutive source keys (in key order) whose rows the target lacks or holds otherwise."""

    first: tuple[Any, ...]
    last: tuple[Any, ...]
    rows: int


@dataclass
class TableDiff:
    """What the target needs to hold one table's source rows exactly."""

    table: Table
    by_key: bool
    runs: list[Run] = field(default_factory=list)
    inserts: list[tuple[Any, ...]] = field(default_factory=list)  # by_key tables
    updates: list[tuple[Any, ...]] = field(default_factory=list)  # by_key tables
    deletes: list[tuple[Any, ...]] = field(default_factory=list)
    inserted: int = 0
    updated: int = 0
    same: int = 0
    source_rows: int = 0
    #: Both sides' checksums (``hermes_store.copy.tablesum``: the sum of the row digests).
    source_sum: int = 0
    target_sum: int = 0
    #: Values of the PEER_TRIGGERS column of rows updated or deleted (old and new).
    groups: set[Any] = field(default_factory=set)
    #: by_key tables with a self-reference: each source key's parent key.
    parents: dict[Any, Any] = field(default_factory=dict)

    @property
    def target_checksum(self) -> str:
        return f"{self.target_sum % TableChecksum.MOD:064x}"

    @property
    def source_checksum(self) -> str:
        return f"{self.source_sum % TableChecksum.MOD:064x}"

    @property
    def upserts(self) -> int:
        return self.inserted + self.updated

    @property
    def empty(self) -> bool:
        return not (self.upserts or self.deletes)


_Keyed = tuple[tuple[Any, ...], int, Row[Any]]


def _keyed(
    rows: Iterator[Row[Any]],
    table: Table,
    side: str,
    on_row: Callable[[Row[Any]], None] | None,
    tick: Callable[[], None],
) -> Iterator[_Keyed]:
    """(key, digest, row) of each row, checking that keys come in strictly rising order."""
    positions = key_positions(table)
    hasher = RowHasher(table)
    previous: tuple[Any, ...] | None = None
    for row in rows:
        if on_row is not None:
            on_row(row)
        key = tuple(row[i] for i in positions)
        try:
            rising = previous is None or previous < key
        except TypeError:
            rising = False
        if not rising:
            raise CopyRefused(
                f"{table.name}: the {side}'s keys do not come in code point order at "
                f"{shown_key(table, key)} (a key of another type, or a character the two "
                "databases sort apart); nothing was changed"
            )
        previous = key
        tick()
        yield key, hasher(row), row


def _with_own_filter(table: Table, where: Any) -> Any:
    own = own_filter(table)
    if own is None or where is None:
        return own if where is None else where
    return and_(own, where)


def _side_rows(conn: Connection | None, table: Table, where: Any) -> Iterator[Row[Any]]:
    if conn is None:
        return iter(())
    query = select(*table.columns).order_by(*ordered_key(table, conn))
    where = _with_own_filter(table, where)
    if where is not None:
        query = query.where(where)
    return iter(conn.execute(query, execution_options={"yield_per": FETCH_ROWS}))


def compare_table(
    source: Connection,
    target: Connection | None,
    table: Table,
    *,
    where: Any = None,
    append: bool = False,
    checks: RowChecks | None = None,
    progress: Callable[[int], None] | None = None,
) -> TableDiff:
    """Read ``table`` on both sides (``target`` None: an empty target) and say what differs
    (the rows matching ``where``; never the state_meta keys each side keeps of its own).

    With ``append`` the target's own rows stay (never deleted), and a source row the
    target holds with other values refuses the copy. ``progress`` gets the rows read so
    far (both sides), every :data:`FETCH_ROWS` rows.
    """
    diff = TableDiff(table, written_by_key(table))
    read = 0

    def tick() -> None:
        nonlocal read
        read += 1
        if progress is not None and read % FETCH_ROWS == 0:
            progress(read)

    on_row = checks.for_table(table) if checks is not None else None
    parent_columns = [column.name for column in self_references(table)]
    peer = PEER_TRIGGERS.get(table.name)
    mine = _keyed(_side_rows(source, table, where), table, "source", on_row, tick)
    theirs = _keyed(_side_rows(target, table, where), table, "target", None, tick)
    run: Run | None = None
    s, t = next(mine, None), next(theirs, None)
    while s is not None or t is not None:
        if t is None or (s is not None and s[0] < t[0]):
            kind, s_row, t_row = "insert", s, None
            s = next(mine, None)
        elif s is None or t[0] < s[0]:
            kind, s_row, t_row = "delete", None, t
            t = next(theirs, None)
        else:
            kind = "same" if s[1] == t[1] else "update"
            s_row, t_row = s, t
            s, t = next(mine, None), next(theirs, None)
        if t_row is not None:
            diff.target_sum += t_row[1]
        if s_row is not None:
            diff.source_rows += 1
            diff.source_sum += s_row[1]
            for name in parent_columns:
                diff.parents[s_row[0][0]] = s_row[2]._mapping[name]
        if kind == "same":
            diff.same += 1
            if run is not None:
                diff.runs.append(run)
                run = None
            continue
        if append and kind != "insert":
            if kind == "update":
                assert s_row is not None
                raise CopyRefused(
                    f"--append: {table.name} {shown_key(table, s_row[0])} is already in the "
                    "target with other values (the target's own, or changed in the source "
                    "since it was copied); a copy with --append never overwrites. Nothing "
                    "was changed"
                )
            continue  # a row of the target's own: kept
        if peer is not None:
            for row in (s_row, t_row):
                if row is not None:
                    diff.groups.add(row[2]._mapping[peer])
        if kind == "delete":
            assert t_row is not None
            diff.deletes.append(t_row[0])
            continue
        assert s_row is not None
        if kind == "insert":
            diff.inserted += 1
        else:
            diff.updated += 1
        if diff.by_key:
            (diff.inserts if kind == "insert" else diff.updates).append(s_row[0])
        elif run is None:
            run = Run(s_row[0], s_row[0], 1)
        else:
            run.last, run.rows = s_row[0], run.rows + 1
    if run is not None:
        diff.runs.append(run)
    if checks is not None and parent_columns:
        _check_parents(table, diff, checks)
    return diff


def _check_parents(table: Table, diff: TableDiff, checks: RowChecks) -> None:
    """Each source row's self-reference names a row the source holds."""
    name = self_references(table)[0].name
    for key, parent in diff.parents.items():
        if parent is not None and parent not in diff.parents:
            checks.add(
                Problem(
                    table.name,
                    name,
                    shown_key(table, [key]),
                    f"names {table.name} {parent!r}, which the source does not hold",
                )
            )


def parents_first(table: Table, diff: TableDiff) -> list[tuple[Any, ...]]:
    """``diff.inserts`` ordered so that every row comes after the row it references.

    The order is (depth in the parent tree, key): both databases check that foreign key
    at each statement (it is not DEFERRABLE), whatever the order of the keys.
    """
    depth: dict[Any, int] = {}
    for start in diff.parents:
        chain: list[Any] = []
        node = start
        while node is not None and node not in depth:
            if node in chain:
                raise CopyRefused(
                    f"{table.name}: the {self_references(table)[0].name} chain of "
                    f"{shown_key(table, [start])} is a cycle; nothing was changed. Fix the "
                    "source (`hermes-store check`)"
                )
            if node not in diff.parents:  # named by RowChecks already
                break
            chain.append(node)
            node = diff.parents[node]
        base = -1 if node is None or node not in depth else depth[node]
        for offset, item in enumerate(reversed(chain), start=1):
            depth[item] = base + offset
    return sorted(diff.inserts, key=lambda key: (depth.get(key[0], 0), key))


# --------------------------------------------------------------------------------------
# Reading the rows to write
# --------------------------------------------------------------------------------------


def run_batches(
    conn: Connection, table: Table, run: Run, size: int, where: Any = None
) -> Iterator[list[Row[Any]]]:
    """The source rows of ``run``, ``size`` at a time, in key order (keyset pagination)."""
    where = _with_own_filter(table, where)
    order = ordered_key(table, conn)
    positions = key_positions(table)
    after: tuple[Any, ...] | None = None
    while True:
        query = select(*table.columns).where(_between(order, run)).order_by(*order).limit(size)
        for clause in (where, None if after is None else _greater(order, after)):
            if clause is not None:
                query = query.where(clause)
        rows = list(conn.execute(query))
        if not rows:
            return
        yield rows
        after = tuple(rows[-1][i] for i in positions)


def key_condition(table: Table, keys: Sequence[Sequence[Any]]) -> ColumnElement[bool]:
    """``key IN (...)`` for ``keys``."""
    columns = key_columns(table)
    if len(columns) == 1:
        return columns[0].in_([key[0] for key in keys])
    return tuple_(*columns).in_([tuple(key) for key in keys])


def rows_by_keys(conn: Connection, table: Table, keys: Sequence[tuple[Any, ...]]) -> list[Row[Any]]:
    """The rows of ``keys``, in the order of ``keys`` (those the database holds)."""
    positions = key_positions(table)
    found = {
        tuple(row[i] for i in positions): row
        for row in conn.execute(select(*table.columns).where(key_condition(table, keys)))
    }
    return [found[key] for key in keys if key in found]

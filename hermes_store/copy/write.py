"""Writing what the comparison found: batch by batch, each batch with the progress marker.

Inserts and updates go parents first, table by table in foreign-key order (sessions by
depth in the ``parent_session_id`` tree: that foreign key is checked at each statement, not
DEFERRABLE); deletes go children first, in the reverse order, after the unique titles and
parent links of the rows they replace are cleared. The target's display triggers rewrite
the display order of a changed message's peers, so the sessions touched are compared and
written again until they are equal.

What differs between the databases (how a batch's transaction begins, the message id
sequence, what the database says of a refused batch, the upkeep after the writes: on
PostgreSQL a VACUUM (ANALYZE) of every table filled) is asked of the target's backend.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Row, Table, and_, bindparam, select, text
from sqlalchemy.exc import DBAPIError

from hermes_store.backend import CopyUpkeep, backend_for, backend_of
from hermes_store.copy.marker import SOURCE_MARKER, identity_sample, markers, put_marker
from hermes_store.copy.rows import (
    PEER_TRIGGERS,
    CopyProgress,
    TableDiff,
    compare_table,
    key_columns,
    key_condition,
    parents_first,
    rows_by_keys,
    run_batches,
    self_references,
    shown_key,
    unique_columns,
)
from hermes_store.errors import CopyRefused

if TYPE_CHECKING:
    from hermes_store.copy.run import Run

__all__ = ["KEYS_PER_STATEMENT", "Writer", "insert_rows"]

#: Keys per IN (...) when rows are fixed up, cleared or deleted by key.
KEYS_PER_STATEMENT = 500


class Writer:
    """Writes what the comparison found, batch by batch, each batch with the marker."""

    def __init__(
        self, run: Run, state: dict[str, Any], previous: str | None, diffs: list[TableDiff]
    ) -> None:
        self.run = run
        self.state = {**state, "run": secrets.token_hex(4), "batches": 0}
        self.previous = previous
        self.diffs = diffs
        self.batches = 0
        self.rows = 0
        self.table_totals = {d.table.name: d.upserts + len(d.deletes) for d in diffs}
        self.table_done: dict[str, int] = {}
        self.total = sum(self.table_totals.values())
        self.upserted: dict[str, int] = {}
        self.deleted: dict[str, int] = {}
        self.updated: dict[str, int] = {}
        self.dst: Connection | None = None
        #: What the target's backend did after the writes (None: nothing to do).
        self.upkeep: CopyUpkeep | None = None

    def changes(self) -> dict[str, dict[str, int]]:
        return {
            diff.table.name: {
                "inserted": self.upserted.get(diff.table.name, 0)
                - self.updated.get(diff.table.name, 0),
                "updated": self.updated.get(diff.table.name, 0),
                "deleted": self.deleted.get(diff.table.name, 0),
            }
            for diff in self.diffs
            if self.upserted.get(diff.table.name) or self.deleted.get(diff.table.name)
        }

    def write(self, *, finish: bool) -> None:
        backend = backend_for(self.run.target_url)
        engine = backend.open_copy_target(self.run.target_url)
        try:
            with engine.connect() as dst:
                self.dst = dst
                if finish:
                    self._write_all()
                    # Before the marker says complete: a run stopped during it does it
                    # again, since the copy is not complete yet.
                    self.upkeep = backend.finish_copy_target(
                        dst, [diff.table.name for diff in self.diffs], self._vacuuming
                    )
                with dst.begin():  # new messages get ids past every copied one
                    _raise_sequence(dst, _high_water(self.run.src))
                    if finish:
                        self._finish()
        finally:
            self.dst = None
            engine.dispose()

    def _vacuuming(self, table: str, done: int, total: int) -> None:
        """The target's upkeep after the writes, counted in tables."""
        self.run.report(CopyProgress(table, done, total, done, total, self.batches, "vacuuming"))

    def _write_all(self) -> None:
        for diff in self.diffs:
            if diff.by_key:
                self._clear(diff)
        for diff in self.diffs:
            self._upsert(diff)
        for diff in reversed(self.diffs):
            self._delete(diff)
        for diff in self.diffs:
            if diff.table.name in PEER_TRIGGERS and diff.groups:
                self._peers(diff)

    # ---- one batch -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _batch(self, table: Table, keys: Sequence[Sequence[Any]], step: str) -> Iterator[None]:
        """One transaction: the batch's writes and the marker, committed together."""
        assert self.dst is not None
        try:
            with self.dst.begin():
                yield
                self.batches += 1
                state = {**self.state, "batches": self.batches}
                self.previous = put_marker(self.dst, SOURCE_MARKER, state, self.previous)
        except DBAPIError as exc:
            raise _batch_failed(self.dst, table, keys, exc) from None
        self.rows += len(keys)
        done = self.table_done[table.name] = self.table_done.get(table.name, 0) + len(keys)
        mine = (table.name, done, max(done, self.table_totals.get(table.name, 0)))
        self.run.report(CopyProgress(*mine, self.rows, self.total, self.batches, step))

    def _clear(self, diff: TableDiff) -> None:
        """Free the unique values and parent links of rows about to change or go, so that
        no order of the writes that follow trips a unique index or a foreign key."""
        table = diff.table
        columns = [c for c in (*unique_columns(table), *self_references(table)) if c.nullable]
        keys = [*diff.updates, *diff.deletes]
        if not columns or not keys:
            return
        for chunk in _chunks(keys, KEYS_PER_STATEMENT):
            assert self.dst is not None
            try:
                with self.dst.begin():
                    self.dst.execute(
                        table.update()
                        .where(key_condition(table, chunk))
                        .values({column.name: None for column in columns})
                    )
            except DBAPIError as exc:
                raise _batch_failed(self.dst, table, chunk, exc) from None

    def _upsert(self, diff: TableDiff, where: Any = None) -> None:
        table, size = diff.table, self.run.batch_rows
        if diff.by_key:
            inserts = parents_first(table, diff)
            for kind, keys in (("insert", inserts), ("update", diff.updates)):
                for chunk in _chunks(keys, size):
                    rows = rows_by_keys(self.run.src, table, chunk)
                    with self._batch(table, chunk, "copying"):
                        self._write_rows(table, rows, kind)
            return
        positions = [list(table.columns).index(column) for column in key_columns(table)]
        for run in diff.runs:
            for rows in run_batches(self.run.src, table, run, size, where):
                keys = [tuple(row[i] for i in positions) for row in rows]
                with self._batch(table, keys, "copying"):
                    self._write_rows(table, rows, None)

    def _write_rows(self, table: Table, rows: Sequence[Row[Any]], kind: str | None) -> None:
        """Insert or update ``rows`` as they are (ids kept). ``kind`` None: whichever the
        target needs (it is asked for the keys it holds)."""
        assert self.dst is not None
        if kind is None:
            held = _held_keys(self.dst, table, rows)
            positions = [list(table.columns).index(column) for column in key_columns(table)]
            old = [row for row in rows if tuple(row[i] for i in positions) in held]
            new = [row for row in rows if tuple(row[i] for i in positions) not in held]
        else:
            old, new = (list(rows), []) if kind == "update" else ([], list(rows))
        if old:
            _update(self.dst, table, old)
            self.updated[table.name] = self.updated.get(table.name, 0) + len(old)
        if new:
            insert_rows(self.dst, table, new)
        self.upserted[table.name] = self.upserted.get(table.name, 0) + len(rows)

    def _delete(self, diff: TableDiff) -> None:
        table = diff.table
        for chunk in _chunks(diff.deletes, min(self.run.batch_rows, KEYS_PER_STATEMENT)):
            with self._batch(table, chunk, "deleting"):
                assert self.dst is not None
                self.dst.execute(table.delete().where(key_condition(table, chunk)))
            self.deleted[table.name] = self.deleted.get(table.name, 0) + len(chunk)

    def _peers(self, diff: TableDiff) -> None:
        """Compare again, and write, the groups of rows the target's triggers rewrote."""
        table = diff.table
        column = table.c[PEER_TRIGGERS[table.name]]
        groups = diff.groups
        for _ in range(3):  # the writes of a round change no peer: one round is enough
            touched: set[Any] = set()
            for chunk in _chunks(sorted(groups, key=repr), KEYS_PER_STATEMENT):
                where = column.in_(chunk)
                assert self.dst is not None
                with self.dst.begin():
                    again = compare_table(self.run.src, self.dst, table, where=where)
                if again.empty:
                    continue
                self.total += again.upserts + len(again.deletes)
                self._upsert(again, where)
                self._delete(again)
                touched |= again.groups
            if not touched:
                return
            groups = touched

    def _finish(self) -> None:
        """The copy is complete: the marker says so; the marker of older versions goes."""
        assert self.dst is not None
        done = [key for key in markers(self.dst) if key != SOURCE_MARKER]
        if done:
            self.dst.execute(
                text("DELETE FROM state_meta WHERE key IN :keys").bindparams(
                    bindparam("keys", expanding=True)
                ),
                {"keys": done},
            )
        state = {**self.state, "state": "complete", "batches": self.batches}
        state["sample"] = identity_sample(self.run.src)
        # What the target holds now (the source's rows as this run read them): a later run
        # refuses to overwrite a target written to since.
        state["sums"] = {diff.table.name: diff.source_checksum for diff in self.diffs}
        self.previous = put_marker(self.dst, SOURCE_MARKER, state, self.previous)


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _high_water(conn: Connection) -> int:
    """The highest message id the database ever handed out (its sequence, or max(id))."""
    return backend_of(conn).message_id_high_water(conn)


def _raise_sequence(conn: Connection, value: int) -> None:
    """Make the target hand out message ids above ``value`` (never lower its sequence)."""
    if value <= 0:
        return
    backend_of(conn).raise_message_ids(conn, value)


def _held_keys(target: Connection, table: Table, rows: Sequence[Row[Any]]) -> set[tuple[Any, ...]]:
    """The keys among ``rows``' that the target holds."""
    key = key_columns(table)
    idents = [tuple(row._mapping[c.name] for c in key) for row in rows]
    found = target.execute(select(*key).where(key_condition(table, idents)))
    return {tuple(row) for row in found}


def _update(target: Connection, table: Table, rows: Sequence[Row[Any]]) -> None:
    """Give the target's rows of these keys the source's values (every column)."""
    key = key_columns(table)
    statement = table.update().where(and_(*(c == bindparam(f"key_{c.name}") for c in key)))
    values = [
        {
            **{c.name: row._mapping[c.name] for c in table.columns if c not in key},
            **{f"key_{c.name}": row._mapping[c.name] for c in key},
        }
        for row in rows
    ]
    target.execute(statement, values)


def insert_rows(target: Connection, table: Table, rows: Sequence[Row[Any]]) -> None:
    """Insert ``rows`` as they are (ids kept; a NULL display order stays NULL)."""
    values = [dict(row._mapping) for row in rows]
    target.execute(table.insert(), values)
    if table.name == "messages":
        # The display-order trigger fills a NULL display_order on insert; the copy keeps
        # the source's NULL (an UPDATE of display_order alone fires no trigger).
        nulls = [v["id"] for v in values if v.get("display_order") is None]
        if nulls:
            target.execute(
                table.update()
                .where(table.c.id.in_(bindparam("ids", expanding=True)))
                .values(display_order=None),
                {"ids": nulls},
            )


def _batch_failed(
    target: Connection, table: Table, keys: Sequence[Sequence[Any]], exc: DBAPIError
) -> CopyRefused:
    """One line for a batch the target refused: the table, the keys, the constraint or
    the kind of error (the backend's words); never the driver's text, which may quote a
    value."""
    reason = backend_of(target).write_refusal_reason(exc.orig)
    span = shown_key(table, keys[0]) if keys else table.name
    if len(keys) > 1:
        span += f" to {shown_key(table, keys[-1])}"
    return CopyRefused(
        f"{table.name}: the target refused the batch of {span} ({reason}); that batch was "
        "rolled back, the batches before it are kept. Fix the cause, then run the same "
        "command again"
    )

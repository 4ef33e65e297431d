"""Checksums of a table's rows that come out the same on SQLite and PostgreSQL.

Computed in Python over the values the drivers return, never with a database's own hash
function: each row's SHA-256 over its values, each normalised by its column's type
(floats by ``float.hex``, so exactly; integers held by a REAL column as floats; bytes
from a ``memoryview`` or ``bytes`` alike; NULL apart from every value; every value
tagged and length-prefixed, so ``('ab', 'c')`` and ``('a', 'bc')`` differ). The rows'
digests are summed modulo 2**256: the order the rows come in does not matter (the two
databases sort text by different collations), and a row present twice counts twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import BLOB, REAL, Column, Connection, Table, select, tuple_

__all__ = ["RowHasher", "TableChecksum", "row_digest", "table_sum"]

#: Rows fetched at a time, and keys per ``IN (...)`` when only some rows are summed.
FETCH_ROWS = 2000
KEYS_PER_QUERY = 500


def _normaliser(column: Column[Any]) -> Callable[[Any], bytes]:
    """How one column's value is encoded for the checksum, the same on both databases."""
    is_real = isinstance(column.type, REAL)
    is_blob = isinstance(column.type, BLOB)

    def encode(value: Any) -> bytes:
        if value is None:
            return b"N"
        if isinstance(value, (memoryview, bytearray)) or (is_blob and isinstance(value, bytes)):
            raw = bytes(value)
            return b"b%d:" % len(raw) + raw
        if isinstance(value, bool):
            value = int(value)
        if is_real and isinstance(value, int):
            value = float(value)
        if isinstance(value, float):
            return b"f" + value.hex().encode()
        if isinstance(value, int):
            return b"i%d" % value
        if isinstance(value, str):
            raw = value.encode("utf-8", "surrogatepass")
            return b"s%d:" % len(raw) + raw
        if isinstance(value, bytes):
            return b"b%d:" % len(value) + value
        raw = repr(value).encode()
        return b"r%d:" % len(raw) + raw

    return encode


class RowHasher:
    """The SHA-256 of one row of a table, as an integer (the same on both databases)."""

    def __init__(self, table: Table) -> None:
        self.encoders = [_normaliser(column) for column in table.columns]

    def __call__(self, row: Sequence[Any]) -> int:
        digest = hashlib.sha256()
        for encode, value in zip(self.encoders, row, strict=True):
            digest.update(encode(value))
        return int.from_bytes(digest.digest(), "big")


class TableChecksum:
    """The row count and order-independent checksum of rows of one table."""

    MOD = 1 << 256

    def __init__(self, table: Table) -> None:
        self.hasher = RowHasher(table)
        self.total = 0
        self.rows = 0

    def add(self, row: Sequence[Any]) -> None:
        """Count one row (its values in the order of the table's columns)."""
        self.add_digest(self.hasher(row))

    def add_digest(self, digest: int) -> None:
        """Count one row given by its :class:`RowHasher` digest."""
        self.total = (self.total + digest) % self.MOD
        self.rows += 1

    def hexdigest(self) -> str:
        """The checksum as 64 hexadecimal digits."""
        return f"{self.total:064x}"


def row_digest(table: Table, row: Sequence[Any]) -> str:
    """The checksum of one row."""
    check = TableChecksum(table)
    check.add(row)
    return check.hexdigest()


def table_sum(
    conn: Connection,
    table: Table,
    where: Any = None,
    *,
    keys: Iterable[Sequence[Any]] | None = None,
    progress: Callable[[int], None] | None = None,
) -> TableChecksum:
    """Rows and checksum of ``table`` (those matching ``where``; only the rows whose primary
    keys are in ``keys``, when given). ``progress`` gets the rows summed so far, every
    :data:`FETCH_ROWS` rows."""
    check = TableChecksum(table)

    def count(rows: Iterable[Sequence[Any]]) -> None:
        for row in rows:
            check.add(row)
            if progress is not None and check.rows % FETCH_ROWS == 0:
                progress(check.rows)

    if keys is None:
        query = select(*table.columns)
        if where is not None:
            query = query.where(where)
        count(conn.execute(query, execution_options={"yield_per": FETCH_ROWS}))
        return check
    key = list(table.primary_key.columns)
    batch: list[Sequence[Any]] = []

    def flush() -> None:
        if not batch:
            return
        if len(key) == 1:
            condition = key[0].in_([ident[0] for ident in batch])
        else:
            condition = tuple_(*key).in_([tuple(ident) for ident in batch])
        if where is not None:
            condition = condition & where
        count(conn.execute(select(*table.columns).where(condition)))
        batch.clear()

    for ident in keys:
        batch.append(ident)
        if len(batch) >= KEYS_PER_QUERY:
            flush()
    flush()
    return check

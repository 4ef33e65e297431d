"""Checksums of table rows: the same values give the same sum on both databases' drivers."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BLOB, REAL, TEXT, Column, Integer, MetaData, Table

from hermes_store.copy.tablesum import TableChecksum, row_digest

TABLE = Table(
    "t",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("a", TEXT),
    Column("b", TEXT),
    Column("when", REAL),
    Column("raw", BLOB),
)


def _sum(*rows: tuple[Any, ...]) -> str:
    check = TableChecksum(TABLE)
    for row in rows:
        check.add(row)
    return check.hexdigest()


def test_the_order_of_rows_does_not_matter_but_each_row_counts() -> None:
    one, two = (1, "x", None, 1.5, None), (2, "y", None, 2.5, None)
    assert _sum(one, two) == _sum(two, one)
    assert _sum(one, one) != _sum(one)
    assert _sum() == "0" * 64


def test_values_the_two_drivers_return_differently_sum_the_same() -> None:
    # SQLite may hand back an integer from a REAL column; psycopg gives bytea as bytes,
    # other paths as memoryview.
    assert row_digest(TABLE, (1, "x", None, 2, b"\x00\xff")) == row_digest(
        TABLE, (1, "x", None, 2.0, memoryview(b"\x00\xff"))
    )


def test_different_values_never_sum_the_same() -> None:
    base = row_digest(TABLE, (1, "ab", "c", 1.0, None))
    assert row_digest(TABLE, (1, "a", "bc", 1.0, None)) != base
    assert row_digest(TABLE, (1, "ab", "c", 1.0 + 2**-40, None)) != base
    assert row_digest(TABLE, (1, "", None, 1.0, None)) != row_digest(
        TABLE, (1, None, "", 1.0, None)
    )
    assert row_digest(TABLE, (1, "1", None, 1.0, None)) != row_digest(
        TABLE, (1, 1, None, 1.0, None)
    )
    assert row_digest(TABLE, (1, None, None, 1.0, b"")) != row_digest(
        TABLE, (1, None, None, 1.0, None)
    )

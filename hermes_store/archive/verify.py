"""A batch verified: the row count and checksum of each of its tables, on both stores.

The checksums are ``hermes_store.copy.tablesum``'s: the same on SQLite and PostgreSQL, each
row's values hashed exactly (floats by their bits), the rows' digests summed so their
order does not matter. The rows summed are those the batch's sessions own, and the system
prompts they refer to, in the columns the hot store has (``shape``): the same on both.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from hermes_store.archive.rows import OWNED_TABLES, owned_condition, prompt_condition
from hermes_store.archive.shape import has
from hermes_store.archive.shape import table as copied_table
from hermes_store.copy.tablesum import table_sum

__all__ = ["Sums", "batch_sums", "differences"]

#: Table -> (rows, checksum).
Sums = dict[str, tuple[int, str]]
#: The sum of a table the hot store lacks: no rows.
_NONE = (0, f"{0:064x}")


def batch_sums(conn: Connection, ids: Sequence[str], hashes: Sequence[str]) -> Sums:
    """(rows, checksum) of what the sessions ``ids`` own, by table, and of the prompts
    of ``hashes``, as the store of ``conn`` holds them."""
    found: Sums = {}
    for name in OWNED_TABLES:
        if not has(name):
            found[name] = _NONE
            continue
        table = copied_table(name)
        check = table_sum(conn, table, owned_condition(table, ids))
        found[name] = (check.rows, check.hexdigest())
    if not has("system_prompts"):
        found["system_prompts"] = _NONE
        return found
    check = table_sum(conn, copied_table("system_prompts"), prompt_condition(hashes))
    found["system_prompts"] = (check.rows, check.hexdigest())
    return found


def differences(first: Sums, second: Sums) -> list[str]:
    """The tables whose rows differ between two stores' sums."""
    return sorted(
        name for name in first.keys() | second.keys() if first.get(name) != second.get(name)
    )

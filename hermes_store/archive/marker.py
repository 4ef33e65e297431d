"""The batch in flight: one ``state_meta`` row in each of the two stores.

``hermes_store.archive.batch`` holds a JSON object: the batch's token, the stores it moves
from and to (by name), its session ids and prompt hashes, and the row count and checksum
of each table's rows of the batch as they were copied. The store it moves from gets it in a
transaction of its own before anything is copied; the store it moves to gets it in the
transaction that copies the rows; the first is deleted in the transaction that deletes
the rows, the second after that. So after a kill at any instant:

- only the first: the copy never committed; the other store holds nothing of the batch;
- both: the copy committed (verified), the delete did not: check the first store still
  holds what was copied, then delete (or, when it changed, take the copy back);
- only the second: the delete committed; only the marker is left to clear.

``hermes-store copy`` never copies it (every ``hermes_store.`` key is a store's own).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, select

from hermes_store.copy.tables import copied_table

__all__ = ["BATCH_MARKER", "clear_marker", "put_marker", "read_marker"]

BATCH_MARKER = "hermes_store.archive.batch"


def read_marker(conn: Connection) -> dict[str, Any] | None:
    """The batch in flight this store records, or None."""
    meta = copied_table("state_meta")
    raw = conn.scalar(select(meta.c.value).where(meta.c.key == BATCH_MARKER))
    return None if raw is None else dict(json.loads(raw))


def put_marker(conn: Connection, value: dict[str, Any]) -> None:
    """Record the batch in flight (in the caller's transaction)."""
    meta = copied_table("state_meta")
    encoded = json.dumps(value, sort_keys=True, ensure_ascii=False)
    done = conn.execute(meta.update().where(meta.c.key == BATCH_MARKER).values(value=encoded))
    if done.rowcount == 0:
        conn.execute(meta.insert().values(key=BATCH_MARKER, value=encoded))


def clear_marker(conn: Connection, batch: str) -> None:
    """Forget the batch ``batch`` (in the caller's transaction); another batch's stays."""
    meta = copied_table("state_meta")
    found = read_marker(conn)
    if found is not None and found.get("batch") == batch:
        conn.execute(meta.delete().where(meta.c.key == BATCH_MARKER))

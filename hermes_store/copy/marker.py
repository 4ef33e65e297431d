"""The copy's progress marker: the ``state_meta`` row that names the source a target copies.

The marker (``hermes_store.copy.source``) is written with every committed batch. It records
the source's name and what identifies it beyond its name (its backend's fingerprint: the
file of a SQLite store, the cluster and database of a PostgreSQL one), and a sample of rows
it held, each reduced to a digest of the values a row keeps for life. A later run compares
them with the source it reads, so a target holding a copy of another store is recognised.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, func, inspect, select, text

from hermes_store.backend import backend_for
from hermes_store.copy.tables import MARKER_PREFIX, copied_table
from hermes_store.errors import CopyRefused

__all__ = [
    "LIFELONG",
    "SAMPLE_ROWS",
    "SOURCE_MARKER",
    "fingerprint",
    "identity_sample",
    "markers",
    "put_marker",
    "read_marker",
    "recognised",
    "source_name",
]

SOURCE_MARKER = MARKER_PREFIX + "source"
#: Rows the marker records to recognise its source, and the columns of each it keeps:
#: what a row keeps for life (a message's session, role and time; a session's platform
#: and start), so an edit or a compaction leaves it recognisable, another store not.
SAMPLE_ROWS = 16
LIFELONG = {
    "messages": ("id", "session_id", "role", "timestamp"),
    "sessions": ("id", "source", "started_at"),
}


def source_name(url: str) -> str:
    """How the copy marker names its source (a file by its name with every link resolved,
    so a resumed copy may name it either way)."""
    return backend_for(url).copy_source_name(url)


def fingerprint(conn: Connection, url: str) -> dict[str, Any]:
    """What tells this source from another at the same name (see the module's docstring)."""
    return backend_for(url).copy_source_fingerprint(conn, url)


def _lifelong_digest(values: Sequence[Any]) -> str:
    """A short digest of a row's lifelong values (numbers as floats: REAL may be int)."""
    normal = [
        float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in values
    ]
    return hashlib.sha256(json.dumps(normal, ensure_ascii=False).encode()).hexdigest()[:16]


def identity_sample(conn: Connection) -> list[list[Any]]:
    """Up to :data:`SAMPLE_ROWS` rows spread over the messages (or the first sessions),
    each as [table, key, digest of its lifelong values]."""
    messages = copied_table("messages")
    low, high = conn.execute(select(func.min(messages.c.id), func.max(messages.c.id))).one()
    columns = [messages.c[name] for name in LIFELONG["messages"]]
    rows: list[Row[Any]] = []
    if low is not None:
        steps = SAMPLE_ROWS - 1
        starts = sorted({low + (high - low) * step // steps for step in range(SAMPLE_ROWS)})
        query = select(*columns).order_by(messages.c.id).limit(1)
        for start in starts:
            row = conn.execute(query.where(messages.c.id >= start)).first()
            if row is not None and all(row[0] != kept[0] for kept in rows):
                rows.append(row)
        return [["messages", row[0], _lifelong_digest(row)] for row in rows]
    sessions = copied_table("sessions")
    columns = [sessions.c[name] for name in LIFELONG["sessions"]]
    found = conn.execute(select(*columns).order_by(sessions.c.id).limit(SAMPLE_ROWS))
    return [["sessions", row[0], _lifelong_digest(row)] for row in found]


def recognised(conn: Connection, sample: list[list[Any]]) -> bool:
    """Whether the source still holds a row of a recorded sample, recognisably."""
    for name in LIFELONG:
        wanted = {key: digest for table, key, digest in sample if table == name}
        if not wanted:
            continue
        table = copied_table(name)
        columns = [table.c[column] for column in LIFELONG[name]]
        query = select(*columns).where(columns[0].in_(list(wanted)))
        if any(_lifelong_digest(row) == wanted[row[0]] for row in conn.execute(query)):
            return True
    return False


def markers(conn: Connection) -> dict[str, str]:
    """The copy's own ``state_meta`` rows (``hermes_store.copy.*``), by key."""
    if "state_meta" not in set(inspect(conn).get_table_names()):
        return {}
    rows = conn.execute(
        text("SELECT key, value FROM state_meta WHERE key LIKE :prefix"),
        {"prefix": MARKER_PREFIX + "%"},  # '_' matches any character: filtered below
    )
    return {str(k): str(v) for k, v in rows if str(k).startswith(MARKER_PREFIX)}


def read_marker(found: dict[str, str], key: str) -> dict[str, Any] | None:
    """The marker ``key`` among ``found`` (see :func:`markers`), decoded."""
    raw = found.get(key)
    return None if raw is None else dict(json.loads(raw))


def put_marker(conn: Connection, key: str, value: dict[str, Any], previous: str | None) -> str:
    """Write a marker, only if it still holds ``previous`` (a second copy run fails)."""
    encoded = json.dumps(value, sort_keys=True, ensure_ascii=False)
    if previous is None:
        taken = conn.execute(
            text("SELECT count(*) FROM state_meta WHERE key = :key"), {"key": key}
        ).scalar_one()
        if not taken:
            conn.execute(
                text("INSERT INTO state_meta (key, value) VALUES (:key, :value)"),
                {"key": key, "value": encoded},
            )
            return encoded
    else:
        done = conn.execute(
            text("UPDATE state_meta SET value = :value WHERE key = :key AND value = :previous"),
            {"key": key, "value": encoded, "previous": previous},
        )
        if done.rowcount == 1:
            return encoded
    raise CopyRefused(
        f"the progress marker {key} changed under this copy: another `hermes-store copy` "
        "writes to the same target. This run stopped; its last batch was rolled back"
    )

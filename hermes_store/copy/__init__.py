"""Copy a whole store to another database (SQLite <-> PostgreSQL), resumably, and verify it.

`copy_store(source, target)` brings the target to what the source holds, table by table
in foreign-key order, keeping every id. The source is only ever read: a SQLite source is
opened through a ``file:...?mode=ro`` URI, a PostgreSQL one in a read-only transaction;
a whole run reads one snapshot of it.

Each run compares before it writes (``hermes_store.copy.rows``): both sides are read in key
order and compared row by row by checksum, so the run knows which source rows the target
lacks, which it holds with other values and which target rows the source no longer
has, and every source value is checked (type, UTF-8, NOT NULL, foreign keys) before the
first write. Then it writes only those, in batches, each committed together with the
progress marker (``state_meta`` ``hermes_store.copy.source``). A first copy writes every
row; a run after a kill -9, Ctrl-C or a lost server, or after the source changed (an
agent writing to it meanwhile), writes what differs: rows added, edited or deleted since
included, whatever their keys. So the same command always converges, and the final pass
of a live move (the agent stopped) writes only what changed since the last run.

Writing order. Inserts and updates go parents first, table by table in foreign-key order
(sessions by depth in the ``parent_session_id`` tree: that foreign key is checked at each
statement, not DEFERRABLE); deletes go children first, in the reverse order, after the
unique titles and parent links of the rows they replace are cleared. The target's display
triggers rewrite the display order of a changed message's peers, so the sessions touched
are compared and written again until they are equal.

The source, named. The marker records the source's name and what identifies it beyond its
name: the file (device and inode) of a SQLite store, the cluster's system identifier and
the database's oid on PostgreSQL, and a sample of rows it held (keys and the values a row
keeps for life). A target holding a copy of another store, or of another file now at the
same path, is refused in one line that names the command making it a copy of this source
(``--restart``).

What the target keeps of its own. `alembic_version` and `schema_version` are written by
the target's own upgrade to the source's revision, not copied. The `state_meta` keys that
describe a database's own search index (`hermes_store.fts_layout`: 'external' on SQLite,
'expression' on PostgreSQL; the deferred-backfill markers; `fts_optimize_available`) keep
the value the target's upgrade wrote; every other key is copied.

Verification (``hermes_store.copy.verify``) reads the target again and compares it with the
snapshot the copy read: checksums of every table and sample searches chosen from the
source's text.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Table,
    and_,
    bindparam,
    create_engine,
    event,
    func,
    inspect,
    or_,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from hermes_store import migrate
from hermes_store.copy.rows import (
    MARKER_PREFIX,
    PEER_TRIGGERS,
    CopyProgress,
    CopyRefused,
    RowChecks,
    TableDiff,
    compare_table,
    copied_tables,
    count_rows,
    key_columns,
    key_condition,
    parents_first,
    read_only,
    read_snapshot,
    revisions,
    rows_by_keys,
    run_batches,
    self_references,
    shown_key,
    unique_columns,
)
from hermes_store.copy.verify import Verification, verify_copy
from hermes_store.copy.verify import verify as verify_target
from hermes_store.engine import (
    backend_name,
    connect_read_only,
    create_store_engine,
    db_path,
    display_url,
    is_server,
    to_url,
)
from hermes_store.errors import SchemaTooNew, StoreNotFound
from hermes_store.postgresql import migration as server
from hermes_store.revisions import head_revision, script_directory

log = logging.getLogger(__name__)

__all__ = [
    "BATCH_ROWS",
    "CopyProgress",
    "CopyRefused",
    "CopyResult",
    "Verification",
    "copied_tables",
    "copy_store",
    "open_source",
    "verify_copy",
]

#: Rows per committed batch.
BATCH_ROWS = 2000
SOURCE_MARKER = MARKER_PREFIX + "source"
#: Rows the marker records to recognise its source, and the columns of each it keeps:
#: what a row keeps for life (a message's session, role and time; a session's platform
#: and start), so an edit or a compaction leaves it recognisable, another store not.
SAMPLE_ROWS = 16
LIFELONG = {
    "messages": ("id", "session_id", "role", "timestamp"),
    "sessions": ("id", "source", "started_at"),
}
#: Keys per IN (...) when rows are fixed up, cleared or deleted by key.
KEYS_PER_STATEMENT = 500


@dataclass
class CopyResult:
    """What one run of the copy did, and the verification that followed it."""

    source: str
    target: str
    revision: tuple[str, ...]
    rows: dict[str, int]
    resumed: bool
    created_target: bool
    already_complete: bool
    seconds: float
    verification: Verification
    #: Per table: rows inserted, updated and deleted by this run.
    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Whether the source changed while this run read it (the target is then a copy of it
    #: as it was when the run began): known for SQLite sources, None on PostgreSQL.
    source_changed: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "revision": list(self.revision),
            "rows_copied": self.rows,
            "changes": self.changes,
            "resumed": self.resumed,
            "created_target": self.created_target,
            "already_complete": self.already_complete,
            "source_changed_during_copy": self.source_changed,
            "seconds": round(self.seconds, 3),
            "verification": self.verification.as_dict(),
        }


# --------------------------------------------------------------------------------------
# Opening both sides
# --------------------------------------------------------------------------------------


def _read_only_sqlite(path: Path) -> Engine:
    """An engine that can only read ``path`` (``mode=ro``): SQLite refuses every write.

    Text is decoded with ``errors="surrogateescape"``: a value that is not UTF-8 (a writer
    that stored bytes as TEXT) reads as text holding lone surrogates, which the copy's
    checks name by table, column and key, where the driver's own error would quote it.
    """

    def connect() -> sqlite3.Connection:
        conn = connect_read_only(path, timeout=30, check_same_thread=False)
        conn.isolation_level = None  # SQLAlchemy's BEGIN below starts the read transaction
        conn.text_factory = functools.partial(str, encoding="utf-8", errors="surrogateescape")
        return conn

    engine = create_engine(
        "sqlite://",
        creator=connect,
        poolclass=NullPool,
        hide_parameters=True,
        logging_name="hermes_store",  # the logger whose fetched rows are never logged
    )

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def open_source(source: str) -> Engine:
    """A read-only engine on the source store (a path or URL); refuses one that is missing."""
    url = to_url(source)
    if is_server(url):
        return create_store_engine(url, create=False)  # read-only: see read_snapshot
    path = db_path(url)
    if path is None or not path.exists() or path.stat().st_size == 0:
        raise StoreNotFound(f"--from {path or url}: no such store; nothing was changed")
    migrate.inspect_file(path)  # read-only: refuses what is not a SQLite Hermes store
    return _read_only_sqlite(path)


def same_store(source: str, target: str) -> bool:
    """Whether two resolved URLs name the same database."""
    if backend_name(source) != backend_name(target):
        return False
    if not is_server(source):
        a, b = db_path(source), db_path(target)
        if a is None or b is None:
            return False
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    from sqlalchemy.engine import make_url

    ua, ub = make_url(source), make_url(target)
    return (ua.host or "localhost", ua.port or 5432, ua.database) == (
        ub.host or "localhost",
        ub.port or 5432,
        ub.database,
    )


# --------------------------------------------------------------------------------------
# The source, named and recognised
# --------------------------------------------------------------------------------------


def _source_name(url: str) -> str:
    """How the copy marker names its source: a file by its name with every link resolved
    (the URL keeps a linked directory as given), so a resumed copy may name it either way."""
    path = db_path(url)
    return display_url(url if path is None else to_url(os.path.realpath(path)))


def _fingerprint(conn: Connection, url: str) -> dict[str, Any]:
    """What tells this source from another at the same name: the file (device, inode) of
    a SQLite store; the cluster's system identifier and the database's oid on PostgreSQL."""
    path = db_path(url)
    if path is not None:
        status = os.stat(os.path.realpath(path))
        return {"file": [status.st_dev, status.st_ino]}
    oid = conn.execute(
        text("SELECT oid FROM pg_database WHERE datname = current_database()")
    ).scalar_one()
    system: str | None = None
    try:
        with conn.begin_nested():
            found = conn.execute(text("SELECT system_identifier FROM pg_control_system()"))
            system = str(found.scalar_one())
    except DBAPIError:  # not granted to this role: the oid alone then
        system = None
    return {"system": system, "database_oid": int(oid)}


def _lifelong_digest(values: Sequence[Any]) -> str:
    """A short digest of a row's lifelong values (numbers as floats: REAL may be int)."""
    normal = [
        float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in values
    ]
    return hashlib.sha256(json.dumps(normal, ensure_ascii=False).encode()).hexdigest()[:16]


def _identity_sample(conn: Connection) -> list[list[Any]]:
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


def _recognised(conn: Connection, sample: list[list[Any]]) -> bool:
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


def copied_table(name: str) -> Table:
    return next(table for table in copied_tables() if table.name == name)


def _data_version(conn: Connection) -> int | None:
    """SQLite's count of commits by other connections (None on PostgreSQL)."""
    if conn.dialect.name != "sqlite":
        return None
    return int(conn.exec_driver_sql("PRAGMA data_version").scalar_one())


# --------------------------------------------------------------------------------------
# The target: its revision, its data, the markers
# --------------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What the target needs before rows are copied."""

    create: bool  # empty (or missing): bring it to the source's revision first
    markers: dict[str, str]  # hermes_store.copy.* rows found
    holds_data: bool


def _holds_data(conn: Connection) -> bool:
    names = set(inspect(conn).get_table_names())
    return any(count_rows(conn, table) for table in copied_tables() if table.name in names)


def _markers(conn: Connection) -> dict[str, str]:
    if "state_meta" not in set(inspect(conn).get_table_names()):
        return {}
    rows = conn.execute(
        text("SELECT key, value FROM state_meta WHERE key LIKE :prefix"),
        {"prefix": MARKER_PREFIX + "%"},  # '_' matches any character: filtered below
    )
    return {str(k): str(v) for k, v in rows if str(k).startswith(MARKER_PREFIX)}


def _inspect_target(url: str, revision: tuple[str, ...]) -> _Plan:
    """Classify the target without writing to it; refuse what cannot receive the copy."""
    where = display_url(url)
    if not is_server(url):
        path = db_path(url)
        if path is None:
            raise CopyRefused("--to: an in-memory database cannot receive a copy")
        if path.exists() and path.is_dir():
            raise CopyRefused(f"--to {path} is a directory; name the store file")
        if not path.parent.exists():
            raise CopyRefused(f"--to {path}: directory {path.parent} does not exist; create it")
        state = migrate.inspect_file(path)
        if state.kind == "new":
            return _Plan(create=True, markers={}, holds_data=False)
        if state.kind == "legacy":
            raise CopyRefused(
                f"--to {where} is a Hermes store never upgraded by hermes-store (schema "
                f"{state.legacy_version}); nothing was changed. Copy into an empty file, or "
                "run `hermes-store upgrade` on it first"
            )
    engine = create_store_engine(url, create=False, wal=False)
    try:
        with engine.connect() as conn:
            if is_server(url) and server.foreign_tables(conn) and not revisions(conn):
                server.refuse_foreign_database(conn)
            found = revisions(conn)
            markers = _markers(conn)
            holds = _holds_data(conn)
    finally:
        engine.dispose()
    if not found:
        return _Plan(create=True, markers={}, holds_data=False)
    if found != revision:
        known = {rev.revision for rev in script_directory().walk_revisions()}
        if any(rev not in known for rev in found):
            raise SchemaTooNew(
                f"--to {where} is at revision {', '.join(found)}, newer than the source "
                f"({', '.join(revision)}) and unknown to this hermes-store; nothing was "
                "changed. Upgrade hermes-store, or copy into an empty database"
            )
        if holds or markers:
            raise CopyRefused(
                f"--to {where} is at revision {', '.join(found)}, the source at "
                f"{', '.join(revision)}; nothing was changed. Run `hermes-store upgrade --db "
                f"{where}` first"
            )
        return _Plan(create=True, markers={}, holds_data=False)
    return _Plan(create=False, markers=markers, holds_data=holds)


def _read_marker(markers: dict[str, str], key: str) -> dict[str, Any] | None:
    raw = markers.get(key)
    return None if raw is None else dict(json.loads(raw))


def _put(conn: Connection, key: str, value: dict[str, Any], previous: str | None) -> str:
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


# --------------------------------------------------------------------------------------
# Checks before anything is written
# --------------------------------------------------------------------------------------


def _check_source(conn: Connection, url: str, head: str) -> tuple[str, ...]:
    """The source's revision; refuses a store not at head, or one whose rows cannot be paged."""
    revision = revisions(conn)
    if revision != (head,):
        raise CopyRefused(
            f"--from {display_url(url)} is at revision {', '.join(revision) or '(none)'}, not "
            f"at this hermes-store's head ({head}); nothing was changed. Run `hermes-store "
            f"upgrade --db {display_url(url)}` first (back it up with --backup)"
        )
    names = set(inspect(conn).get_table_names())
    for table in copied_tables():
        if table.name not in names:
            raise CopyRefused(f"--from: table {table.name} is missing; run `hermes-store check`")
        columns = {column["name"] for column in inspect(conn).get_columns(table.name)}
        extra = columns - set(table.columns.keys())
        if extra:
            raise CopyRefused(
                f"--from: {table.name} has columns hermes-store does not know "
                f"({', '.join(sorted(extra))}); they would be lost. Nothing was changed"
            )
        null_key = or_(*(column.is_(None) for column in key_columns(table)))
        if conn.execute(select(func.count()).select_from(table).where(null_key)).scalar_one():
            raise CopyRefused(
                f"--from: {table.name} has rows with a NULL primary key, which no other "
                "database accepts; nothing was changed"
            )
    return revision


def _high_water(conn: Connection) -> int:
    """The highest message id the database ever handed out (its sequence, or max(id))."""
    top = int(conn.execute(text("SELECT coalesce(max(id), 0) FROM messages")).scalar_one())
    if conn.dialect.name == "postgresql":
        row = conn.execute(
            text(
                "SELECT pg_sequence_last_value(pg_get_serial_sequence('messages', 'id')::regclass)"
            )
        ).scalar()
        return max(top, int(row or 0))
    seq = conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = 'messages'")).scalar()
    return max(top, int(seq or 0))


def _raise_sequence(conn: Connection, value: int) -> None:
    """Make the target hand out message ids above ``value`` (never lower its sequence)."""
    if value <= 0:
        return
    if conn.dialect.name == "postgresql":
        conn.execute(
            text(
                "SELECT setval(pg_get_serial_sequence('messages', 'id'), :value) "
                "WHERE :value > coalesce(pg_sequence_last_value("
                "pg_get_serial_sequence('messages', 'id')::regclass), 0)"
            ),
            {"value": value},
        )
        return
    done = conn.execute(
        text("UPDATE sqlite_sequence SET seq = :value WHERE name = 'messages' AND seq < :value"),
        {"value": value},
    )
    if done.rowcount == 0:
        conn.execute(
            text(
                "INSERT INTO sqlite_sequence (name, seq) SELECT 'messages', :value "
                "WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'messages')"
            ),
            {"value": value},
        )


# --------------------------------------------------------------------------------------
# The copy
# --------------------------------------------------------------------------------------


def copy_store(
    source: str,
    target: str,
    *,
    append: bool = False,
    restart: bool = False,
    batch_rows: int = BATCH_ROWS,
    progress: Callable[[CopyProgress], None] | None = None,
    verify: bool = True,
) -> CopyResult:
    """Bring ``target`` (a URL or path) to what ``source`` holds, then verify both.

    A target holding an unfinished or finished copy of this source is brought up to date
    (only what differs is written); one holding other data is refused unless ``append``;
    one holding a copy of another store (or of another file at the same path) is refused
    unless ``restart``, which makes it a copy of this source. Raises :class:`CopyRefused`
    (or another StoreError) with one line that says what to do, with nothing changed by
    the refused step.
    """
    started = time.perf_counter()
    source_url, target_url = to_url(source), to_url(target)
    if same_store(source_url, target_url):
        raise CopyRefused(
            f"--from and --to name the same database ({display_url(source_url)}); nothing "
            "was changed"
        )
    reader_engine = open_source(source_url)
    try:
        with reader_engine.connect() as conn:
            conn = read_only(conn)
            with conn.begin():
                before = _data_version(conn)
                run = _Run(conn, source_url, target_url, batch_rows, progress)
                result = run.execute(append=append, restart=restart, verify=verify)
            if before is not None:
                result.source_changed = _data_version(conn) != before
    finally:
        reader_engine.dispose()
    result.seconds = time.perf_counter() - started
    return result


class _Run:
    """One run of the copy, reading the source through one snapshot (``src``)."""

    def __init__(
        self,
        src: Connection,
        source_url: str,
        target_url: str,
        batch_rows: int,
        progress: Callable[[CopyProgress], None] | None,
    ) -> None:
        self.src = src
        self.source_url = source_url
        self.target_url = target_url
        self.batch_rows = batch_rows
        self.progress = progress
        self.name = _source_name(source_url)
        self.tables = copied_tables()

    def execute(self, *, append: bool, restart: bool, verify: bool) -> CopyResult:
        revision = _check_source(self.src, self.source_url, head_revision())
        plan = _inspect_target(self.target_url, revision)
        marker = _read_marker(plan.markers, SOURCE_MARKER)
        state, resuming, complete = self._claim(plan, marker, append=append, restart=restart)
        append = bool(state["append"])
        diffs = self._compare(None if plan.create else self.target_url, append)
        if complete and not append:
            _refuse_written_target(self.target_url, marker, diffs, self.name)
        if plan.create:
            migrate.upgrade(self.target_url, revision=revision[0])
        nothing = complete and "sums" in (marker or {}) and all(diff.empty for diff in diffs)
        writer = _Writer(self, state, plan.markers.get(SOURCE_MARKER), diffs)
        writer.write(finish=not nothing)
        verification = Verification()
        if verify:
            verification = verify_target(
                self.src, self.target_url, append=append, progress=self.progress
            )
        return CopyResult(
            source=self.name,
            target=display_url(self.target_url),
            revision=revision,
            rows={diff.table.name: writer.upserted.get(diff.table.name, 0) for diff in diffs},
            resumed=resuming,
            created_target=plan.create,
            already_complete=nothing,
            seconds=0.0,
            verification=verification,
            changes=writer.changes(),
        )

    # ---- whose copy the target holds --------------------------------------------------

    def _claim(
        self, plan: _Plan, marker: dict[str, Any] | None, *, append: bool, restart: bool
    ) -> tuple[dict[str, Any], bool, bool]:
        """The marker state this run writes, whether it resumes an unfinished copy, and
        whether the copy was complete; refuses a target holding another store's copy."""
        fingerprint = _fingerprint(self.src, self.source_url)
        fresh = {
            "source": self.name,
            "fingerprint": fingerprint,
            "sample": _identity_sample(self.src),
            "state": "copying",
            "append": append,
        }
        target = display_url(self.target_url)
        if marker is None:
            if plan.holds_data and not append:
                raise CopyRefused(
                    f"--to {target} already holds sessions or other data not from a copy of "
                    "this source; nothing was changed. Copy into an empty database, or pass "
                    "--append to add these rows (colliding keys refused)"
                )
            return fresh, False, False
        fresh["append"] = append or bool(marker.get("append"))
        if restart:  # whatever the target holds, it becomes a copy of this source
            return fresh, False, False
        why = self._other_source(marker, fingerprint)
        unfinished = marker.get("state") == "copying"
        if why is None:
            return fresh, unfinished, not unfinished
        if append and not unfinished:  # a new copy added to this target
            return fresh, False, False
        command = f"hermes-store copy --from {self.name} --to {target} --restart"
        raise CopyRefused(
            f"--to {target} holds {'an unfinished' if unfinished else 'a'} copy of {why}; "
            f"nothing was changed. Run `{command}` to make it a copy of this source instead "
            "(the rows it does not hold are deleted)"
        )

    def _other_source(self, marker: dict[str, Any], fingerprint: dict[str, Any]) -> str | None:
        """Why the marker's source is not this one (None when it is)."""
        if marker.get("source") != self.name:
            return f"{marker.get('source')}, not of {self.name}"
        recorded = marker.get("fingerprint")
        if recorded is not None and recorded != fingerprint:
            what = "file" if "file" in recorded else "database (its system identifier or oid)"
            return (
                f"another {what} than the one now at {self.name} (the store there was "
                "replaced since)"
            )
        sample = marker.get("sample") or []
        if sample and not _recognised(self.src, sample):
            return (
                f"another store than the one now at {self.name}: it holds none of the "
                f"{len(sample)} rows the copy recorded to recognise its source"
            )
        return None

    # ---- comparing -----------------------------------------------------------------------

    def _compare(self, target_url: str | None, append: bool) -> list[TableDiff]:
        """Every table compared, every source row checked; refuses before any write."""
        checks = RowChecks(self.tables)
        engine = None if target_url is None else create_store_engine(target_url, create=False)
        try:
            dst_context = contextlib.nullcontext(None) if engine is None else read_snapshot(engine)
            with dst_context as dst:
                totals = {
                    t.name: count_rows(self.src, t) + (0 if dst is None else count_rows(dst, t))
                    for t in self.tables
                }
                total, done, diffs = sum(totals.values()), 0, []
                for table in self.tables:

                    def tick(rows: int, name: str = table.name, base: int = done) -> None:
                        whole = (base + rows, total, 0, "comparing")
                        self._report(CopyProgress(name, rows, totals[name], *whole))

                    tick(0)
                    diffs.append(
                        compare_table(
                            self.src, dst, table, append=append, checks=checks, progress=tick
                        )
                    )
                    tick(totals[table.name])
                    done += totals[table.name]
        finally:
            if engine is not None:
                engine.dispose()
        refusal = checks.refusal()
        if refusal is not None:
            raise refusal
        return diffs

    def _report(self, state: CopyProgress) -> None:
        if self.progress is not None:
            self.progress(state)


def _refuse_written_target(
    url: str, marker: dict[str, Any] | None, diffs: list[TableDiff], name: str
) -> None:
    """Refuse to bring up to date a finished copy the target's users have written to since:
    the copy would overwrite or delete their rows."""
    left = (marker or {}).get("sums") or {}
    changed = [
        d.table.name
        for d in diffs
        if d.table.name in left and left[d.table.name] != d.target_checksum
    ]
    if changed:
        target = display_url(url)
        raise CopyRefused(
            f"--to {target} was written to since the copy from {name} finished ("
            f"{', '.join(changed)} no longer hold what the copy left); nothing was changed: a "
            "copy never overwrites a database in use. If those writes may go, run "
            f"`hermes-store copy --from {name} --to {target} --restart`"
        )


class _Writer:
    """Writes what the comparison found, batch by batch, each batch with the marker."""

    def __init__(
        self, run: _Run, state: dict[str, Any], previous: str | None, diffs: list[TableDiff]
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
        engine = create_store_engine(self.run.target_url, create=False)
        if not is_server(self.run.target_url):
            engine = engine.execution_options(sqlite_begin="IMMEDIATE").engine
        try:
            with engine.connect() as dst:
                self.dst = dst
                if finish:
                    self._write_all()
                with dst.begin():  # new messages get ids past every copied one
                    _raise_sequence(dst, _high_water(self.run.src))
                    if finish:
                        self._finish()
                if finish and dst.dialect.name == "postgresql" and self._many():
                    # The planner's statistics of the new rows, before the agent's first
                    # query (autovacuum would gather them only later).
                    with dst.begin():
                        dst.execute(text("ANALYZE"))
        finally:
            self.dst = None
            engine.dispose()

    def _many(self) -> bool:
        rows = sum(diff.source_rows for diff in self.diffs)
        return self.rows * 10 > rows

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
                self.previous = _put(self.dst, SOURCE_MARKER, state, self.previous)
        except DBAPIError as exc:
            raise _batch_failed(table, keys, exc) from None
        self.rows += len(keys)
        done = self.table_done[table.name] = self.table_done.get(table.name, 0) + len(keys)
        mine = (table.name, done, max(done, self.table_totals.get(table.name, 0)))
        self.run._report(CopyProgress(*mine, self.rows, self.total, self.batches, step))

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
                raise _batch_failed(table, chunk, exc) from None

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
            _insert(self.dst, table, new)
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
        done = [key for key in _markers(self.dst) if key != SOURCE_MARKER]
        if done:
            self.dst.execute(
                text("DELETE FROM state_meta WHERE key IN :keys").bindparams(
                    bindparam("keys", expanding=True)
                ),
                {"keys": done},
            )
        state = {**self.state, "state": "complete", "batches": self.batches}
        state["sample"] = _identity_sample(self.run.src)
        # What the target holds now (the source's rows as this run read them): a later run
        # refuses to overwrite a target written to since.
        state["sums"] = {diff.table.name: diff.source_checksum for diff in self.diffs}
        self.previous = _put(self.dst, SOURCE_MARKER, state, self.previous)


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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


def _insert(target: Connection, table: Table, rows: Sequence[Row[Any]]) -> None:
    """Insert ``rows`` as they are (ids kept)."""
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


def _batch_failed(table: Table, keys: Sequence[Sequence[Any]], exc: DBAPIError) -> CopyRefused:
    """One line for a batch the target refused: the table, the keys, the constraint or
    the kind of error; never the driver's text, which may quote a value."""
    original = exc.orig
    diag = getattr(original, "diag", None)
    sqlstate = getattr(original, "sqlstate", None)
    if diag is not None:
        named = diag.constraint_name or diag.column_name or diag.datatype_name
        reason = f"PostgreSQL error {sqlstate}" + (f" on {named}" if named else "")
        if isinstance(sqlstate, str) and sqlstate.startswith("23") and diag.message_primary:
            reason = diag.message_primary  # integrity errors name the constraint, no value
    else:
        first = str(original).strip().splitlines()[0] if str(original).strip() else ""
        reason = first if "constraint failed" in first else type(original).__name__
    span = shown_key(table, keys[0]) if keys else table.name
    if len(keys) > 1:
        span += f" to {shown_key(table, keys[-1])}"
    return CopyRefused(
        f"{table.name}: the target refused the batch of {span} ({reason}); that batch was "
        "rolled back, the batches before it are kept. Fix the cause, then run the same "
        "command again"
    )

"""Copy a whole store to another database (SQLite <-> PostgreSQL), resumably, and verify it.

`copy_store(source, target)` streams every table of the models, in foreign-key order, in
batches read by primary key (keyset pagination: ``WHERE key > :last ORDER BY key LIMIT n``),
keeping every id. The source is only ever read: a SQLite source is opened through a
``file:...?mode=ro`` URI, a PostgreSQL one in read-only transactions.

Resuming. Each batch is committed on the target together with its progress marker, the
``state_meta`` row ``hermes_store.copy.<table>`` holding the last copied key (and
``hermes_store.copy.source`` names the source). A run killed at any point (kill -9,
Ctrl-C, a lost server) leaves the target at the end of a committed batch with its marker,
and the next run continues after that key: no row twice, none left out. A marker written
by a copy from another source is refused.

Parents first. On both databases `sessions.parent_session_id` is a foreign key that is
checked at each statement (not DEFERRABLE, and `session_replication_role` would need a
superuser), so sessions are copied in the order (depth in the parent tree, id): a parent
is always in an earlier batch than its children, whatever the id order.

What the target keeps of its own. `alembic_version` and `schema_version` are written by
the target's own upgrade to the source's revision, not copied. The `state_meta` keys that
describe a database's own search index (`hermes_store.fts_layout`: 'external' on SQLite,
'expression' on PostgreSQL; the deferred-backfill markers; `fts_optimize_available`) keep
the value the target's upgrade wrote; every other key is copied.

Verification (`verify_copy`) reads both sides again: row counts and a checksum per table
(``hermes_store.tablesum``: computed in Python over the values the drivers return, so no
database hash function is trusted), and the hit sets of sample searches on both sides.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
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
    tuple_,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from hermes_store import fts, migrate, server
from hermes_store.engine import (
    backend_name,
    connect_read_only,
    create_store_engine,
    db_path,
    display_url,
    is_server,
    to_url,
)
from hermes_store.errors import SchemaTooNew, StoreError, StoreNotFound
from hermes_store.models import Base
from hermes_store.revisions import head_revision, script_directory
from hermes_store.tablesum import row_digest, table_sum

log = logging.getLogger(__name__)

__all__ = [
    "BATCH_ROWS",
    "SAMPLE_QUERIES",
    "CopyProgress",
    "CopyRefused",
    "CopyResult",
    "TableCheck",
    "Verification",
    "copy_store",
    "verify_copy",
]

#: Rows per committed batch.
BATCH_ROWS = 2000
#: state_meta keys of the copy's own bookkeeping.
MARKER_PREFIX = "hermes_store.copy."
SOURCE_MARKER = MARKER_PREFIX + "source"
#: state_meta keys that describe one database's own search index: each side keeps the
#: value its own upgrade (or backfill) wrote; they are shown side by side, never copied.
OWN_KEYS = frozenset({fts.LAYOUT_MARKER, "fts_optimize_available", fts.APPLICATION_MARKER})
OWN_PREFIXES = ("hermes_store.", "messages_fts")
#: Tables the target's own upgrade fills (no primary key to page by): compared, not copied.
REVISION_TABLES = frozenset({"schema_version"})
#: Searches run on both sides by the verification (from tests/parity_queries.py): the
#: word index (phrase, NEAR, NOT, a joined term), the trigram index, the LIKE route of a
#: short CJK term, filters and inactive rows. Chosen for hit sets of tens to a few
#: thousand at 50k messages: each search also builds every hit's snippet and context, and
#: a query with 10k hits took 10 to 50 s on PostgreSQL there.
SAMPLE_QUERIES: tuple[dict[str, Any], ...] = (
    {"query": '"import os"'},
    {"query": '"no such file or directory"'},
    {"query": "NEAR(def return)"},
    {"query": "import NOT os"},
    {"query": "self.assertEqual"},
    {"query": "数据库"},
    {"query": "数据库", "source_filter": ["telegram"]},
    {"query": "数据库", "include_inactive": True},
    {"query": "的", "exclude_sources": ["cli"], "role_filter": ["user"]},
)
#: Hits per sample search: large enough to be the whole hit set of these queries.
SEARCH_LIMIT = 100_000


class CopyRefused(StoreError):
    """The copy was refused; the target was left as it was (or as its last committed batch)."""


@dataclass(frozen=True)
class CopyProgress:
    """Where a copy is, reported after each committed batch."""

    table: str
    table_rows: int
    table_total: int
    rows: int
    total: int
    batches: int


@dataclass
class TableCheck:
    """One table on both sides: rows and checksum."""

    table: str
    source_rows: int
    target_rows: int
    source_sum: str
    target_sum: str

    @property
    def equal(self) -> bool:
        return self.source_rows == self.target_rows and self.source_sum == self.target_sum


@dataclass
class SearchCheck:
    """One sample search on both sides."""

    query: dict[str, Any]
    source_hits: int
    target_hits: int
    equal: bool


@dataclass
class Verification:
    """Everything compared after a copy; ``ok`` is False on any difference."""

    tables: list[TableCheck] = field(default_factory=list)
    revisions: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    markers: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    searches: list[SearchCheck] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            all(check.equal for check in self.tables)
            and self.revisions[0] == self.revisions[1]
            and all(check.equal for check in self.searches)
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tables": [
                {
                    "table": c.table,
                    "source_rows": c.source_rows,
                    "target_rows": c.target_rows,
                    "source_checksum": c.source_sum,
                    "target_checksum": c.target_sum,
                    "equal": c.equal,
                }
                for c in self.tables
            ],
            "revision": {"source": list(self.revisions[0]), "target": list(self.revisions[1])},
            "markers": {k: {"source": s, "target": t} for k, (s, t) in self.markers.items()},
            "searches": [
                {
                    "query": s.query,
                    "source_hits": s.source_hits,
                    "target_hits": s.target_hits,
                    "equal": s.equal,
                }
                for s in self.searches
            ],
            "not_checked": self.not_checked,
            "seconds": round(self.seconds, 3),
        }


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "revision": list(self.revision),
            "rows_copied": self.rows,
            "resumed": self.resumed,
            "created_target": self.created_target,
            "already_complete": self.already_complete,
            "seconds": round(self.seconds, 3),
            "verification": self.verification.as_dict(),
        }


# --------------------------------------------------------------------------------------
# Opening both sides
# --------------------------------------------------------------------------------------


def _read_only_sqlite(path: Path) -> Engine:
    """An engine that can only read ``path`` (``mode=ro``): SQLite refuses every write."""

    def connect() -> sqlite3.Connection:
        conn = connect_read_only(path, timeout=30, check_same_thread=False)
        conn.isolation_level = None  # SQLAlchemy's BEGIN below starts the read transaction
        return conn

    engine = create_engine("sqlite://", creator=connect, poolclass=NullPool, hide_parameters=True)

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def open_source(source: str) -> Engine:
    """A read-only engine on the source store (a path or URL); refuses one that is missing."""
    url = to_url(source)
    if is_server(url):
        return create_store_engine(url, create=False)  # read-only: see _snapshot
    path = db_path(url)
    if path is None or not path.exists() or path.stat().st_size == 0:
        raise StoreNotFound(f"--from {path or url}: no such store; nothing was changed")
    migrate.inspect_file(path)  # read-only: refuses what is not a SQLite Hermes store
    return _read_only_sqlite(path)


@contextlib.contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """One read transaction on the source: every batch of a run reads the same snapshot."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn = conn.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
        with conn.begin():
            yield conn


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
# Tables, keys and values
# --------------------------------------------------------------------------------------


def copied_tables() -> list[Table]:
    """The models' tables in foreign-key order, without those the revisions fill."""
    return [t for t in Base.metadata.sorted_tables if t.name not in REVISION_TABLES]


def _key(table: Table) -> list[Column[Any]]:
    return list(table.primary_key.columns)


def is_own_key(key: str) -> bool:
    """A state_meta key that belongs to one database's own index or to this copy."""
    return key in OWN_KEYS or key.startswith(OWN_PREFIXES)


def _own_filter(table: Table) -> Any:
    """WHERE clause that leaves out the state_meta keys each side keeps of its own."""
    if table.name != "state_meta":
        return None
    key = table.c.key
    conditions: list[ColumnElement[bool]] = [key.notin_(sorted(OWN_KEYS))]
    conditions += [~key.startswith(prefix, autoescape=True) for prefix in OWN_PREFIXES]
    return and_(*conditions)


# --------------------------------------------------------------------------------------
# The order rows are copied in
# --------------------------------------------------------------------------------------


def _session_order(source: Connection, table: Table) -> list[tuple[int, str]]:
    """Every session as (depth in the parent tree, id), sorted: parents before children."""
    rows = source.execute(select(table.c.id, table.c.parent_session_id)).all()
    parents = {str(row[0]): row[1] for row in rows if row[0] is not None}
    depth: dict[str, int] = {}
    for start in parents:
        chain: list[str] = []
        node: str | None = start
        while node is not None and node not in depth:
            if node in chain:
                raise CopyRefused(
                    f"sessions: the parent_session_id chain of session {start!r} is a cycle; "
                    "nothing was changed. Fix the source (`hermes-store check`)"
                )
            if node not in parents:
                raise CopyRefused(
                    f"sessions: session {chain[-1]!r} names parent {node!r}, which is not in "
                    "the source; the target's foreign key would refuse it. Nothing was changed"
                )
            chain.append(node)
            node = parents[node]
        base = -1 if node is None else depth[node]
        for offset, item in enumerate(reversed(chain), start=1):
            depth[item] = base + offset
    return sorted((level, ident) for ident, level in depth.items())


class _Reader:
    """Reads one table of the source in key order, a batch at a time, after a given key."""

    def __init__(self, source: Connection, table: Table) -> None:
        self.source = source
        self.table = table
        self.key = _key(table)
        self.where = _own_filter(table)
        self.order: list[tuple[int, str]] | None = None
        if table.name == "sessions":
            self.order = _session_order(source, table)

    def total(self) -> int:
        query = select(func.count()).select_from(self.table)
        if self.where is not None:
            query = query.where(self.where)
        return int(self.source.execute(query).scalar_one())

    def remaining(self, after: list[Any] | None) -> int:
        if self.order is not None:
            return len(self.order) - self._position(after)
        query = select(func.count()).select_from(self.table)
        condition = self._after(after)
        for clause in (self.where, condition):
            if clause is not None:
                query = query.where(clause)
        return int(self.source.execute(query).scalar_one())

    def _position(self, after: list[Any] | None) -> int:
        import bisect

        assert self.order is not None
        if after is None:
            return 0
        return bisect.bisect_right(self.order, (int(after[0]), str(after[1])))

    def _after(self, after: list[Any] | None) -> Any:
        if after is None:
            return None
        if len(self.key) == 1:
            return self.key[0] > after[0]
        return tuple_(*self.key) > tuple_(*after)

    def batches(self, after: list[Any] | None, size: int) -> Iterator[tuple[list[Any], list[Any]]]:
        """(rows, key of the last row) for each batch after ``after``, in key order."""
        if self.order is not None:
            start = self._position(after)
            for begin in range(start, len(self.order), size):
                chunk = self.order[begin : begin + size]
                ids = [ident for _, ident in chunk]
                found = {
                    row[0]: row
                    for row in self.source.execute(
                        select(*self.table.columns).where(self.table.c.id.in_(ids))
                    )
                }
                rows = [found[ident] for ident in ids if ident in found]
                yield rows, list(chunk[-1])
            return
        while True:
            query = select(*self.table.columns).order_by(*self.key).limit(size)
            for clause in (self.where, self._after(after)):
                if clause is not None:
                    query = query.where(clause)
            rows = list(self.source.execute(query))
            if not rows:
                return
            last = rows[-1]
            after = [last._mapping[column.name] for column in self.key]
            yield rows, after


# --------------------------------------------------------------------------------------
# The target: its revision, its data, the markers
# --------------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What the target needs before rows are copied."""

    create: bool  # empty (or missing): bring it to the source's revision first
    markers: dict[str, str]  # hermes_store.copy.* rows found
    holds_data: bool


def _revisions(conn: Connection) -> tuple[str, ...]:
    names = set(inspect(conn).get_table_names())
    if server.ALEMBIC_TABLE not in names:
        return ()
    rows = conn.execute(text(f"SELECT version_num FROM {server.ALEMBIC_TABLE}"))
    return tuple(sorted(str(row[0]) for row in rows))


def _holds_data(conn: Connection) -> bool:
    names = set(inspect(conn).get_table_names())
    for table in copied_tables():
        if table.name not in names:
            continue
        query = select(func.count()).select_from(table)
        where = _own_filter(table)
        if where is not None:
            query = query.where(where)
        if conn.execute(query.limit(1)).scalar_one():
            return True
    return False


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
            if is_server(url) and server.foreign_tables(conn) and not _revisions(conn):
                server.refuse_foreign_database(conn)
            found = _revisions(conn)
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


def _source_identity(url: str) -> str:
    """How the copy marker names its source: a file by its name with every link resolved
    (the URL keeps a linked directory as given), so a resumed copy may name it either way."""
    path = db_path(url)
    return display_url(url if path is None else to_url(os.path.realpath(path)))


def _read_marker(markers: dict[str, str], key: str) -> dict[str, Any] | None:
    raw = markers.get(key)
    return None if raw is None else dict(json.loads(raw))


def _put(conn: Connection, key: str, value: dict[str, Any], previous: str | None) -> str:
    """Write a marker, only if it still holds ``previous`` (a second copy run fails)."""
    encoded = json.dumps(value, sort_keys=True, ensure_ascii=False)
    if previous is None:
        conn.execute(
            text("INSERT INTO state_meta (key, value) VALUES (:key, :value)"),
            {"key": key, "value": encoded},
        )
        return encoded
    done = conn.execute(
        text("UPDATE state_meta SET value = :value WHERE key = :key AND value = :previous"),
        {"key": key, "value": encoded, "previous": previous},
    )
    if done.rowcount != 1:
        raise CopyRefused(
            f"the progress marker {key} changed under this copy: another `hermes-store copy` "
            "writes to the same target. This run stopped; its last batch was rolled back"
        )
    return encoded


# --------------------------------------------------------------------------------------
# Checks before anything is written
# --------------------------------------------------------------------------------------


def _check_source(conn: Connection, url: str, head: str) -> tuple[str, ...]:
    """The source's revision; refuses a store not at head, or one whose rows cannot be paged."""
    revision = _revisions(conn)
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
        null_key = or_(*(column.is_(None) for column in _key(table)))
        if conn.execute(select(func.count()).select_from(table).where(null_key)).scalar_one():
            raise CopyRefused(
                f"--from: {table.name} has rows with a NULL primary key, which no other "
                "database accepts; nothing was changed"
            )
    return revision


def _check_collisions(source: Connection, target: Connection, table: Table, after: Any) -> None:
    """--append: refuse keys of the source already in the target with another row."""
    reader = _Reader(source, table)
    key = _key(table)
    for rows, _ in reader.batches(after, BATCH_ROWS):
        there = _existing(target, table, rows)
        for row in rows:
            ident = tuple(row._mapping[c.name] for c in key)
            if ident in there and there[ident] != row_digest(table, row):
                shown = ident[0] if len(ident) == 1 else ident
                raise CopyRefused(
                    f"--append: {table.name} {shown!r} is already in the target with other "
                    "values; a copy never overwrites. Nothing was changed"
                )


def _existing(target: Connection, table: Table, rows: Sequence[Any]) -> dict[tuple[Any, ...], str]:
    """Digest of each target row whose key is among ``rows``' keys."""
    key = _key(table)
    idents = [tuple(row._mapping[c.name] for c in key) for row in rows]
    if not idents:
        return {}
    if len(key) == 1:
        condition = key[0].in_([ident[0] for ident in idents])
    else:
        condition = tuple_(*key).in_(idents)
    return {
        tuple(row._mapping[c.name] for c in key): row_digest(table, row)
        for row in target.execute(select(*table.columns).where(condition))
    }


# --------------------------------------------------------------------------------------
# The copy
# --------------------------------------------------------------------------------------


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


def _insert(target: Connection, table: Table, rows: Sequence[Any], skip: set[Any]) -> int:
    """Insert ``rows`` as they are (ids kept); rows whose key is in ``skip`` are left out."""
    key = _key(table)
    values = [
        dict(row._mapping)
        for row in rows
        if not skip or tuple(row._mapping[c.name] for c in key) not in skip
    ]
    if not values:
        return 0
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
    return len(values)


def _batch_failed(table: Table, exc: DBAPIError) -> CopyRefused:
    first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc).__name__
    return CopyRefused(
        f"{table.name}: the target refused a batch ({first}); that batch was rolled back, the "
        "batches before it are kept, and the next run resumes from there"
    )


def copy_store(
    source: str,
    target: str,
    *,
    append: bool = False,
    batch_rows: int = BATCH_ROWS,
    progress: Callable[[CopyProgress], None] | None = None,
    verify: bool = True,
) -> CopyResult:
    """Copy every table of ``source`` into ``target`` (URLs or paths), then verify both.

    Resumes an unfinished copy of the same source; refuses a target holding other data
    unless ``append``. Raises :class:`CopyRefused` (or another StoreError) with one line
    that says what to do, with nothing changed by the refused step.
    """
    started = time.perf_counter()
    source_url, target_url = to_url(source), to_url(target)
    if same_store(source_url, target_url):
        raise CopyRefused(
            f"--from and --to name the same database ({display_url(source_url)}); nothing "
            "was changed"
        )
    head = head_revision()
    reader_engine = open_source(source_url)
    try:
        with _snapshot(reader_engine) as src:
            revision = _check_source(src, source_url, head)
        plan = _inspect_target(target_url, revision)
        identity = _source_identity(source_url)
        marker = _read_marker(plan.markers, SOURCE_MARKER)
        resuming = marker is not None and marker.get("state") == "copying"
        if marker is not None and marker.get("source") != identity and resuming:
            raise CopyRefused(
                f"--to {display_url(target_url)} holds an unfinished copy from "
                f"{marker.get('source')}, not from {identity}; nothing was changed. Finish it "
                "with that --from, or copy into an empty database"
            )
        complete = (
            marker is not None
            and marker.get("state") == "complete"
            and marker.get("source") == identity
            and not append
        )
        if plan.holds_data and not resuming and not complete and not append:
            raise CopyRefused(
                f"--to {display_url(target_url)} already holds sessions or other data not "
                "from an unfinished copy of this source; nothing was changed. Copy into an "
                "empty database, or pass --append to add these rows (colliding keys refused)"
            )
        # A copy begun (or finished) with --append stays one: resuming or verifying it
        # compares the source's rows only, the target's own rows apart.
        ours = marker is not None and marker.get("source") == identity
        append = append or bool(ours and marker and (resuming or complete) and marker.get("append"))
        created = plan.create
        if plan.create:
            migrate.upgrade(target_url, revision=revision[0])
        copied: dict[str, int] = {}
        if not complete:
            copied = _copy_tables(
                reader_engine,
                target_url,
                identity,
                append=append,
                batch_rows=batch_rows,
                progress=progress,
            )
        verification = (
            verify_copy(reader_engine, target_url, append=append) if verify else Verification()
        )
    finally:
        reader_engine.dispose()
    return CopyResult(
        source=identity,
        target=display_url(target_url),
        revision=revision,
        rows=copied,
        resumed=resuming,
        created_target=created,
        already_complete=complete,
        seconds=time.perf_counter() - started,
        verification=verification,
    )


def _copy_tables(
    reader_engine: Engine,
    target_url: str,
    identity: str,
    *,
    append: bool,
    batch_rows: int,
    progress: Callable[[CopyProgress], None] | None,
) -> dict[str, int]:
    """Every table, batch by batch, each batch committed with its marker."""
    engine = create_store_engine(target_url, create=False)
    if not is_server(target_url):
        engine = engine.execution_options(sqlite_begin="IMMEDIATE").engine
    copied: dict[str, int] = {}
    try:
        with _snapshot(reader_engine) as src, engine.connect() as dst:
            with dst.begin():
                markers = _markers(dst)
            tables = copied_tables()
            if append:  # before anything is written: a colliding key refuses the whole copy
                with dst.begin():
                    for table in tables:
                        info = _read_marker(markers, MARKER_PREFIX + table.name)
                        _check_collisions(src, dst, table, info and info.get("after"))
            with dst.begin():
                source_marker = markers.get(SOURCE_MARKER)
                state = _read_marker(markers, SOURCE_MARKER)
                if state is None or state.get("state") != "copying":
                    state = {"source": identity, "state": "copying", "append": append}
                    source_marker = _write_source(dst, state, source_marker)
            readers = {table.name: _Reader(src, table) for table in tables}
            totals = {name: reader.total() for name, reader in readers.items()}
            done_before = {}
            for table in tables:
                info = _read_marker(markers, MARKER_PREFIX + table.name)
                after = None if info is None else info.get("after")
                done_before[table.name] = totals[table.name] - readers[table.name].remaining(after)
            total = sum(totals.values())
            rows = sum(done_before.values())
            batches = 0
            for table in tables:
                key = MARKER_PREFIX + table.name
                previous = markers.get(key)
                info = _read_marker(markers, key)
                after = None if info is None else info.get("after")
                table_rows = done_before[table.name]
                copied[table.name] = 0
                for chunk, last in readers[table.name].batches(after, batch_rows):
                    try:
                        with dst.begin():
                            skip: set[Any] = set()
                            if append:
                                skip = set(_existing(dst, table, chunk))
                            written = _insert(dst, table, chunk, skip)
                            previous = _put(dst, key, {"after": last}, previous)
                    except DBAPIError as exc:
                        raise _batch_failed(table, exc) from exc
                    copied[table.name] += written
                    table_rows += len(chunk)
                    rows += len(chunk)
                    batches += 1
                    if progress is not None:
                        progress(
                            CopyProgress(
                                table.name, table_rows, totals[table.name], rows, total, batches
                            )
                        )
            with dst.begin():
                _raise_sequence(dst, _high_water(src))
                done = [key for key in _markers(dst) if key != SOURCE_MARKER]
                if done:
                    dst.execute(
                        text("DELETE FROM state_meta WHERE key IN :keys").bindparams(
                            bindparam("keys", expanding=True)
                        ),
                        {"keys": done},
                    )
                _write_source(dst, {**state, "state": "complete"}, source_marker)
            if dst.dialect.name == "postgresql":
                # The planner's statistics of the new rows, before the agent's first query
                # (autovacuum would gather them only later).
                with dst.begin():
                    dst.execute(text("ANALYZE"))
    finally:
        engine.dispose()
    return copied


def _write_source(conn: Connection, state: dict[str, Any], previous: str | None) -> str:
    """The source marker: which source this target receives, and whether it is done."""
    if previous is not None:
        conn.execute(text("DELETE FROM state_meta WHERE key = :key"), {"key": SOURCE_MARKER})
    return _put(conn, SOURCE_MARKER, state, None)


# --------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------


def _state_meta_markers(conn: Connection) -> dict[str, str | None]:
    rows = conn.execute(text("SELECT key, value FROM state_meta")).all()
    return {str(k): v for k, v in rows if is_own_key(str(k)) and not k.startswith(MARKER_PREFIX)}


def _search_hits(conn: Connection, query: dict[str, Any]) -> set[int]:
    from hermes_store.search import search_messages

    return {hit["id"] for hit in search_messages(conn, limit=SEARCH_LIMIT, **query)}


def _search_available(engine: Engine) -> str | None:
    """None when ``search_messages`` answers on this database, else why not.

    The search of PostgreSQL stores is being written (branch search-pg); until it lands,
    the sample searches are reported as not checked rather than as a difference.
    """
    try:
        with _snapshot(engine) as conn:
            from hermes_store.search import search_messages

            search_messages(conn, "error", limit=1)
    except Exception as exc:  # any failure means: not available on this database
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        name = "PostgreSQL" if engine.dialect.name == "postgresql" else engine.dialect.name
        return f"{name} search not available ({first[:100]})"
    return None


def _compare_searches(
    source: Engine, target: Engine, append: bool
) -> tuple[list[SearchCheck], list[str]]:
    """Each sample search on both sides (each in a read transaction of its own)."""
    checks: list[SearchCheck] = []
    failed: list[str] = []
    for query in SAMPLE_QUERIES:
        try:
            with _snapshot(source) as conn:
                hits = _search_hits(conn, query)
            with _snapshot(target) as conn:
                other = _search_hits(conn, query)
        except Exception as exc:  # a search that fails on one side is not checked
            failed.append(f"search {query}: {type(exc).__name__}")
            continue
        # --append: the target's own rows may add hits; the source's must all be there.
        equal = hits <= other if append else hits == other
        checks.append(SearchCheck(query, len(hits), len(other), equal))
    return checks, failed


def verify_copy(source: Engine | str, target: str, *, append: bool = False) -> Verification:
    """Compare the target with the source: revision, rows and checksum of every table,
    the search markers side by side, and the hit sets of :data:`SAMPLE_QUERIES`.

    With ``append`` only the target rows whose keys are in the source are compared.
    """
    started = time.perf_counter()
    own_engine = isinstance(source, str)
    reader = open_source(to_url(source)) if isinstance(source, str) else source
    target_url = to_url(target)
    dst_engine = create_store_engine(target_url, create=False, wal=False)
    result = Verification()
    try:
        why_not = [w for w in (_search_available(reader), _search_available(dst_engine)) if w]
        with _snapshot(reader) as src, _snapshot(dst_engine) as dst:
            result.revisions = (_revisions(src), _revisions(dst))
            for table in Base.metadata.sorted_tables:
                where = _own_filter(table)
                a = table_sum(src, table, where)
                if append and table.name not in REVISION_TABLES:
                    # Only the target's rows whose keys the source has: the rest are its own.
                    keys = select(*_key(table))
                    keys = keys if where is None else keys.where(where)
                    b = table_sum(dst, table, where, keys=(tuple(r) for r in src.execute(keys)))
                else:
                    b = table_sum(dst, table, where)
                result.tables.append(
                    TableCheck(table.name, a.rows, b.rows, a.hexdigest(), b.hexdigest())
                )
            mine, theirs = _state_meta_markers(src), _state_meta_markers(dst)
            result.markers = {k: (mine.get(k), theirs.get(k)) for k in sorted({*mine, *theirs})}
            if why_not:
                result.not_checked.append(f"sample searches: {'; '.join(why_not)}")
        if not why_not:
            result.searches, failed = _compare_searches(reader, dst_engine, append)
            result.not_checked += failed
    finally:
        dst_engine.dispose()
        if own_engine:
            reader.dispose()
    result.seconds = time.perf_counter() - started
    return result

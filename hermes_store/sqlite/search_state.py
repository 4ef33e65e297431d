"""What a SQLite search knows about its database, and where its statements run.

Kept with the DBAPI connection and checked once per schema change of its database (the
schema cookie), so a normal search pays one PRAGMA: which tables hold the indexes, whether
their search mechanism can be trusted. The backfill markers are re-read when the data may
have changed (hermes_store.sqlite.pending.pending_ranges). Learning it needs a SQLAlchemy
Connection (:func:`learn_state`); everything else a search runs, a :class:`Runner` runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from sqlalchemy import String, column, select, table
from sqlalchemy.engine import Connection

from hermes_store.prepared import Driver
from hermes_store.search.query import TRIGRAM_INDEX, WORD_INDEX
from hermes_store.sqlite import fts

_sqlite_master = table("sqlite_master", column("type", String), column("name", String))
_STATE = "hermes_store.search.state"


class Runner(Protocol):
    """Runs a search's statements: on a SQLAlchemy Connection, or on the driver."""

    #: The cache of the pooled connection (where the State is kept).
    info: dict[Any, Any]
    #: The DBAPI connection (Python functions, the backfill markers, the text factory).
    driver: sqlite3.Connection

    def rows(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Sequence[Any]]: ...


class OnConnection:
    """Statements through a SQLAlchemy Connection (its events and logging see them)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.info = conn.info
        self.driver = cast(sqlite3.Connection, conn.connection.driver_connection)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Sequence[Any]]:
        return self.conn.exec_driver_sql(sql, tuple(params)).fetchall()


class OnDriver:
    """Statements on the pooled driver connection (hermes_store.prepared): a SQLAlchemy
    Connection costs as much as the SQL of a cheap query."""

    def __init__(self, db: Driver) -> None:
        self.db = db
        self.info = db.info
        self.driver = db.connection

    def rows(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Sequence[Any]]:
        return self.db.run(sql, params).fetchall()


@dataclass
class State:
    """What search knows about one connection's database, for one schema cookie."""

    cookie: int
    #: Each FTS index present -> the table that holds it (index_tables).
    tables: dict[str, str]
    #: Whether `state_meta` exists (where a deferred backfill keeps its markers).
    meta: bool
    #: Index -> why its search mechanism cannot be trusted; {} when it can.
    damaged: dict[str, str]
    #: The store is in the Hermes application's own layout (not searched here).
    application: bool
    #: pending_ranges' last reading, and the (total_changes, data_version) it was made at.
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)
    markers_read_at: tuple[int, ...] | None = None


def index_tables(conn: Connection) -> tuple[dict[str, str], bool]:
    """Each FTS index this database has -> the table that holds it, and whether `state_meta`
    exists. The one place search learns its table names: every statement is built from
    them, once per schema change."""
    staged = {index: fts.staged_name(index) for index in (WORD_INDEX, TRIGRAM_INDEX)}
    statement = select(_sqlite_master.c.name).where(
        _sqlite_master.c.type == "table",
        _sqlite_master.c.name.in_([WORD_INDEX, TRIGRAM_INDEX, "state_meta", *staged.values()]),
    )
    present = set(conn.execute(statement).scalars())
    # An index rebuilt beside its legacy table (`messages_fts_next`) is read from the new
    # table: the legacy one keeps serving the application meanwhile, but it is the one that
    # drifted; the new one plus its pending rows is exact. An index rebuilt beside itself to
    # compact it is complete: it serves until the swap.
    rebuilt = {name for name in staged.values() if name in present}
    if rebuilt and "state_meta" in present:
        rebuilt -= fts.compaction_staged(conn, rebuilt)
    tables = {
        index: staged[index] if staged[index] in rebuilt else index
        for index in (WORD_INDEX, TRIGRAM_INDEX)
        if index in present or staged[index] in present
    }
    return tables, "state_meta" in present


def _current(on: Runner) -> tuple[int, State | None]:
    """The schema cookie, and this connection's State if it was made for that cookie."""
    cookie = int(on.rows("PRAGMA schema_version")[0][0])
    state: State | None = on.info.get(_STATE)
    return cookie, state if state is not None and state.cookie == cookie else None


def known_state(on: Runner) -> State | None:
    """This connection's State if it is still current (the schema cookie unchanged); None
    when it must be learnt again (:func:`learn_state`, on a Connection)."""
    return _current(on)[1]


def learn_state(conn: Connection) -> State:
    """This connection's State, made again when the schema cookie has changed."""
    cookie, state = _current(OnConnection(conn))
    if state is None:
        tables, meta = index_tables(conn)
        application = fts.is_application_layout(conn)
        damaged = {} if application else fts.check_mechanism(conn, probe_trigram=False).damaged()
        state = State(cookie, tables, meta, damaged, application)
        conn.info[_STATE] = state
    return state


def accept_search_objects(conn: Connection) -> None:
    """Use this connection's indexes as they are, until the schema next changes.

    For deliberate variants of the search objects (the benchmarks' comparison-only
    layouts): search no longer compares them with this package's definition, so it does
    not answer by a scan. Not for stores in production: `hermes-store check` finds what
    differs, `check --repair` restores it.
    """
    cookie = int(conn.exec_driver_sql("PRAGMA schema_version").scalar_one())
    tables, meta = index_tables(conn)
    conn.info[_STATE] = State(cookie, tables, meta, {}, False)


def degraded(index: str, why: str) -> str:
    """The one-line warning of a search answered without its damaged index."""
    return (
        f"the search index {index} is damaged ({why}); results come from a slower scan of "
        "the messages; run `hermes-store check --repair`"
    )


def share_state(source: dict[Any, Any], target: dict[Any, Any]) -> None:
    """Give the driver connection what the Connection learnt of the database (learn_state).

    A store's own connections are not its engine's (hermes_store.prepared): without this,
    each of their searches would take the Connection again to learn it.
    """
    state: State | None = source.get(_STATE)
    known: State | None = target.get(_STATE)
    if (
        state is not None
        and target is not source
        and (known is None or known.cookie != state.cookie)
    ):
        target[_STATE] = State(
            state.cookie, state.tables, state.meta, state.damaged, state.application
        )

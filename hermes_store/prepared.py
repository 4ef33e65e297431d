"""Core statements compiled once and run on a plain driver connection: the hot paths.

A statement through SQLAlchemy's ``Connection`` pays for the connection wrapper, the
transaction's events, the compiled-cache lookup, parameter processing and the result
wrapper: tens of microseconds per statement and per transaction, as much as a one-row
write costs SQLite itself. The Store's hot paths (appends, flag updates, deletes, the
reads the agent makes on every turn) instead compile their Core statement once, to the
SQL text SQLite runs and the order of its parameters (:class:`Prepared`), and run it on
a DBAPI connection (:func:`driver`, :func:`fetch`), in one transaction when it writes: one
of the store's own (:class:`StoreConnections`, a store opened with ``Store.open``), or
one of its engine's pool (:class:`PooledConnections`).

What a caller sees does not change: a failing statement raises SQLAlchemy's exception
(``sqlalchemy.exc.IntegrityError``, ``OperationalError``...) with the parameters hidden,
as through a ``Connection`` of the store's engine, and the statements are logged when the
engine's SQL logging is on. ``Connection`` events (``before_cursor_execute``) do not see
them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.sql.expression import Executable

from hermes_store.backend import Backend, backend_of
from hermes_store.engine import SQL_LOGGER, create_store_engine, store_backend
from hermes_store.models import unstorable_text
from hermes_store.sqlite.engine import configure_connection, sqlite_timeout

_DIALECT = sqlite.dialect()
#: The logger of the store's engine (create_store_engine): statements are logged there.
_SQL_LOG = logging.getLogger(SQL_LOGGER)


@dataclass(frozen=True)
class Prepared:
    """A Core statement compiled for SQLite: its text and its parameters' names in order.

    An ``expanding`` parameter (``column.in_(bindparam(name, expanding=True))``) takes a
    list of values: its marks are rendered per call, one per value. :attr:`on_server` is
    the same statement compiled for PostgreSQL, on first use.
    """

    sql: str
    names: tuple[str, ...]
    #: Values the statement carries itself (literals such as ``coalesce(x, 0)``'s 0).
    fixed: Mapping[str, Any]
    expanding: frozenset[str]
    #: The Core statement it was compiled from, and the driver's parameter mark.
    statement: Executable | None = field(default=None, compare=False, repr=False)
    mark: str = "?"

    @classmethod
    def of(cls, statement: Executable, *, server: bool = False) -> Prepared:
        """Compile ``statement`` once (for SQLite; for PostgreSQL with ``server``)."""
        dialect = _server_dialect() if server else _DIALECT
        compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        names = tuple(compiled.positiontup or ())
        binds = compiled.binds
        return cls(
            str(compiled),
            names,
            {n: binds[n].value for n in names if not binds[n].required},
            frozenset(n for n in names if binds[n].expanding),
            statement,
            "%s" if server else "?",
        )

    @functools.cached_property
    def on_server(self) -> Prepared:
        """The same statement compiled for PostgreSQL (psycopg's ``%s`` marks)."""
        if self.statement is None:
            raise TypeError("a Prepared made without its statement cannot be recompiled")
        return Prepared.of(self.statement, server=True)

    def bind(self, values: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The SQL text and the positional parameters for ``values`` (by name)."""
        if not self.expanding:
            if not self.fixed:  # the usual case, in C: a read costs a few us in all
                return self.sql, tuple(map(values.__getitem__, self.names))
            return self.sql, tuple(
                values[name] if name in values else self.fixed[name] for name in self.names
            )
        sql, params = self.sql, []
        for name in self.names:
            value = values[name] if name in values else self.fixed[name]
            if name in self.expanding:
                marks = ",".join([self.mark] * len(value))
                sql = sql.replace(f"__[POSTCOMPILE_{name}]", marks, 1)
                params.extend(value)
            else:
                params.append(value)
        return sql, tuple(params)


@functools.cache
def _server_dialect() -> Dialect:
    """PostgreSQL through psycopg 3, with positional ``%s`` parameters."""
    from sqlalchemy.dialects.postgresql import psycopg

    return psycopg.dialect(paramstyle="format")  # type: ignore[no-untyped-call]


class Driver:
    """A DBAPI connection running prepared statements: a pooled one, or the Store's own.

    On PostgreSQL (``server``) the statements run in their PostgreSQL form, text crosses
    in the server's code (``hermes_store.models.to_server_text``, as the models' TEXT does),
    and a driver error the operator can act on is raised as its domain error, as through
    the engine. In a write transaction (:meth:`begin_write`), a text neither database can
    hold (a lone surrogate, which the driver cannot encode) is refused as
    :class:`~hermes_store.errors.TextNotStorable`, naming its column; the transaction then
    rolls back whole, as for any failed write.
    """

    __slots__ = (
        "_log",
        "_run",
        "connection",
        "dialect",
        "hide_parameters",
        "info",
        "lease",
        "logger",
        "owner",
        "server",
        "url",
        "writing",
    )

    def __init__(
        self,
        owner: object,
        connection: sqlite3.Connection,
        info: dict[Any, Any],
        *,
        logger: Any,
        backend: Backend,
        dialect: Dialect = _DIALECT,
        hide_parameters: bool = True,
    ) -> None:
        #: Whose connection it is: the Engine of the pool, or the StoreConnections.
        self.owner = owner
        self.connection = connection
        #: The connection's own dict (for a pooled one, ``Connection.info`` of it too).
        self.info = info
        self.logger = logger
        self.dialect = dialect
        self.hide_parameters = hide_parameters
        #: What its lender needs to take it back (the pool's proxy, or the generation).
        self.lease: Any = None
        self._log = logger.isEnabledFor(logging.INFO)
        #: A database on a server (no store file): statements in their server form
        #: (:attr:`Prepared.on_server`), transactions the driver begins.
        self.server = not backend.features.store_file
        #: The store's URL as it may be shown, once its runner has needed it.
        self.url = ""
        #: Whether a write transaction is open (from begin_write to its commit or rollback).
        self.writing = False
        self._run = backend.statement_runner(self)

    def run(
        self, sql: str, params: Sequence[Any] = (), *, columns: Sequence[str] = ()
    ) -> sqlite3.Cursor:
        """Execute one statement; a driver error is raised as SQLAlchemy raises it.

        ``columns`` names the parameters (repeated for a statement of several rows), so
        that a text refused in a write names its column.
        """
        if self._log:
            self.logger.info("%s", sql)
        try:
            return self._run(sql, params)  # type: ignore[no-any-return]
        except UnicodeEncodeError:
            # A read raises it as is: its caller knows nothing can match (search does).
            named = zip(itertools.cycle(columns), params)
            unstorable = unstorable_text(named) if self.writing and columns else None
            if unstorable is None:
                raise
            raise unstorable from None

    def execute(self, statement: Prepared, **values: Any) -> sqlite3.Cursor:
        """Execute a prepared statement with its parameters by name."""
        if self.server:
            statement = statement.on_server
        try:
            return self.run(*statement.bind(values))
        except UnicodeEncodeError:
            refusal = unstorable_text(values.items()) if self.writing else None
            if refusal is None:
                raise
            raise refusal from None

    def begin_write(self) -> None:
        """Begin a write transaction: SQLite's write lock now; psycopg begins on its own."""
        if not self.server:
            self.run("BEGIN IMMEDIATE")
        self.writing = True

    def commit(self) -> None:
        """Commit the transaction."""
        self.writing = False
        if self.server:
            self.connection.commit()
        else:
            self.run("COMMIT")


class Connections(Protocol):
    """Where a store's prepared statements run: a connection lent for one call at a time."""

    @property
    def engine(self) -> Engine:
        """The store's engine."""

    def take(self) -> Driver:
        """A connection for the caller alone, until it gives it back."""

    def give(self, runner: Driver) -> None:
        """Take back a connection; a transaction it left open is rolled back."""

    def connect(self) -> Connection:
        """A SQLAlchemy Connection to the same store (the paths that need one)."""

    def close(self) -> None:
        """Close the idle connections (the store reconnects when used again)."""


class PooledConnections:
    """The connections of an engine's pool (a store opened on an engine, or in memory)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._backend = backend_of(engine)

    def take(self) -> Driver:
        pooled = self.engine.raw_connection()
        runner = Driver(
            self.engine,
            pooled.driver_connection,  # type: ignore[arg-type]
            pooled.info,
            logger=self.engine.logger,
            backend=self._backend,
            dialect=self.engine.dialect,
            hide_parameters=self.engine.hide_parameters,
        )
        runner.lease = pooled
        return runner

    def give(self, runner: Driver) -> None:
        runner.lease.close()  # back to the pool, which rolls back what is left open

    def connect(self) -> Connection:
        return self.engine.connect()

    def close(self) -> None:
        """Close the pool's idle connections (the engine reconnects when used again)."""
        # The pool's own dispose: Engine.dispose() would also build a replacement pool,
        # a third of what opening the store cost.
        self.engine.pool.dispose()


class StoreConnections:
    """A store file's own sqlite3 connections, and the engine it gets when something needs one.

    The Store's methods run their prepared statements here, on plain sqlite3 connections
    opened as the store's engine opens its own (the same arguments, then
    :func:`~hermes_store.sqlite.engine.configure_connection`): opening a store and reading a
    session then costs what sqlite3 costs, not the engine's construction and pool. A call
    takes an idle connection, or opens one, for itself alone (so each thread that uses
    the store at the same time has its own), and gives it back when done. The engine
    (ORM sessions, the search's rare paths) is created on first use, with the same URL,
    busy timeout and WAL setting. :meth:`close` closes every connection, those in use as
    soon as they are given back, and the engine's; the store stays usable (it reconnects).
    """

    def __init__(
        self,
        url: str,
        path: Path,
        *,
        busy_timeout_ms: int,
        wal: bool = True,
        create: bool = False,
    ) -> None:
        self.url = url
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.wal = wal
        self._create = create
        self._idle: list[Driver] = []
        #: Bumped by close(): a connection of an earlier generation is closed when given back.
        self._generation = 0
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._backend = store_backend(url)
        self.logger = _SQL_LOG
        # Taken now, as an engine takes them when it is created: a relative file name is
        # made absolute from the current directory of this moment.
        connect_args = _absolute_connect_args if path.is_absolute() else _connect_args
        self._connect_args = connect_args(url, busy_timeout_ms)

    @property
    def engine(self) -> Engine:
        """The store's engine, created on first use."""
        engine = self._engine
        if engine is None:
            with self._lock:
                if self._engine is None:
                    self._engine = create_store_engine(
                        self.url,
                        create=self._create,
                        busy_timeout_ms=self.busy_timeout_ms,
                        wal=self.wal,
                    )
                engine = self._engine
        return engine

    @property
    def has_engine(self) -> bool:
        """Whether the engine has been created."""
        return self._engine is not None

    def connect(self) -> Connection:
        return self.engine.connect()

    def take(self) -> Driver:
        with self._lock:
            runner = self._idle.pop() if self._idle else None
        if runner is None:
            return self._open()
        runner._log = self.logger.isEnabledFor(logging.INFO)
        return runner

    def _open(self) -> Driver:
        """A new connection, opened and set up as the engine opens its own."""
        args, kwargs = self._connect_args
        connection = sqlite3.connect(*args, **kwargs)
        try:
            configure_connection(connection, self.path, wal=self.wal)
        except BaseException:
            connection.close()
            raise
        runner = Driver(self, connection, {}, logger=self.logger, backend=self._backend)
        runner.lease = self._generation
        return runner

    def give(self, runner: Driver) -> None:
        connection = runner.connection
        try:
            connection.rollback()  # what a pool does with a connection it gets back
        except sqlite3.Error:
            self._discard(runner)
            return
        with self._lock:
            if runner.lease == self._generation:
                self._idle.append(runner)
                return
        self._discard(runner)

    @staticmethod
    def _discard(runner: Driver) -> None:
        with contextlib.suppress(sqlite3.Error):
            runner.connection.close()

    def close(self) -> None:
        """Close the idle connections now, those in use when given back, and the engine's."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for runner in idle:
            self._discard(runner)
        if self._engine is not None:
            self._engine.pool.dispose()


def _connect_args(url: str, busy_timeout_ms: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What ``sqlite3.connect`` gets for ``url`` in an engine of create_store_engine.

    The pysqlite dialect's own reading of the URL (file name made absolute, ``uri=`` and the
    rest), then the engine's ``connect_args``.
    """
    args, kwargs = _DIALECT.create_connect_args(make_url(url))
    kwargs = {**kwargs, "timeout": sqlite_timeout(busy_timeout_ms), "check_same_thread": False}
    return tuple(args), kwargs


#: The same, for a store given by its absolute path (the usual case): it depends on
#: nothing else, and opening a store takes it every time.
_absolute_connect_args = functools.lru_cache(maxsize=64)(_connect_args)


def fetch(lender: Connections, statement: Prepared, /, **values: Any) -> list[Any]:
    """The rows of one read statement, run on a connection ``lender`` lends."""
    runner = lender.take()
    try:
        return runner.execute(statement, **values).fetchall()
    finally:
        lender.give(runner)


@contextlib.contextmanager
def driver(source: Engine | Connections, *, write: bool = False) -> Iterator[Driver]:
    """A connection's driver for the block; with ``write``, one write transaction.

    ``source`` is an engine (its pool lends the connection) or a store's connections.
    ``write=True`` begins with ``BEGIN IMMEDIATE`` on SQLite (the write lock, waited for
    up to the busy timeout), commits when the block ends and rolls back when it raises. Without it
    each statement is its own (read) transaction.
    """
    lender = PooledConnections(source) if isinstance(source, Engine) else source
    runner = lender.take()
    try:
        if not write:
            yield runner
            return
        runner.begin_write()
        try:
            yield runner
            runner.commit()
        except BaseException:
            runner.writing = False
            runner.connection.rollback()  # a no-op when COMMIT ended the transaction
            raise
    finally:
        lender.give(runner)

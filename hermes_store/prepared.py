"""Core statements compiled once and run on the pooled driver connection: the hot paths.

A statement through SQLAlchemy's ``Connection`` pays for the connection wrapper, the
transaction's events, the compiled-cache lookup, parameter processing and the result
wrapper: tens of microseconds per statement and per transaction, as much as a one-row
write costs SQLite itself. The Store's hot paths (appends, flag updates, deletes, the
reads the agent makes on every turn) instead compile their Core statement once, to the
SQL text SQLite runs and the order of its parameters (:class:`Prepared`), and run it on
the pool's DBAPI connection (:func:`driver`), in one transaction when it writes.

What a caller sees does not change: a failing statement raises SQLAlchemy's exception
(``sqlalchemy.exc.IntegrityError``, ``OperationalError``...) with the parameters hidden,
as through a ``Connection`` of the store's engine, and the statements are logged when the
engine's SQL logging is on. ``Connection`` events (``before_cursor_execute``) do not see
them.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import Executable

_DIALECT = sqlite.dialect()


@dataclass(frozen=True)
class Prepared:
    """A Core statement compiled for SQLite: its text and its parameters' names in order.

    An ``expanding`` parameter (``column.in_(bindparam(name, expanding=True))``) takes a
    list of values: its marks are rendered per call, one per value.
    """

    sql: str
    names: tuple[str, ...]
    #: Values the statement carries itself (literals such as ``coalesce(x, 0)``'s 0).
    fixed: Mapping[str, Any]
    expanding: frozenset[str]

    @classmethod
    def of(cls, statement: Executable) -> Prepared:
        """Compile ``statement`` once."""
        compiled = statement.compile(dialect=_DIALECT)  # type: ignore[attr-defined]
        names = tuple(compiled.positiontup or ())
        binds = compiled.binds
        return cls(
            str(compiled),
            names,
            {n: binds[n].value for n in names if not binds[n].required},
            frozenset(n for n in names if binds[n].expanding),
        )

    def bind(self, values: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The SQL text and the positional parameters for ``values`` (by name)."""
        if not self.expanding:
            return self.sql, tuple(
                values[name] if name in values else self.fixed[name] for name in self.names
            )
        sql, params = self.sql, []
        for name in self.names:
            value = values[name] if name in values else self.fixed[name]
            if name in self.expanding:
                sql = sql.replace(f"__[POSTCOMPILE_{name}]", ",".join("?" * len(value)), 1)
                params.extend(value)
            else:
                params.append(value)
        return sql, tuple(params)


class Driver:
    """The DBAPI connection of a pooled connection, running prepared statements."""

    def __init__(
        self, engine: Engine, connection: sqlite3.Connection, info: dict[Any, Any]
    ) -> None:
        self.engine = engine
        self.connection = connection
        #: The pooled connection's own dict (``Connection.info`` of the same connection).
        self.info = info
        self._log = engine.logger.isEnabledFor(logging.INFO)

    def run(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Execute one statement; a driver error is raised as SQLAlchemy raises it."""
        if self._log:
            self.engine.logger.info("%s", sql)
        try:
            return self.connection.execute(sql, params)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(
                sql,
                params,
                exc,
                sqlite3.Error,
                hide_parameters=self.engine.hide_parameters,
                dialect=self.engine.dialect,
            ) from exc

    def execute(self, statement: Prepared, **values: Any) -> sqlite3.Cursor:
        """Execute a prepared statement with its parameters by name."""
        return self.run(*statement.bind(values))


@contextlib.contextmanager
def driver(engine: Engine, *, write: bool = False) -> Iterator[Driver]:
    """A pooled connection's driver for the block; with ``write``, one write transaction.

    ``write=True`` begins with ``BEGIN IMMEDIATE`` (the write lock, waited for up to the
    busy timeout), commits when the block ends and rolls back when it raises. Without it
    each statement is its own (read) transaction.
    """
    pooled = engine.raw_connection()
    try:
        runner = Driver(engine, pooled.driver_connection, pooled.info)  # type: ignore[arg-type]
        if not write:
            yield runner
            return
        runner.run("BEGIN IMMEDIATE")
        try:
            yield runner
            runner.run("COMMIT")
        except BaseException:
            runner.connection.rollback()  # a no-op when COMMIT ended the transaction
            raise
    finally:
        pooled.close()

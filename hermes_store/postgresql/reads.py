"""Running the search statements on PostgreSQL: the planner's settings, savepoints, and
what a rejected query means.

A search reads in a transaction of its own or in the caller's (search_messages), so each
statement whose query values the server may reject runs in a savepoint, and the caller's
transaction goes on. The word and trigram paths' statements are planned with _BY_INDEX,
set and ended in that same savepoint (rolled back: a search writes nothing), the settings
read in the statement that sets them: one savepoint, the settings, the statement, the
rollback, four round trips.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

log = logging.getLogger("hermes_store.postgresql.search")

#: A statement and its parameters.
Statement = tuple[Any, dict[str, Any]]

#: The planner's own settings for one statement: no sequential or plain index scan, so the
#: matches come from a bitmap scan of the search index. The planner takes the cost of the
#: index expression (tokenising a text) for a few operators' worth: for a common term
#: (`e*` matches most messages) it would rather re-tokenise every row (5 s at 20k
#: messages) than read the index (0.3 s); the functions' costs are the revision's.
#: No JIT: a statement's estimated cost grows with its matches (a common word's) past
#: jit_above_cost, and compiling it then costs tens of milliseconds, more than it runs
#: (`self OR error NOT test` at 50k messages: 81 ms of JIT in a 204 ms statement).
_BY_INDEX = (
    func.set_config("enable_seqscan", "off", True),
    func.set_config("enable_indexscan", "off", True),
    func.set_config("jit", "off", True),
)


def encodable(values: Iterable[Any]) -> bool:
    """Whether every string can be sent to the server (lone surrogates cannot)."""
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return False
    return True


def rows(conn: Connection, statement: Any, values: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The statement's rows; None when the server rejected the query's values (in a
    savepoint, so the caller's transaction goes on). Any other error (a store without the
    search functions, a lost connection) is raised: it is no answer to the query."""
    if not encodable(values.values()):
        log.debug("search: query or filter not encodable as UTF-8; no results")
        return []
    try:
        with conn.begin_nested():
            return [dict(row) for row in conn.execute(statement, values).mappings()]
    except DBAPIError as exc:
        if not rejected_query(exc):
            raise
        log.debug("search: PostgreSQL rejected the query (%s)", type(exc.orig).__name__)
        return None


def rows_by_index(
    conn: Connection,
    make: Callable[[Sequence[Any]], Statement],
    read: Sequence[ColumnElement[Any]] = (),
) -> list[dict[str, Any]] | None:
    """The rows of the statement ``make`` gives, planned with _BY_INDEX, in one savepoint
    that both bounds the settings and keeps the caller's transaction going when the
    server rejects the query's values (None); rolled back after the read, as a search
    writes nothing. ``read``: values the statement depends on, read with the settings and
    given to ``make``."""
    try:
        with conn.begin_nested() as savepoint:
            found = conn.execute(select(*_BY_INDEX, *read)).one()
            statement, values = make(tuple(found)[len(_BY_INDEX) :])
            if not encodable(values.values()):
                log.debug("search: query or filter not encodable as UTF-8; no results")
                savepoint.rollback()
                return []
            answer = [dict(row) for row in conn.execute(statement, values).mappings()]
            savepoint.rollback()
            return answer
    except DBAPIError as exc:
        if not rejected_query(exc):
            raise
        log.debug("search: PostgreSQL rejected the query (%s)", type(exc.orig).__name__)
        return None


#: SQLSTATEs of a query the server refuses for what it says: a data exception (class 22),
#: a syntax error (a tsquery that does not parse), a limit exceeded (class 54).
_REJECTED = ("22", "42601", "54")


def rejected_query(exc: DBAPIError) -> bool:
    return sqlstate(exc).startswith(_REJECTED)


def sqlstate(exc: DBAPIError) -> str:
    return str(getattr(exc.orig, "sqlstate", "") or "")

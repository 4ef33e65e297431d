"""Running the search statements on PostgreSQL: the planner's settings, savepoints, and
what a rejected query means.

A search reads in a transaction of its own (``guarded`` False) or in the caller's
(search_messages). In the caller's, each statement whose query values the server may
reject runs in a savepoint, so that the caller's transaction goes on; in its own, a
rejected statement rolls the transaction back, and the next statement begins another
(nothing was read in it that the search keeps).

The word and trigram paths' statements are planned with the planner's settings of their
path (BY_INDEX, BY_TRIGRAM_INDEX): set by the statement that also reads what the search
needs first (the layout marker, the newest id), and put back to the values they had by one
more statement after the read, never by rolling back; or, when the statement was the
search's last (the ranked trigram statement reads its page's context windows too) in the
search's own transaction, left to end with it.
psycopg forgets every prepared statement of a connection at any ROLLBACK, ROLLBACK TO
SAVEPOINT included, so a search that rolled back would have PostgreSQL parse and plan all
its statements again each time (1.5 ms of the 1.7 a word search that matches nothing
took at 50,000 messages, against 0.2 prepared). The search's own transaction ends with
COMMIT for the same reason (search.read_transaction): it wrote nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, String, bindparam, func, select
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
#: Generic plans: the settings above leave the planner one shape of plan whatever the
#: values, so planning it again for each search's values (a custom plan, which PostgreSQL
#: keeps choosing for these statements) is work for nothing: 0.5-1.9 ms a search at
#: 50,000 messages, more than a whole search that matches nothing takes to run. A
#: statement is planned once it is prepared (psycopg prepares it at its fifth run).
_PLANNER = (
    ("enable_seqscan", "off"),
    ("enable_indexscan", "off"),
    ("jit", "off"),
    ("plan_cache_mode", "force_generic_plan"),
)


class Planner(NamedTuple):
    """Planner settings for a statement: the target list that reads each one's value and
    then sets it (until the transaction ends, or ``restore``: a target list is evaluated
    in order), and the statement that gives them back the values they had (binds
    ``was0``, ``was1``...)."""

    settings: tuple[tuple[str, str], ...]
    by_index: tuple[ColumnElement[Any], ...]
    restore: Any


def _planner(settings: tuple[tuple[str, str], ...]) -> Planner:
    return Planner(
        settings,
        (
            *(func.current_setting(name) for name, _ in settings),
            *(func.set_config(name, value, True) for name, value in settings),
        ),
        select(
            *(
                func.set_config(name, bindparam(f"was{n}", type_=String), True)
                for n, (name, _) in enumerate(settings)
            )
        ),
    )


#: _PLANNER's settings: the word path's, and the trigram path's by time.
BY_INDEX = _planner(_PLANNER)
#: The ranked trigram statement's: _PLANNER's but plain index scans. No index but the
#: trigram index serves its condition, which a GIN index answers by a bitmap scan only
#: (tests/test_search_postgresql.py checks its plan), and it reads its page's context
#: windows, each neighbour of a hit through the sessions' index: with no plain index
#: scan, each one read its hit's whole session (a page's windows took 1.8 ms, against 0.6).
BY_TRIGRAM_INDEX = _planner(tuple(item for item in _PLANNER if item[0] != "enable_indexscan"))


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


def rows(
    conn: Connection, statement: Any, values: dict[str, Any], *, guarded: bool = True
) -> list[dict[str, Any]] | None:
    """The statement's rows; None when the server rejected the query's values (in a
    savepoint when ``guarded``, so the caller's transaction goes on; else the search's own
    transaction is rolled back). Any other error (a store without the search functions, a
    lost connection) is raised: it is no answer to the query."""
    if not encodable(values.values()):
        log.debug("search: query or filter not encodable as UTF-8; no results")
        return []
    try:
        with _guard(conn, guarded):
            return [dict(row) for row in conn.execute(statement, values).mappings()]
    except DBAPIError as exc:
        return _rejected(conn, exc, guarded)


def rows_by_index(
    conn: Connection,
    make: Callable[[Sequence[Any]], Statement],
    read: Sequence[ColumnElement[Any]] = (),
    *,
    guarded: bool = True,
    planner: Planner = BY_INDEX,
    last: bool = False,
) -> list[dict[str, Any]] | None:
    """The rows of the statement ``make`` gives, planned with ``planner``'s settings, the
    settings put back after the read; None when the server rejected the query's values (as
    :func:`rows`). ``read``: values the statement depends on, read with the settings and
    given to ``make``. ``last``: the search runs no statement after this one (it read its
    context windows too), so in the search's own transaction the settings are left to end
    with it, at its COMMIT: no statement to give them back."""
    count = len(planner.settings)
    try:
        with _guard(conn, guarded):
            found = tuple(conn.execute(select(*planner.by_index, *read)).one())
            was = {f"was{n}": value for n, value in enumerate(found[:count])}
            statement, values = make(found[2 * count :])
            answer: list[dict[str, Any]] = []
            if encodable(values.values()):
                answer = [dict(row) for row in conn.execute(statement, values).mappings()]
            else:
                log.debug("search: query or filter not encodable as UTF-8; no results")
            if guarded or not last:
                conn.execute(planner.restore, was)
            return answer
    except DBAPIError as exc:
        return _rejected(conn, exc, guarded)


def _guard(conn: Connection, guarded: bool) -> contextlib.AbstractContextManager[Any]:
    """A savepoint, released when the block ends well and rolled back when it raises
    (``guarded``); else nothing."""
    return conn.begin_nested() if guarded else contextlib.nullcontext()


def _rejected(conn: Connection, exc: DBAPIError, guarded: bool) -> list[dict[str, Any]] | None:
    """A server's error: the query rejected (None; the search's own transaction rolled
    back, the caller's was by the savepoint), else raised."""
    if not rejected_query(exc):
        raise exc
    if not guarded:
        conn.rollback()
    log.debug("search: PostgreSQL rejected the query (%s)", type(exc.orig).__name__)
    return None


#: SQLSTATEs of a query the server refuses for what it says: a data exception (class 22),
#: a syntax error (a tsquery that does not parse), a limit exceeded (class 54).
_REJECTED = ("22", "42601", "54")


def rejected_query(exc: DBAPIError) -> bool:
    return sqlstate(exc).startswith(_REJECTED)


def sqlstate(exc: DBAPIError) -> str:
    return str(getattr(exc.orig, "sqlstate", "") or "")

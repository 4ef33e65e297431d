"""A PostgreSQL store: the psycopg 3 driver, its options, and what the server's errors mean.

The server owns its files, so there is nothing to prepare before connecting: the URL is
checked (:func:`supported_url`), the engine made with the busy timeout as the sessions'
``lock_timeout`` (:func:`create_engine`), and an error the operator can act on (a lock
held too long, a full disk, a standby, no such database, a refused login) told in one line
without the row the server quoted (:func:`translate_server_error`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.exc import DBAPIError

from hermes_store.engine import (
    ENV_BUSY_TIMEOUT,
    ENV_URL,
    PG_DRIVER,
    POSTGRESQL,
    check_driver_options,
    default_busy_timeout_ms,
    display_url,
    error_chain,
)
from hermes_store.errors import (
    DiskFull,
    ServerUnavailable,
    StoreBusy,
    StoreError,
    StoreNotFound,
    StoreReadOnly,
)
from hermes_store.models import from_server_text, to_server_text

if TYPE_CHECKING:
    from hermes_store.prepared import Driver


def supported_url(parsed: URL) -> str:
    """The URL with the psycopg 3 driver named; what it could not connect with, refused.

    ``postgres://`` and ``postgresql://`` (which SQLAlchemy would hand to psycopg2) mean
    ``postgresql+psycopg://``.
    """
    driver_name = parsed.drivername.partition("+")[2]
    if driver_name and driver_name != PG_DRIVER:
        raise StoreError(
            f"{parsed.drivername}://: hermes-store talks to PostgreSQL through psycopg 3 "
            f"only; use postgresql+{PG_DRIVER}://..."
        )
    parsed = parsed.set(drivername=f"{POSTGRESQL}+{PG_DRIVER}")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise StoreError(
            f"{display_url(parsed)}: port {parsed.port} is out of range; ports go from 1 "
            "to 65535 (leave it out for 5432)"
        )
    check_driver_options(parsed, f"postgresql+{PG_DRIVER}://USER@HOST[:PORT]/DATABASE")
    _check_host_names(parsed)
    return parsed.render_as_string(hide_password=False)


def _check_host_names(parsed: URL) -> None:
    """Refuse a host name that cannot be looked up at all (not IDNA, a NUL in it): psycopg
    would raise the encoding error itself, where an unknown host is a connection error."""
    in_query = parsed.query.get("host", ())
    given = [parsed.host or "", *((in_query,) if isinstance(in_query, str) else in_query)]
    for names in given:
        for host in names.split(","):
            if not host or host.startswith("/") or host.startswith("["):
                continue
            try:
                host.encode("idna")
                if "\x00" in host:
                    raise UnicodeError("NUL")
            except UnicodeError:
                shown = host.encode("unicode_escape").decode("ascii")
                raise StoreError(
                    f"{display_url(parsed)}: {shown!r} is not a host name (letters, digits, "
                    "dots and dashes, an IP address, or a socket directory); fix the URL's host"
                ) from None


#: PostgreSQL's SQLSTATE codes this module turns into domain errors.
_PG_ERRORS: dict[str, type[StoreError]] = {
    "55P03": StoreBusy,  # lock_not_available: lock_timeout (the busy timeout) ran out
    "53100": DiskFull,  # disk_full
    "25006": StoreReadOnly,  # read_only_sql_transaction: a standby, or read-only mode
    "3D000": StoreNotFound,  # invalid_catalog_name: no such database
    "28000": ServerUnavailable,  # invalid_authorization_specification
    "28P01": ServerUnavailable,  # invalid_password
    "57P03": ServerUnavailable,  # cannot_connect_now: starting up or shutting down
}
_PG_ADVICE = {
    StoreBusy: "another session held a lock for longer than the busy timeout ({timeout:g} s); "
    f"the step in progress was rolled back. Retry, or wait longer with {ENV_BUSY_TIMEOUT}",
    DiskFull: "the server's disk is full; the step in progress was rolled back. Free space "
    "on the server and run the command again",
    StoreReadOnly: "the server accepts no writes (a standby, or default_transaction_read_only);"
    " nothing was changed. Point the URL at the primary",
    StoreNotFound: "no such database; create it (`createdb NAME`), then run "
    "`hermes-store upgrade --db URL`",
    ServerUnavailable: "check the URL (--db / " + ENV_URL + "), that the server is running "
    "and that it lets this user in",
}


def redact_server_error(error: BaseException) -> BaseException:
    """Drop a PostgreSQL error's DETAIL and HINT from its text, in place, and return it.

    The DETAIL may quote the row ("Failing row contains (...)", "Key (title)=(...) already
    exists"), and message text must never reach an exception's text (or a traceback, where
    the driver's error is the cause). The class (so the SQLSTATE) and ``diag`` are kept.
    """
    diag = getattr(error, "diag", None)
    if diag is not None and (diag.message_detail or diag.message_hint):
        error.args = (diag.message_primary or type(error).__name__,)
    return error


def translate_server_error(exc: BaseException, url: str) -> StoreError | None:
    """The domain error for a PostgreSQL failure the operator can act on, else None."""
    for error in error_chain(exc):
        sqlstate = getattr(error, "sqlstate", None)
        kind = _PG_ERRORS.get(sqlstate) if isinstance(sqlstate, str) else None
        connection_failed = type(error).__name__ == "OperationalError" and sqlstate in (
            None,
            "08001",
            "08006",
        )
        if kind is None and connection_failed and not isinstance(error, DBAPIError):
            kind = ServerUnavailable
        if kind is None:
            continue
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        advice = _PG_ADVICE[kind].format(timeout=default_busy_timeout_ms() / 1000)
        return kind(f"{display_url(url)}: {detail}; {advice}")
    return None


def create_engine(url: str, *, busy_timeout_ms: int, echo: bool = False) -> Engine:
    """The engine of a PostgreSQL store: psycopg 3, the busy timeout as ``lock_timeout``."""
    try:
        import psycopg  # noqa: F401 - only to say what to install when it is missing
    except ImportError as exc:
        raise StoreError(
            "PostgreSQL needs the psycopg driver: pip install 'hermes-store[postgresql]'"
        ) from exc
    engine = sa_create_engine(
        url,
        echo=echo,
        hide_parameters=True,
        logging_name="hermes_store",
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": 10,
            "application_name": "hermes-store",
            "options": f"-c lock_timeout={int(busy_timeout_ms)}",
        },
    )

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> BaseException | None:
        error = context.original_exception
        text_before = str(error)
        redact_server_error(error)
        translated = translate_server_error(error, url)
        if translated is not None or str(error) == text_before:
            return translated
        import psycopg  # the message SQLAlchemy made quoted the DETAIL: made again without

        return DBAPIError.instance(
            context.statement,
            context.parameters,
            error,
            psycopg.Error,
            hide_parameters=True,
            dialect=engine.dialect,
        )

    return engine


# -- prepared statements on the driver's connection ---------------------------------------


class _ServerCursor:
    """A psycopg cursor whose rows give text as the data layer gives it (NUL where
    PostgreSQL holds U+FFFE: ``hermes_store.models.from_server_text``)."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @staticmethod
    def _row(row: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(from_server_text(v) if isinstance(v, str) else v for v in row)

    def fetchone(self) -> tuple[Any, ...] | None:
        row = self._cursor.fetchone() if self._cursor.description else None
        return None if row is None else self._row(row)

    def fetchall(self) -> list[tuple[Any, ...]]:
        if not self._cursor.description:
            return []
        return [self._row(row) for row in self._cursor.fetchall()]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())


def statement_runner(driver: Driver) -> Callable[[str, Sequence[Any]], Any]:
    """Run one SQL text (``%s`` marks) on ``driver``'s psycopg connection, text crossing in
    the server's code; an error the operator can act on is raised as its domain error."""
    import psycopg

    connection = driver.connection
    if isinstance(driver.owner, Engine):  # a server's errors name the store's URL
        driver.url = driver.owner.url.render_as_string(hide_password=True)

    def run(sql: str, params: Sequence[Any]) -> _ServerCursor:
        sent = tuple(to_server_text(v) if isinstance(v, str) else v for v in params)
        try:
            return _ServerCursor(connection.execute(sql, sent))
        except psycopg.Error as exc:
            wrapped = DBAPIError.instance(
                sql,
                sent,
                redact_server_error(exc),
                psycopg.Error,
                hide_parameters=driver.hide_parameters,
                dialect=driver.dialect,
            )
            translated = translate_server_error(exc, driver.url)
            if translated is not None:
                raise translated from wrapped
            raise wrapped from exc

    return run


def open_existing(url: str) -> Engine:
    """An engine on a PostgreSQL database that holds a store (never creates anything)."""
    from hermes_store.engine import create_store_engine
    from hermes_store.postgresql.migration import facts

    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            revisions, version, _layout = facts(conn)
    except BaseException:
        engine.dispose()
        raise
    if not revisions and version is None:
        engine.dispose()
        raise StoreNotFound(
            f"{display_url(url)}: the database holds no Hermes store; make it one with "
            "`hermes-store upgrade --db URL`"
        )
    return engine

"""URL resolution and the one engine factory every entry point uses.

What is the same for every database lives here: which store a command means (``--db``,
``$HERMES_STORE_URL``, the legacy default), how a URL is shown, the busy timeout, and the
factory that hands the URL to its backend (:func:`hermes_store.backend.backend_for`). What
a SQLite file needs (its side files, WAL, read-only opening, a full disk) is in
:mod:`hermes_store.sqlite.engine`; PostgreSQL's driver options and errors are in
:mod:`hermes_store.postgresql.engine`. Both are loaded only when a store of theirs is opened.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError

from hermes_store.backend import backend_for
from hermes_store.errors import NotOnThisDatabase, StoreError

if TYPE_CHECKING:
    from hermes_store.sqlite.readonly import ReadOnlyOpening

log = logging.getLogger(__name__)

ENV_URL = "HERMES_STORE_URL"
ENV_HOME = "HERMES_HOME"
DEFAULT_HOME = "~/.hermes"
DB_FILENAME = "state.db"
BUSY_TIMEOUT_MS = 30_000
#: SQLite takes the busy timeout as a C int of milliseconds (about 24 days); PostgreSQL's
#: lock_timeout is bounded the same way.
MAX_BUSY_TIMEOUT_MS = 2**31 - 1
#: Overrides BUSY_TIMEOUT_MS for engines built without an explicit ``busy_timeout_ms``.
ENV_BUSY_TIMEOUT = "HERMES_STORE_BUSY_TIMEOUT_MS"
#: Execution option naming the BEGIN flavour: "DEFERRED" (default), "IMMEDIATE", "EXCLUSIVE".
#: A SQLite engine honours it; a PostgreSQL one ignores it (its writers wait for row locks).
BEGIN_OPTION = "sqlite_begin"
#: The backends hermes-store runs on, and the one driver it uses for PostgreSQL (psycopg 3).
SQLITE = "sqlite"
POSTGRESQL = "postgresql"
PG_DRIVER = "psycopg"
#: The logger of every engine this module builds (SQLAlchemy's SQL echo, off by default).
SQL_LOGGER = "sqlalchemy.engine.Engine.hermes_store"
#: What a file path names (:func:`to_url`): its backend's rules read an OS error, or an
#: error raised where no URL is at hand (:func:`translate_error`).
_FILE_STORES = "sqlite://"


#: The backend of a store URL (:func:`~hermes_store.backend.backend_for`), kept: every
#: opening of a store asks, and reading the URL again costs an eighth of a raw sqlite3 open.
store_backend = functools.lru_cache(maxsize=64)(backend_for)


class _NoResultRows(logging.Filter):
    """Drop SQLAlchemy's DEBUG records of fetched rows: they would print message text.

    Statements are still logged when SQL logging is turned on, and their parameters are
    hidden (``hide_parameters=True``), so no log level shows a message's content.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Row ")


logging.getLogger(SQL_LOGGER).addFilter(_NoResultRows())


def hermes_home() -> Path:
    """Return ``$HERMES_HOME`` (default ``~/.hermes``) as an absolute path."""
    return Path(_absolute_name(os.environ.get(ENV_HOME) or DEFAULT_HOME))


def to_url(path_or_url: str | os.PathLike[str], *, resolve_link: bool = True) -> str:
    """Turn a file path or a SQLAlchemy URL into a SQLAlchemy URL string.

    The path is made absolute and escaped, so that a ``%`` or ``?`` in a directory name
    names that directory instead of being decoded or read as the URL's query string.
    ``":memory:"`` gives an in-memory store. A symbolic link as the file itself is
    followed (SQLite keeps -wal / -shm next to its target) and a dangling one refused,
    unless ``resolve_link`` is false (the caller looks at the file itself).
    """
    text = os.fspath(path_or_url)
    if not text or "\x00" in text:
        raise StoreError(
            f"{'an empty name' if not text else 'a name with a NUL character'} names "
            "no store: give the store's path or a URL (sqlite:///PATH, "
            f"postgresql+{PG_DRIVER}://USER@HOST/DATABASE)"
        )
    if "://" in text:
        return _supported_url(text)
    if text == ":memory:":
        return _FILE_STORES
    name = _absolute_name(text)
    if resolve_link:  # a path names a SQLite file: its backend follows a link there
        from hermes_store.sqlite.engine import link_followed

        name = link_followed(name)
    return file_url(name)


def require_utf8(name: str, what: str) -> None:
    """Refuse a name that is not UTF-8 (bytes Python carries as lone surrogates): SQLite and
    the database URL take UTF-8 text only."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(name).decode("utf-8", "backslashreplace")
        raise StoreError(
            f"{shown}: {what} is not valid UTF-8, and SQLite opens UTF-8 file names only; "
            "rename the file or directory (or link to it from a UTF-8 name)"
        ) from None


def _absolute_name(text: str) -> str:
    """``text`` (``~`` expanded) made absolute, looking at no directory on the way.

    Through a linked directory a name made absolute this way (``os.path.abspath``) leads
    to the same file, and to the same -wal and -shm, as the name with every link resolved;
    the two differ only after a ``..``, which follows a linked directory to the target's
    parent: such a name has its directories resolved on disk (``os.path.realpath``).
    Resolving every name took a system call per directory on each store open.
    """
    if text.startswith("~"):
        text = os.path.expanduser(text)
    if ".." not in text.split("/"):
        return _normalized(text) if text.startswith("/") else os.path.abspath(text)
    # The directories resolved, not the last name: a link there is the caller's to
    # follow or refuse (a dangling one must not be followed to create a store).
    head, tail = os.path.split(text)
    if tail in ("", ".", ".."):
        return os.path.realpath(text)
    return os.path.join(os.path.realpath(head or "."), tail)


#: An absolute name normalised (``//`` and ``/./`` taken out); kept, as each open takes it.
_normalized = functools.lru_cache(maxsize=64)(os.path.normpath)


@functools.lru_cache(maxsize=64)
def file_url(database: str) -> str:
    """The URL of a database file (escaped: see :func:`to_url`); kept, as each open takes it."""
    require_utf8(database, "the path")
    return URL.create(SQLITE, database=database).render_as_string(hide_password=False)


@functools.lru_cache(maxsize=64)  # a URL is checked once per process, not at each open
def _supported_url(text: str) -> str:
    """The URL as its backend opens it (the driver named), or refused in one line.

    What SQLAlchemy would only find wrong when it connects (a port that is not a number,
    an option its driver cannot take) is refused here or by the backend, in one line that
    never shows the URL's password.
    """
    require_utf8(text, "the URL")
    try:
        parsed = make_url(text)
    except ArgumentError:
        raise StoreError(
            "not a database URL: expected a file path, sqlite:///PATH or "
            f"postgresql+{PG_DRIVER}://USER@HOST[:PORT]/DATABASE"
        ) from None
    except ValueError as exc:  # the port: SQLAlchemy reads it with int()
        port = str(exc).rpartition(": ")[2]
        hint = " (an IPv6 address goes in brackets: [::1]:5432)" if "[" in text else ""
        raise StoreError(
            f"not a database URL: its port {port} is not a number{hint}; write "
            f"postgresql+{PG_DRIVER}://USER@HOST:PORT/DATABASE with PORT from 1 to 65535, or "
            "leave the port out for 5432"
        ) from None
    try:
        backend = backend_for(text)
    except NotOnThisDatabase:
        raise StoreError(
            f"{parsed.drivername}:// is not supported: hermes-store runs on SQLite (a file path "
            f"or sqlite:///PATH) and PostgreSQL (postgresql+{PG_DRIVER}://USER@HOST/DATABASE)"
        ) from None
    return backend.supported_url(text, parsed)


def check_driver_options(parsed: URL, form: str) -> None:
    """Refuse a URL the dialect would refuse when it connects: a SQLite URL with a host, or
    a query option whose value the dialect cannot read (``timeout=soon``), named."""
    dialect = parsed.get_dialect()()
    try:
        with warnings.catch_warnings(record=True) as ignored:
            warnings.simplefilter("always")
            dialect.create_connect_args(parsed)
    except (ArgumentError, ValueError, TypeError):
        pass
    else:
        if ignored:  # options SQLAlchemy would drop with a warning (`?mode=ro` without uri)
            said = str(ignored[0].message)
            names = said.partition("argument(s) ")[2].partition(" are not")[0] or said
            raise StoreError(
                f"{display_url(parsed)}: the driver would ignore the option(s) {names}; "
                "SQLite's own options need uri=true (sqlite:///file:PATH?mode=ro&uri=true): "
                "fix or drop them"
            )
        return
    for key, value in parsed.query.items():
        try:
            dialect.create_connect_args(parsed.set(query={key: value}))
        except (ArgumentError, ValueError, TypeError):
            raise StoreError(
                f"{display_url(parsed)}: the URL's option {key}={value!r} has a value its "
                f"driver cannot read; fix the value or drop the option ({form})"
            ) from None
    raise StoreError(f"{display_url(parsed)}: not a usable URL; write {form}")


def display_url(url: str | URL) -> str:
    """The URL as it may be shown to an operator: any password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def resolve_url(
    explicit: str | os.PathLike[str] | None = None,
    *,
    create_home: bool = True,
    resolve_link: bool = True,
) -> str:
    """Pick the store URL: explicit argument, then ``$HERMES_STORE_URL``, then the legacy default.

    The legacy default is ``<HERMES_HOME>/state.db``; its directory is created (mode 0700)
    when ``create_home`` is true and it does not exist yet. ``resolve_link``: see
    :func:`to_url`.
    """
    if explicit:
        return to_url(explicit, resolve_link=resolve_link)
    env = os.environ.get(ENV_URL)
    if env:
        return to_url(env, resolve_link=resolve_link)
    home = hermes_home()
    if create_home:
        make_private_dirs(home)
    return to_url(home / DB_FILENAME, resolve_link=resolve_link)


@functools.lru_cache(maxsize=64)  # a URL always names the same file: each open asks
def db_path(url: str) -> Path | None:
    """The store's file, or None where there is none (an in-memory or a server's database).

    Raises ValueError for a URL of a database hermes-store does not run on.
    """
    try:
        backend = store_backend(url)
    except NotOnThisDatabase:
        raise ValueError(
            f"hermes-store only supports SQLite and PostgreSQL URLs, got "
            f"{make_url(url).get_backend_name()!r}"
        ) from None
    return backend.db_path(url)


def prepare_store_file(
    url: str | os.PathLike[str] | None, *, create: bool = True
) -> tuple[str, Path | None]:
    """Resolve a store's URL and make it safe to open: ``(url, file or None)``.

    What every opening of a store does before its driver sees it (an engine's, or the
    Store's own connections'); its backend says what that takes (for a SQLite file:
    :func:`hermes_store.sqlite.engine.prepare_file`). With ``create=False`` a missing
    store raises :class:`~hermes_store.errors.StoreNotFound` and nothing (file or
    HERMES_HOME) is created.
    """
    # A read-only open must not leave an empty HERMES_HOME behind either.
    resolved = resolve_url(url, create_home=create, resolve_link=False)
    return store_backend(resolved).prepare(resolved, create=create)


def create_store_engine(
    url: str | os.PathLike[str] | None = None,
    *,
    create: bool = True,
    busy_timeout_ms: int | None = None,
    wal: bool = True,
    echo: bool = False,
    read_only: ReadOnlyOpening | None = None,
) -> Engine:
    """Build the engine for a store (resolved, then prepared by its backend), set up as
    every caller needs it: see ``create_engine`` in ``hermes_store/sqlite/engine.py`` and
    ``hermes_store/postgresql/engine.py``.

    With ``create=False`` a missing store raises
    :class:`~hermes_store.errors.StoreNotFound` and nothing is created. ``busy_timeout_ms``
    defaults to :func:`default_busy_timeout_ms`. ``wal`` and ``read_only``
    (``hermes_store.sqlite.readonly.read_only_opening``) concern store files only.
    """
    if busy_timeout_ms is None:
        busy_timeout_ms = default_busy_timeout_ms()
    resolved, path = prepare_store_file(url, create=create)
    return store_backend(resolved).create_engine(
        resolved, path, busy_timeout_ms=busy_timeout_ms, wal=wal, echo=echo, read_only=read_only
    )


def error_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the driver error it wraps, and the errors it was raised from or during."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen or len(seen) > 32:
            continue
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        for linked in (orig, current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                todo.append(linked)


def translate_error(
    exc: BaseException, path: Path | None = None, *, url: str | None = None
) -> StoreError | None:
    """The domain error for a driver or OS failure the operator can act on, else None.

    The store's backend reads the failure: the one of ``url`` when given, else the rules of
    a store file (an OS error, a full disk, a locked or read-only store at ``path``).
    """
    return store_backend(url or _FILE_STORES).translate_error(exc, url=url, path=path)


@contextlib.contextmanager
def joined_transaction(connection: Connection) -> Iterator[None]:
    """Join the caller's transaction, or run in one of its own."""
    if connection.in_transaction():
        yield
    else:
        with connection.begin():
            yield


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents readable by their owner only (0700),
    whatever the umask (``mkdir(mode=...)`` is masked by it)."""
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    for created in reversed(missing):
        with contextlib.suppress(FileExistsError):
            created.mkdir(mode=0o700)
            created.chmod(0o700)


def default_busy_timeout_ms() -> int:
    """``$HERMES_STORE_BUSY_TIMEOUT_MS`` when set, else :data:`BUSY_TIMEOUT_MS` (30 s)."""
    raw = os.environ.get(ENV_BUSY_TIMEOUT, "").strip()
    if not raw:
        return BUSY_TIMEOUT_MS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_BUSY_TIMEOUT_MS:
        raise StoreError(
            f"{ENV_BUSY_TIMEOUT}={raw!r}: expected a whole number of milliseconds, from 0 to "
            f"{MAX_BUSY_TIMEOUT_MS}"
        )
    return value

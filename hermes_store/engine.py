"""URL resolution and the one engine factory every entry point uses."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import sqlite3
import stat
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, ResourceClosedError
from sqlalchemy.pool import QueuePool, StaticPool

from hermes_store.errors import (
    DiskFull,
    NotADatabase,
    NotOnThisDatabase,
    ServerUnavailable,
    StoreBusy,
    StoreError,
    StoreNotFound,
    StoreReadOnly,
    UnsafePath,
)
from hermes_store.sqlite.space import describe_free, free_bytes, sqlite_temp_dir

log = logging.getLogger(__name__)

ENV_URL = "HERMES_STORE_URL"
ENV_HOME = "HERMES_HOME"
DEFAULT_HOME = "~/.hermes"
DB_FILENAME = "state.db"
BUSY_TIMEOUT_MS = 30_000
#: SQLite takes the busy timeout as a C int of milliseconds (about 24 days).
MAX_BUSY_TIMEOUT_MS = 2**31 - 1
#: Overrides BUSY_TIMEOUT_MS for engines built without an explicit ``busy_timeout_ms``.
ENV_BUSY_TIMEOUT = "HERMES_STORE_BUSY_TIMEOUT_MS"
#: Execution option naming the BEGIN flavour: "DEFERRED" (default), "IMMEDIATE", "EXCLUSIVE".
BEGIN_OPTION = "sqlite_begin"
_BEGIN_MODES = {"DEFERRED", "IMMEDIATE", "EXCLUSIVE"}
#: Files SQLite keeps next to a store; a symbolic link at any of them is refused.
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
#: The backends hermes-store runs on, and the one driver it uses for PostgreSQL (psycopg 3).
SQLITE = "sqlite"
POSTGRESQL = "postgresql"
PG_DRIVER = "psycopg"
#: The logger of every engine this module builds (SQLAlchemy's SQL echo, off by default).
SQL_LOGGER = "sqlalchemy.engine.Engine.hermes_store"


class _NoResultRows(logging.Filter):
    """Drop SQLAlchemy's DEBUG records of fetched rows: they would print message text.

    Statements are still logged when SQL logging is turned on, and their parameters are
    hidden (``hide_parameters=True``), so no log level shows a message's content.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Row ")


logging.getLogger(SQL_LOGGER).addFilter(_NoResultRows())


class WalUnavailableWarning(UserWarning):
    """The file system refused WAL; the store runs with the rollback journal."""


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
        return "sqlite://"
    name = _absolute_name(text)
    return _file_url(_link_followed(name) if resolve_link else name)


def _require_utf8(name: str, what: str) -> None:
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


def _link_followed(name: str) -> str:
    """The store file named ``name`` (absolute): a link as the file itself followed.

    SQLite keeps -wal and -shm next to a linked file's target, so that is the name of
    the store; a link to nothing is refused (the store must not be created through it).
    """
    own = _mode(name, follow=False)
    if own is None or not stat.S_ISLNK(own):
        return name
    if _mode(name, follow=True) is None:
        raise UnsafePath(
            f"{name} is a symbolic link to {os.readlink(name)}, which does not exist; "
            "refusing to create a store through a dangling link. Point --db at the real file"
        )
    return os.path.realpath(name)


@functools.lru_cache(maxsize=64)
def _file_url(database: str) -> str:
    """The URL of a database file (escaped: see :func:`to_url`); kept, as each open takes it."""
    _require_utf8(database, "the path")
    return URL.create("sqlite", database=database).render_as_string(hide_password=False)


@functools.lru_cache(maxsize=64)  # a URL is checked once per process, not at each open
def _supported_url(text: str) -> str:
    """A SQLite URL as given; a PostgreSQL one with the psycopg 3 driver named; else refused.

    ``postgres://`` and ``postgresql://`` (which SQLAlchemy would hand to psycopg2) mean
    ``postgresql+psycopg://``. What SQLAlchemy would only find wrong when it connects (a
    port that is not a number, an option its driver cannot take) is refused here, in one
    line that never shows the URL's password.
    """
    _require_utf8(text, "the URL")
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
    backend, _, driver_name = parsed.drivername.partition("+")
    if backend == SQLITE:
        if driver_name not in ("", "pysqlite"):
            raise StoreError(
                f"{parsed.drivername}://: hermes-store opens SQLite through Python's sqlite3 "
                "only; use sqlite:///PATH"
            )
        if parsed.username or parsed.password or parsed.host or parsed.port:
            raise StoreError(
                f"{display_url(parsed)}: a SQLite URL names a file, not a user or a host; "
                "write sqlite:///RELATIVE/PATH or sqlite:////ABSOLUTE/PATH"
            )
        _check_driver_options(parsed, "sqlite:///RELATIVE/PATH or sqlite:////ABSOLUTE/PATH")
        return text
    if backend in (POSTGRESQL, "postgres"):
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
        _check_driver_options(parsed, f"postgresql+{PG_DRIVER}://USER@HOST[:PORT]/DATABASE")
        _check_host_names(parsed)
        return parsed.render_as_string(hide_password=False)
    raise StoreError(
        f"{parsed.drivername}:// is not supported: hermes-store runs on SQLite (a file path or "
        f"sqlite:///PATH) and PostgreSQL (postgresql+{PG_DRIVER}://USER@HOST/DATABASE)"
    )


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


def _check_driver_options(parsed: URL, form: str) -> None:
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


def backend_name(url: str) -> str:
    """``"sqlite"`` or ``"postgresql"``: the database a (resolved) store URL names."""
    name = make_url(url).get_backend_name()
    return POSTGRESQL if name == "postgres" else name


def is_server(url: str) -> bool:
    """Whether the store is a database server (PostgreSQL), not a SQLite file."""
    return backend_name(url) == POSTGRESQL


def require_sqlite(url: str, what: str) -> None:
    """Refuse, in one line, a command that means something only on a SQLite store."""
    if is_server(url):
        raise NotOnThisDatabase(
            f"{what} works on SQLite stores only; on PostgreSQL the server manages its files "
            "(use pg_dump for backups and the server's own tools for its storage)"
        )


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
    """Return the database file of a SQLite URL, or None for an in-memory database or a
    PostgreSQL one (see :func:`is_server`)."""
    parsed = make_url(url)
    if parsed.get_backend_name() in (POSTGRESQL, "postgres"):
        return None
    if parsed.get_backend_name() != SQLITE:
        raise ValueError(
            f"hermes-store only supports SQLite and PostgreSQL URLs, got "
            f"{parsed.get_backend_name()!r}"
        )
    database = parsed.database
    if (
        not database
        or database == ":memory:"
        or database.startswith("file::memory:")
        or (database.startswith("file:") and parsed.query.get("mode") == "memory")
    ):
        return None
    if database.startswith("file:"):
        database = database[5:].split("?", 1)[0]
    return Path(database)


def side_files(path: Path) -> list[Path]:
    """The -wal, -shm and -journal paths of a store."""
    return [path.with_name(path.name + suffix) for suffix in SIDE_SUFFIXES]


def flush_to_disk(path: Path) -> None:
    """Write what the page cache still holds of a store and its WAL to disk (best effort).

    The first commit into a new WAL syncs it, and on a journaling file system that sync
    waits until the store's own unwritten pages are on disk too: seconds for a store just
    copied or restored (2.5-4 s for 3.6 GB here), all inside that commit's write lock.
    Called before a long job takes the lock, it moves that wait out of it.
    """
    store = os.path.realpath(path)  # a linked store: its data is in the link's target
    for name in dict.fromkeys((store, f"{store}-wal", f"{path}-wal")):
        try:  # O_NONBLOCK: a FIFO planted there must not hang the caller
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:  # no such file (no WAL yet), or a link SQLite refuses later
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fsync(fd)
        except OSError:
            pass  # a file system that cannot sync: nothing to move out of the lock
        finally:
            os.close(fd)


#: The errors pathlib's ``exists()`` / ``is_dir()`` / ``is_symlink()`` answer False for.
_NO_SUCH_FILE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def _stat(name: str, *, follow: bool) -> os.stat_result | None:
    """``stat`` of ``name`` (of a link itself unless ``follow``), or None where pathlib
    would say it does not exist. One system call and no Path built: pathlib's is_dir(),
    is_symlink(), exists() and is_file() took up to 15 system calls to open a store.
    """
    try:
        return (os.stat if follow else os.lstat)(name)
    except OSError as exc:
        if exc.errno in _NO_SUCH_FILE:
            return None
        raise
    except ValueError:
        return None


def _mode(name: str, *, follow: bool) -> int | None:
    """``st_mode`` of ``name`` (see :func:`_stat`), or None."""
    found = _stat(name, follow=follow)
    return None if found is None else found.st_mode


def _side_modes(path: Path) -> dict[str, int | None]:
    """Each side file's ``lstat`` mode (None when absent); a symbolic link is refused."""
    modes = {}
    for suffix in SIDE_SUFFIXES:
        side = f"{path}{suffix}"
        mode = modes[side] = _mode(side, follow=False)
        if mode is not None and stat.S_ISLNK(mode):
            raise UnsafePath(
                f"{side} is a symbolic link (to {os.readlink(side)}); SQLite writes the "
                f"store's journal there, so hermes-store refuses to open {path.name}. Remove "
                "the link (nothing of the store is in it) and run the command again"
            )
    return modes


def side_link_refusal(exc: BaseException, path: Path | None) -> UnsafePath | None:
    """The refusal naming a symbolic link at a side file of the store at ``path``, when
    that link is why SQLite failed with ``exc``; else None.

    SQLite opens side files with ``O_NOFOLLOW``: a link planted there makes it fail with
    "unable to open database file" rather than write through it.
    """
    if path is None or "unable to open database file" not in str(exc).lower():
        return None
    try:
        _side_modes(path)
    except UnsafePath as refusal:
        return refusal
    return None


def check_side_files(path: Path) -> None:
    """Refuse a store whose -wal / -shm / -journal path is a symbolic link.

    SQLite would refuse to open it with an unhelpful "unable to open database file"
    (or, in builds without O_NOFOLLOW, write the journal through the link).
    """
    _side_modes(path)


def writable_problem(path: Path) -> str | None:
    """Why a store (or the new one at ``path``) cannot be written, or None when it can."""
    target = path if path.exists() else path.parent
    if not target.exists():
        return None
    try:
        read_only_fs = bool(os.statvfs(target).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    if read_only_fs:
        return f"{target} is on a read-only file system"
    if path.exists() and not _may(path, os.W_OK):
        return f"{path} is not writable (read-only, immutable or another user's file)"
    if not _may(path.parent, os.W_OK | os.X_OK):
        return (
            f"its directory {path.parent} is not writable, so SQLite cannot create "
            f"{path.name}-wal, -shm or -journal next to it"
        )
    return None


def _may(path: Path, mode: int) -> bool:
    """``os.access`` as the user SQLite opens files as (the effective one, where the two
    differ: a set-user-ID program, or a test that takes another user's part)."""
    return os.access(path, mode, effective_ids=os.access in os.supports_effective_ids)


def require_writable(path: Path | None) -> None:
    """Raise StoreReadOnly, before anything is attempted, when the store cannot be written."""
    if path is None:
        return
    problem = writable_problem(path)
    if problem is not None:
        raise StoreReadOnly(
            f"the store is read-only: {problem}; nothing was changed. Remount or fix the "
            "permissions, or copy the store to a writable place and run the command there"
        )


#: Bytes 18 and 19 of a database's header (its file format versions) in WAL mode.
_WAL_FORMAT = b"\x02\x02"


def _in_wal_mode(path: Path) -> bool:
    """Whether the store's header says WAL mode (so that SQLite needs -wal and -shm to read it)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(20)[18:20] == _WAL_FORMAT
    except OSError:
        return False


def _file_uri(path: Path, options: str) -> str:
    """A sqlite3 URI of the store file with ``options`` (``mode=ro``...), the name escaped."""
    return f"{Path(os.path.abspath(path)).as_uri()}?{options}"


@dataclass(frozen=True)
class ReadOnlyOpening:
    """How a store that cannot be written is read, and the line that tells the operator."""

    uri: str
    note: str


def read_only_opening(path: Path, problem: str) -> ReadOnlyOpening:
    """How to read the store at ``path``, which cannot be written because of ``problem``.

    SQLite reads a WAL store only through its -shm, which it must create when it is missing,
    so: ``mode=ro`` (SQLite's read-only mode, with the usual locks) for a store in the
    rollback journal, or one whose -wal and -shm are there and usable; else ``immutable=1``,
    which reads the file alone, without locks or WAL. That is exact while nothing writes the
    store, as on a read-only file system; what a -wal still holds (transactions committed
    since the last checkpoint) is then not seen, and the note says how much there is.
    Creating the -shm ourselves next to a file we may not write would leave it behind, and
    owned by us, where the store's own user could then not open it.
    """
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    if not _in_wal_mode(path) or (wal.exists() and shm.exists() and _opens(path, "mode=ro")):
        return ReadOnlyOpening(
            _file_uri(path, "mode=ro"),
            f"read-only: {problem}; the store was read without writing anything (SQLite mode=ro)",
        )
    unread = _size(wal)
    left_out = (
        f"; {wal.name} ({unread:,} bytes) was not read: what was committed there since the "
        "last checkpoint is not shown. Copy the store with its -wal to a writable place to "
        "see all of it"
        if unread
        else ""
    )
    return ReadOnlyOpening(
        _file_uri(path, "mode=ro&immutable=1"),
        f"read-only: {problem}, and SQLite cannot use the store's WAL there (it needs "
        f"{shm.name}); the store was read as immutable, without locks, which is exact while "
        f"nothing writes it{left_out}",
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _opens(path: Path, options: str) -> bool:
    """Whether SQLite reads the store's schema through a connection with ``options``."""
    try:
        with contextlib.closing(sqlite3.connect(_file_uri(path, options), uri=True)) as conn:
            conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error:
        return False
    return True


class _ReadOnlyConnection(sqlite3.Connection):
    """A connection that cannot write its store, and removes, once closed, the -wal and -shm
    that SQLite created for it (see :func:`connect_read_only`)."""

    created_by_us: tuple[Path, list[str]] | None = None

    def close(self) -> None:
        super().close()
        if self.created_by_us is not None:
            path, absent = self.created_by_us
            self.created_by_us = None
            _remove_side_files_created(path, absent)


def connect_read_only(
    path: Path, *, timeout: float = 5.0, check_same_thread: bool = True
) -> sqlite3.Connection:
    """A sqlite3 connection that cannot write the store at ``path`` and leaves no file behind.

    SQLite's read-only mode (``mode=ro``) where the store can be written, else the way
    :func:`read_only_opening` chooses. A read-only connection to a WAL store creates the
    -wal and -shm it needs but cannot remove them when it closes, as the last connection
    that may write does: whatever it created and was not used since is removed when it
    closes (:func:`_remove_side_files_created`).
    """
    path = Path(os.path.realpath(path))  # a linked store: its side files are the target's
    problem = writable_problem(path)
    uri = _file_uri(path, "mode=ro") if problem is None else read_only_opening(path, problem).uri
    absent = [side for side in (f"{path}-wal", f"{path}-shm") if not os.path.lexists(side)]
    conn = sqlite3.connect(
        uri,
        uri=True,
        timeout=timeout,
        check_same_thread=check_same_thread,
        factory=_ReadOnlyConnection,
    )
    if absent and problem is None:
        conn.created_by_us = (path, absent)
    return conn


def _remove_side_files_created(path: Path, absent: list[str]) -> None:
    """Have SQLite remove the -wal and -shm a read-only connection left (``absent`` before it
    opened): a connection that may write opens the store and closes, and SQLite removes
    them as at any last close, only when no other connection has the store open. A -wal
    that holds anything was written by another connection since: its close removes it.
    """
    if not any(os.path.lexists(side) for side in absent) or _size(Path(f"{path}-wal")):
        return
    with contextlib.suppress(sqlite3.Error):
        tidy = sqlite3.connect(path, timeout=0)
        try:
            tidy.execute("PRAGMA schema_version")  # opens the WAL (a damaged store may fail)
        finally:
            tidy.close()


#: SQLite's primary result codes this module acts on (the extended code's low byte).
SQLITE_IOERR = 10
SQLITE_FULL = 13
#: Key in a connection's `info` that holds the first full-disk error of its transaction.
_DISK_FULL_KEY = "hermes_store.disk_full"
#: Free bytes below which an I/O error is taken for a full disk: SQLite reports ENOSPC as
#: SQLITE_FULL where it writes pages, but as an I/O error where it grows its -shm file
#: (SQLITE_IOERR_SHMSIZE: 32 KiB at a time).
_NEARLY_FULL = 64 << 10


def _chain(exc: BaseException) -> Iterator[BaseException]:
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


def _code(exc: BaseException) -> int | None:
    """SQLite's primary result code of a driver error (Python 3.11+), else None."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_disk_full(exc: BaseException, path: Path | None = None) -> bool:
    """Whether ``exc`` comes from a full disk, or was raised while handling one.

    Looked for along the exception chain: SQLITE_FULL (a full file system, or the store at
    `max_page_count`), ENOSPC, SQLite's "database or disk is full", or an I/O error while
    the store's or SQLite's temporary file system has (almost) no space left.
    """
    for error in _chain(exc):
        if isinstance(error, DiskFull):
            return True
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        code = _code(error)
        if code == SQLITE_FULL or "database or disk is full" in str(error):
            return True
        io_error = code == SQLITE_IOERR or (code is None and "disk i/o error" in str(error).lower())
        if isinstance(error, sqlite3.Error) and io_error and _disk_full(path):
            return True
    return False


def disk_full_error(detail: str, path: Path | None) -> DiskFull:
    """The DiskFull a step that ran out of space raises: what SQLite said, what is free."""
    where = f"{path}: " if path is not None else ""
    free = describe_free(path)
    return DiskFull(
        f"{where}the disk is full ({detail}{'; ' + free if free else ''}); the step in "
        "progress was rolled back and the store left as it was. Free space and run the "
        "command again (`hermes-store upgrade` says how much it needs before it starts)"
    )


def _full_disk_detail(exc: BaseException) -> str:
    """What SQLite (or the OS) said about the full disk, from the first such error."""
    for error in _chain(exc):
        if isinstance(error, DBAPIError):  # its driver error follows, without the SQL
            continue
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return f"{error.strerror}: {error.filename}" if error.filename else str(error.strerror)
        if _code(error) == SQLITE_FULL or "database or disk is full" in str(error):
            return str(error)
        if str(getattr(error, "sqlite_errorname", "")).startswith("SQLITE_IOERR_SHM"):
            return f"{error}: no room for the -shm file SQLite needs even to read a WAL store"
    return str(getattr(exc, "orig", exc))


def translate_error(exc: BaseException, path: Path | None = None) -> StoreError | None:
    """The domain error for a driver or OS failure the operator can act on, else None."""
    where = f"{path}: " if path is not None else ""
    if isinstance(exc, DiskFull):
        return exc
    if is_disk_full(exc, path):
        return disk_full_error(_full_disk_detail(exc), path)
    if isinstance(exc, OSError):
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return StoreReadOnly(
                f"{where}cannot write {exc.filename or 'the store'} ({exc.strerror}); "
                "nothing was changed"
            )
        return None
    detail = str(exc.orig) if isinstance(exc, DBAPIError) else str(exc)
    lowered = detail.lower()
    if "readonly" in lowered or "read-only" in lowered:
        return StoreReadOnly(
            f"{where}the store is read-only ({detail}); the step in progress was rolled "
            "back. Fix the permissions or the mount, or copy the store to a writable place"
        )
    if "database is locked" in lowered or "database is busy" in lowered:
        return StoreBusy(
            "the store is locked: another process held its write lock for longer than the "
            f"busy timeout ({default_busy_timeout_ms() / 1000:g} s) this command waited; the "
            "step in progress was rolled back and nothing was changed by it. Retry when the "
            f"agent is idle, or wait longer with {ENV_BUSY_TIMEOUT}=MILLISECONDS"
        )
    if "unable to open database file" in lowered and path is not None:
        refusal = side_link_refusal(exc, path)
        if refusal is not None:
            return refusal
        problem = writable_problem(path)
        if problem is not None:
            return StoreReadOnly(
                f"{where}the store is read-only and SQLite cannot open it: {problem} (a WAL "
                f"store needs {path.name}-shm even to be read); nothing was changed. Copy the "
                "store to a writable place to use it"
            )
    return None


def _disk_full(path: Path | None) -> bool:
    """Whether the store's file system, or SQLite's temporary one, has (almost) no space left."""
    directories = [sqlite_temp_dir()]
    if path is not None:
        directories.insert(0, path.parent)
    for directory in directories:
        if directory is None:
            continue
        try:
            if free_bytes(directory) < _NEARLY_FULL:
                return True
        except OSError:
            continue
    return False


@contextlib.contextmanager
def joined_transaction(connection: Connection) -> Iterator[None]:
    """Join the caller's transaction, or run in one of its own."""
    if connection.in_transaction():
        yield
    else:
        with connection.begin():
            yield


@contextlib.contextmanager
def sqlite_errors(path: Path | None) -> Iterator[None]:
    """Re-raise a full disk, a read-only store or a held lock as its domain error."""
    try:
        yield
    except (DBAPIError, sqlite3.Error, OSError) as exc:
        translated = translate_error(exc, path)
        if translated is None:
            raise
        raise translated from exc


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


def tighten_permissions(path: Path) -> None:
    """Make the store and its -wal / -shm / -journal files readable by their owner only."""
    modes: dict[str, int | None] = {}
    for candidate in (str(path), *(f"{path}{suffix}" for suffix in SIDE_SUFFIXES)):
        # A file we do not own or a read-only mount: the store still works, nothing to do.
        with contextlib.suppress(OSError):
            modes[candidate] = _mode(candidate, follow=False)
    _tighten(modes)


def _tighten(modes: dict[str, int | None]) -> None:
    """chmod 0600 each regular file (never a link) of ``modes`` that others may read."""
    for candidate, mode in modes.items():
        if mode is not None and stat.S_ISREG(mode) and mode & 0o077:
            with contextlib.suppress(OSError):
                os.chmod(candidate, 0o600)


def create_private_file(path: Path) -> None:
    """Create an empty (valid, zero-page) database file with mode 0600 if none exists."""
    make_private_dirs(path.parent)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)


def _set_journal_mode(dbapi_connection: sqlite3.Connection, path: Path | None) -> str:
    """Ask for WAL; fall back to the rollback journal, with a warning, where it is refused."""
    try:
        mode = str(dbapi_connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise
        if is_disk_full(exc, path):  # no room for the -shm file: not a refusal of WAL
            raise disk_full_error(_full_disk_detail(exc), path) from exc
        refusal = side_link_refusal(exc, path)
        if refusal is not None:  # a link at -wal / -shm: SQLite would not open it
            raise refusal from exc
        translated = translate_error(exc, path) if "readonly" in str(exc) else None
        if translated is not None:
            raise translated from exc
        mode = f"error: {exc}"
    if mode != "wal" and path is not None:
        warnings.warn(
            f"{path}: the file system refused WAL ({mode}); using the rollback journal. "
            "Readers will block during writes; move the store to a local disk to fix this.",
            WalUnavailableWarning,
            stacklevel=2,
        )
        with contextlib.suppress(sqlite3.OperationalError):
            dbapi_connection.execute("PRAGMA journal_mode=DELETE")
        mode = "delete"
    return mode


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


def sqlite_timeout(busy_timeout_ms: int) -> float:
    """``sqlite3.connect``'s ``timeout`` (seconds) that sets a busy timeout of exactly
    ``busy_timeout_ms``: the module truncates ``timeout * 1000`` to whole milliseconds, so
    half of one more is added (``1001 / 1000 * 1000`` is 1000.999...). Set there, the busy
    timeout costs no statement of its own on each new connection.
    """
    if not 0 <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS:
        raise ValueError(
            f"busy_timeout_ms must be from 0 to {MAX_BUSY_TIMEOUT_MS}, got {busy_timeout_ms}"
        )
    return (busy_timeout_ms + 0.5) / 1000


#: The stores (name, device, inode) whose side files this process has looked at; a store
#: replaced by another file is looked at again.
_SIDES_LOOKED_AT: set[tuple[str, int, int]] = set()
_SIDES_LOOKED_AT_MAX = 1024
#: Whether SQLite opens side files with O_NOFOLLOW (checked on 3.40.1; older builds are
#: not trusted with it, and every opening then looks at the side files).
_SQLITE_REFUSES_SIDE_LINKS = sqlite3.sqlite_version_info >= (3, 40, 0)


def prepare_store_file(
    url: str | os.PathLike[str] | None, *, create: bool = True
) -> tuple[str, Path | None]:
    """Resolve a store's URL and make its file safe to open: ``(url, file or None)``.

    What every opening of a store does before SQLite sees the file (an engine's, or the
    Store's own connections'): follow a link as the file itself, refuse a directory,
    create a missing file (mode 0600) or, with ``create=False``, raise
    :class:`StoreNotFound` creating nothing, and make the store's files private.

    Its -wal, -shm and -journal files are looked at (made private, a symbolic link there
    refused) the first time this process opens the store, and again whenever the store
    itself is new or readable by others; other openings make one system call, the
    ``lstat`` of the store (looking at the three every time cost a third as much as the
    rest of a raw sqlite3 open's own work). That is enough because SQLite creates side
    files with the store's own mode, so a private store's are private, and opens them with
    ``O_NOFOLLOW`` (checked on 3.40): a link planted later is never written through, and
    the failure is reported as the same :class:`UnsafePath` (:func:`translate_error`, the
    engine's error hook, the Store's connections). With an older SQLite every opening
    looks at them.
    """
    # A read-only open must not leave an empty HERMES_HOME behind either.
    resolved = resolve_url(url, create_home=create, resolve_link=False)
    path = db_path(resolved)
    if path is None:
        return resolved, None
    # Each file is looked at once (the checks' order and errors are those of pathlib's
    # is_dir(), is_symlink() and exists()).
    name = str(path)
    found = _stat(name, follow=False)
    if found is not None and stat.S_ISLNK(found.st_mode):  # the store is the link's target
        name = _link_followed(name)
        resolved, path = _file_url(name), Path(name)
        found = _stat(name, follow=False)
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise NotADatabase(f"{path} is a directory, not a database file; pass the file's path")
    if found is None:
        if not create:
            raise StoreNotFound(
                f"{path}: no such database. Check --db / {ENV_URL}, or create it with "
                "`hermes-store upgrade --create`."
            )
        modes = _side_modes(path)  # a removed store's leftovers, before anything is created
        create_private_file(path)
        # Another process may have created it first: then it is tightened like any other.
        with contextlib.suppress(OSError):
            modes[name] = _mode(name, follow=False)
        _tighten(modes)
        return resolved, path
    own = found.st_mode
    seen = (name, found.st_dev, found.st_ino)
    if seen not in _SIDES_LOOKED_AT or own & 0o077 or not _SQLITE_REFUSES_SIDE_LINKS:
        # Before SQLite opens the file: the side files it creates from here on take the
        # store's own mode (0600).
        _tighten({name: own, **_side_modes(path)})
        if len(_SIDES_LOOKED_AT) >= _SIDES_LOOKED_AT_MAX:
            _SIDES_LOOKED_AT.clear()
        _SIDES_LOOKED_AT.add(seen)
    return resolved, path


def create_store_engine(
    url: str | os.PathLike[str] | None = None,
    *,
    create: bool = True,
    busy_timeout_ms: int | None = None,
    wal: bool = True,
    echo: bool = False,
    read_only: ReadOnlyOpening | None = None,
) -> Engine:
    """Build the engine for a store with the PRAGMAs and transactional DDL every caller needs.

    ``url`` is resolved with :func:`resolve_url`. With ``create=False`` a missing file
    raises :class:`StoreNotFound` and nothing (file or HERMES_HOME) is created (read-only
    commands).
    Every connection gets ``foreign_keys=ON``, ``recursive_triggers=ON`` (so that
    ``INSERT OR REPLACE`` fires the delete triggers that keep the FTS indexes exact), a busy
    timeout, WAL where the file system allows it, and ``BEGIN`` issued by SQLAlchemy
    itself so that DDL runs inside transactions. Pass the execution option
    ``sqlite_begin="IMMEDIATE"`` to take the write lock when a transaction starts.
    ``busy_timeout_ms`` defaults to :func:`default_busy_timeout_ms`.
    ``read_only``: connect the way :func:`read_only_opening` chose for a store file that
    cannot be written (the caller only reads it).
    """
    if busy_timeout_ms is None:
        busy_timeout_ms = default_busy_timeout_ms()
    resolved, path = prepare_store_file(url, create=create)
    if is_server(resolved):
        return _create_server_engine(resolved, busy_timeout_ms=busy_timeout_ms, echo=echo)
    options: dict[str, Any] = {
        "connect_args": {
            "timeout": sqlite_timeout(busy_timeout_ms),
            "check_same_thread": False,
        }
    }
    if read_only is not None:
        options = {
            "creator": functools.partial(
                sqlite3.connect,
                read_only.uri,
                uri=True,
                timeout=sqlite_timeout(busy_timeout_ms),
                check_same_thread=False,
            )
        }
    engine = create_engine(
        resolved,
        echo=echo,
        # Message text must never reach a log or an exception's text: SQL logging (off by
        # default) shows statements without their parameters, and no result rows.
        hide_parameters=True,
        logging_name="hermes_store",
        # A file store keeps a few connections open between uses (the default QueuePool):
        # each new connection would pay for the PRAGMAs, the schema parse and, when it is
        # the last one to close, a WAL checkpoint, which outweighs a small write several
        # times over. `dispose()` (Store.close) closes them. An in-memory store lives as
        # long as its one connection, so that one is kept.
        poolclass=QueuePool if path is not None else StaticPool,
        **options,
    )
    _install_listeners(engine, path, wal=wal)
    return engine


def configure_connection(
    dbapi_connection: sqlite3.Connection, path: Path | None, *, wal: bool
) -> None:
    """Set up a new sqlite3 connection to a store: what every connection of it runs first.

    Transactions begun by the caller (the driver's own BEGIN is off), ``foreign_keys``,
    ``recursive_triggers`` and WAL, falling back to the rollback journal with a
    :class:`WalUnavailableWarning` where the file system refuses it. Run on each
    connection an engine opens, and on the Store's own (``hermes_store.prepared``). The
    busy timeout is the connection's own, set when it was opened (:func:`sqlite_timeout`).
    """
    # Let SQLAlchemy (not the driver) decide where transactions start: required for
    # transactional DDL and SAVEPOINT with the stdlib driver.
    dbapi_connection.isolation_level = None
    dbapi_connection.execute("PRAGMA foreign_keys=ON")
    dbapi_connection.execute("PRAGMA recursive_triggers=ON")
    if wal:
        _set_journal_mode(dbapi_connection, path)


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
    for error in _chain(exc):
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


def _create_server_engine(url: str, *, busy_timeout_ms: int, echo: bool) -> Engine:
    """The engine of a PostgreSQL store: psycopg 3, the busy timeout as ``lock_timeout``."""
    try:
        import psycopg  # noqa: F401 - only to say what to install when it is missing
    except ImportError as exc:
        raise StoreError(
            "PostgreSQL needs the psycopg driver: pip install 'hermes-store[postgresql]'"
        ) from exc
    engine = create_engine(
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


def _install_listeners(engine: Engine, path: Path | None, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        configure_connection(dbapi_connection, path, wal=wal)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = str(conn.get_execution_options().get(BEGIN_OPTION, "DEFERRED")).upper()
        if mode not in _BEGIN_MODES:
            raise ValueError(f"{BEGIN_OPTION} must be one of {sorted(_BEGIN_MODES)}, got {mode!r}")
        conn.info.pop(_DISK_FULL_KEY, None)
        conn.exec_driver_sql(f"BEGIN {mode}")

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> BaseException | None:
        full = _name_full_disk(context, path)
        if full is not None:
            return full
        if context.connection is None:  # the opening itself: what the URL asked for
            refusal = _url_refusal(context.original_exception, path, engine.url)
            if refusal is not None:
                return refusal
        # A link planted at a side file since the store was opened.
        return side_link_refusal(context.original_exception, path)


#: What SQLite says when a URI option of the URL names something it does not have.
_URI_REFUSALS = ("no such vfs", "no such access mode", "no such cache mode")


def _url_refusal(error: BaseException, path: Path | None, url: URL) -> StoreError | None:
    """The one line for a store SQLite cannot open as its URL's options ask, else None."""
    detail = str(error)
    if not detail.startswith(_URI_REFUSALS):
        return None
    return StoreError(
        f"{path or display_url(url)}: SQLite cannot open the store as the URL asks ({detail}); fix "
        "or drop that option after '?' in --db / HERMES_STORE_URL (mode is ro, rw or rwc)"
    )


def _name_full_disk(context: ExceptionContext, path: Path | None) -> DiskFull | None:
    """Raise a full disk as DiskFull, and so every error that follows it in its transaction.

    When SQLite runs out of space mid-statement it may roll the whole transaction back;
    what the caller does next then fails for another reason ("no such savepoint" when it
    rolls back its savepoint, "vtable constructor failed" when FTS5 reads its tables
    again), which would hide the cause. The first full-disk error of a transaction is
    remembered on the connection until its next BEGIN. Raising DiskFull (no
    OperationalError) also keeps code that falls back on an OperationalError (a probe, a
    second way of doing a step) from trying again on a full disk.
    """
    error = context.original_exception
    info: dict[Any, Any] | None = None
    if context.connection is not None:
        with contextlib.suppress(ResourceClosedError):
            info = context.connection.info
    if is_disk_full(error, path):
        detail = _full_disk_detail(error)
        if info is not None:
            info.setdefault(_DISK_FULL_KEY, detail)
        return disk_full_error(detail, path)
    first = info.get(_DISK_FULL_KEY) if info is not None else None
    if first is not None and isinstance(error, sqlite3.Error):
        return disk_full_error(f"{first}; then: {error}", path)
    return None

"""A SQLite store file: opening it safely, its connections' settings, and its errors.

What every opening of a store file does first (:func:`prepare_file`: links, side files,
modes), the engine and the settings of each connection (:func:`create_engine`,
:func:`configure_connection`: WAL, foreign keys, the busy timeout, BEGIN issued by
SQLAlchemy), and what the operator is told when SQLite fails (:func:`translate_error`: a
full disk, a locked or read-only store, a link planted at a side file). What is the same
for every database (which URL, the busy timeout) is in :mod:`hermes_store.engine`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sqlite3
import stat
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import URL, Connection, ExceptionContext, make_url
from sqlalchemy.exc import DBAPIError, ResourceClosedError
from sqlalchemy.pool import QueuePool, StaticPool

from hermes_store.engine import (
    BEGIN_OPTION,
    ENV_BUSY_TIMEOUT,
    ENV_URL,
    MAX_BUSY_TIMEOUT_MS,
    check_driver_options,
    default_busy_timeout_ms,
    display_url,
    error_chain,
    file_url,
    make_private_dirs,
)
from hermes_store.errors import (
    DiskFull,
    NotADatabase,
    StoreBusy,
    StoreError,
    StoreNotFound,
    StoreReadOnly,
    UnsafePath,
)
from hermes_store.sqlite.readonly import ReadOnlyOpening, writable_problem
from hermes_store.sqlite.space import describe_free, free_bytes, sqlite_temp_dir

if TYPE_CHECKING:
    from hermes_store.prepared import Driver

#: BEGIN flavours the ``sqlite_begin`` execution option takes (:data:`BEGIN_OPTION`).
_BEGIN_MODES = {"DEFERRED", "IMMEDIATE", "EXCLUSIVE"}
#: Files SQLite keeps next to a store; a symbolic link at any of them is refused.
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")


class WalUnavailableWarning(UserWarning):
    """The file system refused WAL; the store runs with the rollback journal."""


# -- the URL and the file it names -------------------------------------------------------


def link_followed(name: str) -> str:
    """The store file named ``name`` (absolute): a link as the file itself followed.

    SQLite keeps -wal and -shm next to a linked file's target, so that is the name of
    the store; a link to nothing is refused (the store must not be created through it).
    """
    own = stat_or_none(name, follow=False)
    if own is None or not stat.S_ISLNK(own.st_mode):
        return name
    if stat_or_none(name, follow=True) is None:
        raise UnsafePath(
            f"{name} is a symbolic link to {os.readlink(name)}, which does not exist; "
            "refusing to create a store through a dangling link. Point --db at the real file"
        )
    return os.path.realpath(name)


#: The errors pathlib's ``exists()`` / ``is_dir()`` / ``is_symlink()`` answer False for.
_NO_SUCH_FILE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def stat_or_none(name: str, *, follow: bool) -> os.stat_result | None:
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


def supported_url(text: str, parsed: URL) -> str:
    """A SQLite URL (``text``, ``parsed``) as given, when sqlite3 opens it as it says."""
    driver_name = parsed.drivername.partition("+")[2]
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
    check_driver_options(parsed, "sqlite:///RELATIVE/PATH or sqlite:////ABSOLUTE/PATH")
    return text


@functools.lru_cache(maxsize=64)  # a URL always names the same file: each open asks
def db_path(url: str) -> Path | None:
    """The database file of a SQLite URL, or None for an in-memory database."""
    parsed = make_url(url)
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


def _mode(name: str, *, follow: bool) -> int | None:
    """``st_mode`` of ``name`` (see :func:`stat_or_none`), or None."""
    found = stat_or_none(name, follow=follow)
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


# -- a full disk, a locked or read-only store: what the operator is told -----------------


#: SQLite's primary result codes this module acts on (the extended code's low byte).
SQLITE_IOERR = 10
SQLITE_FULL = 13
#: Key in a connection's `info` that holds the first full-disk error of its transaction.
_DISK_FULL_KEY = "hermes_store.disk_full"
#: Free bytes below which an I/O error is taken for a full disk: SQLite reports ENOSPC as
#: SQLITE_FULL where it writes pages, but as an I/O error where it grows its -shm file
#: (SQLITE_IOERR_SHMSIZE: 32 KiB at a time).
_NEARLY_FULL = 64 << 10


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
    for error in error_chain(exc):
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
    for error in error_chain(exc):
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
def sqlite_errors(path: Path | None) -> Iterator[None]:
    """Re-raise a full disk, a read-only store or a held lock as its domain error."""
    try:
        yield
    except (DBAPIError, sqlite3.Error, OSError) as exc:
        translated = translate_error(exc, path)
        if translated is None:
            raise
        raise translated from exc


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


# -- opening the file, the engine, each connection ---------------------------------------


def prepare_file(url: str, *, create: bool) -> tuple[str, Path | None]:
    """Make the file of a (resolved) store URL safe to open: ``(url, file or None)``.

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
    resolved = url
    path = db_path(resolved)
    if path is None:
        return resolved, None
    # Each file is looked at once (the checks' order and errors are those of pathlib's
    # is_dir(), is_symlink() and exists()).
    name = str(path)
    found = stat_or_none(name, follow=False)
    if found is not None and stat.S_ISLNK(found.st_mode):  # the store is the link's target
        name = link_followed(name)
        resolved, path = file_url(name), Path(name)
        found = stat_or_none(name, follow=False)
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


def create_engine(
    url: str,
    path: Path | None,
    *,
    busy_timeout_ms: int,
    wal: bool = True,
    echo: bool = False,
    read_only: ReadOnlyOpening | None = None,
) -> Engine:
    """The engine of a store file prepared by :func:`prepare_file` (or in memory).

    Every connection gets ``foreign_keys=ON``, ``recursive_triggers=ON`` (so that
    ``INSERT OR REPLACE`` fires the delete triggers that keep the FTS indexes exact), a busy
    timeout, WAL where the file system allows it, and ``BEGIN`` issued by SQLAlchemy
    itself so that DDL runs inside transactions. Pass the execution option
    ``sqlite_begin="IMMEDIATE"`` to take the write lock when a transaction starts.
    ``read_only``: connect the way
    :func:`~hermes_store.sqlite.readonly.read_only_opening` chose for a store file that
    cannot be written (the caller only reads it).
    """
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
    engine = sa_create_engine(
        url,
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


# -- prepared statements on the store's own connections ----------------------------------


def statement_runner(driver: Driver) -> Callable[[str, Sequence[Any]], sqlite3.Cursor]:
    """Run one SQL text on ``driver``'s sqlite3 connection; a failure is raised as
    SQLAlchemy raises it (parameters hidden), or as the refusal of a link at a side file."""
    execute = driver.connection.execute
    # A link planted at a side file of the Store's own file (StoreConnections).
    path: Path | None = getattr(driver.owner, "path", None)

    def run(sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        try:
            return execute(sql, params)
        except sqlite3.Error as exc:
            refusal = side_link_refusal(exc, path)
            if refusal is not None:
                raise refusal from exc
            raise DBAPIError.instance(
                sql,
                params,
                exc,
                sqlite3.Error,
                hide_parameters=driver.hide_parameters,
                dialect=driver.dialect,
            ) from exc

    return run

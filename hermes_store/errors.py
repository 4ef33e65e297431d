"""Domain errors: each says what was found and what the operator should do next."""

from __future__ import annotations

#: Control characters and line separators, as Python escapes them (``\\n``, ``\\x85``).
_ESCAPES = {
    code: repr(chr(code))[1:-1] for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
}


def one_line(message: str) -> str:
    """``message`` on one line: a newline typed into a path cannot break the line it is in."""
    return message.strip().translate(_ESCAPES)


class StoreError(Exception):
    """Base class of every error hermes-store raises on purpose; its message is one line."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(one_line(arg) if isinstance(arg, str) else arg for arg in args))


class StoreNotFound(StoreError):
    """The database file does not exist and the command does not create one."""


class NotADatabase(StoreError):
    """The file exists but is not a SQLite database."""


class SchemaTooOld(StoreError):
    """The store predates the oldest legacy schema this package can adopt (17)."""


class SchemaTooNew(StoreError):
    """The database was written by a newer schema than this package knows."""


class UnknownSchema(StoreError):
    """The database is SQLite but its tables are not a Hermes session store."""


class StoreBusy(StoreError):
    """Another process held the write lock for longer than the busy timeout."""


class StoreReadOnly(StoreError):
    """The database (or its directory) cannot be written."""


class DiskFull(StoreError):
    """The file system ran out of space (or the store hit its page limit) mid-operation."""


class NotEnoughFreeSpace(DiskFull):
    """A command was refused before it changed anything: the disk lacks the space it needs."""

    def __init__(self, message: str, *, needed: int, free: int, where: str) -> None:
        super().__init__(message)
        #: Bytes the command needs free on ``where`` (a mount point), and bytes free there.
        self.needed = needed
        self.free = free
        self.where = where


class UnsafePath(StoreError):
    """A symbolic link sits where the store or one of its -wal / -shm / -journal files goes."""


class BackupExists(StoreError):
    """The backup destination already exists and overwriting it was not asked for."""


class UnsupportedLayout(StoreError):
    """The store's search indexes are in a layout this package does not search."""


class QueryTooComplex(StoreError):
    """A search query has more distinct terms than a search answers in bounded time."""


class SearchFailed(StoreError):
    """A search could not read the messages: the database refused what no query causes."""


class SessionNotFound(StoreError):
    """The session id given to a write does not exist in the store."""


class SessionExists(StoreError):
    """A session with the id given to create_session is already in the store."""


class TitleTaken(StoreError):
    """Another session already has the title given (titles are unique when set)."""


class ServerUnavailable(StoreError):
    """The database server could not be reached, or refused the connection."""


class NotOnThisDatabase(StoreError):
    """The command means something only on SQLite (or only on a server database)."""


class TextNotStorable(StoreError, ValueError):
    """A text holds a lone surrogate, which no database the store runs on can hold."""


class UnknownRevision(StoreError):
    """A revision name this package does not have (`hermes-store history` lists them)."""


class CopyRefused(StoreError):
    """The copy was refused; the target was left as it was (or as its last committed batch)."""


class Interrupted(KeyboardInterrupt):
    """Work stopped by Ctrl-C; the message says what was kept, what is left and what
    command finishes it. Still a KeyboardInterrupt, so callers that stop on one still do."""


class ArchiveRefused(StoreError):
    """An archive, a restore or a search with archives was refused: the archive is missing,
    not a store, unreachable, not at head, or the hot store itself. Both stores were left
    as they were (or as the last finished batch left them, every session in exactly one
    of them)."""

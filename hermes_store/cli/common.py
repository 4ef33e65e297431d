"""What every command shares: the --db option, one-line errors, opening a store."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
from alembic.util import CommandError
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from hermes_store.backend import backend_for
from hermes_store.engine import db_path, resolve_url, translate_error
from hermes_store.errors import StoreError, one_line

F = TypeVar("F", bound=Callable[..., Any])


DB_HELP = (
    "Store file or SQLAlchemy URL (sqlite:///PATH, or postgresql+psycopg://USER@HOST/DB for "
    "a PostgreSQL store). Default: $HERMES_STORE_URL, else $HERMES_HOME/state.db "
    "(HERMES_HOME defaults to ~/.hermes)."
)


def _named_store(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """--db as given; an empty value (an unset shell variable) would mean the default store."""
    if value == "":
        raise click.BadParameter(
            "an empty value names no store: give a path or URL, or leave --db out to use "
            "$HERMES_STORE_URL, else $HERMES_HOME/state.db"
        )
    return value


def db_option(func: F) -> F:
    """The --db option every command takes."""
    return click.option(
        "--db", "db", metavar="PATH_OR_URL", default=None, help=DB_HELP, callback=_named_store
    )(func)


def json_option(func: F) -> F:
    """The --json option of commands that do something (reporting ones take format_options)."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(func)


class OperatorError(click.ClickException):
    """A failure told in one line: what it names (a path, a URL) cannot break it in two."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


@contextlib.contextmanager
def operator_errors() -> Iterator[None]:
    """Turn every expected failure into a one-line message and a non-zero exit."""
    try:
        yield
    except StoreError as exc:
        raise OperatorError(str(exc)) from None
    except CommandError as exc:
        raise OperatorError(str(exc)) from None
    except (DBAPIError, sqlite3.Error, OSError) as exc:
        translated = translate_error(exc)
        if translated is not None:
            raise OperatorError(str(translated)) from None
        if isinstance(exc, OSError):
            raise OperatorError(f"{exc.strerror or exc}: {exc.filename or ''}".strip()) from None
        detail = str(getattr(exc, "orig", exc))
        if _from_server(exc):
            lines = detail.strip().splitlines() or [type(exc).__name__]
            raise OperatorError(f"PostgreSQL error: {lines[0]}") from None
        if "not a database" in detail or "malformed" in detail:
            raise OperatorError(
                f"SQLite cannot read the store ({detail}): it is damaged; `hermes-store check` "
                "names what is broken, and a backup restores it"
            ) from None
        raise OperatorError(f"SQLite error: {detail}") from None


def _from_server(exc: BaseException) -> bool:
    """Whether a driver error came from PostgreSQL (psycopg), not SQLite."""
    original = getattr(exc, "orig", exc)
    return type(original).__module__.split(".")[0] == "psycopg"


def server_url(db: str | None) -> str | None:
    """The resolved URL when --db (or $HERMES_STORE_URL) names a PostgreSQL store, else None."""
    url = resolve_url(db, create_home=False)
    return None if backend_for(url).features.store_file else url


def store_url(db: str | None, *, create_home: bool) -> tuple[str, Path | None]:
    """Resolve --db like the engine does; refuse a URL that is not SQLite."""
    url = resolve_url(db, create_home=create_home)
    try:
        return url, db_path(url)
    except ValueError as exc:  # a non-SQLite URL
        raise click.ClickException(f"--db: {exc}") from None


def backup_options(func: F) -> F:
    """--backup PATH and --overwrite-backup."""
    func = click.option(
        "--overwrite-backup", is_flag=True, help="Replace an existing file at the --backup PATH."
    )(func)
    return click.option(
        "--backup",
        "backup_to",
        metavar="PATH",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="First write a consistent copy of the store to PATH (SQLite backup API, mode "
        "0600), in an existing directory. Recommended for large or precious stores.",
    )(func)


def open_existing(db: str | None, *, reading: bool = False) -> Engine:
    """An engine on an existing store, checked read-only first; never creates a file.

    ``reading``: the command only reads, so a store that cannot be written is read anyway
    (read-only, saying so on stderr); otherwise such a store is refused before anything.
    The engine is disposed of when the command ends, failed or not: its pooled connections
    would keep the store's -wal and -shm.
    """
    engine = _open_existing(db, reading=reading)
    context = click.get_current_context(silent=True)
    if context is not None:
        context.call_on_close(engine.dispose)
    return engine


def _open_existing(db: str | None, *, reading: bool) -> Engine:
    url, _path = store_url(db, create_home=False)
    engine, note = backend_for(url).open_existing(url, reading=reading)
    if note is not None:
        click.echo(f"Warning: {note}", err=True)
    return engine


def names(revisions: str | Iterable[str] | None) -> str:
    if revisions is None:
        return ""
    return revisions if isinstance(revisions, str) else ", ".join(revisions)

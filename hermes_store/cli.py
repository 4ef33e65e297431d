"""The `hermes-store` command: thin click wrappers over the library."""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
from alembic.util import CommandError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import DBAPIError

from hermes_store import backfill, fts, migrate, server
from hermes_store.copy import copy_store
from hermes_store.demo import corpus as corpus_mod
from hermes_store.engine import (
    create_store_engine,
    db_path,
    display_url,
    is_server,
    make_private_dirs,
    read_only_opening,
    require_writable,
    resolve_url,
    side_files,
    sqlite_errors,
    translate_error,
    writable_problem,
)
from hermes_store.errors import (
    Interrupted,
    NotOnThisDatabase,
    StoreError,
    StoreNotFound,
    one_line,
)
from hermes_store.fts import CheckResult
from hermes_store.maintenance import RepairResult, check_store, repair, store_stats
from hermes_store.maintenance import optimize as optimize_store
from hermes_store.output import console, emit_json, emit_records, format_options, say
from hermes_store.progress import Phase, Report
from hermes_store.revisions import script_directory
from hermes_store.search import search_messages
from hermes_store.server_check import check_server, repair_server, search_index_states
from hermes_store.server_maintenance import optimize_server, server_stats
from hermes_store.server_storage import ServerStorageReport, server_storage_report
from hermes_store.storage import GROUPS, StorageReport, human_bytes, storage_report

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


def _interactive() -> bool:
    """Progress goes to stderr only when a person watches it."""
    return sys.stderr.isatty()


def _progress(enabled: bool) -> Callable[[str], None]:
    def step(message: str) -> None:
        if enabled:
            say(f"… {message}", err=True, style="dim")

    return step


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
    return url if is_server(url) else None


def refuse_on_server(db: str | None, what: str, why: str) -> None:
    """Refuse, in one line, a command or option that means something on SQLite only, saying
    why and what to do on a server instead (engine.require_sqlite's words are generic)."""
    if server_url(db) is not None:
        raise NotOnThisDatabase(f"{what} works on SQLite stores only: {why}. Nothing was changed")


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
    url, path = store_url(db, create_home=False)
    if is_server(url):
        return _open_server(url)
    if path is not None and not path.exists():
        raise StoreNotFound(
            f"{path}: no such store; nothing was created. Check --db / HERMES_STORE_URL, or "
            "start a new store with `hermes-store upgrade --create`"
        )
    state = migrate.inspect_file(path)
    if state.kind == "new":
        raise StoreNotFound(
            f"{path or url}: the database is empty, not a Hermes store yet; make it one with "
            "`hermes-store upgrade`"
        )
    problem = writable_problem(path) if path is not None else None
    if problem is None or path is None:
        return create_store_engine(url, create=False, wal=False)
    if not reading:
        require_writable(path)
    opening = read_only_opening(path, problem)
    click.echo(f"Warning: {opening.note}", err=True)
    return create_store_engine(url, create=False, wal=False, read_only=opening)


def _open_server(url: str) -> Engine:
    """An engine on a PostgreSQL database that holds a store (never creates anything)."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            revisions, version, _layout = server.facts(conn)
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


_emit = emit_json


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="hermes-store")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Say each step: -v shows hermes-store's and Alembic's progress lines, -vv debug.",
)
def main(verbose: int) -> None:
    """Operate a Hermes session store: upgrade, inspect, optimize, check and search it.

    Every command that writes waits up to the busy timeout for the agent's write lock
    ($HERMES_STORE_BUSY_TIMEOUT_MS). Reporting commands print a table, or --json, --nl
    (one JSON record per line) or --csv. Colour only on a terminal; NO_COLOR is honoured.

    \b
    Example:
      hermes-store --help
      hermes-store demo
      hermes-store -v upgrade --db ~/.hermes/state.db --backup ~/state-before.db
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    for name in ("hermes_store", "alembic"):
        logging.getLogger(name).setLevel(level)
    warnings.showwarning = _show_warning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A warning is one `Warning: ...` line on stderr, not a source location."""
    click.echo(f"Warning: {message}", err=True)


@main.command()
@db_option
@click.option(
    "--create",
    is_flag=True,
    help="Create a new, empty store when the file does not exist (otherwise refused).",
)
@click.option(
    "--app-version",
    type=int,
    default=None,
    metavar="N",
    help=f"Stop the relational schema at the application's schema N "
    f"({migrate.FIRST_LEGACY}-{migrate.LAST_LEGACY}; default: the newest), the one the agent "
    "you run writes. The search layout is converted either way.",
)
@click.option(
    "--revision",
    default=None,
    help="Run to this Alembic revision instead (advanced; see `hermes-store history`). "
    "A revision below the store's is refused: that is `hermes-store downgrade`.",
)
@click.option(
    "--rebuild-fts",
    is_flag=True,
    help="Re-index from the messages instead of converting the legacy index in place.",
)
@click.option(
    "--deferred-fts",
    is_flag=True,
    help="When an index must be rebuilt, swap the layout at once and leave the fill to "
    "`hermes-store optimize-storage` (large stores; a healthy store still converts in place).",
)
@backup_options
@json_option
def upgrade(
    db: str | None,
    create: bool,
    app_version: int | None,
    revision: str | None,
    rebuild_fts: bool,
    deferred_fts: bool,
    backup_to: Path | None,
    overwrite_backup: bool,
    as_json: bool,
) -> None:
    """Upgrade a store, adopting a legacy one first (--create: start a new one).

    The same as `alembic -x db=PATH upgrade head`. A store written by the Hermes agent
    (schema 17 to 30, never under Alembic) is adopted: missing columns and indexes of its
    version are added and the matching revision stamped. Then the application's schema
    steps run up to --app-version, and the search indexes move to external content (text
    stored once); `schema_version` always names the application schema the store has.
    With --backup, a consistent copy is taken before anything is changed (not for a new,
    empty store: there is nothing to copy). On a terminal each step shows as it runs.
    Interrupted (Ctrl-C), the step in progress is rolled back (every revision is a
    transaction of its own) and the message says what was done, what is left and the
    command that finishes it.

    \b
    Examples:
      hermes-store upgrade --db ~/.hermes/state.db --backup ~/state-before.db
      hermes-store upgrade --db ~/.hermes/state.db --app-version 21   # agent still at 21
      hermes-store upgrade --db /srv/hermes/new.db --create
      hermes-store upgrade --db postgresql+psycopg://hermes@db.internal/hermes
    """
    if overwrite_backup and backup_to is None:
        raise click.UsageError("--overwrite-backup only goes with --backup PATH")
    if revision is not None and (rebuild_fts or deferred_fts or app_version is not None):
        raise click.UsageError(
            "--revision runs one Alembic target as it is: it does not go with --app-version, "
            "--rebuild-fts or --deferred-fts"
        )
    x = {"fts_convert": "rebuild"} if rebuild_fts else {}
    if deferred_fts:
        x["fts_backfill"] = "deferred"
    with (
        operator_errors(),
        _interrupted_upgrade(db),
        _phases(_interactive() and not as_json) as show,
    ):
        store_url(db, create_home=False)
        _refuse_sqlite_upgrade_options(db, backup_to, rebuild_fts, deferred_fts)
        started = time.perf_counter()
        result = migrate.upgrade(
            db,
            revision,
            app_version=app_version,
            x=x,
            backup_to=backup_to,
            overwrite_backup=overwrite_backup,
            create=create,
            progress=show,
        )
        elapsed = time.perf_counter() - started
    if as_json:
        _emit({**result.as_dict(), "seconds": round(elapsed, 3)})
        return
    if result.before == result.after and not result.adopted and not result.healed:
        say(f"already at {result.to_revision}: nothing to do ({elapsed:.2f} s)")
    else:
        if result.from_revision is not None:
            origin = result.from_revision
        elif result.adopted is not None:
            origin = f"legacy schema {result.adopted} (unversioned)"
        else:
            origin = "(new store)"
        say(f"{origin} -> {result.to_revision} in {elapsed:.2f} s")
    say(
        f"application schema: {result.schema_before or '-'} -> {result.schema_after}; "
        f"search layout: {result.layout_before} -> {result.layout_after}"
    )
    if (rebuild_fts or deferred_fts) and result.layout_before == "external":
        say(
            "note: the search indexes were already external: --rebuild-fts / --deferred-fts "
            "had nothing to convert"
        )
    if result.restamped:
        say(
            "this store had been stamped 22 by an earlier hermes-store: its versions now say "
            "what it has"
        )
    if result.layout_after == "application":
        say(
            "search indexes: the Hermes application's own layout, left as it is "
            "(hermes-store search refuses it; use the agent's search)"
        )
    for item, why in result.healed.items():
        say(f"repaired {item} ({why})")
    if result.backup is not None:
        say(f"backup of the store as it was: {result.backup.path}")
    if result.pending_backfill:
        with operator_errors():
            engine = open_existing(db)
            with engine.connect() as conn:
                waiting = backfill_status(conn)
        for index, status in waiting.items():
            say(
                f"{index}: {status['rows_left']} rows left to index: run "
                "`hermes-store optimize-storage`"
            )


def _refuse_sqlite_upgrade_options(
    db: str | None, backup_to: Path | None, rebuild_fts: bool, deferred_fts: bool
) -> None:
    """On PostgreSQL: --backup copies a file, and there is no FTS5 index to convert."""
    if backup_to is not None:
        refuse_on_server(
            db, "--backup", "it copies the SQLite file; on PostgreSQL back up with pg_dump first"
        )
    if rebuild_fts or deferred_fts:
        refuse_on_server(
            db,
            "--rebuild-fts / --deferred-fts",
            "on PostgreSQL the search indexes are expression indexes the upgrade builds "
            "itself, without blocking writes",
        )


def _names(revisions: str | Iterable[str] | None) -> str:
    if revisions is None:
        return ""
    return revisions if isinstance(revisions, str) else ", ".join(revisions)


@contextlib.contextmanager
def _interrupted_upgrade(db: str | None) -> Iterator[None]:
    """Ctrl-C during a migration: say what was done and what is left (the library's own
    account, read from the store after the interrupt), exit 130."""
    try:
        with _interrupted():
            yield
    except KeyboardInterrupt:  # outside the library's own account (or a second Ctrl-C)
        where = "as it was"
        with contextlib.suppress(Exception):
            url, path = store_url(db, create_home=False)
            if is_server(url):
                where = f"at {_server_revision(url)}"
            elif path is not None and path.exists():
                state = migrate.inspect_file(path)
                where = (
                    f"at revision {state.revision}"
                    if state.revision
                    else f"at legacy schema {state.legacy_version} (unversioned)"
                    if state.legacy_version
                    else "empty"
                )
            else:
                where = "not created"
        click.echo(f"\ninterrupted: the store is {where}; see `hermes-store current`", err=True)
        sys.exit(130)


@contextlib.contextmanager
def _interrupted() -> Iterator[None]:
    """Ctrl-C during long work: the library's account of what was kept and what is left
    (an Interrupted), exit 130."""
    try:
        yield
    except Interrupted as exc:
        click.echo(f"\n{exc}", err=True)
        sys.exit(130)


class _TimeLeft(TimeRemainingColumn):
    """The time left, once the phase can be counted (nothing for a spinner)."""

    def render(self, task: Task) -> Text:
        return Text("") if task.total is None else Text.assemble("eta ", super().render(task))


@contextlib.contextmanager
def _phases(show: bool) -> Iterator[Report | None]:
    """Long work's phases on stderr when a person watches: a spinner with the phase and its
    elapsed time, a bar once it can be counted; None (nothing drawn) otherwise."""
    if not show:
        yield None
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=12),
        TextColumn("{task.fields[count]}"),
        TimeElapsedColumn(),
        _TimeLeft(),
    )
    # Only ever drawn for a terminal (see _interactive), so drawn as one.
    screen = Console(file=sys.stderr, force_terminal=True, highlight=False)
    with Progress(*columns, console=screen, transient=True) as bar:
        shown: dict[str, Any] = {}

        def report(phase: Phase) -> None:
            # One line per thing worked on: its description may change (a backfill goes
            # from indexing to merging and back), its elapsed time goes on.
            key = (phase.kind, phase.item or phase.label)
            # Room left for the spinner, the bar, the count and the times.
            label = _shorten(phase.label, max(20, screen.width - 48))
            if shown.get("key") != key:
                if "task" in shown:
                    bar.remove_task(shown["task"])
                shown.update(key=key, task=bar.add_task(label, total=None, count=""))
            if phase.done is not None and phase.total is not None:
                count = f"{phase.done:,}/{phase.total:,} {phase.unit}".strip()
                bar.update(
                    shown["task"],
                    description=label,
                    completed=phase.done,
                    total=phase.total,
                    count=count,
                )
            else:
                bar.update(shown["task"], description=label)
            bar.refresh()

        yield report


def _server_revision(url: str) -> str:
    """Where an interrupted upgrade left a PostgreSQL store, for the operator."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            revisions, _version, _layout = server.facts(conn)
    finally:
        engine.dispose()
    return f"revision {', '.join(revisions)}" if revisions else "nothing (an empty database)"


class _TakesRelativeRevision(click.Command):
    """A command whose REVISION may be `-1`, `-3`: read as the argument, not an option."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" not in args:
            relative = [arg for arg in args if re.fullmatch(r"-\d+", arg)]
            args = [arg for arg in args if arg not in relative] + (
                ["--", *relative] if relative else []
            )
        return super().parse_args(ctx, args)


@main.command(cls=_TakesRelativeRevision)
@click.argument("revision")
@db_option
@backup_options
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--i-know-this-deletes-data",
    "delete_data",
    is_flag=True,
    help="With `base`: allow dropping every table of a store that holds conversations.",
)
@json_option
def downgrade(
    revision: str,
    db: str | None,
    backup_to: Path | None,
    overwrite_backup: bool,
    yes: bool,
    delete_data: bool,
    as_json: bool,
) -> None:
    """Take a store back: REVISION is -N (N steps), an id from `hermes-store history`,
    an application version (17-30), fts@-1 (the search layout only) or base.

    One step is the newest revision of the store that changes it, in the order `upgrade`
    applies them (the application's schema versions, then the search layout): -1 from
    the head undoes the search layout (the merge revision above it changes nothing and
    goes with it), -1 again undoes 30, and so on. A revision id or version means what it
    means to Alembic: every revision that depends on it is undone (from the head, 21
    leaves 21 and fts1). Asks first, listing what each undone revision gives up, unless
    --yes. Each revision's downgrade runs in its own transaction. `base` (or every step)
    drops every table: on a store holding conversations it is refused unless --yes
    --i-know-this-deletes-data are both given. Take a --backup first.

    \b
    Examples:
      hermes-store downgrade -1 --db state.db --backup ~/state-before-downgrade.db
      hermes-store downgrade 21 --db state.db      # the application's schema 21
      hermes-store downgrade fts@-1 --db state.db --yes   # search indexes back to inline
    """
    if overwrite_backup and backup_to is None:
        raise click.UsageError("--overwrite-backup only goes with --backup PATH")
    if delete_data and not yes:
        raise click.UsageError("--i-know-this-deletes-data only counts together with --yes")
    with operator_errors():
        if backup_to is not None:
            refuse_on_server(
                db, "--backup", "it copies the SQLite file; on PostgreSQL back up with pg_dump"
            )
        open_existing(db).dispose()
        plan = migrate.plan_store_downgrade(db, revision)
        url, path = store_url(db, create_home=False)
        if not plan.undone:
            if as_json:
                _emit({"from": _names(plan.before), "to": _names(plan.after), "undone": []})
            else:
                say(f"already at {_names(plan.before) or 'base'}: nothing to undo")
            return
        if not yes:
            click.confirm(_downgrade_question(str(path or display_url(url)), plan), abort=True)
        with _interrupted_upgrade(db), _phases(_interactive() and not as_json) as show:
            start, end = migrate.downgrade(
                db,
                revision,
                backup_to=backup_to,
                overwrite_backup=overwrite_backup,
                delete_data=delete_data,
                expect=plan,
                progress=show,
            )
    if as_json:
        _emit(
            {
                "from": start,
                "to": end,
                "backup": str(backup_to) if backup_to else None,
                "undone": plan.describe(),
            }
        )
        return
    say(f"{start} -> {end or 'base'}")
    if backup_to is not None:
        say(f"backup of the store as it was: {backup_to.expanduser().absolute()}")


def _downgrade_question(store: str, plan: migrate.DowngradePlan) -> str:
    """The confirmation: from where to where, then each revision undone, newest first,
    with what it did and what undoing it gives up."""
    lines = [
        f"Downgrade {store} from {_names(plan.before) or 'base'} to "
        f"{_names(plan.after) or 'base'}? It undoes, newest first:"
    ]
    for step in plan.describe():
        lines.append(f"  {step['revision']}  {step['does'].rstrip('.')}. {step['undoing']}")
    lines.append("Go on?")
    return "\n".join(lines)


@main.command()
@click.argument("revision")
@db_option
@json_option
def stamp(revision: str, db: str | None, as_json: bool) -> None:
    """Record REVISION as the store's version without running anything.

    Refused unless the store really has the schema REVISION declares (schema_version,
    tables, columns, search layout): a stamp that lies makes the next upgrade skip or repeat
    steps. An unversioned store needs no stamp: `hermes-store upgrade` adopts it.

    \b
    Example:
      hermes-store stamp head --db restored-copy.db
    """
    with operator_errors():
        refuse_on_server(
            db,
            "stamp",
            "it checks a SQLite store's schema before recording a revision; a PostgreSQL "
            "database is only ever at a revision its upgrade ran",
        )
        open_existing(db).dispose()
        start, end = migrate.stamp(db, revision)
    if as_json:
        _emit({"from": start, "to": end})
    else:
        say(f"stamped {end} (was {start or 'unversioned'})")


@main.command()
@db_option
@format_options
def history(db: str | None, fmt: str) -> None:
    """List the revisions, newest first; with --db, mark the store's own.

    An unversioned (legacy) store is marked at the revision of its legacy schema version,
    the one `hermes-store upgrade` would adopt it at.

    \b
    Example:
      hermes-store history --db state.db
    """
    with operator_errors():
        current: set[str] = set()
        mark = "current"
        if db is not None or fmt == "text":
            with contextlib.suppress(StoreError):
                engine = open_existing(db, reading=True)
                with engine.connect() as conn:
                    current = set((migrate.current_revision(conn) or "").split(", ")) - {""}
                path = None if is_server(str(engine.url)) else db_path(str(engine.url))
                engine.dispose()
                state = migrate.inspect_file(path) if path is not None else None
                if not current and state is not None and state.legacy_version is not None:
                    current = {str(state.legacy_version)}
                    mark = (
                        f"unversioned, legacy schema {state.legacy_version} ~ revision "
                        f"{state.legacy_version}"
                    )
        records = [
            {
                "revision": script.revision,
                "down_revision": _names(script.down_revision),
                "branch": ", ".join(sorted(script.branch_labels)),
                "current": script.revision in current,
                "store": mark if script.revision in current else "",
                "head": script.is_head,
                "description": (script.doc or "").strip().splitlines()[0] if script.doc else "",
            }
            for script in script_directory().walk_revisions()
        ]
    shown = ["store"] if fmt == "text" else ["current", "store"]
    emit_records(
        fmt,
        records,
        ["revision", "down_revision", "branch", *shown, "description"],
        headers={"down_revision": "after"},
        styles={"revision": "bold"},
    )


def backfill_status(conn: Connection) -> dict[str, dict[str, Any]]:
    """Per index, what an unfinished deferred backfill still has to do.

    An index rebuilt beside its legacy table is listed under its own name, with the table
    it is built in (``"table": "messages_fts_next"``); a swapped-out legacy index whose
    pages are still being freed under its retired name.
    """
    status: dict[str, dict[str, Any]] = {}
    if fts.layout(conn) not in ("external", "staging"):  # nothing of ours to fill or drop
        items: list[backfill.Pending] = []
        filled: list[str] = []
    else:
        items, filled = backfill.pending(conn), backfill.merging(conn)
    for item in items:
        status[item.logical] = {
            "state": "filling",
            "high_water": item.high_water,
            "indexed_upto": item.indexed_upto,
            "rows_left": backfill.rows_left(conn, item),
        }
    for table in filled:
        status[fts.logical_index(table)] = {"state": "merging", "rows_left": 0}
    for index, table in fts.staged_indexes(conn).items():
        status.setdefault(index, {"state": "ready to swap in", "rows_left": 0})
        status[index]["table"] = table
    for table in fts.retired_indexes(conn):
        status[table] = {
            "state": "retired, being freed in steps (`hermes-store optimize` frees it)",
            "rows_left": backfill.retired_rows(conn, table),
        }
    if backfill.has_change_log(conn):  # see migrate.verify_ahead
        status["upgrade change log"] = {
            "state": "an upgrade is running or was interrupted; optimize, optimize-storage "
            "or the next upgrade removes it",
            "rows_left": 0,
        }
    return status


def _current(engine: Engine) -> dict[str, Any]:
    if is_server(str(engine.url)):
        return _current_on_server(engine)
    with engine.connect() as conn:
        revision = migrate.current_revision(conn)
        legacy = conn.exec_driver_sql("SELECT version FROM schema_version").scalar()
        return {
            "revision": revision,
            "legacy_schema": legacy,
            "head": migrate.head_revision(),
            "fts_layout": fts.layout(conn),
            "fts_indexes": {name: fts.index_layout(conn, name) for name in fts.INDEXES},
            "backfill": backfill_status(conn),
        }


def _current_on_server(engine: Engine) -> dict[str, Any]:
    """`current` on PostgreSQL: the same fields, and each search index's state."""
    with engine.connect() as conn:
        revisions, version, layout = server.facts(conn)
        states = search_index_states(conn)
    return {
        "database": display_url(engine.url.render_as_string(hide_password=False)),
        "revision": ", ".join(revisions) or None,
        "legacy_schema": version,
        "head": migrate.head_revision(),
        "fts_layout": layout,
        "fts_indexes": {
            name: layout if state != "missing" else "missing" for name, state in states.items()
        },
        "search_indexes": states,
        "backfill": {},
    }


@main.command()
@db_option
@format_options
def current(db: str | None, fmt: str) -> None:
    """Show the store's revision(s), application schema version and search layout.

    \b
    Example:
      hermes-store current --db state.db --json
    """
    with operator_errors():
        engine = open_existing(db, reading=True)
        info = _current(engine)
    record = {
        "revision": info["revision"] or "(unversioned legacy store)",
        "head": info["head"],
        "app_schema": info["legacy_schema"],
        "search_layout": info["fts_layout"],
    }
    records = [{"field": key, "value": value} for key, value in record.items()]
    for index, state in info.get("search_indexes", {}).items():
        records.append({"field": f"search index {index}", "value": state})
    for index, status in info["backfill"].items():
        records.append(
            {
                "field": f"backfill {index}",
                "value": f"{status['state']}, {status['rows_left']} rows left",
            }
        )
    if fmt in ("nl", "csv"):
        emit_records(fmt, [record], list(record))
        return
    emit_records(fmt, records, ["field", "value"], document=info, styles={"field": "bold"})


@main.command()
@db_option
@format_options
def stats(db: str | None, fmt: str) -> None:
    """Count sessions and messages, sessions per source, and the file size.

    \b
    Example:
      hermes-store stats --db state.db
    """
    with operator_errors():
        engine = open_existing(db, reading=True)
        if is_server(str(engine.url)):
            with engine.connect() as conn:
                on_server = server_stats(conn)
            engine.dispose()
            _print_server_stats(on_server.as_dict(), fmt)
            return
        with engine.connect() as conn:
            result = store_stats(conn, db_path(str(engine.url)))
    records: list[dict[str, Any]] = [
        {"what": "sessions", "count": result.sessions},
        {"what": "messages", "count": result.messages},
        *(
            {"what": f"sessions from {source}", "count": count}
            for source, count in result.sessions_by_source.items()
        ),
        {"what": "file bytes", "count": result.file_bytes},
        {"what": "WAL bytes", "count": result.wal_bytes},
    ]
    if fmt == "text":
        records[-2]["count"] = human_bytes(result.file_bytes)
        records[-1]["count"] = human_bytes(result.wal_bytes)
    emit_records(fmt, records, ["what", "count"], document=result.as_dict(), right=["count"])


def _print_server_stats(result: dict[str, Any], fmt: str) -> None:
    """`stats` of a PostgreSQL store: the same counts, and the database's size."""
    records: list[dict[str, Any]] = [
        {"what": "sessions", "count": result["sessions"]},
        {"what": "messages", "count": result["messages"]},
        *(
            {"what": f"sessions from {source}", "count": count}
            for source, count in result["sessions_by_source"].items()
        ),
        {"what": "database bytes", "count": result["database_bytes"]},
    ]
    if fmt == "text":
        records[-1]["count"] = human_bytes(result["database_bytes"])
    emit_records(fmt, records, ["what", "count"], document=result, right=["count"])


def render_storage(report: StorageReport) -> None:
    """The storage report as tables a person reads in a terminal."""
    total = report.file_bytes or 1
    rows: list[dict[str, Any]] = [
        {"group": group, "size": human_bytes(size), "share": f"{size / total:.1%}"}
        for group in GROUPS
        for size in [report.groups.get(group, 0)]
    ]
    rows.append({"group": "free pages", "size": human_bytes(report.free_bytes), "share": ""})
    rows.append({"group": "file", "size": human_bytes(report.file_bytes), "share": ""})
    emit_records(
        "text",
        rows,
        ["group", "size", "share"],
        title=f"layout: {report.layout}",
        right=["size", "share"],
    )
    if report.layout == "inline" and report.reclaimable_bytes:
        say(
            f"upgrading to external content would reclaim about "
            f"{human_bytes(report.reclaimable_bytes)} "
            f"({report.reclaimable_bytes / total:.0%}) after `hermes-store optimize --vacuum`"
        )
    biggest = sorted(report.objects.items(), key=lambda item: -item[1])[:15]
    emit_records(
        "text",
        [{"object": name, "size": human_bytes(size)} for name, size in biggest],
        ["object", "size"],
        right=["size"],
    )


def _print_server_storage(report: ServerStorageReport, fmt: str) -> None:
    """The storage report of a PostgreSQL store: groups, the text stored once, objects."""
    if fmt == "json":
        _emit(report.as_dict())
        return
    by_size = sorted(report.objects.items(), key=lambda item: (-item[1], item[0]))
    if fmt in ("nl", "csv"):
        records = [
            {"object": name, "kind": report.kinds[name], "bytes": size} for name, size in by_size
        ]
        emit_records(fmt, records, ["object", "kind", "bytes"])
        return
    total = report.total_bytes or 1
    rows: list[dict[str, Any]] = [
        {"group": group, "size": human_bytes(size), "share": f"{size / total:.1%}"}
        for group in GROUPS
        for size in [report.groups.get(group, 0)]
    ]
    rows.append({"group": "tables and indexes", "size": human_bytes(report.total_bytes)})
    rows.append({"group": "database", "size": human_bytes(report.database_bytes)})
    emit_records(
        "text",
        rows,
        ["group", "size", "share"],
        title=f"layout: {report.layout} (PostgreSQL database {report.database})",
        right=["size", "share"],
    )
    if report.text_stored_once:
        say(
            "message text stored once, in messages: no tsvector column, no copy table; "
            "search uses expression indexes over it"
        )
    else:
        found = [f"tsvector column {name}" for name in report.tsvector_columns]
        found += [f"table {name}" for name in report.other_tables]
        say(f"not only the store's tables here: {', '.join(found)}")
    for name in fts.INDEXES:
        size = report.search_indexes.get(name)
        say(f"search index {name}: {'missing' if size is None else human_bytes(size)}")
    emit_records(
        "text",
        [
            {"object": name, "kind": report.kinds[name], "size": human_bytes(size)}
            for name, size in by_size[:15]
        ],
        ["object", "kind", "size"],
        right=["size"],
    )


@main.command()
@db_option
@format_options
def storage(db: str | None, fmt: str) -> None:
    """Show where the bytes go: per table and index, grouped, from `dbstat`.

    Groups: message data, FTS index data, redundant FTS text copies (the inline
    `*_content` tables the upgrade removes), other. For an inline store it says how much
    the upgrade would reclaim. --nl and --csv give one record per table or index.
    On PostgreSQL: each table's bytes (heap and TOAST) and index's, the same groups, and
    whether the message text is stored once (no tsvector column, no copy table).

    \b
    Examples:
      hermes-store storage --db state.db
      hermes-store storage --db postgresql+psycopg://hermes@db/hermes --json
    """
    with operator_errors():
        engine = open_existing(db, reading=True)
        if is_server(str(engine.url)):
            with engine.connect() as conn:
                on_server = server_storage_report(conn)
            engine.dispose()
            _print_server_storage(on_server, fmt)
            return
        with engine.connect() as conn:
            report = storage_report(conn)
            waiting = backfill_status(conn)
    if fmt == "json":
        _emit({**report.as_dict(), "backfill": waiting})
        return
    if fmt in ("nl", "csv"):
        records = [
            {"object": name, "bytes": size}
            for name, size in sorted(report.objects.items(), key=lambda item: -item[1])
        ]
        emit_records(fmt, records, ["object", "bytes"])
        return
    render_storage(report)
    for index, status in waiting.items():
        say(f"backfill: {index} {status['state']}, {status['rows_left']} rows left")


@main.command()
@db_option
@click.option(
    "--vacuum",
    "full",
    is_flag=True,
    help="VACUUM too: returns every free page, but holds the write lock for its whole run "
    "(stop the agent or let it idle); switches the store to incremental auto-vacuum.",
)
@click.option("--no-vacuum", is_flag=True, help="Merge and checkpoint only.")
@json_option
def optimize(db: str | None, full: bool, no_vacuum: bool, as_json: bool) -> None:
    """Merge the FTS indexes, checkpoint the WAL and shrink the file; print what was reclaimed.

    By default every step is a short write transaction, with pauses between, so the agent
    keeps writing: the indexes are merged a few pages at a time, and free pages go back to
    the file system in steps when the store uses incremental auto-vacuum (a store that does
    not is told how much only `--vacuum` returns). `--vacuum` runs VACUUM, which holds the
    write lock throughout and needs about the file's size free in the store's directory and
    in the temp directory (refused otherwise). On PostgreSQL: VACUUM (ANALYZE) of each of
    the store's tables, which never locks out the agent.

    \b
    Examples:
      hermes-store optimize --db state.db
      hermes-store optimize --db state.db --vacuum     # with the agent stopped
      hermes-store optimize --db postgresql+psycopg://hermes@db/hermes --json
    """
    if full and no_vacuum:
        raise click.UsageError("--vacuum and --no-vacuum contradict each other: pick one")
    with operator_errors():
        if full or no_vacuum:
            refuse_on_server(
                db,
                "--vacuum / --no-vacuum",
                "on PostgreSQL optimize runs VACUUM (ANALYZE) and nothing else (VACUUM FULL, "
                "which locks out the agent, is the server's own tool)",
            )
        engine = open_existing(db)
        if is_server(str(engine.url)):
            try:
                on_server = optimize_server(engine)
            finally:
                engine.dispose()
            _print_server_optimize(on_server.as_dict(), as_json)
            return
        try:
            with _interrupted(), _phases(_interactive() and not as_json) as show:
                result = optimize_store(
                    engine, vacuum=True if full else False if no_vacuum else None, report=show
                )
        finally:
            engine.dispose()  # its pooled connections keep the -wal open, deleted or not
    if as_json:
        _emit(result.as_dict())
    else:
        say(
            f"{human_bytes(result.bytes_before)} -> {human_bytes(result.bytes_after)} "
            f"(reclaimed {human_bytes(result.reclaimed)}; merged {len(result.indexes)} "
            f"index(es); longest write lock {result.longest_write_lock_s:.2f} s)"
        )
        for leftover in result.removed_partials:
            say(f"removed {leftover}, left by an interrupted backup")
        if result.vacuum_needed_bytes:
            say(
                f"{human_bytes(result.vacuum_needed_bytes)} of free pages can only be returned "
                "by `hermes-store optimize --vacuum`, which holds the write lock for its whole "
                "run (run it with the agent stopped); it also switches the store to "
                "incremental auto-vacuum, after which this command returns them in steps"
            )
        if not result.wal_truncated:
            say(
                "the WAL was not truncated: a reader stayed open (the agent, a search, a "
                "backup); its size is counted above and it shrinks at a later checkpoint"
            )


def _print_server_optimize(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _emit(result)
        return
    say(
        f"VACUUM (ANALYZE) of {len(result['tables'])} tables: "
        f"{human_bytes(result['bytes_before'])} -> {human_bytes(result['bytes_after'])} "
        f"(reclaimed {human_bytes(result['reclaimed'])}); dead rows made reusable and the "
        "planner's statistics refreshed"
    )


@main.command("optimize-storage")
@db_option
@click.option(
    "--chunk-rows",
    default=backfill.DEFAULT_CHUNK_ROWS,
    show_default=True,
    type=click.IntRange(1),
    help="At most this many messages per transaction.",
)
@click.option(
    "--max-lock-ms",
    default=backfill.DEFAULT_MAX_LOCK_MS,
    show_default=True,
    type=click.FloatRange(1),
    help="Aim to hold the write lock at most this long per transaction.",
)
@click.option(
    "--duty",
    default=backfill.DEFAULT_DUTY,
    show_default=True,
    type=click.FloatRange(0.01, 1.0),
    help="Share of time spent holding the lock; the rest is left to other writers.",
)
@json_option
def optimize_storage(
    db: str | None, chunk_rows: int, max_lock_ms: float, duty: float, as_json: bool
) -> None:
    """Finish a deferred index build in short transactions, resumably.

    After `hermes-store upgrade --deferred-fts` (or `check --repair` on a large store)
    the indexes are filled here, a chunk at a time, each chunk in its own short
    transaction, pausing between chunks so the agent keeps writing. Search covers every
    message meanwhile. Safe to interrupt (Ctrl-C, kill) and to run again: it resumes.

    \b
    Example:
      hermes-store optimize-storage --db state.db --max-lock-ms 50
    """
    show = _interactive() and not as_json
    with operator_errors():
        refuse_on_server(
            db,
            "optimize-storage",
            "it finishes a deferred FTS5 index build; on PostgreSQL the upgrade builds the "
            "search indexes itself",
        )
        engine = open_existing(db)
        with engine.connect() as conn:
            if not backfill_status(conn):
                if as_json:
                    _emit(
                        {
                            "rows_done": 0,
                            "chunks": 0,
                            "status": "nothing to do",
                            "longest_write_lock_s": 0.0,
                        }
                    )
                else:
                    click.echo("no deferred index build is pending: nothing to do")
                return
        path = db_path(str(engine.url))
        require_writable(path)
        with _interrupted(), sqlite_errors(path), _backfill_bar(show) as bar:
            report = backfill.run(
                engine, chunk_rows=chunk_rows, max_lock_ms=max_lock_ms, duty=duty, progress=bar
            )
    result = {
        "rows_done": report.rows_done,
        "chunks": report.chunks,
        "lock_seconds": round(report.lock_seconds, 3),
        "longest_lock_ms": round(report.longest_lock * 1000, 1),
        "longest_write_lock_s": round(report.longest_lock, 3),
        "paused_seconds": round(report.paused_seconds, 3),
        "checkpoint_seconds": round(report.checkpoint_seconds, 3),
        "status": "done",
    }
    if as_json:
        _emit(result)
    else:
        say(
            f"indexed {report.rows_done} rows in {report.chunks} transactions; longest lock "
            f"{result['longest_lock_ms']} ms, {report.lock_seconds:.1f} s locked in all"
        )


@contextlib.contextmanager
def _rows_bar(show: bool, label: str) -> Iterator[Callable[[int, int | None, str], None]]:
    """A rich progress bar of rows with an ETA on stderr, when it is a terminal; it yields
    ``draw(rows_done, rows_total, description)``."""
    if not show:
        yield lambda _done, _total, _description: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def draw(done: int, total: int | None, description: str) -> None:
            bar.update(task, description=description, completed=done, total=total or None)

        yield draw


@contextlib.contextmanager
def _backfill_bar(show: bool) -> Iterator[Callable[[backfill.BackfillProgress], None]]:
    """The backfill's progress as a bar of rows."""
    with _phases(show) as report:
        if report is None:
            yield lambda _progress: None
            return
        draw = report

        def step(progress: backfill.BackfillProgress) -> None:
            counted = progress.phase.startswith("indexing") and progress.rows_total > 0
            done, total = (progress.rows_done, progress.rows_total) if counted else (None, None)
            draw(Phase("fill", progress.phase, done, total, "rows", item="backfill"))

        yield step


@main.command()
@db_option
@click.option(
    "--quick",
    is_flag=True,
    help="PRAGMA quick_check instead of integrity_check (PostgreSQL: no amcheck pass).",
)
@click.option(
    "--repair",
    "repair_",
    is_flag=True,
    help="Restore the search mechanism and rebuild every FTS index whose check fails "
    "(after a backup), then check again.",
)
@click.option(
    "--backup",
    "backup_to",
    metavar="PATH",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --repair: where the backup goes (default <store>.repair-<time>.bak).",
)
@click.option(
    "--deferred",
    is_flag=True,
    help="With --repair: empty the broken indexes and refill them in short, resumable "
    "transactions (large stores; external layout only).",
)
@format_options
def check(
    db: str | None,
    quick: bool,
    repair_: bool,
    backup_to: Path | None,
    deferred: bool,
    fmt: str,
) -> None:
    """Run PRAGMA integrity_check, the schema, search mechanism and FTS5 checks; exit 1
    when broken.

    Every index and trigger the store's revisions declare, and the search mechanism (the
    view and the six triggers that keep the indexes in step with the messages), are
    compared with the revisions: each one missing, re-created by the Hermes application's
    FTS recovery with its inline-layout body, or otherwise different is named. So is each
    FTS5 index that fails its check (a missing shadow table by name), and each message
    whose text is not UTF-8 (by id, never by its text). With --repair (after a consistent
    backup of the store) the objects are created again, every FTS index they fed or whose
    check fails is dropped, declared again and rebuilt from what it indexes, in one
    transaction (one per index on a legacy inline store), and the checks run again: exit
    0 only when they pass. Damage that PRAGMA integrity_check reports is not repaired,
    nor are messages that are not UTF-8.

    On PostgreSQL: every index of the store valid and ready, every index and trigger the
    revisions declare present, the search extensions, functions and indexes exactly as the
    fts1 revision creates them, and each B-tree index verified by amcheck when the
    extension is installed (--quick: not). --repair rebuilds an invalid index (REINDEX
    INDEX CONCURRENTLY) and re-creates a missing or different object from its revision,
    without blocking writes.

    \b
    Example:
      hermes-store check --db state.db
      hermes-store check --db state.db --repair --backup /safe/state-before-repair.db
      hermes-store check --db postgresql+psycopg://hermes@db/hermes --repair
    """
    if (backup_to is not None or deferred) and not repair_:
        raise click.UsageError("--backup and --deferred only go with --repair")
    with operator_errors():
        if backup_to is not None or deferred:
            refuse_on_server(
                db,
                "--backup / --deferred",
                "on PostgreSQL back up with pg_dump, and a repair rebuilds indexes "
                "CONCURRENTLY, without blocking writes",
            )
        engine = open_existing(db, reading=not repair_)
        if is_server(str(engine.url)):
            try:
                if repair_:
                    repaired = repair_server(engine, quick=quick)
                    result = repaired.after
                else:
                    with engine.connect() as conn:
                        result = check_server(conn, quick=quick)
            finally:
                engine.dispose()
        elif repair_:
            try:
                with _backfill_bar(_interactive() and fmt == "text") as bar:
                    repaired = repair(
                        engine,
                        backup_to=backup_to.expanduser().absolute() if backup_to else None,
                        deferred=deferred,
                        quick=quick,
                        progress=bar,
                    )
            except KeyboardInterrupt:
                click.echo(
                    "\ninterrupted: finished chunks are kept and search stays complete; "
                    "finish with `hermes-store optimize-storage`"
                    if deferred
                    else "\ninterrupted: the rebuild in progress was rolled back; run again",
                    err=True,
                )
                sys.exit(130)
            result = repaired.after
        else:
            with engine.connect() as conn:
                result = check_store(conn, quick=quick)
    if fmt == "json":
        payload: dict[str, Any] = {
            "ok": result.ok,
            "checked": result.checked,
            "problems": result.problems,
            "skipped": result.skipped,
            "fts_checked_on": result.fts_checked_on,
            "longest_write_lock_s": round(
                max(result.longest_write_lock_s, repaired.longest_write_lock_s)
                if repair_
                else result.longest_write_lock_s,
                3,
            ),
        }
        if repair_:
            payload["repair"] = repaired.as_dict()
        _emit(payload)
    elif fmt in ("nl", "csv"):
        emit_records(fmt, _check_records(result), ["item", "status", "detail"])
    else:
        if repair_:
            _print_repair(repaired)
        emit_records(
            "text",
            _check_records(result),
            ["item", "status", "detail"],
            headers={"detail": ""},
            styles={"status": "bold"},
        )
    if repair_ and repaired.refused:
        click.echo(f"not repaired: {repaired.refused}", err=True)
    if not result.ok:
        if fmt == "text":
            # Objects broken the same way share one cause: "a, b (cause); c (other cause)".
            causes: dict[str, list[str]] = {}
            for name, problem in result.problems.items():
                causes.setdefault(problem, []).append(name)
            summary = "; ".join(
                f"{', '.join(names)} ({_shorten(problem)})" for problem, names in causes.items()
            )
            click.echo(f"broken: {summary}", err=True)
        sys.exit(1)


def _check_records(result: CheckResult) -> list[dict[str, str]]:
    """One record per check: the PRAGMA, each index, and each wrong mechanism object."""
    # The search mechanism's objects are listed only when wrong ("trigger messages_fts_delete").
    mechanism = [item for item in result.problems if item != "database"]
    mechanism = [item for item in mechanism if item not in result.checked]
    records = []
    for item in result.checked:
        # The PRAGMA's problems are filed under "database".
        problem = result.problems.get("database" if item.startswith("PRAGMA") else item)
        records.append(
            {"item": item, "status": "BROKEN" if problem else "ok", "detail": problem or ""}
        )
    for item in mechanism:
        records.append({"item": item, "status": "BROKEN", "detail": result.problems[item]})
    for item, reason in result.skipped.items():
        records.append({"item": item, "status": "not checked", "detail": reason})
    return records


def _print_repair(repaired: RepairResult) -> None:
    if not repaired.before.problems:
        say("nothing to repair: every check passed")
        return
    if repaired.backup is not None:
        say(f"backup of the store before the repair: {repaired.backup}")
    records = [
        {"item": item, "done": f"restored from this package's definition (it was: {was})"}
        for item, was in repaired.restored.items()
    ]
    records += [
        {"item": index, "done": f"repaired: {how}"} for index, how in repaired.repaired.items()
    ]
    records += [
        {"item": item, "done": f"not repaired: {why}"}
        for item, why in repaired.not_repaired.items()
    ]
    if records:
        emit_records("text", records, ["item", "done"], headers={"done": ""})
        say("checks after the repair:")


def _shorten(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _highlighted(snippet: str) -> Text:
    """The snippet with the contract's >>> <<< markers shown as emphasis (colour on a
    terminal; the markers themselves are not printed)."""
    text = Text()
    for number, part in enumerate(snippet.replace("<<<", ">>>").split(">>>")):
        text.append(part, style="bold yellow" if number % 2 else "")
    return text


@contextlib.contextmanager
def _degraded_said_once() -> Iterator[None]:
    """Keep the library's warning of a degraded search off stderr: `search` says it itself."""
    logger = logging.getLogger(search_messages.__module__)

    def quiet(record: logging.LogRecord) -> bool:
        return record.levelno != logging.WARNING

    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@main.command()
@click.argument("query")
@db_option
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option(
    "--offset", default=0, type=click.IntRange(0, 1_000_000_000), help="Skip this many hits."
)
@click.option("--source", "sources", multiple=True, help="Only these sources (repeatable).")
@click.option("--role", "roles", multiple=True, help="Only these roles (repeatable).")
@click.option(
    "--sort",
    type=click.Choice(["rank", "newest", "oldest"], case_sensitive=False),
    default="rank",
    show_default=True,
)
@click.option("--include-inactive", is_flag=True, help="Also rewound messages.")
@format_options
def search(
    query: str,
    db: str | None,
    limit: int,
    offset: int,
    sources: tuple[str, ...],
    roles: tuple[str, ...],
    sort: str,
    include_inactive: bool,
    fmt: str,
) -> None:
    """Search messages the way the agent's session_search does.

    QUERY uses the agent's syntax (SQLite's FTS5, as the agent sanitises it):

    \b
      docker compose       both words, anywhere in a message (word order free)
      "docker compose"     "phrases": the words side by side, in this order
      dock*                prefix*: any word that starts with dock
      docker OR podman     AND, OR, NOT between two terms, upper case;
      docker NOT compose   docker without compose (NOT binds tighter than AND,
                           AND tighter than OR)
      NEAR                 is a plain word here: the parentheses of NEAR(...)
                           are removed, as are + { } ( ) : ^ outside quotes
      chat-send, P2.2      words joined by - . _ are searched as a phrase
      数据库               CJK: words of three characters or more are found
                           as substrings (the trigram index); shorter ones by
                           a scan that also finds rewound messages, newest
                           first (as the agent does)

    A query the index does not understand (`docker AND NOT compose`, `-docker`, a
    character such as ? or # outside quotes) is not understood: the command says why on
    stderr and exits 1 (the agent gets no hits for it). Put such a word in double quotes
    ("-docker", "C#"). A query that starts with "-" goes after `--`, or click takes it
    for an option.

    \b
    Examples:
      hermes-store search "docker compose" --source telegram --limit 5
      hermes-store search --db state.db -- '"-docker"'
    """
    with operator_errors(), _degraded_said_once():
        engine = open_existing(db, reading=True)
        with engine.connect() as conn:
            hits = search_messages(
                conn,
                query,
                source_filter=list(sources) or None,
                role_filter=list(roles) or None,
                limit=limit,
                offset=offset,
                sort=None if sort == "rank" else sort,
                include_inactive=include_inactive,
            )
    if hits.degraded:
        click.echo(f"Warning: {hits.degraded}", err=True)
    if hits.query_error:  # the library's answer is no hits: say why, and fail
        raise click.ClickException(hits.query_error)
    if fmt != "text":
        columns = ["id", "session_id", "source", "role", "timestamp", "snippet"]
        emit_records(fmt, hits, columns, document=list(hits))
        return
    out = console()
    for hit in hits:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(hit["timestamp"]))
        out.print(
            Text(f"#{hit['id']} {hit['source']} {hit['role']} {when} session {hit['session_id']}")
        )
        snippet = " ".join((hit["snippet"] or "").split())
        out.print(Text("    ") + _highlighted(snippet))
    if not hits:
        click.echo("no matches", err=True)


DEMO_QUERIES = ("error", "import json", "TODO: fix", "def*", "terminal OR docker", "数据库")
#: The corpus is generated in memory before it is written: a bound that stays a demo.
DEMO_MAX_MESSAGES = 1_000_000


@main.command()
@click.option(
    "--messages",
    "n_messages",
    default=5000,
    show_default=True,
    type=click.IntRange(1, DEMO_MAX_MESSAGES),
)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write demo.db (default: a new temporary directory). It is kept, and the "
    "last line says how to remove it.",
)
@click.option("--seed", default=0, show_default=True, help="Corpus seed.")
@click.option(
    "--db",
    "db",
    metavar="URL",
    default=None,
    help="Also copy the upgraded store into this empty PostgreSQL database "
    "(postgresql+psycopg://...) and compare the searches on both.",
)
def demo(n_messages: int, directory: Path | None, seed: int, db: str | None) -> None:
    """Build a realistic legacy store, upgrade it, optimize it and compare search results.

    Generates a schema-30 store in the legacy inline layout (never under Alembic), runs
    the real upgrade (adoption, then in-place conversion), `optimize`, and prints the
    storage report before and after and a few searches, each compared hit for hit (every
    hit, snippets included) before and after. With --db URL (an empty PostgreSQL
    database) the upgraded store is then copied into it at head, its storage report
    shown, and the same searches compared on both databases (every hit's id). The store
    is kept: the last line says where, and how to remove it. A failed demo removes what
    it wrote.

    \b
    Examples:
      hermes-store demo --messages 20000 --dir /tmp/hermes-demo
      hermes-store demo --db postgresql+psycopg://hermes@localhost/hermes_demo
    """
    with operator_errors():
        target = _demo_target(db)
        made, path = _demo_files(directory)
        try:
            run_demo(n_messages, path, seed)
            if target is not None:
                run_demo_on_server(path, target)
        except BaseException:
            _remove_demo(made, path)
            raise
    say(f"\n{_demo_files_line(made, path)}", style="bold")


def _demo_files(directory: Path | None) -> tuple[Path | None, Path]:
    """Where the demo writes: ``(the directory it makes, or None, demo.db's path)``.

    Without --dir, a new temporary directory; a --dir that does not exist is made (with
    its missing parents, 0700), and the top-most directory made is returned.
    """
    if directory is None:
        made = Path(tempfile.mkdtemp(prefix="hermes-demo-"))
        return made, made / "demo.db"
    directory = directory.expanduser().absolute()
    top: Path | None = None
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            break
        top = candidate
    path = directory / "demo.db"
    if path.exists():
        raise click.ClickException(f"{path} exists; pass another --dir or remove it")
    if top is not None:
        make_private_dirs(directory)
    return top, path


def _remove_demo(made: Path | None, path: Path) -> None:
    """A failed demo leaves nothing: the directory it made, or its own demo.db files."""
    import shutil

    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    for name in (path, *side_files(path)):
        with contextlib.suppress(FileNotFoundError):
            name.unlink()


def _demo_files_line(made: Path | None, path: Path) -> str:
    """Where the demo's store is, its size, and the command that removes what it wrote."""
    import shlex

    size = sum(name.stat().st_size for name in (path, *side_files(path)) if name.exists())
    removal = (
        f"rm -r {shlex.quote(str(made))}" if made is not None else (f"rm {shlex.quote(str(path))}")
    )
    return f"== the demo store is kept: {path} ({human_bytes(size)}); remove it with `{removal}`"


def _demo_target(db: str | None) -> str | None:
    """The PostgreSQL database the demo copies into: given explicitly, and empty."""
    if db is None:
        return None
    url = server_url(db)
    if url is None:
        raise NotOnThisDatabase(
            "demo --db takes a PostgreSQL URL (postgresql+psycopg://...); the SQLite demo "
            "store is written to --dir"
        )
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            tables = sorted(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    if tables:
        raise StoreError(
            f"{display_url(url)} already holds tables ({', '.join(tables[:5])}"
            f"{', ...' if len(tables) > 5 else ''}); the demo writes into an empty database "
            "only. Nothing was changed"
        )
    return url


def run_demo_on_server(path: Path, url: str) -> None:
    """The demo's PostgreSQL part: copy the store into the empty database, compare."""
    step = _progress(_interactive())
    step(f"copying the upgraded store into {display_url(url)} (hermes-store copy)")
    # The demo compares the searches itself, on every demo query: no sample-search check.
    copied = copy_store(str(path), url, verify=False).rows
    engine = create_store_engine(url, create=False)
    try:
        optimize_server(engine)  # the planner's statistics, as an operator would
        with engine.connect() as conn:
            report = server_storage_report(conn)
        say(
            f"\n== copied into PostgreSQL ({display_url(url)}): {copied.get('sessions', 0)} "
            f"sessions, {copied.get('messages', 0)} messages",
            style="bold",
        )
        _print_server_storage(report, "text")
        with engine.connect() as conn:
            server_hits = {q: _demo_search(conn, q) for q in DEMO_QUERIES}
    finally:
        engine.dispose()
    sqlite_engine = create_store_engine(str(path), create=False)
    try:
        with sqlite_engine.connect() as conn:
            sqlite_hits = {q: _demo_search(conn, q) for q in DEMO_QUERIES}
    finally:
        sqlite_engine.dispose()
    records = [
        {
            "query": query,
            "sqlite": len(sqlite_hits[query]),
            "postgresql": len(server_hits[query]),
            "result": "same messages" if sqlite_hits[query] == server_hits[query] else "DIFFERENT",
        }
        for query in DEMO_QUERIES
    ]
    emit_records(
        "text",
        records,
        ["query", "sqlite", "postgresql", "result"],
        title="\n== the same searches on SQLite and PostgreSQL (every hit)",
        right=["sqlite", "postgresql"],
    )
    different = [record["query"] for record in records if record["result"] != "same messages"]
    if different:
        raise click.ClickException(
            f"PostgreSQL finds other messages than SQLite for {', '.join(map(repr, different))}"
        )


def _demo_search(conn: Connection, query: str) -> list[int]:
    """The ids of every hit of a query, newest first (rank order differs between the two
    databases, the hit set does not)."""
    return [hit["id"] for hit in search_messages(conn, query, limit=-1, sort="newest")]


def run_demo(n_messages: int, path: Path, seed: int) -> None:
    """The demo's steps (see `demo`), writing the store at ``path`` (which must not exist)."""
    step = _progress(_interactive())
    step(f"generating {n_messages} messages (seed {seed})")
    data = corpus_mod.generate(n_messages, seed)
    step("writing a legacy schema-30 store (inline FTS5, as the Hermes agent leaves it)")
    migrate.upgrade(str(path), "30")
    with contextlib.closing(sqlite3.connect(path)) as raw:
        corpus_mod.populate(raw, data)
        # A store the legacy application wrote was never under Alembic.
        raw.execute("DROP TABLE alembic_version")
        raw.commit()
    engine = create_store_engine(str(path))
    with engine.connect() as conn:
        before = storage_report(conn)
        before_hits = {q: _every_hit(conn, q) for q in DEMO_QUERIES}
    say(f"\n== legacy store: {path}", style="bold")
    render_storage(before)
    step("upgrading (adopt, then convert in place)")
    started = time.perf_counter()
    upgrade_result = migrate.upgrade(str(path))
    upgraded = time.perf_counter() - started
    step("optimizing (merge, checkpoint, VACUUM)")
    result = optimize_store(engine, vacuum=True, progress=step)
    with engine.connect() as conn:
        after = storage_report(conn)
        after_hits = {q: _every_hit(conn, q) for q in DEMO_QUERIES}
    engine.dispose()
    say(
        f"\n== upgraded {upgrade_result.from_revision or '(unversioned)'} -> "
        f"{upgrade_result.to_revision} in {upgraded:.2f} s; "
        f"optimize: {human_bytes(result.bytes_before)} -> {human_bytes(result.bytes_after)}",
        style="bold",
    )
    render_storage(after)
    ratio = after.file_bytes / before.file_bytes if before.file_bytes else 1.0
    say(
        f"\n== size: {human_bytes(before.file_bytes)} -> {human_bytes(after.file_bytes)} "
        f"({ratio:.3f}x)\n",
        style="bold",
    )
    records = [
        {
            "query": query,
            "hits": len(after_hits[query]),
            "result": "identical" if before_hits[query] == after_hits[query] else "DIFFERENT",
        }
        for query in DEMO_QUERIES
    ]
    emit_records(
        "text",
        records,
        ["query", "hits", "result"],
        title="== searches before and after the upgrade (every hit, in order, snippets included)",
        right=["hits"],
    )
    for record in records:
        if record["result"] != "identical":
            raise click.ClickException(f"search results differ for {record['query']!r}")


def _every_hit(conn: Connection, query: str) -> list[Any]:
    """Every hit of a query, in rank order (a negative limit is no limit)."""
    return list(search_messages(conn, query, limit=-1))


# --------------------------------------------------------------------------------------
# copy: a whole store to another database (hermes_store.copy)
# --------------------------------------------------------------------------------------


#: What each step of the copy counts, for its progress bar.
_COPY_UNITS = {"searching": "searches"}


@contextlib.contextmanager
def _copy_bar(show: bool) -> Iterator[Callable[[Any], None]]:
    """The copy's progress on stderr (a terminal only): comparing both sides, copying,
    deleting, then the verification's checksums and sample searches, each with its bar."""
    if not show:
        yield lambda _progress: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        tasks: dict[str, Any] = {}

        def draw(progress: Any) -> None:
            step = progress.step
            description = step if step == "searching" else f"{step} {progress.table}"
            total = progress.total or None
            if step not in tasks:
                for other in tasks.values():  # one bar at a time: the earlier steps are done
                    bar.update(other, visible=False)
                unit = _COPY_UNITS.get(step, "rows")
                tasks[step] = bar.add_task(description, total=total, unit=unit)
                bar.refresh()  # each step shows, however short
            bar.update(tasks[step], description=description, completed=progress.rows, total=total)

        yield draw


@main.command("copy")
@click.option("--from", "source", metavar="PATH_OR_URL", required=True, help="Store to copy.")
@click.option(
    "--to", "target", metavar="PATH_OR_URL", required=True, help="Database to fill, or to update."
)
@click.option(
    "--append", is_flag=True, help="Add to a target that holds data; colliding keys refused."
)
@click.option(
    "--restart",
    is_flag=True,
    help="Make a target holding a copy of another store (or of another file at the same "
    "path) a copy of --from: the rows --from does not hold are deleted.",
)
@click.option("--batch-rows", default=2000, show_default=True, type=click.IntRange(1, 100_000))
@json_option
def copy_command(
    source: str, target: str, append: bool, restart: bool, batch_rows: int, as_json: bool
) -> None:
    """Copy a whole store to another database (SQLite <-> PostgreSQL), then verify it.

    Ids are kept; the source is only read. Run again, the same command writes only what
    differs: after Ctrl-C or a kill it finishes the copy, after the source changed it
    brings the target up to date (rows added, edited and deleted). To move a live agent's
    store, copy while it runs, then stop it and run the same command once more. The
    target is brought to the source's revision first. The verification compares row
    counts and a checksum of every table and the hits of sample searches chosen from the
    source's text; any difference, or anything it could not compare, exits 1.

    \b
    Examples:
      hermes-store copy --from ~/.hermes/state.db --to postgresql://hermes@db/hermes
      hermes-store copy --from postgresql://hermes@db/hermes --to back.db --json
    """
    from hermes_store.copy import copy_store

    try:
        with operator_errors(), _copy_bar(_interactive() and not as_json) as draw:
            result = copy_store(
                source,
                target,
                append=append,
                restart=restart,
                batch_rows=batch_rows,
                progress=draw,
            )
    except KeyboardInterrupt:
        raise click.ClickException(
            "interrupted; every committed batch is kept: run the same command again to resume"
        ) from None
    verification = result.verification
    if as_json:
        _emit(result.as_dict())
    else:
        _print_copy(result)
    if not verification.ok:
        sys.exit(1)


def _copy_summary(result: Any) -> str:
    """What this run wrote, in a few words."""
    if result.already_complete:
        return "already complete and nothing changed since, verified again"
    changes = result.changes.values()
    inserted = sum(change["inserted"] for change in changes)
    updated = sum(change["updated"] for change in changes)
    deleted = sum(change["deleted"] for change in changes)
    done = f"{inserted} rows copied"
    if updated or deleted:
        done += f", {updated} updated, {deleted} deleted"
    return f"resumed, {done}" if result.resumed else done


def _print_copy(result: Any) -> None:
    """The copy's result and its verification, as tables for a person."""
    verification = result.verification
    say(f"{result.source} -> {result.target}: {_copy_summary(result)} in {result.seconds:.1f} s")
    records = [
        {
            "table": check.table,
            "source rows": check.source_rows,
            "target rows": check.target_rows,
            "checksum": "equal" if check.equal else "DIFFERENT",
        }
        for check in verification.tables
    ]
    emit_records(
        "text",
        records,
        ["table", "source rows", "target rows", "checksum"],
        right=["source rows", "target rows"],
    )
    source_rev, target_rev = verification.revisions
    say(f"revision: source {', '.join(source_rev)}, target {', '.join(target_rev)}")
    for key, (mine, theirs) in verification.markers.items():
        say(f"{key}: source {mine!r}, target {theirs!r} (each database's own, not copied)")
    # The sample searches' words come from messages: they are named by number and by how
    # they were chosen, never shown.
    for search in verification.searches:
        state = "equal" if search.equal else "DIFFERENT"
        say(
            f"sample search {search.number} ({search.how}): "
            f"{search.source_hits} / {search.target_hits} hits, {state}"
        )
    if verification.no_searches:
        say(f"no sample search: {verification.no_searches}")
    for item in verification.not_checked:
        say(f"not checked: {item}")
    if result.source_changed:
        say(
            "the source changed while this ran: the target is a copy of it as it was when "
            "the run began. Stop the agent and run the same command again (it writes only "
            "what changed)",
            style="yellow",
        )
    say(
        "verification passed" if verification.ok else "verification FAILED",
        style="green" if verification.ok else "bold red",
    )


if __name__ == "__main__":
    main(prog_name="hermes-store")

"""The `hermes-store` command: thin click wrappers over the library."""

from __future__ import annotations

import contextlib
import json
import logging
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
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from hermes_store import backfill, fts, migrate
from hermes_store import corpus as corpus_mod
from hermes_store.engine import (
    create_store_engine,
    db_path,
    require_writable,
    resolve_url,
    sqlite_errors,
    translate_error,
)
from hermes_store.errors import StoreError, StoreNotFound
from hermes_store.fts import CheckResult
from hermes_store.maintenance import RepairResult, check_store, repair, store_stats
from hermes_store.maintenance import optimize as optimize_store
from hermes_store.search import search_messages
from hermes_store.storage import GROUPS, StorageReport, human_bytes, storage_report

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = (
    "Store file or SQLAlchemy URL. Default: $HERMES_STORE_URL, else $HERMES_HOME/state.db "
    "(HERMES_HOME defaults to ~/.hermes)."
)


def db_option(func: F) -> F:
    """The --db option every command takes."""
    return click.option("--db", "db", metavar="PATH_OR_URL", default=None, help=DB_HELP)(func)


def json_option(func: F) -> F:
    """The --json option of reporting commands."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(func)


def _interactive() -> bool:
    """Progress goes to stderr only when a person watches it."""
    return sys.stderr.isatty()


def _color_stdout() -> bool:
    """Highlight search hits only when stdout is a terminal."""
    return sys.stdout.isatty()


def _progress(enabled: bool) -> Callable[[str], None]:
    def say(message: str) -> None:
        if enabled:
            click.echo(f"… {message}", err=True)

    return say


@contextlib.contextmanager
def operator_errors() -> Iterator[None]:
    """Turn every expected failure into a one-line message and a non-zero exit."""
    try:
        yield
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    except CommandError as exc:
        raise click.ClickException(str(exc)) from None
    except (DBAPIError, sqlite3.Error, OSError) as exc:
        translated = translate_error(exc)
        if translated is not None:
            raise click.ClickException(str(translated)) from None
        if isinstance(exc, OSError):
            raise click.ClickException(
                f"{exc.strerror or exc}: {exc.filename or ''}".strip()
            ) from None
        detail = str(getattr(exc, "orig", exc))
        if "not a database" in detail or "malformed" in detail:
            raise click.ClickException(
                f"SQLite cannot read the store ({detail}); run `hermes-store check` or restore "
                "a backup"
            ) from None
        raise click.ClickException(f"SQLite error: {detail}") from None


def store_url(db: str | None, *, create_home: bool) -> tuple[str, Path | None]:
    """Resolve --db like the engine does; refuse a URL that is not SQLite."""
    url = resolve_url(db, create_home=create_home)
    try:
        return url, db_path(url)
    except ValueError as exc:  # a non-SQLite URL
        raise click.ClickException(f"--db: {exc}") from None


def open_existing(db: str | None) -> Engine:
    """An engine on an existing store, checked read-only first; never creates a file."""
    url, path = store_url(db, create_home=False)
    if path is not None and not path.exists():
        raise StoreNotFound(
            f"{path}: no such store. Pass --db, set HERMES_STORE_URL, or create one with "
            "`hermes-store upgrade`"
        )
    state = migrate.inspect_file(path)
    if state.kind == "new":
        raise StoreNotFound(
            f"{path or url}: the database is empty, not a Hermes store yet; create one with "
            "`hermes-store upgrade`"
        )
    return create_store_engine(url, create=False, wal=False)


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="hermes-store")
def main() -> None:
    """Operate a Hermes session store: upgrade, inspect, optimize, check and search it.

    \b
    Example:
      hermes-store --help
      hermes-store demo
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
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
    help="Run to this Alembic revision instead (advanced; see `alembic history`).",
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
@click.option(
    "--backup",
    "backup_to",
    metavar="PATH",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="First write a consistent copy of the store to PATH (SQLite backup API, mode 0600). "
    "Recommended for large or precious stores.",
)
@click.option(
    "--overwrite-backup", is_flag=True, help="Replace an existing file at the --backup PATH."
)
@json_option
def upgrade(
    db: str | None,
    app_version: int | None,
    revision: str | None,
    rebuild_fts: bool,
    deferred_fts: bool,
    backup_to: Path | None,
    overwrite_backup: bool,
    as_json: bool,
) -> None:
    """Upgrade (or create) a store, adopting a legacy one first.

    The same as `alembic -x db=PATH upgrade head`. A store written by the Hermes agent
    (schema 17 to 30, never under Alembic) is adopted: missing columns and indexes of its
    version are added and the matching revision stamped. Then the application's schema
    steps run up to --app-version, and the search indexes move to external content (text
    stored once); `schema_version` always names the application schema the store has.
    With --backup, a consistent copy is taken before anything is changed (not for a new,
    empty store: there is nothing to copy).

    \b
    Examples:
      hermes-store upgrade --db ~/.hermes/state.db --backup ~/state-before.db
      hermes-store upgrade --db ~/.hermes/state.db --app-version 21   # agent still at 21
    """
    x = {"fts_convert": "rebuild"} if rebuild_fts else {}
    if deferred_fts:
        x["fts_backfill"] = "deferred"
    with operator_errors():
        store_url(db, create_home=True)
        if _interactive() and not as_json:
            logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
            logging.getLogger("hermes_store").setLevel(logging.INFO)
        started = time.perf_counter()
        result = migrate.upgrade(
            db,
            revision,
            app_version=app_version,
            x=x,
            backup_to=backup_to,
            overwrite_backup=overwrite_backup,
        )
        elapsed = time.perf_counter() - started
    if as_json:
        _emit({**result.as_dict(), "seconds": round(elapsed, 3)})
        return
    if result.from_revision is not None:
        origin = result.from_revision
    elif result.adopted is not None:
        origin = f"legacy schema {result.adopted} (unversioned)"
    else:
        origin = "(new store)"
    click.echo(f"{origin} -> {result.to_revision} in {elapsed:.2f} s")
    click.echo(
        f"application schema: {result.schema_before or '-'} -> {result.schema_after}; "
        f"search layout: {result.layout_before} -> {result.layout_after}"
    )
    if result.restamped:
        click.echo(
            "this store had been stamped 22 by an earlier hermes-store: its versions now say "
            "what it has"
        )
    if result.layout_after == "application":
        click.echo(
            "search indexes: the Hermes application's own layout, left as it is "
            "(hermes-store search refuses it; use the agent's search)"
        )
    for item, why in result.healed.items():
        click.echo(f"repaired {item} ({why})")
    if result.backup is not None:
        click.echo(f"backup of the store as it was: {result.backup.path}")
    if result.pending_backfill:
        with operator_errors():
            engine = open_existing(db)
            with engine.connect() as conn:
                waiting = backfill_status(conn)
        for index, status in waiting.items():
            click.echo(
                f"{index}: {status['rows_left']} rows left to index: run "
                "`hermes-store optimize-storage`"
            )


def backfill_status(conn: Connection) -> dict[str, dict[str, Any]]:
    """Per index, what an unfinished deferred backfill still has to do."""
    status: dict[str, dict[str, Any]] = {}
    for item in backfill.pending(conn):
        status[item.index] = {
            "state": "filling",
            "high_water": item.high_water,
            "indexed_upto": item.indexed_upto,
            "rows_left": backfill.rows_left(conn, item),
        }
    for index in backfill.merging(conn):
        status[index] = {"state": "merging", "rows_left": 0}
    return status


def _current(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        revision = migrate.current_revision(conn)
        legacy = conn.exec_driver_sql("SELECT version FROM schema_version").scalar()
        return {
            "revision": revision,
            "legacy_schema": legacy,
            "head": migrate.head_revision(),
            "fts_layout": fts.layout(conn),
            "fts_indexes": {name: fts.index_layout(conn, name) for name in fts.INDEXES},
            "backfill": backfill_status(conn) if fts.layout(conn) == "external" else {},
        }


@main.command()
@db_option
@json_option
def current(db: str | None, as_json: bool) -> None:
    """Show the store's revision(s), application schema version and search layout.

    \b
    Example:
      hermes-store current --db state.db --json
    """
    with operator_errors():
        engine = open_existing(db)
        info = _current(engine)
    if as_json:
        _emit(info)
        return
    revision = info["revision"] or "(unversioned legacy store)"
    click.echo(f"revision:      {revision} (head is {info['head']})")
    click.echo(f"app schema:    {info['legacy_schema']} (the Hermes application's version)")
    click.echo(f"search layout: {info['fts_layout']}")
    for index, status in info["backfill"].items():
        click.echo(f"backfill:      {index} {status['state']}, {status['rows_left']} rows left")


@main.command()
@db_option
@json_option
def stats(db: str | None, as_json: bool) -> None:
    """Count sessions and messages, sessions per source, and the file size.

    \b
    Example:
      hermes-store stats --db state.db
    """
    with operator_errors():
        engine = open_existing(db)
        with engine.connect() as conn:
            result = store_stats(conn, db_path(str(engine.url)))
    if as_json:
        _emit(result.as_dict())
        return
    click.echo(f"sessions: {result.sessions}")
    click.echo(f"messages: {result.messages}")
    for source, count in result.sessions_by_source.items():
        click.echo(f"  {source:<12} {count}")
    click.echo(
        f"file:     {human_bytes(result.file_bytes)} (+ WAL {human_bytes(result.wal_bytes)})"
    )


def render_storage(report: StorageReport) -> str:
    """The storage report as a table a person reads in a terminal."""
    total = report.file_bytes or 1
    lines = [f"layout: {report.layout}", f"{'group':<28}{'size':>12}{'share':>8}"]
    for group in GROUPS:
        size = report.groups.get(group, 0)
        lines.append(f"{group:<28}{human_bytes(size):>12}{size / total:>8.1%}")
    lines.append(f"{'free pages':<28}{human_bytes(report.free_bytes):>12}")
    lines.append(f"{'file':<28}{human_bytes(report.file_bytes):>12}")
    if report.layout == "inline" and report.reclaimable_bytes:
        lines.append(
            f"upgrading to external content would reclaim about "
            f"{human_bytes(report.reclaimable_bytes)} "
            f"({report.reclaimable_bytes / total:.0%}) after `hermes-store optimize`"
        )
    lines.append("")
    lines.append(f"{'object':<36}{'size':>12}")
    for name, size in sorted(report.objects.items(), key=lambda item: -item[1])[:15]:
        lines.append(f"{name:<36}{human_bytes(size):>12}")
    return "\n".join(lines)


@main.command()
@db_option
@json_option
def storage(db: str | None, as_json: bool) -> None:
    """Show where the bytes go: per table and index, grouped, from `dbstat`.

    Groups: message data, FTS index data, redundant FTS text copies (the inline
    `*_content` tables the upgrade removes), other. For an inline store it says how much
    the upgrade would reclaim.

    \b
    Example:
      hermes-store storage --db state.db
    """
    with operator_errors():
        engine = open_existing(db)
        with engine.connect() as conn:
            report = storage_report(conn)
            waiting = backfill_status(conn) if fts.layout(conn) == "external" else {}
    if as_json:
        _emit({**report.as_dict(), "backfill": waiting})
        return
    click.echo(render_storage(report))
    for index, status in waiting.items():
        click.echo(f"backfill: {index} {status['state']}, {status['rows_left']} rows left")


@main.command()
@db_option
@click.option("--no-vacuum", is_flag=True, help="Merge and checkpoint only; skip VACUUM.")
@json_option
def optimize(db: str | None, no_vacuum: bool, as_json: bool) -> None:
    """Merge the FTS indexes, checkpoint the WAL and VACUUM; print what was reclaimed.

    Refuses when the disk lacks the free space VACUUM needs (about the file's size in
    the store's directory and in the temp directory).

    \b
    Example:
      hermes-store optimize --db state.db
    """
    with operator_errors():
        engine = open_existing(db)
        result = optimize_store(
            engine, vacuum=not no_vacuum, progress=_progress(_interactive() and not as_json)
        )
    if as_json:
        _emit(result.as_dict())
    else:
        click.echo(
            f"{human_bytes(result.bytes_before)} -> {human_bytes(result.bytes_after)} "
            f"(reclaimed {human_bytes(result.reclaimed)}; merged {len(result.indexes)} index(es))"
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
        engine = open_existing(db)
        with engine.connect() as conn:
            if not backfill_status(conn):
                if as_json:
                    _emit({"rows_done": 0, "chunks": 0, "status": "nothing to do"})
                else:
                    click.echo("no deferred index build is pending: nothing to do")
                return
        bar = _backfill_bar(show)
        path = db_path(str(engine.url))
        require_writable(path)
        try:
            with sqlite_errors(path):
                report = backfill.run(
                    engine, chunk_rows=chunk_rows, max_lock_ms=max_lock_ms, duty=duty, progress=bar
                )
        except KeyboardInterrupt:
            click.echo("\ninterrupted: every finished chunk is kept; run again to resume", err=True)
            sys.exit(130)
    result = {
        "rows_done": report.rows_done,
        "chunks": report.chunks,
        "lock_seconds": round(report.lock_seconds, 3),
        "longest_lock_ms": round(report.longest_lock * 1000, 1),
        "paused_seconds": round(report.paused_seconds, 3),
        "checkpoint_seconds": round(report.checkpoint_seconds, 3),
        "status": "done",
    }
    if as_json:
        _emit(result)
    else:
        if show:
            click.echo("", err=True)
        click.echo(
            f"indexed {report.rows_done} rows in {report.chunks} transactions; longest lock "
            f"{result['longest_lock_ms']} ms, {report.lock_seconds:.1f} s locked in all"
        )


def _backfill_bar(show: bool) -> Callable[[backfill.BackfillProgress], None]:
    """A one-line progress bar with an ETA, drawn on stderr when it is a terminal."""

    def draw(progress: backfill.BackfillProgress) -> None:
        if not show:
            return
        total = progress.rows_total or 1
        share = progress.rows_done / total
        eta = progress.eta_seconds
        eta_text = f"ETA {eta:5.0f} s" if eta is not None else "ETA     ?"
        bar = "#" * int(share * 30)
        click.echo(
            f"\r[{bar:<30}] {progress.rows_done}/{progress.rows_total} rows  {eta_text}",
            err=True,
            nl=False,
        )

    return draw


@main.command()
@db_option
@click.option("--quick", is_flag=True, help="PRAGMA quick_check instead of integrity_check.")
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
@json_option
def check(
    db: str | None,
    quick: bool,
    repair_: bool,
    backup_to: Path | None,
    deferred: bool,
    as_json: bool,
) -> None:
    """Run PRAGMA integrity_check, the search mechanism and FTS5 checks; exit 1 when broken.

    The search mechanism is the view and the six triggers that keep the indexes in step
    with the messages: each one missing, re-created by the Hermes application's FTS
    recovery with its inline-layout body, or otherwise different is named. With --repair
    (after a consistent backup of the store) they are restored, every FTS index they fed or
    whose check fails is rebuilt from what it indexes, and the checks run again: exit 0
    only when they pass. Damage that PRAGMA integrity_check reports is not repaired.

    \b
    Example:
      hermes-store check --db state.db
      hermes-store check --db state.db --repair --backup /safe/state-before-repair.db
    """
    if (backup_to is not None or deferred) and not repair_:
        raise click.UsageError("--backup and --deferred only go with --repair")
    with operator_errors():
        engine = open_existing(db)
        if repair_:
            try:
                repaired = repair(
                    engine,
                    backup_to=backup_to.expanduser().absolute() if backup_to else None,
                    deferred=deferred,
                    quick=quick,
                    progress=_backfill_bar(_interactive() and not as_json),
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
    if as_json:
        payload: dict[str, Any] = {
            "ok": result.ok,
            "checked": result.checked,
            "problems": result.problems,
            "skipped": result.skipped,
        }
        if repair_:
            payload["repair"] = repaired.as_dict()
        _emit(payload)
    else:
        if repair_:
            _print_repair(repaired)
        _print_check(result)
    if repair_ and repaired.refused:
        click.echo(f"not repaired: {repaired.refused}", err=True)
    if not result.ok:
        if not as_json:
            # Objects broken the same way share one cause: "a, b (cause); c (other cause)".
            causes: dict[str, list[str]] = {}
            for name, problem in result.problems.items():
                causes.setdefault(problem, []).append(name)
            summary = "; ".join(
                f"{', '.join(names)} ({_shorten(problem)})" for problem, names in causes.items()
            )
            click.echo(f"broken: {summary}", err=True)
        sys.exit(1)


def _width(*names: Iterable[str]) -> int:
    """The first column's width: 28, or more for a long name (trigger names)."""
    return max([28, *(len(name) + 1 for group in names for name in group)])


def _print_check(result: CheckResult) -> None:
    # The search mechanism's objects are listed only when wrong ("trigger messages_fts_delete").
    mechanism = [item for item in result.problems if item != "database"]
    mechanism = [item for item in mechanism if item not in result.checked]
    width = _width(result.checked, mechanism, result.skipped)
    for item in result.checked:
        # The PRAGMA's problems are filed under "database".
        problem = result.problems.get("database" if item.startswith("PRAGMA") else item)
        click.echo(f"{item:<{width}} {'BROKEN: ' + problem if problem else 'ok'}")
    for item in mechanism:
        click.echo(f"{item:<{width}} BROKEN: {result.problems[item]}")
    for item, reason in result.skipped.items():
        click.echo(f"{item:<{width}} not checked: {reason}")


def _print_repair(repaired: RepairResult) -> None:
    if not repaired.before.problems:
        click.echo("nothing to repair: every check passed")
        return
    if repaired.backup is not None:
        click.echo(f"backup of the store before the repair: {repaired.backup}")
    width = _width(repaired.restored, repaired.repaired)
    for item, was in repaired.restored.items():
        click.echo(f"{item:<{width}} restored from this package's definition (it was: {was})")
    for index, how in repaired.repaired.items():
        click.echo(f"{index:<{width}} repaired: {how}")
    if repaired.repaired or repaired.restored:
        click.echo("checks after the repair:")


def _shorten(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _highlight(snippet: str, color: bool) -> str:
    if not color:
        return snippet
    return snippet.replace(">>>", "\x1b[1;33m").replace("<<<", "\x1b[0m")


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
@click.option("--offset", default=0, type=click.IntRange(0))
@click.option("--source", "sources", multiple=True, help="Only these sources (repeatable).")
@click.option("--role", "roles", multiple=True, help="Only these roles (repeatable).")
@click.option(
    "--sort",
    type=click.Choice(["rank", "newest", "oldest"], case_sensitive=False),
    default="rank",
    show_default=True,
)
@click.option("--include-inactive", is_flag=True, help="Also rewound messages.")
@json_option
def search(
    query: str,
    db: str | None,
    limit: int,
    offset: int,
    sources: tuple[str, ...],
    roles: tuple[str, ...],
    sort: str,
    include_inactive: bool,
    as_json: bool,
) -> None:
    """Search messages the way the agent's session_search does.

    \b
    Example:
      hermes-store search "docker compose" --source telegram --limit 5
    """
    with operator_errors(), _degraded_said_once():
        engine = open_existing(db)
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
    if as_json:
        _emit(hits)
        return
    color = _color_stdout()
    for hit in hits:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(hit["timestamp"]))
        click.echo(f"#{hit['id']} {hit['source']} {hit['role']} {when} session {hit['session_id']}")
        snippet = " ".join((hit["snippet"] or "").split())
        click.echo(f"    {_highlight(snippet, color)}")
    if not hits:
        click.echo("no matches", err=True)


DEMO_QUERIES = ("error", "import json", "TODO: fix", "def*", "terminal OR docker", "数据库")


@main.command()
@click.option("--messages", "n_messages", default=5000, show_default=True, type=click.IntRange(1))
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write demo.db (default: a new temporary directory).",
)
@click.option("--seed", default=0, show_default=True, help="Corpus seed.")
def demo(n_messages: int, directory: Path | None, seed: int) -> None:
    """Build a realistic legacy store, upgrade it, optimize it and compare search results.

    Generates a schema-30 store in the legacy inline layout (never under Alembic), runs
    the real upgrade (adoption, then in-place conversion), `optimize`, and prints the
    storage report before and after and a few searches answered identically.

    \b
    Example:
      hermes-store demo --messages 20000 --dir /tmp/hermes-demo
    """
    with operator_errors():
        run_demo(n_messages, directory, seed)


def run_demo(n_messages: int, directory: Path | None, seed: int) -> None:
    """The demo's steps (see `demo`)."""
    say = _progress(_interactive())
    directory = directory or Path(tempfile.mkdtemp(prefix="hermes-demo-"))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / "demo.db"
    if path.exists():
        raise click.ClickException(f"{path} exists; pass another --dir or remove it")
    say(f"generating {n_messages} messages (seed {seed})")
    data = corpus_mod.generate(n_messages, seed)
    say("writing a legacy schema-30 store (inline FTS5, as the Hermes agent leaves it)")
    migrate.upgrade(str(path), "30")
    with contextlib.closing(sqlite3.connect(path)) as raw:
        corpus_mod.populate(raw, data)
        # A store the legacy application wrote was never under Alembic.
        raw.execute("DROP TABLE alembic_version")
        raw.commit()
    engine = create_store_engine(str(path))
    with engine.connect() as conn:
        before = storage_report(conn)
        before_hits = {q: search_messages(conn, q, limit=5) for q in DEMO_QUERIES}
    click.echo(f"\n== legacy store: {path}\n{render_storage(before)}\n")
    say("upgrading (adopt, then convert in place)")
    started = time.perf_counter()
    upgrade_result = migrate.upgrade(str(path))
    upgraded = time.perf_counter() - started
    say("optimizing (merge, checkpoint, VACUUM)")
    result = optimize_store(engine, progress=say)
    with engine.connect() as conn:
        after = storage_report(conn)
        after_hits = {q: search_messages(conn, q, limit=5) for q in DEMO_QUERIES}
    engine.dispose()
    click.echo(
        f"== upgraded {upgrade_result.from_revision or '(unversioned)'} -> "
        f"{upgrade_result.to_revision} in {upgraded:.2f} s; "
        f"optimize: {human_bytes(result.bytes_before)} -> {human_bytes(result.bytes_after)}\n"
        f"{render_storage(after)}\n"
    )
    ratio = after.file_bytes / before.file_bytes if before.file_bytes else 1.0
    click.echo(
        f"== size: {human_bytes(before.file_bytes)} -> {human_bytes(after.file_bytes)} "
        f"({ratio:.3f}x)\n"
    )
    click.echo("== searches before and after the upgrade")
    for query in DEMO_QUERIES:
        same = before_hits[query] == after_hits[query]
        click.echo(
            f"{query!r:<24} {len(after_hits[query])} hits  {'identical' if same else 'DIFFERENT'}"
        )
        if not same:
            raise click.ClickException(f"search results differ for {query!r}")


if __name__ == "__main__":
    main(prog_name="hermes-store")

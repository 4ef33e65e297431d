"""The maintenance commands: optimize, optimize-storage, check (and --repair)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hermes_store.backend import Backend, backend_for, backend_of
from hermes_store.cli.common import db_option, json_option, open_existing, operator_errors
from hermes_store.cli.output import (
    emit_json,
    emit_records,
    emit_result,
    emit_view,
    format_options,
    shorten,
)
from hermes_store.cli.progress import backfill_bar, interrupted, phases
from hermes_store.engine import resolve_url
from hermes_store.maintenance import RepairResult
from hermes_store.sqlite import backfill


def backend_of_db(db: str | None) -> Backend:
    """The backend of --db (or its default) before the store is opened: an option the
    database cannot honour is refused before anything is opened or written."""
    return backend_for(resolve_url(db, create_home=False))


@click.command()
@db_option
@click.option(
    "--vacuum",
    "full",
    is_flag=True,
    help="VACUUM too: returns every free page, but holds the write lock for its whole run "
    "(stop the agent or let it idle); switches the store to incremental auto-vacuum.",
)
@click.option("--no-vacuum", is_flag=True, help="Merge and checkpoint only.")
@click.option(
    "--compact",
    is_flag=True,
    help="Also rebuild the search indexes online, in short steps, and swap them in: drops "
    "what deleted messages left in them (after an archive run, say).",
)
@json_option
def optimize(db: str | None, full: bool, no_vacuum: bool, compact: bool, as_json: bool) -> None:
    """Merge the FTS indexes, checkpoint the WAL and shrink the file; print what was reclaimed.

    By default every step is a short write transaction, with pauses between, so the agent
    keeps writing: the indexes are merged a few pages at a time, and free pages go back to
    the file system in steps when the store uses incremental auto-vacuum (a store that does
    not is told how much only `--vacuum` returns). `--vacuum` runs VACUUM, which holds the
    write lock throughout and needs about the file's size free in the store's directory and
    in the temp directory (refused otherwise). On PostgreSQL: gin_clean_pending_list of
    each GIN index (the pages cleaned are reported), then VACUUM (ANALYZE) of each of the
    store's tables, which never locks out the agent.

    `--compact` (SQLite) first rebuilds each FTS5 index beside itself from the messages,
    in short paced steps, swaps it in and frees the old one in steps: FTS5 keeps a deleted
    message's entries until a merge that bounded steps do not reach, so after most
    messages left (an archive run) only this gives the index's pages back. Search stays
    exact throughout; an interrupted compaction is finished by the next `optimize`. On
    PostgreSQL VACUUM already reclaims the indexes: there is nothing to rebuild.

    \b
    Examples:
      hermes-store optimize --db state.db
      hermes-store optimize --db state.db --compact    # after archiving most of it
      hermes-store optimize --db state.db --vacuum     # with the agent stopped
      hermes-store optimize --db postgresql+psycopg://hermes@db/hermes --json
    """
    if full and no_vacuum:
        raise click.UsageError("--vacuum and --no-vacuum contradict each other: pick one")
    if full and compact:
        raise click.UsageError(
            "--vacuum already merges each index whole (holding the lock); --compact is the "
            "bounded way to the same end: pick one"
        )
    vacuum = True if full else False if no_vacuum else None
    with operator_errors():
        if vacuum is not None:
            backend_of_db(db).require("vacuum_modes", "--vacuum" if full else "--no-vacuum")
        engine = open_existing(db)
        try:
            with interrupted(), phases(not as_json) as report:
                result = backend_of(engine).optimize(
                    engine, vacuum=vacuum, compact=compact, report=report
                )
        finally:
            engine.dispose()  # its pooled connections keep the -wal open, deleted or not
    emit_result(result, as_json)


@click.command("optimize-storage")
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
    with operator_errors():
        backend_of_db(db).require("staged_backfill", "optimize-storage")
        engine = open_existing(db)
        with interrupted(), backfill_bar(not as_json) as bar:
            result = backend_of(engine).finish_deferred(
                engine, chunk_rows=chunk_rows, max_lock_ms=max_lock_ms, duty=duty, progress=bar
            )
    emit_result(result, as_json)


@click.command()
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
    extension is installed (--quick: not); each table of 1,000 rows or more has planner
    statistics, and each GIN pending list is under 1 MiB (measured with the pgstattuple
    extension, else estimated from the pages a search reads). --repair rebuilds an invalid
    index (REINDEX INDEX CONCURRENTLY), re-creates a missing or different object from its
    revision, without blocking writes, and does what optimize does for pending lists and
    statistics.

    \b
    Example:
      hermes-store check --db state.db
      hermes-store check --db state.db --repair --backup /safe/state-before-repair.db
      hermes-store check --db postgresql+psycopg://hermes@db/hermes --repair
    """
    if (backup_to is not None or deferred) and not repair_:
        raise click.UsageError("--backup and --deferred only go with --repair")
    repaired: RepairResult | None = None
    with operator_errors():
        if backup_to is not None:
            backend_of_db(db).require("file_backup", "--backup")
        if deferred:
            backend_of_db(db).require("deferred_repair", "--deferred")
        engine = open_existing(db, reading=not repair_)
        backend = backend_of(engine)
        if repair_:
            with interrupted(), backfill_bar(fmt == "text") as bar:
                repaired = backend.repair(
                    engine, quick=quick, backup_to=backup_to, deferred=deferred, progress=bar
                )
            result = repaired.after
        else:
            result = backend.check(engine, quick=quick)
    if fmt == "json":
        emit_json(result.document(repaired))
    elif fmt in ("nl", "csv"):
        emit_records(fmt, result.records(), ["item", "status", "detail"])
    else:
        if repaired is not None:
            emit_view(repaired.view())
        emit_records(
            "text",
            result.records(),
            ["item", "status", "detail"],
            headers={"detail": ""},
            styles={"status": "bold"},
        )
    if repaired is not None and repaired.refused:
        click.echo(f"not repaired: {repaired.refused}", err=True)
    if not result.ok:
        if fmt == "text":
            # Objects broken the same way share one cause: "a, b (cause); c (other cause)".
            causes: dict[str, list[str]] = {}
            for name, problem in result.problems.items():
                causes.setdefault(problem, []).append(name)
            summary = "; ".join(
                f"{', '.join(names)} ({shorten(problem)})" for problem, names in causes.items()
            )
            click.echo(f"broken: {summary}", err=True)
        sys.exit(1)

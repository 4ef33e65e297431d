"""The maintenance commands: optimize, optimize-storage, check (and --repair)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from hermes_store.cli.common import (
    db_option,
    json_option,
    open_existing,
    operator_errors,
    refuse_on_server,
)
from hermes_store.cli.output import emit_json, emit_records, format_options, say, shorten
from hermes_store.cli.progress import backfill_bar, interrupted, phases
from hermes_store.cli.schema import backfill_status
from hermes_store.engine import (
    db_path,
    is_server,
    require_writable,
    sqlite_errors,
)
from hermes_store.postgresql.check import check_server, repair_server
from hermes_store.postgresql.maintenance import optimize_server
from hermes_store.sqlite import backfill
from hermes_store.sqlite.fts import CheckResult
from hermes_store.sqlite.maintenance import RepairResult, check_store, repair
from hermes_store.sqlite.maintenance import optimize as optimize_store
from hermes_store.sqlite.storage import human_bytes


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
            with interrupted(), phases(not as_json) as show:
                result = optimize_store(
                    engine, vacuum=True if full else False if no_vacuum else None, report=show
                )
        finally:
            engine.dispose()  # its pooled connections keep the -wal open, deleted or not
    if as_json:
        emit_json(result.as_dict())
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
        emit_json(result)
        return
    say(
        f"VACUUM (ANALYZE) of {len(result['tables'])} tables: "
        f"{human_bytes(result['bytes_before'])} -> {human_bytes(result['bytes_after'])} "
        f"(reclaimed {human_bytes(result['reclaimed'])}); dead rows made reusable and the "
        "planner's statistics refreshed"
    )


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
    show = not as_json
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
                    emit_json(
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
        with interrupted(), sqlite_errors(path), backfill_bar(show) as bar:
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
        emit_json(result)
    else:
        say(
            f"indexed {report.rows_done} rows in {report.chunks} transactions; longest lock "
            f"{result['longest_lock_ms']} ms, {report.lock_seconds:.1f} s locked in all"
        )


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
                with backfill_bar(fmt == "text") as bar:
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
        emit_json(payload)
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
                f"{', '.join(names)} ({shorten(problem)})" for problem, names in causes.items()
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

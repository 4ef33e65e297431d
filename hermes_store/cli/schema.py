"""The schema commands: upgrade, downgrade, stamp, history, current."""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from sqlalchemy import Engine

from hermes_store import migrate
from hermes_store.backend import backend_of
from hermes_store.cli import with_app_versions
from hermes_store.cli.common import (
    backup_options,
    db_option,
    json_option,
    names,
    open_existing,
    operator_errors,
    store_url,
)
from hermes_store.cli.output import emit_json, emit_records, format_options, say
from hermes_store.cli.progress import interrupted, phases
from hermes_store.engine import display_url
from hermes_store.errors import StoreError
from hermes_store.revisions import script_directory

# What a deferred backfill still has to do: the library's, shown by upgrade, current,
# optimize-storage and stats.


@click.command()
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
@with_app_versions
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
    (schema {app_versions}, never under Alembic) is adopted: missing columns and indexes of
    its version are added and the matching revision stamped. Then the application's schema
    steps run up to --app-version, and the search indexes move to external content (text
    stored once); `schema_version` always names the application schema the store has. With
    --backup, a consistent copy is taken before anything is changed (not for a new, empty
    store: there is nothing to copy). On a terminal each step shows as it runs. Interrupted
    (Ctrl-C), the step in progress is rolled back (every revision is a transaction of its
    own) and the message says what was done, what is left and the command that finishes it.

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
        phases(not as_json) as show,
    ):
        store_url(db, create_home=False)
        _refuse_options_of_another_database(db, backup_to, rebuild_fts, deferred_fts)
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
        emit_json({**result.as_dict(), "seconds": round(elapsed, 3)})
        return
    for line in result.view(elapsed, fts_choice=rebuild_fts or deferred_fts):
        say(line)


def _refuse_options_of_another_database(
    db: str | None, backup_to: Path | None, rebuild_fts: bool, deferred_fts: bool
) -> None:
    """--backup copies a file, and --rebuild-fts / --deferred-fts choose how an FTS5 index
    is converted: refused, before anything is opened, where the backend has neither."""
    backend = migrate.Target.resolve(db).backend
    if backup_to is not None:
        backend.require("file_backup", "--backup")
    if rebuild_fts or deferred_fts:
        backend.require("fts_rebuild_choice", "--rebuild-fts / --deferred-fts")


@contextlib.contextmanager
def _interrupted_upgrade(db: str | None) -> Iterator[None]:
    """Ctrl-C during a migration: say what was done and what is left (the library's own
    account, read from the store after the interrupt), exit 130."""
    try:
        with interrupted():
            yield
    except KeyboardInterrupt:  # outside the library's own account (or a second Ctrl-C)
        where = "as it was"
        with contextlib.suppress(Exception):
            target = migrate.Target.resolve(db)
            if target.path is not None and not target.path.exists():
                where = "not created"
            else:
                state = target.backend.classify(target)
                where = (
                    f"at revision {state.revision}"
                    if state.revision
                    else f"at legacy schema {state.legacy_version} (unversioned)"
                    if state.legacy_version
                    else "empty"
                )
        click.echo(f"\ninterrupted: the store is {where}; see `hermes-store current`", err=True)
        sys.exit(130)


class _TakesRelativeRevision(click.Command):
    """A command whose REVISION may be `-1`, `-3`: read as the argument, not an option."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" not in args:
            relative = [arg for arg in args if re.fullmatch(r"-\d+", arg)]
            args = [arg for arg in args if arg not in relative] + (
                ["--", *relative] if relative else []
            )
        return super().parse_args(ctx, args)


@click.command(cls=_TakesRelativeRevision)
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
@with_app_versions
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
    an application version ({app_versions}), fts@-N (steps of the search layout only) or
    base.

    One step is the newest revision of the store that changes it, in the order `upgrade`
    applies them (the application's schema versions, then the search layout's revisions):
    -1 from the head undoes the search layout's newest revision, fts2 (on SQLite it changes
    nothing; the merge revision above it changes nothing either and goes with it), -1 again
    the conversion fts1 (the search indexes back to inline), -1 again the application's
    newest version, and so on. A revision id or version means what it means to Alembic:
    every revision that depends on it is undone (from the head, 21 leaves 21 and fts2).
    Asks first, listing what each undone revision gives up, unless --yes. Each revision's
    downgrade runs in its own transaction. `base` (or every step) drops every table: on a
    store holding conversations it is refused unless --yes --i-know-this-deletes-data are
    both given. Take a --backup first.

    \b
    Examples:
      hermes-store downgrade -1 --db state.db --backup ~/state-before-downgrade.db
      hermes-store downgrade 21 --db state.db      # the application's schema 21
      hermes-store downgrade fts@-2 --db state.db --yes   # search indexes back to inline
    """
    if overwrite_backup and backup_to is None:
        raise click.UsageError("--overwrite-backup only goes with --backup PATH")
    if delete_data and not yes:
        raise click.UsageError("--i-know-this-deletes-data only counts together with --yes")
    with operator_errors():
        if backup_to is not None:
            migrate.Target.resolve(db).backend.require("file_backup", "--backup")
        open_existing(db).dispose()
        plan = migrate.plan_store_downgrade(db, revision)
        url, path = store_url(db, create_home=False)
        if not plan.undone:
            if as_json:
                emit_json({"from": names(plan.before), "to": names(plan.after), "undone": []})
            else:
                say(f"already at {names(plan.before) or 'base'}: nothing to undo")
            return
        if not yes:
            click.confirm(_downgrade_question(str(path or display_url(url)), plan), abort=True)
        with _interrupted_upgrade(db), phases(not as_json) as show:
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
        emit_json(
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
        f"Downgrade {store} from {names(plan.before) or 'base'} to "
        f"{names(plan.after) or 'base'}? It undoes, newest first:"
    ]
    for step in plan.describe():
        lines.append(f"  {step['revision']}  {step['does'].rstrip('.')}. {step['undoing']}")
    lines.append("Go on?")
    return "\n".join(lines)


@click.command()
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
        migrate.Target.resolve(db).backend.require("stamp", "stamp")
        open_existing(db).dispose()
        start, end = migrate.stamp(db, revision)
    if as_json:
        emit_json({"from": start, "to": end})
    else:
        say(f"stamped {end} (was {start or 'unversioned'})")


@click.command()
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
                engine.dispose()
                state = migrate.classify(db) if not current else None
                if state is not None and state.legacy_version is not None:
                    current = {str(state.legacy_version)}
                    mark = (
                        f"unversioned, legacy schema {state.legacy_version} ~ revision "
                        f"{state.legacy_version}"
                    )
        records = [
            {
                "revision": script.revision,
                "down_revision": names(script.down_revision),
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


def _current(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return backend_of(engine).describe_revision(conn)


@click.command()
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

"""The copy command."""

from __future__ import annotations

import sys
from typing import Any

import click

from hermes_store.cli.common import json_option, operator_errors
from hermes_store.cli.output import emit_json, emit_records, say
from hermes_store.cli.progress import copy_bar
from hermes_store.copy import copy_store


@click.command("copy")
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

    try:
        with operator_errors(), copy_bar(not as_json) as draw:
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
        emit_json(result.as_dict())
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
    upkeep = result.upkeep
    if upkeep is not None:
        say(
            f"{upkeep.statement} of {len(upkeep.tables)} tables: planner statistics "
            "gathered, GIN pending lists merged"
        )
        for table, reason in upkeep.refused.items():
            say(f"{upkeep.statement} not done on {table} ({reason}): run `hermes-store optimize`")
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

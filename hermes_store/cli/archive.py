"""The archive and restore commands: cold storage for old sessions."""

from __future__ import annotations

from typing import Any

import click

from hermes_store.cli.common import db_option, json_option, operator_errors
from hermes_store.cli.output import emit_json, say
from hermes_store.cli.progress import archive_bar, interrupted
from hermes_store.maintenance import human_bytes


def _what(result: Any) -> str:
    return (
        f"{result.sessions} sessions in {result.trees} trees, {result.messages} messages, "
        f"{human_bytes(result.bytes)} of row data"
    )


def _print(result: Any) -> None:
    """The run's result for a person."""
    moved = result.moved
    if moved.resumed:
        say(moved.resumed)
    if result.in_flight:
        say(result.in_flight, style="yellow")
    if result.created_archive:
        say(f"created the archive {result.archive} (at head, mode 0600)")
    verb = "archive" if result.direction == "archive" else "restore"
    if result.dry_run:
        say(f"would {verb}: {_what(result)}; nothing was changed (dry run)")
    elif result.in_hot:
        say("nothing to restore: the session is in the hot store already")
    elif result.nothing_to_move:
        say(f"nothing to {verb}: no session tree qualifies")
    else:
        where = result.archive if result.direction == "archive" else result.hot
        say(
            f"moved {moved.sessions} sessions, {moved.messages} messages "
            f"({human_bytes(moved.bytes)}) to {where} in {moved.batches} verified batches in "
            f"{result.seconds:.1f} s; longest write lock on the hot store "
            f"{moved.longest_lock_s:.2f} s"
        )
    for why, trees in sorted(result.kept.items()):
        say(f"kept {trees} trees: {why}")
    if moved.changed:
        say(f"left {moved.changed} batches where they were: they changed while being moved")
    shrunk = "hot store" if result.direction == "archive" else "archive"
    if not result.dry_run and moved.batches:
        say(f"{shrunk}: {human_bytes(result.bytes_before)} -> {human_bytes(result.bytes_after)}")
    if result.compacted:
        sizes = (result.index_bytes_before, result.index_bytes_after)
        say(
            f"compacted the search indexes ({', '.join(result.compacted)}) online in "
            f"{result.compact_seconds:.1f} s"
            + (
                f": {human_bytes(sizes[0])} -> {human_bytes(sizes[1])}"
                if sizes[0] is not None and sizes[1] is not None
                else ""
            )
        )
    if result.vacuum_needed_bytes:
        say(
            f"{human_bytes(result.vacuum_needed_bytes)} of free pages can only be returned by "
            "`hermes-store optimize --vacuum` (once, with the agent stopped); it switches the "
            "store to incremental auto-vacuum, after which archive runs return them in steps"
        )


@click.command("archive")
@db_option
@click.option(
    "--to", "to", metavar="PATH_OR_URL", required=True, help="Archive store (created if missing)."
)
@click.option("--before", metavar="DATE", help="Sessions last active before DATE (ISO, UTC).")
@click.option(
    "--older-than",
    "older_than",
    metavar="AGE",
    help="Sessions last active more than AGE ago: 90d, 12h, 2w.",
)
@click.option("--archived", is_flag=True, help="Sessions the application flagged archived.")
@click.option("--dry-run", is_flag=True, help="Say what would move; change nothing.")
@click.option(
    "--batch-messages",
    default=2000,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Most messages per batch (batches are sized to keep the write lock short).",
)
@json_option
def archive(
    db: str | None,
    to: str,
    before: str | None,
    older_than: str | None,
    archived: bool,
    dry_run: bool,
    batch_messages: int,
    as_json: bool,
) -> None:
    """Move old session trees out of the hot store into an archive store.

    Give exactly one of --before, --older-than or --archived. A session's age is its last
    activity (its newest message, ended_at, last_activity_at). Linked sessions (parents,
    continuations, subagents, delegations) move together, and only when each qualifies;
    a session not ended never moves. Each batch is copied, verified by checksums on both
    sides, then deleted from the hot store in one short transaction (a long conversation
    in short chunks); after a kill or a full disk, the same command finishes the batch in
    flight. The freed pages are given
    back in steps. Nothing to move exits 0 and says so.

    \b
    Examples:
      hermes-store archive --db ~/.hermes/state.db --to ~/hermes-archive.db --older-than 90d
      hermes-store archive --to ~/hermes-archive.db --before 2025-01-01 --dry-run
    """
    from hermes_store.archive import archive_sessions, criterion

    with interrupted(), operator_errors(), archive_bar(not as_json) as draw:
        rule = criterion(before=before, older_than=older_than, archived=archived)
        result = archive_sessions(
            db, to, rule, dry_run=dry_run, batch_messages=batch_messages, progress=draw
        )
    if as_json:
        emit_json(result.as_dict())
    else:
        _print(result)


@click.command("restore")
@click.argument("session_id")
@db_option
@click.option(
    "--from", "from_", metavar="PATH_OR_URL", required=True, help="Archive store to restore from."
)
@click.option("--dry-run", is_flag=True, help="Say what would move; change nothing.")
@json_option
def restore(db: str | None, session_id: str, from_: str, dry_run: bool, as_json: bool) -> None:
    """Bring a session, with its whole tree, back from an archive into the hot store.

    The tree is copied into the hot store, verified by checksums on both sides, then
    deleted from the archive; after a kill or a full disk, the same command finishes it.

    \b
    Example:
      hermes-store restore 20250418_202521_e79a27 --db ~/.hermes/state.db --from ~/hermes-archive.db
    """
    from hermes_store.archive import restore_session

    with interrupted(), operator_errors():
        result = restore_session(session_id, db, from_, dry_run=dry_run)
    if as_json:
        emit_json(result.as_dict())
    else:
        _print(result)

"""The reporting commands stats and storage."""

from __future__ import annotations

from typing import Any

import click

from hermes_store.cli.common import db_option, open_existing, operator_errors
from hermes_store.cli.output import emit_json, emit_records, format_options, say
from hermes_store.cli.schema import backfill_status
from hermes_store.engine import (
    db_path,
    is_server,
)
from hermes_store.postgresql.maintenance import server_stats
from hermes_store.postgresql.storage import ServerStorageReport, server_storage_report
from hermes_store.sqlite import fts
from hermes_store.sqlite.maintenance import store_stats
from hermes_store.sqlite.storage import GROUPS, StorageReport, human_bytes, storage_report


@click.command()
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


def render_server_storage(report: ServerStorageReport, fmt: str) -> None:
    """The storage report of a PostgreSQL store: groups, the text stored once, objects."""
    if fmt == "json":
        emit_json(report.as_dict())
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


@click.command()
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
            render_server_storage(on_server, fmt)
            return
        with engine.connect() as conn:
            report = storage_report(conn)
            waiting = backfill_status(conn)
    if fmt == "json":
        emit_json({**report.as_dict(), "backfill": waiting})
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

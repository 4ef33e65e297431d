"""The reporting commands stats and storage."""

from __future__ import annotations

import click

from hermes_store.backend import backend_of
from hermes_store.cli.common import db_option, open_existing, operator_errors
from hermes_store.cli.output import emit_json, emit_records, emit_view, format_options


@click.command()
@db_option
@format_options
def stats(db: str | None, fmt: str) -> None:
    """Count sessions and messages, sessions per source, and the file size.

    On PostgreSQL the size is the database's (pg_database_size).

    \b
    Example:
      hermes-store stats --db state.db
    """
    with operator_errors():
        engine = open_existing(db, reading=True)
        result = backend_of(engine).stats(engine)
    records = result.records(human=fmt == "text")
    emit_records(fmt, records, ["what", "count"], document=result.as_dict(), right=["count"])


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
        report = backend_of(engine).storage_report(engine)
    if fmt == "json":
        emit_json(report.as_dict())
    elif fmt in ("nl", "csv"):
        table = report.records()
        emit_records(fmt, table.records, table.columns)
    else:
        emit_view(report.view())

"""How `hermes-store` prints: rich tables for people, JSON, NDJSON or CSV for programs.

Text goes through one rich Console: it aligns wide (CJK) characters, colours only a
terminal, and honours ``NO_COLOR``. Machine formats never carry colour or markup.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

F = TypeVar("F", bound=Callable[..., Any])

#: The output formats of reporting commands: text (a person), json (one document), nl
#: (newline-delimited JSON, one record per line) and csv (one record per row, with a header).
FORMATS = ("text", "json", "nl", "csv")


def format_options(func: F) -> F:
    """--json, --nl and --csv, one ``fmt`` parameter (default "text")."""
    func = click.option(
        "--csv", "fmt", flag_value="csv", help="Print the records as CSV, with a header row."
    )(func)
    func = click.option(
        "--nl", "fmt", flag_value="nl", help="Print one JSON record per line (NDJSON)."
    )(func)
    func = click.option("--json", "fmt", flag_value="json", help="Print one JSON document.")(func)
    return click.option("--text", "fmt", flag_value="text", default=True, hidden=True)(func)


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): colour only on a terminal and without NO_COLOR; wide
    enough off a terminal that a piped table is not wrapped."""
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    return Console(
        file=stream,
        width=None if terminal else 200,
        highlight=False,
        soft_wrap=not terminal,
    )


def emit_json(data: Any) -> None:
    """One JSON document on stdout (non-ASCII text kept as is)."""
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def emit_records(
    fmt: str,
    records: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    document: Any = None,
    title: str | None = None,
    headers: Mapping[str, str] | None = None,
    right: Iterable[str] = (),
    styles: Mapping[str, str] | None = None,
) -> None:
    """Print ``records`` in ``fmt``: a rich table, JSON (``document`` when given, else the
    records), NDJSON or CSV (``columns`` in that order)."""
    if fmt == "json":
        emit_json(records if document is None else document)
        return
    if fmt == "nl":
        for record in records:
            click.echo(json.dumps(dict(record), ensure_ascii=False, default=str))
        return
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        for record in records:
            writer.writerow([_plain(record.get(key)) for key in columns])
        click.echo(buffer.getvalue(), nl=False)
        return
    aligned = set(right)
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
    for key in columns:
        table.add_column(
            (headers or {}).get(key, key), justify="right" if key in aligned else "left"
        )
    for record in records:
        table.add_row(
            *(Text(_plain(record.get(key)), style=(styles or {}).get(key, "")) for key in columns)
        )
    console().print(table)


def _plain(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def say(message: str, *, err: bool = False, style: str | None = None) -> None:
    """One line of text for a person (no rich markup is interpreted in ``message``)."""
    console(stderr=err).print(Text(message, style=style or ""))


def shorten(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def emit_view(view: Sequence[Any]) -> None:
    """A report's view for a person (hermes_store.maintenance.View): its tables and its
    lines, in order."""
    from hermes_store.maintenance import Table

    for part in view:
        if isinstance(part, Table):
            emit_records(
                "text",
                part.records,
                part.columns,
                title=part.title,
                right=part.right,
                headers=part.headers,
            )
        else:
            say(str(part))


def emit_result(result: Any, as_json: bool) -> None:
    """A result (hermes_store.maintenance.Shown) as JSON, or its view for a person."""
    if as_json:
        emit_json(result.as_dict())
    else:
        emit_view(result.view())

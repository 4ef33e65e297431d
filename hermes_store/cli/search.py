"""The search command."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import click
from rich.text import Text

from hermes_store.cli.common import db_option, open_existing, operator_errors
from hermes_store.cli.output import console, emit_records, format_options
from hermes_store.search import SearchOptions, search_messages
from hermes_store.search.archives import Searched, opening, require_archive, search_stores


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


@click.command()
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
@click.option(
    "--archive",
    "archives",
    metavar="PATH_OR_URL",
    multiple=True,
    help="Also search this archive store, at head (repeatable; the first given wins a "
    "message two archives hold, the --db store one it holds too).",
)
@format_options
def search(
    query: str,
    db: str | None,
    archives: tuple[str, ...],
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

    With --archive, the archives are searched too: one list, each message once, the
    --db store's copy first (docs/search.md, "Searching archives").

    \b
    Examples:
      hermes-store search "docker compose" --source telegram --limit 5
      hermes-store search --db state.db -- '"-docker"'
      hermes-store search error --db state.db --archive archive-2024.db --sort newest
    """
    options = SearchOptions(
        query,
        source_filter=list(sources) or None,
        role_filter=list(roles) or None,
        limit=limit,
        offset=offset,
        sort=None if sort == "rank" else sort,
        include_inactive=include_inactive,
    )
    with operator_errors(), _degraded_said_once():
        names = [require_archive(archive) for archive in archives]
        engine = open_existing(db, reading=True)
        opened = []
        for name, archive in zip(names, archives, strict=True):
            with opening(name):
                opened.append(Searched(name, open_existing(archive, reading=True)))
        hits = search_stores(engine, opened, options)
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

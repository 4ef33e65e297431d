"""The `hermes-store` command: the group, and where each command lives.

Each command is a module of this package, imported only when that command runs (or its own
``--help`` is asked for): `hermes-store --version` and `hermes-store --help` import click
and nothing of SQLAlchemy, Alembic or rich. The group's help lists the commands from
:data:`COMMANDS` without importing them; a test holds each entry's summary equal to its
command's own.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import click

from hermes_store.errors import one_line
from hermes_store.revisions import app_version_range

_Function = TypeVar("_Function", bound=Callable[..., Any])


def with_app_versions(function: _Function) -> _Function:
    """Fill the application versions into a command's help where it says
    ``{app_versions}``: revisions.LAST_APP_VERSION alone decides them."""
    function.__doc__ = (function.__doc__ or "").replace("{app_versions}", app_version_range())
    return function


class Entry(NamedTuple):
    """Where a command is defined, and the one line the group's help shows for it."""

    module: str
    attribute: str
    summary: str


#: Every command (the group's help lists them by name).
COMMANDS: dict[str, Entry] = {
    "demo": Entry(
        "demo",
        "demo",
        "Build a realistic legacy store, upgrade it, optimize it and compare search results.",
    ),
    "upgrade": Entry(
        "schema",
        "upgrade",
        "Upgrade a store, adopting a legacy one first (--create: start a new one).",
    ),
    "downgrade": Entry(
        "schema",
        "downgrade",
        "Take a store back: REVISION is -N (N steps), an id from `hermes-store history`, an "
        f"application version ({app_version_range()}), fts@-N (steps of the search layout "
        "only) or base.",
    ),
    "stamp": Entry(
        "schema",
        "stamp",
        "Record REVISION as the store's version without running anything.",
    ),
    "history": Entry(
        "schema",
        "history",
        "List the revisions, newest first; with --db, mark the store's own.",
    ),
    "current": Entry(
        "schema",
        "current",
        "Show the store's revision(s), application schema version and search layout.",
    ),
    "stats": Entry(
        "reports",
        "stats",
        "Count sessions and messages, sessions per source, and the file size.",
    ),
    "storage": Entry(
        "reports",
        "storage",
        "Show where the bytes go: per table and index, grouped, from `dbstat`.",
    ),
    "optimize": Entry(
        "maintenance",
        "optimize",
        "Merge the FTS indexes, checkpoint the WAL and shrink the file; print what was reclaimed.",
    ),
    "optimize-storage": Entry(
        "maintenance",
        "optimize_storage",
        "Finish a deferred index build in short transactions, resumably.",
    ),
    "check": Entry(
        "maintenance",
        "check",
        "Run PRAGMA integrity_check, the schema, search mechanism and FTS5 checks; exit 1 "
        "when broken.",
    ),
    "search": Entry(
        "search",
        "search",
        "Search messages the way the agent's session_search does.",
    ),
    "archive": Entry(
        "archive",
        "archive",
        "Move old session trees out of the hot store into an archive store.",
    ),
    "restore": Entry(
        "archive",
        "restore",
        "Bring a session, with its whole tree, back from an archive into the hot store.",
    ),
    "copy": Entry(
        "copy",
        "copy_command",
        "Copy a whole store to another database (SQLite <-> PostgreSQL), then verify it.",
    ),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when they are used, not when it is."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module = importlib.import_module(f"{__name__}.{entry.module}")
        command = getattr(module, entry.attribute)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a usage error of its options is one line, whatever was typed
        (a carriage return in a value would otherwise break the message in two)."""
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise click.UsageError(one_line(exc.format_message()), exc.ctx) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from :data:`COMMANDS`, without importing a command (cut to
        the width as click cuts a command's own summary)."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=COMMANDS[name].summary).get_short_help_str(limit))
            for name in sorted(COMMANDS)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def every_command() -> dict[str, click.Command]:
    """Each command by name, imported (what the documentation and its tests read)."""
    ctx = click.Context(main)
    found = {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}
    return {name: command for name, command in found.items() if command is not None}


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A warning is one `Warning: ...` line on stderr, not a source location."""
    click.echo(f"Warning: {message}", err=True)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="hermes-store")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Say each step: -v shows hermes-store's and Alembic's progress lines, -vv debug.",
)
def main(verbose: int) -> None:
    """Operate a Hermes session store: upgrade, inspect, optimize, check and search it.

    Every command that writes waits up to the busy timeout for the agent's write lock
    ($HERMES_STORE_BUSY_TIMEOUT_MS). Reporting commands print a table, or --json, --nl
    (one JSON record per line) or --csv. Colour only on a terminal; NO_COLOR is honoured.

    \b
    Example:
      hermes-store --help
      hermes-store demo
      hermes-store -v upgrade --db ~/.hermes/state.db --backup ~/state-before.db
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    for name in ("hermes_store", "alembic"):
        logging.getLogger(name).setLevel(level)
    warnings.showwarning = show_warning

"""The command starts at once: `--version` and `--help` import no more than click.

Each command's module is imported when the command runs; the group lists the commands from
hermes_store.cli.COMMANDS. How fast that is against `python -c "import click"` is measured
in benchmarks/test_bench_startup.py.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import click
import pytest

import hermes_store.cli as cli
from hermes_store.cli import COMMANDS, every_command, main

#: What a command pays for only when it runs.
HEAVY = ("sqlalchemy", "alembic", "rich", "psycopg", "hermes_store.migrate", "hermes_store.store")

_LOADED = """
import json, sys
from hermes_store.cli import main
try:
    main(sys.argv[1:], prog_name="hermes-store")
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _modules_after(*args: str) -> tuple[str, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *args], capture_output=True, text=True, check=True
    )
    return done.stdout, set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [("--version",), ("--help",)])
def test_the_group_imports_nothing_heavy(args: tuple[str, ...]) -> None:
    out, loaded = _modules_after(*args)
    assert out.strip(), "the command printed nothing"
    heavy = sorted(name for name in loaded if name.split(".")[0] in HEAVY or name in HEAVY)
    assert heavy == []
    # ... and a command does import what it needs when it runs.
    _, loaded = _modules_after("history")
    assert "alembic" in loaded


def test_the_group_lists_every_command_with_its_own_summary() -> None:
    ctx = click.Context(main)
    assert COMMANDS
    for name, entry in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None
        assert command.name == name
        assert entry.summary == command.get_short_help_str(limit=10**6)


def test_no_command_is_left_out_of_the_list() -> None:
    """A command defined in a module of the package but not in COMMANDS would never run."""
    listed = {(entry.module, entry.attribute) for entry in COMMANDS.values()}
    found = set()
    for info in pkgutil.iter_modules(cli.__path__):
        if info.name == "__main__":
            continue
        module = __import__(f"hermes_store.cli.{info.name}", fromlist=["_"])
        for attribute, value in vars(module).items():
            callback = getattr(value, "callback", None)
            if isinstance(value, click.Command) and callback.__module__ == module.__name__:
                found.add((info.name, attribute))
    assert found
    assert found == listed


def test_help_lists_the_commands_as_click_would() -> None:
    """The lazy listing prints what click prints from the commands themselves."""
    ctx = click.Context(main, info_name="hermes-store")
    eager = click.Group(
        name="hermes-store", commands=every_command(), params=main.params, help=main.help
    )
    lazy_text = main.get_help(ctx)
    eager_text = eager.get_help(click.Context(eager, info_name="hermes-store"))
    assert "Commands:" in lazy_text
    assert lazy_text.split("Commands:")[1] == eager_text.split("Commands:")[1]


def test_python_m_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hermes_store.cli", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0
    assert "Usage: hermes-store" in done.stdout
    assert all(name in done.stdout for name in COMMANDS)

"""Ctrl-C during `hermes-store archive` or `restore`, at each step of a batch: one line on
stderr (exit 130) saying every session is in exactly one store and to run the same command
again; that command then finishes the batch, and nothing is lost or split.

The interrupt is a KeyboardInterrupt raised where a batch reaches the step (what Ctrl-C
raises in the main thread), so the run's own handling is what is tested.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from archive_support import (
    MOVED_BY_AGE,
    build_hot,
    hot_copy,
    rows_of,
    session_ids,
    snapshot,
    union_equals,
)
from click.testing import CliRunner, Result

from hermes_store.archive import move
from hermes_store.cli import main

STEPS = ("marked", "copying", "copied", "verified", "deleting", "deleted", "done")
TREE = {"r1", "r1-cont", "r1-sub"}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hot(tmp_path_factory.mktemp("interrupt") / "template.db")


@pytest.fixture
def hot(template: Path, tmp_path: Path) -> Path:
    return hot_copy(template, tmp_path)


@pytest.fixture
def ctrl_c_at() -> Iterator[list[str]]:
    """Set the step at which the next batch gets a KeyboardInterrupt (once)."""
    wanted: list[str] = []

    def hook(step: str) -> None:
        if wanted and step == wanted[0]:
            wanted.clear()
            raise KeyboardInterrupt

    move.STEP_HOOK = hook
    try:
        yield wanted
    finally:
        move.STEP_HOOK = None


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def interrupted(result: Result) -> str:
    assert result.exit_code == 130, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def no_markers(*paths: Path) -> None:
    for path in paths:
        assert not rows_of(path, "SELECT 1 FROM state_meta WHERE key LIKE 'hermes_store.archive%'")


def checks(*paths: Path) -> None:
    for path in paths:
        done = invoke("check", "--db", path)
        assert done.exit_code == 0, done.output


@pytest.mark.parametrize("step", STEPS)
def test_archive_interrupted_at_each_step_says_so_and_the_same_command_finishes(
    hot: Path, tmp_path: Path, ctrl_c_at: list[str], step: str
) -> None:
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    command = ("archive", "--db", hot, "--to", archive, "--older-than", "90d")
    ctrl_c_at.append(step)
    line = interrupted(invoke(*command))
    assert line.startswith("interrupted after "), line
    assert "exactly one store" in line
    assert "run the same command again" in line
    assert not ctrl_c_at, "the interrupt was never raised"
    again = invoke(*command)
    assert again.exit_code == 0, again.output
    union_equals(before, hot, archive)
    assert session_ids(archive) == MOVED_BY_AGE
    no_markers(hot, archive)
    checks(hot, archive)


@pytest.mark.parametrize("step", ["copied", "deleting", "deleted"])
def test_restore_interrupted_says_so_and_the_same_command_finishes(
    hot: Path, tmp_path: Path, ctrl_c_at: list[str], step: str
) -> None:
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    moved = invoke("archive", "--db", hot, "--to", archive, "--older-than", "90d")
    assert moved.exit_code == 0, moved.output
    command = ("restore", "r1-cont", "--db", hot, "--from", archive)
    ctrl_c_at.append(step)
    line = interrupted(invoke(*command))
    assert line.startswith("interrupted after "), line
    again = invoke(*command)
    assert again.exit_code == 0, again.output
    union_equals(before, hot, archive)
    assert session_ids(hot) >= TREE
    assert session_ids(archive) == MOVED_BY_AGE - TREE
    no_markers(hot, archive)
    checks(hot, archive)

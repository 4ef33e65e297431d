"""Long work drawn on a terminal (rich), and nothing extra when piped."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from hermes_store.cli.output import console, say, shorten
from hermes_store.errors import (
    Interrupted,
)
from hermes_store.progress import Phase, Report
from hermes_store.sqlite import backfill


def interactive() -> bool:
    """Progress goes to stderr only when a person watches it."""
    return sys.stderr.isatty()


def progress_lines() -> Callable[[str], None]:
    """Say each step of long work on stderr, when a person watches it."""

    def step(message: str) -> None:
        if interactive():
            say(f"… {message}", err=True, style="dim")

    return step


@contextlib.contextmanager
def interrupted() -> Iterator[None]:
    """Ctrl-C during long work: the library's account of what was kept and what is left
    (an Interrupted), exit 130."""
    try:
        yield
    except Interrupted as exc:
        click.echo(f"\n{exc}", err=True)
        sys.exit(130)


class TimeLeft(TimeRemainingColumn):
    """The time left, once the phase can be counted (nothing for a spinner)."""

    def render(self, task: Task) -> Text:
        return Text("") if task.total is None else Text.assemble("eta ", super().render(task))


@contextlib.contextmanager
def phases(show: bool) -> Iterator[Report | None]:
    """Long work's phases on stderr when a person watches: a spinner with the phase and its
    elapsed time, a bar once it can be counted; None (nothing drawn) otherwise."""
    if not (show and interactive()):
        yield None
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=12),
        TextColumn("{task.fields[count]}"),
        TimeElapsedColumn(),
        TimeLeft(),
    )
    # Only ever drawn for a terminal (see interactive), so drawn as one.
    screen = Console(file=sys.stderr, force_terminal=True, highlight=False)
    with Progress(*columns, console=screen, transient=True) as bar:
        shown: dict[str, Any] = {}

        def report(phase: Phase) -> None:
            # One line per thing worked on: its description may change (a backfill goes
            # from indexing to merging and back), its elapsed time goes on.
            key = (phase.kind, phase.item or phase.label)
            # Room left for the spinner, the bar, the count and the times.
            label = shorten(phase.label, max(20, screen.width - 48))
            if shown.get("key") != key:
                if "task" in shown:
                    bar.remove_task(shown["task"])
                shown.update(key=key, task=bar.add_task(label, total=None, count=""))
            if phase.done is not None and phase.total is not None:
                count = f"{phase.done:,}/{phase.total:,} {phase.unit}".strip()
                bar.update(
                    shown["task"],
                    description=label,
                    completed=phase.done,
                    total=phase.total,
                    count=count,
                )
            else:
                bar.update(shown["task"], description=label)
            bar.refresh()

        yield report


@contextlib.contextmanager
def rows_bar(show: bool, label: str) -> Iterator[Callable[[int, int | None, str], None]]:
    """A rich progress bar of rows with an ETA on stderr, when it is a terminal; it yields
    ``draw(rows_done, rows_total, description)``."""
    if not (show and interactive()):
        yield lambda _done, _total, _description: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def draw(done: int, total: int | None, description: str) -> None:
            bar.update(task, description=description, completed=done, total=total or None)

        yield draw


@contextlib.contextmanager
def backfill_bar(show: bool) -> Iterator[Callable[[backfill.BackfillProgress], None]]:
    """The backfill's progress as a bar of rows."""
    with phases(show) as report:
        if report is None:
            yield lambda progress_lines: None
            return
        draw = report

        def step(progress: backfill.BackfillProgress) -> None:
            counted = progress.phase.startswith("indexing") and progress.rows_total > 0
            done, total = (progress.rows_done, progress.rows_total) if counted else (None, None)
            draw(Phase("fill", progress.phase, done, total, "rows", item="backfill"))

        yield step


#: What each step of the copy counts, for its progress bar.
_COPY_UNITS = {"searching": "searches", "vacuuming": "tables"}


@contextlib.contextmanager
def copy_bar(show: bool) -> Iterator[Callable[[Any], None]]:
    """The copy's progress on stderr (a terminal only): comparing both sides, copying,
    deleting, then the verification's checksums and sample searches, each with its bar."""
    if not (show and interactive()):
        yield lambda progress_lines: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        tasks: dict[str, Any] = {}

        def draw(progress: Any) -> None:
            step = progress.step
            description = step if step == "searching" else f"{step} {progress.table}"
            total = progress.total or None
            if step not in tasks:
                for other in tasks.values():  # one bar at a time: the earlier steps are done
                    bar.update(other, visible=False)
                unit = _COPY_UNITS.get(step, "rows")
                tasks[step] = bar.add_task(description, total=total, unit=unit)
                bar.refresh()  # each step shows, however short
            bar.update(tasks[step], description=description, completed=progress.rows, total=total)

        yield draw


@contextlib.contextmanager
def archive_bar(show: bool) -> Iterator[Callable[[Any, int], None]]:
    """Sessions moved so far, out of those chosen, on stderr (a terminal only)."""
    if not (show and interactive()):
        yield lambda moved, total: None
        return
    columns = (
        TextColumn("moving sessions"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("moving", total=None)

        def draw(moved: Any, total: int) -> None:
            bar.update(task, completed=moved.sessions, total=total or None)

        yield draw

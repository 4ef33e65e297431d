"""Long work shows its progress on a terminal (rich: the phase, a count where there is one,
the time it has taken) and nothing extra when piped or with --json: upgrade, downgrade,
optimize and optimize-storage."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from migration_support import legacy_corpus_store

from hermes_store import migrate
from hermes_store.cli import main, progress
from hermes_store.revisions import fts_head_revision

#: Control sequences a terminal is drawn with (colour, cursor movement, erasing).
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def drawn(stderr: str) -> str:
    """What a person saw: the frames without their control sequences, one per line."""
    return "\n".join(part for part in re.split(r"[\r\n]+", ANSI.sub("", stderr)) if part.strip())


@pytest.fixture(scope="module")
def legacy_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return legacy_corpus_store(tmp_path_factory.mktemp("progress") / "legacy.db", 800, 5)


@pytest.fixture
def legacy_store(legacy_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(legacy_template, tmp_path / "state.db"))


def on_a_terminal(*args: str | Path) -> tuple[int, str, str]:
    """The command as a real process whose stderr is a terminal (a pty) and stdout a pipe:
    its exit status, stdout, and everything drawn on the terminal."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_store.cli", *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env={**os.environ, "COLUMNS": "160"},
    )
    os.close(slave)
    screen = bytearray()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the process closed its end
                break
            if not chunk:
                break
            screen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    return proc.wait(timeout=60), out, screen.decode(errors="replace")


def test_an_upgrade_on_a_terminal_shows_each_phase(legacy_store: Path) -> None:
    status, out, screen = on_a_terminal("upgrade", "--db", legacy_store)
    assert status == 0, screen
    assert f"-> {migrate.head_revision()}" in out
    seen = drawn(screen)
    for phase in (
        "adopting legacy schema 21",
        "revision 22",
        "verifying the search indexes",
        "revision fts1: moving the search indexes to external content in place",
        "freeing messages_fts_content_retired",
    ):
        assert phase in seen, (phase, seen)
    counts = re.findall(r"freeing messages_fts_content_retired\S* .*?([\d,]+)/([\d,]+) rows", seen)
    assert counts, seen
    assert {total for _done, total in counts} == {"800"}
    assert any(done != "0" for done, _total in counts)


def test_a_piped_upgrade_prints_nothing_extra(legacy_store: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hermes_store.cli", "upgrade", "--db", str(legacy_store)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines()[0].startswith("legacy schema 21 (unversioned) -> ")


def invoke(*args: str | Path) -> Result:
    """In-process, as on a terminal 160 columns wide (where `_interactive` says so)."""
    result = CliRunner(env={"COLUMNS": "160"}).invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def test_a_rebuild_says_it_cannot_count_and_shows_the_time_instead(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "interactive", lambda: True)
    seen = drawn(invoke("upgrade", "--db", legacy_store, "--rebuild-fts").stderr)
    assert re.search(r"revision fts1: re-indexing every message.* \d+:\d\d:\d\d", seen), seen


def test_downgrade_optimize_and_optimize_storage_show_progress_and_json_does_not(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(str(legacy_store), x={"fts_convert": "rebuild", "fts_backfill": "deferred"})
    monkeypatch.setattr(progress, "interactive", lambda: True)
    seen = drawn(invoke("optimize-storage", "--db", legacy_store).stderr)
    assert re.search(r"indexing messages_fts\w*", seen), seen
    assert "800/800 rows" in seen or "800 rows" in seen, seen
    seen = drawn(invoke("optimize", "--db", legacy_store, "--vacuum").stderr)
    assert "vacuuming" in seen, seen
    # The search layout back to inline: its head (fts2), then the conversion (fts1).
    seen = drawn(invoke("downgrade", "fts@-2", "--db", legacy_store, "--yes").stderr)
    assert f"undoing revision {fts_head_revision()}" in seen, seen
    assert "undoing revision fts1" in seen, seen
    assert invoke("upgrade", "--db", legacy_store, "--json").stderr == ""
    assert invoke("optimize", "--db", legacy_store, "--json").stderr == ""
    assert invoke("downgrade", "-1", "--db", legacy_store, "--yes", "--json").stderr == ""

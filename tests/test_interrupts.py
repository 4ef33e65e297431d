"""Ctrl-C tells the truth: in every phase of `upgrade` (classify, backup, adopt, verify, each
revision, the search check, freeing the set-aside copies), of `downgrade`, `optimize` and
`optimize-storage`, the message says what was done, what is left and the command that
finishes it, and `current` then agrees with the store.

The interrupt is a KeyboardInterrupt raised where the phase's work is (after part of it,
where that proves the rollback), and for one case a real SIGINT to a real process.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from migration_support import legacy_corpus_store

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.declarations import SQLITE
from hermes_store.errors import Interrupted
from hermes_store.migrate import adoption
from hermes_store.sqlite import backfill, changelog, fts
from hermes_store.sqlite import migration as sqlite_migration

HEAD = migrate.head_revision()
SET_ASIDE = [fts.retired_copy_name(index) for index in fts.INDEXES]


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


def tables(path: Path) -> set[str]:
    return {row[0] for row in query(path, "SELECT name FROM sqlite_master WHERE type='table'")}


def revisions(path: Path) -> list[str]:
    if "alembic_version" not in tables(path):
        return []
    return sorted(row[0] for row in query(path, "SELECT version_num FROM alembic_version"))


def set_aside_rows(path: Path) -> dict[str, int]:
    """Rows still in each set-aside copy, counted with the stdlib driver."""
    present = tables(path)
    return {
        name: query(path, f"SELECT count(*) FROM {name}")[0][0]
        for name in SET_ASIDE
        if name in present
    }


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def interrupted(result: Result) -> str:
    """Exit 130 and one line on stderr: the account of the interrupt."""
    assert result.exit_code == 130, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("interrupted "), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def current(path: Path) -> dict[str, Any]:
    result = invoke("current", "--db", path, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def assert_current_agrees(path: Path) -> dict[str, Any]:
    """`current` says the revision and the rows left that the store itself holds."""
    data = current(path)
    expected = ", ".join(revisions(path)) or None
    assert data["revision"] == expected, (data["revision"], expected)
    left = {name: status["rows_left"] for name, status in data["backfill"].items()}
    for name, rows in set_aside_rows(path).items():
        assert left[name] == rows, (name, left, rows)
    return data


def interrupt_at(
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    name: str,
    *,
    calls_before: int = 0,
    run_first: bool = False,
) -> list[int]:
    """Replace ``owner.name``: the first ``calls_before`` calls go through, the next one
    raises KeyboardInterrupt (after doing its work when ``run_first``), later ones go
    through again (the account of the interrupt reads the store with them)."""
    original: Callable[..., Any] = getattr(owner, name)
    seen = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] != calls_before + 1:
            return original(*args, **kwargs)
        if run_first:
            original(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(owner, name, wrapper)
    return seen


@pytest.fixture(scope="module")
def legacy_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return legacy_corpus_store(tmp_path_factory.mktemp("interrupts") / "legacy.db", 600, 11)


@pytest.fixture
def legacy_store(legacy_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(legacy_template, tmp_path / "state.db"))


@pytest.fixture
def set_aside_store(legacy_store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Upgraded to head with the two text copies still set aside (as an earlier
    `alembic upgrade head`, or an upgrade killed while freeing them, left them)."""
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_migration, "free_set_aside", lambda *_args, **_kw: None)
        migrate.upgrade(str(legacy_store))
    assert set(set_aside_rows(legacy_store)) == set(SET_ASIDE)
    return legacy_store


# --------------------------------------------------------------------------------------
# upgrade, phase by phase
# --------------------------------------------------------------------------------------


def test_while_classifying_nothing_is_written(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = legacy_store.read_bytes()
    interrupt_at(monkeypatch, sqlite_migration, "check_upgrade_space")
    line = interrupted(invoke("upgrade", "--db", legacy_store))
    assert "before anything was written" in line
    assert "legacy schema 21 (unversioned)" in line
    assert f"`hermes-store upgrade --db {legacy_store}`" in line
    assert legacy_store.read_bytes() == before
    assert current(legacy_store)["revision"] is None


def test_while_backing_up_the_store_is_untouched_and_no_copy_is_left(
    legacy_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "backups" / "before.db"
    target.parent.mkdir()
    interrupt_at(monkeypatch, sqlite_migration, "backup_from")
    line = interrupted(invoke("upgrade", "--db", legacy_store, "--backup", target))
    assert "while taking the backup" in line
    assert "legacy schema 21 (unversioned)" in line
    assert list(target.parent.iterdir()) == []
    assert revisions(legacy_store) == []
    assert_current_agrees(legacy_store)


def test_while_adopting_the_adoption_is_rolled_back(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = query(legacy_store, "SELECT name, sql FROM sqlite_master ORDER BY name")
    interrupt_at(monkeypatch, adoption, "_add_missing", run_first=True)
    line = interrupted(invoke("upgrade", "--db", legacy_store))
    assert "while adopting the legacy store: that transaction was rolled back" in line
    assert "the store is at legacy schema 21 (unversioned)" in line
    assert "(it was at" not in line  # nothing moved
    assert query(legacy_store, "SELECT name, sql FROM sqlite_master ORDER BY name") == schema
    assert_current_agrees(legacy_store)


def test_while_verifying_the_store_is_adopted_and_nothing_converted(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupt_at(monkeypatch, changelog, "verify_inline")
    line = interrupted(invoke("upgrade", "--db", legacy_store))
    assert "while verifying the search indexes (a read): nothing was converted" in line
    assert "the store is at revision 21 (it was at legacy schema 21 (unversioned))" in line
    assert "run `hermes-store upgrade" in line
    assert SQLITE.change_log.table not in tables(legacy_store)  # no trigger left logging
    assert assert_current_agrees(legacy_store)["fts_layout"] == "inline"


UPGRADE_PATH = ["22", "23", "24", "25", "26", "27", "28", "29", "30", "fts1"]


@pytest.mark.parametrize("revision", UPGRADE_PATH)
def test_during_a_revision_it_is_rolled_back_and_the_earlier_ones_kept(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch, revision: str
) -> None:
    module = migrate.script_directory().get_revision(revision).module
    interrupt_at(monkeypatch, module, "upgrade", run_first=True)
    line = interrupted(invoke("upgrade", "--db", legacy_store))
    previous = "30" if revision == "fts1" else str(int(revision) - 1)
    assert f"during revision {revision}, which was rolled back whole" in line
    assert f"the store is at revision {previous} (it was at legacy schema 21" in line
    assert f"run `hermes-store upgrade --db {legacy_store}` to finish" in line
    assert revisions(legacy_store) == [previous]
    assert assert_current_agrees(legacy_store)["fts_layout"] == "inline"
    monkeypatch.undo()
    assert invoke("upgrade", "--db", legacy_store).exit_code == 0
    assert revisions(legacy_store) == [HEAD]


def test_while_checking_the_search_mechanism_the_revisions_are_done(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupt_at(monkeypatch, sqlite_migration, "heal_search")
    line = interrupted(invoke("upgrade", "--db", legacy_store))
    assert "while checking the search mechanism" in line
    assert f"the store is at revision {HEAD}" in line
    # The copies come after the check: they are still all there, and said to be.
    rows = set_aside_rows(legacy_store)
    assert set(rows) == set(SET_ASIDE)
    assert f"{sum(rows.values()):,} rows" in line
    assert_current_agrees(legacy_store)


def test_while_freeing_the_copies_it_says_the_upgrade_is_done_and_what_is_left(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupt_at(monkeypatch, backfill, "retire_step", calls_before=1)
    line = interrupted(invoke("upgrade", "--db", legacy_store))
    rows = set_aside_rows(legacy_store)
    assert rows
    assert sum(rows.values()) > 0
    messages = query(legacy_store, "SELECT count(*) FROM messages")[0][0]
    assert rows[SET_ASIDE[0]] == messages - backfill.FIRST_RETIRE_ROWS  # the first step kept
    assert "while freeing what the search conversion set aside: the revisions are all done" in line
    assert f"the store is at revision {HEAD}" in line
    assert "rolled back" not in line
    assert "revision in progress" not in line
    assert f"{sum(rows.values()):,} rows" in line
    assert f"`hermes-store optimize --db {legacy_store}` frees them" in line
    data = assert_current_agrees(legacy_store)
    assert sum(data["backfill"][name]["rows_left"] for name in rows) == sum(rows.values())


# --------------------------------------------------------------------------------------
# downgrade, optimize, optimize-storage
# --------------------------------------------------------------------------------------


def test_a_downgrade_interrupted_in_a_later_step_says_what_is_left(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(str(legacy_store))
    module = migrate.script_directory().get_revision("30").module
    interrupt_at(monkeypatch, module, "downgrade", run_first=True)
    line = interrupted(invoke("downgrade", "-3", "--db", legacy_store, "--yes"))
    # -3 from head: the search layout's two steps (fts2, then the conversion fts1, each
    # with the merge above it) were undone, then 30, the third step, was interrupted.
    assert "during the downgrade of revision 30, which was rolled back whole" in line
    assert f"the store is at revision 30 (it was at revision {HEAD})" in line
    assert f"run `hermes-store downgrade -1 --db {legacy_store}` to finish" in line
    assert revisions(legacy_store) == ["30"]
    assert_current_agrees(legacy_store)
    monkeypatch.undo()
    assert invoke("downgrade", "-1", "--db", legacy_store, "--yes").exit_code == 0
    assert revisions(legacy_store) == ["29"]


def test_optimize_interrupted_while_freeing_keeps_every_finished_step(
    set_aside_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupt_at(monkeypatch, backfill, "retire_step", calls_before=1)
    line = interrupted(invoke("optimize", "--db", set_aside_store))
    rows = set_aside_rows(set_aside_store)
    assert rows
    assert f"interrupted while freeing {SET_ASIDE[0]}" in line
    assert "every finished one is kept" in line
    assert f"{sum(rows.values()):,} rows of {', '.join(sorted(rows))}" in line
    assert f"run `hermes-store optimize --db {set_aside_store}` to finish" in line
    assert_current_agrees(set_aside_store)


def test_optimize_storage_interrupted_while_indexing_says_how_many_rows_are_left(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(str(legacy_store), x={"fts_convert": "rebuild", "fts_backfill": "deferred"})
    interrupt_at(monkeypatch, backfill, "_chunk", calls_before=2)
    line = interrupted(invoke("optimize-storage", "--db", legacy_store, "--chunk-rows", "50"))
    assert re.search(r"interrupted while indexing messages_fts\w*: that step was rolled back", line)
    data = current(legacy_store)
    filling = {
        name: s["rows_left"] for name, s in data["backfill"].items() if s["state"] == "filling"
    }
    assert filling
    assert all(rows > 0 for rows in filling.values())
    assert f"{sum(filling.values()):,} rows left to index" in line
    assert "run `hermes-store optimize-storage` to resume" in line
    assert_current_agrees(legacy_store)


def test_the_library_raises_a_keyboard_interrupt_with_the_account(
    legacy_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that stops on KeyboardInterrupt still does; the message is the account."""
    interrupt_at(monkeypatch, backfill, "retire_step")
    with pytest.raises(KeyboardInterrupt) as caught:
        migrate.upgrade(str(legacy_store))
    assert isinstance(caught.value, Interrupted)
    assert "the revisions are all done" in str(caught.value)


@pytest.mark.slow
def test_sigint_to_a_real_process_while_it_frees_the_copies(set_aside_store: Path) -> None:
    """A real Ctrl-C (SIGINT) to `optimize-storage` freeing the set-aside copies in very
    small, widely spaced steps: the account names what is left, and `current` agrees."""
    start = sum(set_aside_rows(set_aside_store).values())
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_store.cli", "optimize-storage", "--db", str(set_aside_store)]
        + ["--max-lock-ms", "1", "--duty", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(sqlite3.Error):
            if 0 < sum(set_aside_rows(set_aside_store).values()) < start:
                break
        time.sleep(0.02)
    assert proc.poll() is None, "the command ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("interrupted while freeing "), stderr
    rows = set_aside_rows(set_aside_store)
    assert rows
    assert 0 < sum(rows.values()) < start
    assert f"{sum(rows.values()):,} rows of swapped-out indexes and set-aside copies" in lines[0]
    assert "run `hermes-store optimize-storage` to resume" in lines[0]
    assert_current_agrees(set_aside_store)

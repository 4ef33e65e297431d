"""`downgrade -N`, `fts@-1`, `base` and revision ids from any revision, the merge head included,
through `hermes-store downgrade` and the bare `alembic downgrade` alike; the confirmation says
what will be undone; an unknown revision points to `hermes-store history`.

One step is the newest revision that changes the store, in the order `hermes-store upgrade`
applies them (the application's 17 to its newest version, then the search layout: fts1, the
conversion to external content, and each layout revision after it); the merges that join the
two change nothing and are undone together with the step below them. So -1 from the head
undoes the search layout's newest revision only (fts2, which changes nothing on SQLite), and
going back to the inline layout takes one step per layout revision.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from legacy.build import build_legacy_store
from migration_support import legacy_corpus_store

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.errors import StoreError, UnknownRevision
from hermes_store.revisions import (
    APP_VERSIONS,
    FTS_EXTERNAL_REVISION,
    LAST_APP_VERSION,
    fts_head_revision,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HEAD = migrate.head_revision()
#: The application's newest version and the two before it, as revision ids.
NEWEST, PREVIOUS, BEFORE_PREVIOUS = (str(LAST_APP_VERSION - n) for n in range(3))
#: The search layout's head (fts2) and the merge below the head that joined the layout's
#: previous revision to the chain (merge_30_fts1): where -1 from the head leaves a store.
FTS_HEAD = fts_head_revision()
_HEAD_SCRIPT = migrate.script_directory().get_revision(HEAD)
assert _HEAD_SCRIPT is not None
assert FTS_HEAD in _HEAD_SCRIPT.down_revision
(PREVIOUS_MERGE,) = (rev for rev in _HEAD_SCRIPT.down_revision if rev != FTS_HEAD)


def _layout_revisions() -> list[str]:
    """The search layout's revisions, newest first: its head down to the conversion, fts1."""
    script = migrate.script_directory()
    found = [FTS_HEAD]
    while found[-1] != FTS_EXTERNAL_REVISION:
        rev = script.get_revision(found[-1])
        assert rev is not None
        assert isinstance(rev.down_revision, str)
        found.append(rev.down_revision)
    return found


def _merge_above(revision: str) -> list[str]:
    """The merge that joined ``revision`` of the search layout to the chain."""
    return [
        rev.revision
        for rev in migrate.script_directory().walk_revisions()
        if rev.is_merge_point and revision in rev.down_revision
    ]


#: The layout's revisions, newest first (fts2, fts1): one step each.
LAYOUT_REVISIONS = _layout_revisions()
LAYOUT_STEPS = len(LAYOUT_REVISIONS)
#: What -1 from the head undoes: the merge above the layout's head (changing nothing) and
#: the head itself (fts2), which on SQLite changes nothing either.
FIRST_STEP = [HEAD, FTS_HEAD]
#: What going back from the head to the inline layout undoes, newest first: each layout
#: revision with the merge above it (changing nothing), down to the conversion fts1.
LAYOUT_STEP = [name for rev in LAYOUT_REVISIONS for name in (*_merge_above(rev), rev)]
#: The steps a store at head has: each application version, and each layout revision.
STEPS = len(APP_VERSIONS) + LAYOUT_STEPS


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


def revisions(path: Path) -> list[str]:
    return sorted(row[0] for row in query(path, "SELECT version_num FROM alembic_version"))


def schema(path: Path) -> list[tuple[Any, ...]]:
    """Every schema object with its SQL: two stores with equal lists have one schema."""
    return query(path, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")


def invoke(*args: str | Path, expect: int | None = 0, input: str | None = None) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args], input=input)
    if expect is not None:
        assert result.exit_code == expect, (result.exit_code, result.output, result.exception)
    return result


def one_line_error(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert "Traceback" not in result.output
    return lines[0]


def alembic(*args: str) -> subprocess.CompletedProcess[str]:
    """The bare `alembic` command line, from the project directory."""
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(PROJECT_ROOT / "alembic.ini"), *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def alembic_errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What `alembic` said on stderr besides its INFO progress lines."""
    return [line for line in done.stderr.splitlines() if not line.startswith("INFO")]


@pytest.fixture(scope="module")
def head_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A schema-21 legacy store with 300 messages, upgraded to head."""
    path = legacy_corpus_store(tmp_path_factory.mktemp("downgrade") / "head.db", 300, 3)
    migrate.upgrade(str(path))
    return path


@pytest.fixture
def head_store(head_template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(head_template, tmp_path / "state.db"))


def current_layout(path: Path) -> str:
    return str(json.loads(invoke("current", "--db", path, "--json").stdout)["fts_layout"])


def test_minus_one_from_the_merge_head_undoes_the_search_layout(head_store: Path) -> None:
    """-1 from the head undoes the layout's newest revision (fts2: nothing on SQLite); the
    next -1 undoes the conversion, fts1, back to the inline layout."""
    messages = query(head_store, "SELECT count(*) FROM messages")
    before = schema(head_store)
    data = json.loads(invoke("downgrade", "-1", "--db", head_store, "--yes", "--json").stdout)
    assert (data["from"], data["to"]) == (HEAD, PREVIOUS_MERGE)
    assert [step["revision"] for step in data["undone"]] == FIRST_STEP
    assert revisions(head_store) == [PREVIOUS_MERGE]
    assert schema(head_store) == before  # fts2 changes nothing on SQLite
    assert current_layout(head_store) == "external"
    assert query(head_store, "SELECT count(*) FROM messages") == messages

    data = json.loads(invoke("downgrade", "-1", "--db", head_store, "--yes", "--json").stdout)
    assert (data["from"], data["to"]) == (PREVIOUS_MERGE, NEWEST)
    assert [step["revision"] for step in data["undone"]] == [
        *_merge_above(FTS_EXTERNAL_REVISION),
        FTS_EXTERNAL_REVISION,
    ]
    assert revisions(head_store) == [NEWEST]
    assert query(head_store, "SELECT version FROM schema_version") == [(LAST_APP_VERSION,)]
    assert current_layout(head_store) == "inline"
    assert query(head_store, "SELECT count(*) FROM messages") == messages


def test_minus_n_walks_back_one_step_at_a_time(head_store: Path, tmp_path: Path) -> None:
    """-4 from head is -1 four times: fts2, the conversion fts1 (the search layout), then the
    newest version, then the one before."""
    walked = Path(shutil.copy(head_store, tmp_path / "walked.db"))
    seen = []
    for _ in range(4):
        invoke("downgrade", "-1", "--db", walked, "--yes")
        seen.append(revisions(walked))
    assert seen == [[PREVIOUS_MERGE], [NEWEST], [PREVIOUS], [BEFORE_PREVIOUS]]
    invoke("downgrade", "-4", "--db", head_store, "--yes")
    assert revisions(head_store) == [BEFORE_PREVIOUS]
    assert schema(head_store) == schema(walked)


def test_minus_one_at_the_agents_version_undoes_the_search_layout(head_store: Path) -> None:
    """A store at (21, fts2), as `upgrade --app-version 21` leaves it: one step is fts2
    (nothing on SQLite), the next the conversion fts1."""
    invoke("downgrade", "21", "--db", head_store, "--yes")
    assert revisions(head_store) == ["21", FTS_HEAD]
    before = schema(head_store)
    invoke("downgrade", "-1", "--db", head_store, "--yes")
    assert revisions(head_store) == ["21", FTS_EXTERNAL_REVISION]
    assert schema(head_store) == before
    invoke("downgrade", "-1", "--db", head_store, "--yes")
    assert revisions(head_store) == ["21"]
    assert current_layout(head_store) == "inline"
    invoke("downgrade", "-1", "--db", head_store, "--yes")
    assert revisions(head_store) == ["20"]


def test_branch_relative_and_absolute_targets(head_store: Path, tmp_path: Path) -> None:
    other = Path(shutil.copy(head_store, tmp_path / "other.db"))
    before = schema(head_store)
    invoke("downgrade", "fts@-1", "--db", head_store, "--yes")  # fts2: nothing on SQLite
    assert revisions(head_store) == [PREVIOUS_MERGE]
    assert schema(head_store) == before
    invoke("downgrade", "fts@-1", "--db", head_store, "--yes")  # fts1: back to inline
    assert revisions(head_store) == [NEWEST]
    # Alembic's meaning: what depends on NEWEST, the merges only; the layout's head stays.
    invoke("downgrade", NEWEST, "--db", other, "--yes")
    assert revisions(other) == sorted([NEWEST, FTS_HEAD])
    assert schema(other) == before
    invoke("downgrade", "fts@-1", "--db", other, "--yes")
    assert revisions(other) == sorted([NEWEST, FTS_EXTERNAL_REVISION])
    invoke("downgrade", "fts@-1", "--db", other, "--yes")
    assert revisions(other) == [NEWEST]
    assert schema(other) == schema(head_store)


def test_the_bare_alembic_command_takes_the_same_step(head_store: Path, tmp_path: Path) -> None:
    through_cli = Path(shutil.copy(head_store, tmp_path / "cli.db"))
    invoke("downgrade", "-1", "--db", through_cli, "--yes")
    done = alembic("-x", f"db={head_store}", "downgrade", "-1")
    assert done.returncode == 0, done.stderr
    assert alembic_errors(done) == []
    assert revisions(head_store) == revisions(through_cli) == [PREVIOUS_MERGE]
    assert schema(head_store) == schema(through_cli)
    # The conversion, then the newest version and the one before.
    done = alembic("-x", f"db={head_store}", "downgrade", "-3")
    assert done.returncode == 0, done.stderr
    assert revisions(head_store) == [BEFORE_PREVIOUS]


def test_minus_one_needs_no_double_dash(head_store: Path) -> None:
    for args in (["downgrade", "-1", "--db", head_store], ["downgrade", "--db", head_store, "-1"]):
        invoke(*args, "--yes")
    assert revisions(head_store) == [NEWEST]  # fts2, then fts1
    result = invoke("downgrade", "--yess", "-1", "--db", head_store, expect=2)
    assert "No such option" in result.stderr
    assert revisions(head_store) == [NEWEST]


def test_the_confirmation_says_what_each_step_gives_up(head_store: Path) -> None:
    before = schema(head_store)
    steps = LAYOUT_STEPS + 1  # the search layout's revisions, then the newest version
    result = invoke("downgrade", f"-{steps}", "--db", head_store, input="n\n", expect=1)
    prompt = result.output
    lines = [line.strip() for line in prompt.splitlines() if line.strip()]
    assert any(f"from {HEAD} to {PREVIOUS}" in line for line in lines), prompt
    undone = [line for line in lines if line.split()[0] in (*LAYOUT_STEP, NEWEST)]
    assert [line.split()[0] for line in undone] == [*LAYOUT_STEP, NEWEST], prompt
    assert "nothing to undo" in undone[0].lower()
    # fts2's own downgrade paragraph: what it restores, and that nothing is lost.
    assert undone[1].split()[0] == FTS_HEAD
    assert "nothing is lost" in undone[1].lower()
    assert "inline" in undone[-2]  # the search indexes go back to the legacy layout
    assert "lost" in undone[-1]  # the newest version's downgrade drops columns and their values
    assert schema(head_store) == before


def test_walking_past_base_is_one_line(head_store: Path) -> None:
    before = schema(head_store)
    line = one_line_error(invoke("downgrade", "-40", "--db", head_store, "--yes", expect=None))
    assert "-40" in line
    assert str(STEPS) in line
    assert schema(head_store) == before
    # All the steps is base, which deletes the conversations: both flags are needed.
    line = one_line_error(
        invoke("downgrade", f"-{STEPS}", "--db", head_store, "--yes", expect=None)
    )
    assert "--i-know-this-deletes-data" in line
    assert schema(head_store) == before
    done = alembic("-x", f"db={head_store}", "downgrade", f"-{STEPS}")
    assert done.returncode != 0
    assert "i_know_this_deletes_data" in alembic_errors(done)[0]
    assert schema(head_store) == before


def test_plan_from_every_revision_is_one_step(head_store: Path) -> None:
    """From each state the chain can be in, -1 undoes exactly one revision that changes the
    store (plus the merge above it) and never more."""
    script = migrate.script_directory()
    states = [
        ("17",),
        ("21",),
        (NEWEST,),
        ("17", "fts1"),
        ("21", "fts1"),
        (NEWEST, "fts1"),
        (FTS_HEAD,),
        ("21", FTS_HEAD),
        (NEWEST, FTS_HEAD),
        (PREVIOUS_MERGE,),
        (PREVIOUS_MERGE, FTS_HEAD),
        (HEAD,),
    ]
    seen = []
    for heads in states:
        plan = migrate.plan_downgrade(heads, "-1")
        changing = [rev for rev in plan.undone if not script.get_revision(rev).is_merge_point]
        assert len(changing) == 1, (heads, plan.undone)
        seen.append((heads, plan.after))
    assert seen == [
        (("17",), ()),
        (("21",), ("20",)),
        ((NEWEST,), (PREVIOUS,)),
        (("17", "fts1"), ("17",)),
        (("21", "fts1"), ("21",)),
        ((NEWEST, "fts1"), (NEWEST,)),
        ((FTS_HEAD,), ("fts1",)),
        (("21", FTS_HEAD), ("21", "fts1")),
        ((NEWEST, FTS_HEAD), (NEWEST, "fts1")),
        ((PREVIOUS_MERGE,), (NEWEST,)),
        ((PREVIOUS_MERGE, FTS_HEAD), (PREVIOUS_MERGE,)),
        ((HEAD,), (PREVIOUS_MERGE,)),
    ]


def test_an_unknown_revision_points_to_history(head_store: Path) -> None:
    before = schema(head_store)
    for args in (
        ["downgrade", "nosuch", "--yes"],
        ["downgrade", "nosuch@-1", "--yes"],
        ["upgrade", "--revision", "nosuch"],
        ["stamp", "nosuch"],
    ):
        line = one_line_error(invoke(*args, "--db", head_store, expect=None))
        assert "'nosuch'" in line, line
        assert "hermes-store history" in line, line
        assert "Can't locate" not in line
    assert schema(head_store) == before
    for verb in ("upgrade", "downgrade", "stamp"):
        done = alembic("-x", f"db={head_store}", verb, "nosuch")
        assert done.returncode != 0
        errors = alembic_errors(done)
        assert errors, done.stderr
        assert "'nosuch'" in errors[0], errors
        assert "hermes-store history" in errors[0], errors
        assert "Traceback" not in done.stderr
    assert schema(head_store) == before
    with pytest.raises(UnknownRevision, match="hermes-store history"):
        migrate.plan_downgrade((HEAD,), "nosuch")
    assert issubclass(UnknownRevision, StoreError)


def test_history_marks_the_revision_an_unversioned_store_corresponds_to(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    build_legacy_store(path, 21)
    text = invoke("history", "--db", path).stdout
    marked = [line for line in text.splitlines() if "legacy schema 21" in line]
    assert len(marked) == 1, text
    assert marked[0].split()[0] == "21"
    assert "unversioned" in marked[0]
    records = [
        json.loads(line) for line in invoke("history", "--db", path, "--nl").stdout.splitlines()
    ]
    assert records
    assert [r["revision"] for r in records if r["current"]] == ["21"]
    assert query(path, "SELECT name FROM sqlite_master WHERE name = 'alembic_version'") == []


@pytest.mark.postgresql
def test_on_postgresql_minus_one_is_the_same_step(pg_url: str) -> None:
    invoke("upgrade", "--db", pg_url)
    data = json.loads(invoke("downgrade", "-1", "--db", pg_url, "--yes", "--json").stdout)
    assert (data["from"], data["to"]) == (HEAD, PREVIOUS_MERGE)
    assert [step["revision"] for step in data["undone"]] == FIRST_STEP
    # On PostgreSQL fts2 is a change of its own: the stored words go, fts1's index is back.
    assert json.loads(invoke("current", "--db", pg_url, "--json").stdout)["fts_layout"] == (
        "expression"
    )
    done = alembic("-x", f"db={pg_url}", "downgrade", "-2")  # fts1, then the newest version
    assert done.returncode == 0, done.stderr
    assert json.loads(invoke("current", "--db", pg_url, "--json").stdout)["revision"] == PREVIOUS
    line = one_line_error(invoke("downgrade", f"-{PREVIOUS}", "--db", pg_url, "--yes", expect=None))
    # 17 to the one before the newest
    assert f"has {len(APP_VERSIONS) - 1} step(s) to undo" in line
    invoke("upgrade", "--db", pg_url)
    assert json.loads(invoke("current", "--db", pg_url, "--json").stdout)["revision"] == HEAD

"""kill -9 at each step of an archive or restore batch, then the same command again: every
message in exactly one store and unchanged, no tree split, `check` passing on both."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from archive_support import (
    BIG,
    MOVED_BY_AGE,
    add_big_tree,
    build_hot,
    hot_copy,
    message_ids,
    rows_of,
    session_ids,
    snapshot,
    union_equals,
)
from click.testing import CliRunner

from hermes_store.archive import archive_sessions, criterion, move, restore_session
from hermes_store.cli import main
from hermes_store.store import NewMessage, Store

pytestmark = pytest.mark.slow

STEPS = ("marked", "copying", "copied", "verified", "deleting", "deleted", "done")

_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from hermes_store.archive import archive_sessions, criterion, move, restore_session

    step, direction, hot, other, session = sys.argv[1:6]
    step, _, nth = step.partition(":")
    seen = []

    def kill_at(name):
        if name == step:
            seen.append(name)
            if len(seen) >= int(nth or 1):
                os.kill(os.getpid(), signal.SIGKILL)

    move.STEP_HOOK = kill_at
    if direction == "archive":
        archive_sessions(hot, other, criterion(older_than="90d"))
    else:
        restore_session(session, hot, other)
    sys.exit(3)  # the step was never reached
    """
)


def _killed_at(step: str, direction: str, hot: Path, other: Path, session: str = "") -> None:
    done = subprocess.run(
        [sys.executable, "-c", _KILLED, step, direction, str(hot), str(other), session],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, (step, done.returncode, done.stderr[-2000:])


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hot(tmp_path_factory.mktemp("kill") / "template.db")


@pytest.fixture
def hot(template: Path, tmp_path: Path) -> Path:
    return hot_copy(template, tmp_path)


def _check(path: Path) -> None:
    done = CliRunner().invoke(main, ["check", "--db", str(path)])
    assert done.exit_code == 0, done.output


@pytest.mark.parametrize("step", STEPS)
def test_archive_killed_at_each_step_then_resumed(hot: Path, tmp_path: Path, step: str) -> None:
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    _killed_at(step, "archive", hot, archive)
    # Killed: a session may be in both stores (copied, not yet deleted), never in neither.
    union = message_ids(hot) | message_ids(archive)
    assert union == {row[0] for row in before["messages"]}
    result = archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    if step not in ("done",):
        assert result.moved.resumed, step
    union_equals(before, hot, archive)
    assert session_ids(archive) == MOVED_BY_AGE
    assert not rows_of(hot, "SELECT 1 FROM state_meta WHERE key LIKE 'hermes_store.archive%'")
    assert not rows_of(archive, "SELECT 1 FROM state_meta WHERE key LIKE 'hermes_store.archive%'")
    _check(hot)
    _check(archive)


@pytest.mark.parametrize("step", STEPS)
def test_restore_killed_at_each_step_then_resumed(hot: Path, tmp_path: Path, step: str) -> None:
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    _killed_at(step, "restore", hot, archive, "r1-cont")
    result = restore_session("r1-cont", str(hot), str(archive))
    assert result.moved.resumed or step == "done"
    union_equals(before, hot, archive)
    assert {"r1", "r1-cont", "r1-sub"} <= session_ids(hot)
    assert session_ids(archive) == MOVED_BY_AGE - {"r1", "r1-cont", "r1-sub"}
    _check(hot)
    _check(archive)


def test_a_batch_written_to_after_the_kill_is_taken_back(hot: Path, tmp_path: Path) -> None:
    """Killed between the copy and the delete; the agent then appends to one of the
    batch's sessions: the next run finds the hot rows changed, takes the copy back out of
    the archive, and the new message is kept with its session in the hot store."""
    archive = tmp_path / "archive.db"
    _killed_at("verified", "archive", hot, archive)
    with Store.open(str(hot)) as store:
        (late,) = store.append_messages("r1-sub", [NewMessage(role="user", content="late")])
    before = snapshot(hot)
    result = archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    assert "took back" in result.moved.resumed
    union_equals(before, hot, archive)
    assert late in message_ids(hot)
    assert {"r1", "r1-cont", "r1-sub"} <= session_ids(hot)  # its tree is young again
    assert session_ids(archive) == MOVED_BY_AGE - {"r1", "r1-cont", "r1-sub"}
    _check(hot)
    _check(archive)


def test_a_batch_in_flight_to_another_archive_is_refused(hot: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    _killed_at("copied", "archive", hot, first)
    done = CliRunner().invoke(
        main, ["archive", "--db", str(hot), "--to", str(second), "--older-than", "90d"]
    )
    assert done.exit_code == 1
    assert "batch in flight" in done.output
    assert str(first) in done.output
    assert len(done.output.strip().splitlines()) == 1
    assert session_ids(second) == set()
    archive_sessions(str(hot), str(first), criterion(older_than="90d"))
    assert session_ids(first) == MOVED_BY_AGE


def test_a_restored_session_the_agent_continues_stays_continued(hot: Path, tmp_path: Path) -> None:
    """Killed after a restore's copy committed; the agent then continues the restored
    session in the hot store: the next run deletes the archive's copy (the hot store's is
    the newer one) and the agent's message is kept."""
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    _killed_at("copied", "restore", hot, archive, "r1")
    with Store.open(str(hot)) as store:
        (late,) = store.append_messages("r1", [NewMessage(role="user", content="continued")])
    result = restore_session("r1", str(hot), str(archive))
    assert "finished" in result.moved.resumed
    assert late in message_ids(hot)
    assert not message_ids(hot) & message_ids(archive)
    assert {"r1", "r1-cont", "r1-sub"} <= session_ids(hot)
    assert not {"r1", "r1-cont", "r1-sub"} & session_ids(archive)
    _check(hot)
    _check(archive)


@pytest.fixture
def big_hot(hot: Path) -> Path:
    add_big_tree(hot)
    return hot


@pytest.mark.parametrize("nth", [1, 3])
def test_a_chunked_archive_killed_midway_then_resumed(
    big_hot: Path, tmp_path: Path, nth: int
) -> None:
    hot = big_hot
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    _killed_at(f"deleting-chunk:{nth}", "archive", hot, archive)
    assert BIG in session_ids(hot)
    both = len(message_ids(hot) & message_ids(archive))
    assert both == 1000 if nth == 1 else both < 1000  # some of its messages gone already
    result = archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    assert "finished" in result.moved.resumed
    union_equals(before, hot, archive)
    assert session_ids(archive) == MOVED_BY_AGE | {BIG}
    _check(hot)
    _check(archive)


@pytest.mark.parametrize("nth", [1, 3])
def test_a_chunked_restore_killed_midway_then_resumed(
    big_hot: Path, tmp_path: Path, nth: int
) -> None:
    hot = big_hot
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    _killed_at(f"copying-chunk:{nth}", "restore", hot, archive, BIG)
    assert (BIG in session_ids(hot)) == (nth > 1)  # half copied, the archive whole
    result = restore_session(BIG, str(hot), str(archive))
    assert ("finished" if nth > 1 else "forgot") in result.moved.resumed
    union_equals(before, hot, archive)
    assert BIG in session_ids(hot)
    assert BIG not in session_ids(archive)
    _check(hot)
    _check(archive)


def test_a_chunked_archive_the_agent_writes_to_midway_is_taken_back(
    big_hot: Path, tmp_path: Path
) -> None:
    """The agent appends to the big session between two chunks of its delete: the
    messages already deleted come back from the archive's copy, the copy is taken back,
    and the hot store holds the whole session and the agent's message."""
    hot = big_hot
    archive = tmp_path / "archive.db"
    appended: list[int] = []

    def agent_at(step: str) -> None:
        if step == "chunk-committed" and not appended:
            with Store.open(str(hot)) as store:
                appended.extend(store.append_messages(BIG, [NewMessage(role="user", content="x")]))

    before = snapshot(hot)
    move.STEP_HOOK = agent_at
    try:
        result = archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    finally:
        move.STEP_HOOK = None
    assert appended
    assert result.moved.changed == 1
    assert BIG in session_ids(hot)
    assert BIG not in session_ids(archive)
    big_before = {row for row in before["messages"] if row[1] == BIG}
    big_now = set(rows_of(hot, f"SELECT * FROM messages WHERE session_id = '{BIG}'"))
    assert big_before <= big_now
    assert len(big_now) == len(big_before) + 1
    assert not message_ids(hot) & message_ids(archive)
    assert session_ids(archive) == MOVED_BY_AGE
    _check(hot)
    _check(archive)


_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from hermes_store.errors import SessionNotFound
    from hermes_store.store import NewMessage, Store

    hot, log, stop, old = sys.argv[1:5]
    with Store.open(hot) as store, open(log, "a") as out:
        store.create_session("live", "cli")
        n = 0
        while not os.path.exists(stop):
            target = old if n % 5 == 0 else "live"
            try:
                (mid,) = store.append_messages(target, [NewMessage(role="user", content=f"w{n}")])
            except SessionNotFound:
                pass  # archived meanwhile
            else:
                out.write(f"{mid} w{n}\\n")
                out.flush()
            n += 1
            time.sleep(0.005)
    """
)


@pytest.mark.parametrize("step", ["deleting-chunk:2", "copied", "deleting"])
def test_killed_while_the_agent_writes_then_resumed(
    big_hot: Path, tmp_path: Path, step: str
) -> None:
    """An agent process appends all along (to a live session, and to one the run chose);
    the archive is killed at a step, then run again: every message the agent was told was
    stored is in exactly one store, unchanged."""
    hot = big_hot
    archive = tmp_path / "archive.db"
    log, stop = tmp_path / "written.log", tmp_path / "stop"
    before = {row[0]: row for row in rows_of(hot, "SELECT * FROM messages")}
    agent = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(hot), str(log), str(stop), "d1"],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        _killed_at(step, "archive", hot, archive)
        archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    finally:
        stop.touch()
        agent.wait(timeout=60)
    assert agent.returncode == 0
    written = dict(line.split(" ", 1) for line in log.read_text().splitlines())
    assert written
    texts = dict(rows_of(hot, "SELECT id, content FROM messages"))
    texts.update(rows_of(archive, "SELECT id, content FROM messages"))
    for mid, text in written.items():
        assert texts[int(mid)] == text
    rows = {row[0]: row for row in rows_of(hot, "SELECT * FROM messages")}
    rows.update({row[0]: row for row in rows_of(archive, "SELECT * FROM messages")})
    for mid, row in before.items():
        assert rows[mid] == row
    assert not message_ids(hot) & message_ids(archive)
    assert not session_ids(hot) & session_ids(archive)
    assert BIG in session_ids(archive)
    _check(hot)
    _check(archive)

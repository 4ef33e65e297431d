"""`hermes-store archive` and `restore`: old session trees moved to an archive store and back,
whole, verified, nothing lost."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from archive_support import (
    KEPT_BY_AGE,
    MOVED_ARCHIVED,
    MOVED_BY_AGE,
    OLD,
    OWN_PROMPT,
    SECRET,
    SHARED_PROMPT,
    build_hot,
    hot_copy,
    message_ids,
    rows,
    rows_of,
    session_ids,
    snapshot,
    union_equals,
)
from click.testing import CliRunner
from sqlalchemy import Engine, event

from hermes_store.archive import archive_sessions, criterion, restore_session
from hermes_store.archive.rows import KEPT_TABLES, OWNED_TABLES, SHARED_TABLES
from hermes_store.cli import main
from hermes_store.errors import ArchiveRefused, StoreError
from hermes_store.models import Base
from hermes_store.revisions import head_revision
from hermes_store.store import NewMessage, Store


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hot(tmp_path_factory.mktemp("archive") / "template.db")


@pytest.fixture
def hot(template: Path, tmp_path: Path) -> Path:
    return hot_copy(template, tmp_path)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, [str(arg) for arg in args], catch_exceptions=False)


def _check(path: Path) -> None:
    done = _cli("check", "--db", path)
    assert done.exit_code == 0, done.output


def test_every_table_is_owned_shared_or_kept() -> None:
    """A table added to the models must say whether its rows move with sessions."""
    classified = {*OWNED_TABLES, *SHARED_TABLES, *KEPT_TABLES}
    assert set(Base.metadata.tables) == classified


def test_archive_moves_whole_old_trees_and_keeps_the_rest(hot: Path, tmp_path: Path) -> None:
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    done = _cli("archive", "--db", hot, "--to", archive, "--older-than", "90d")
    assert done.exit_code == 0, done.output
    assert session_ids(archive) == MOVED_BY_AGE
    assert session_ids(hot) == KEPT_BY_AGE
    union_equals(before, hot, archive)
    # The prompt only moved sessions used went with them; the shared one is in both.
    assert {row[0] for row in rows(hot, "system_prompts")} == {SHARED_PROMPT}
    assert {row[0] for row in rows(archive, "system_prompts")} == {OWN_PROMPT, SHARED_PROMPT}
    # The expired lock moved with its session; the live lease and the running delegation stay.
    assert {row[0] for row in rows(archive, "compression_locks")} == {"l2"}
    assert {row[0] for row in rows(hot, "session_turn_leases")} == {"l1"}
    assert {row[0] for row in rows(archive, "async_delegations")} == {"del-1"}
    assert {row[0] for row in rows(archive, "session_model_usage")} == {"r1", "r1-sub"}
    # Kept tables stay where they are.
    assert rows(archive, "gateway_routing") == set()
    assert len(rows(hot, "gateway_routing")) == 1
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    assert "moved 6 sessions" in done.output
    assert "kept 2 trees: a session has not ended" in done.output, done.output
    for why in ("a delegation is still running", "the gateway still routes", "lock or turn lease"):
        assert why in done.output
    assert SECRET not in done.output
    _check(hot)
    _check(archive)


def test_the_archive_is_an_ordinary_store(hot: Path, tmp_path: Path) -> None:
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    with Store.open(str(archive)) as store:
        assert store.get_session("r1-cont").parent_session_id == "r1"  # type: ignore[union-attr]
        hits = store.search("docker compose")
        assert {hit["session_id"] for hit in hits} <= MOVED_BY_AGE
        assert hits
    done = _cli("stats", "--db", archive, "--json")
    assert done.exit_code == 0
    assert json.loads(done.output)["sessions"] == len(MOVED_BY_AGE)
    current = _cli("current", "--db", archive)
    assert head_revision() in current.output


def test_archived_flag_and_before(hot: Path, tmp_path: Path) -> None:
    archive = tmp_path / "archive.db"
    result = archive_sessions(str(hot), str(archive), criterion(archived=True))
    assert session_ids(archive) == MOVED_ARCHIVED
    assert result.moved.sessions == 1
    # Before a date after the old sessions but before the recent ones: what 90d moves.
    day = datetime.fromtimestamp(OLD + 30 * 86400, UTC)
    archive_sessions(str(hot), str(archive), criterion(before=day.date().isoformat()))
    assert session_ids(archive) == MOVED_ARCHIVED | MOVED_BY_AGE


def test_dry_run_says_what_would_move_and_changes_nothing(hot: Path, tmp_path: Path) -> None:
    before = hot.read_bytes()
    archive = tmp_path / "archive.db"
    done = _cli(
        "archive", "--db", hot, "--to", archive, "--older-than", "90d", "--dry-run", "--json"
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["selected"]["sessions"] == len(MOVED_BY_AGE)
    assert report["selected"]["messages"] == 3 * len(MOVED_BY_AGE)
    assert report["selected"]["bytes"] > 0
    assert report["moved"]["sessions"] == 0
    assert not archive.exists()
    assert hot.read_bytes() == before


def test_round_trip_restores_every_row(hot: Path, tmp_path: Path) -> None:
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    with Store.open(str(hot)) as store:
        found = {hit["session_id"] for hit in store.search("docker compose", limit=100)}
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    for root in ("r1", "d2", "l2"):  # a member of a tree brings the whole tree back
        done = _cli("restore", root, "--db", hot, "--from", archive)
        assert done.exit_code == 0, done.output
    assert session_ids(archive) == set()
    assert snapshot(hot) == before
    assert rows(archive, "messages") == set()
    _check(hot)
    _check(archive)
    with Store.open(str(hot)) as store:
        assert store.get_session("r1").message_count == 3  # type: ignore[union-attr]
        assert {hit["session_id"] for hit in store.search("docker compose", limit=100)} == found


def test_restore_takes_the_whole_tree(hot: Path, tmp_path: Path) -> None:
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    result = restore_session("r1-sub", str(hot), str(archive))
    assert result.moved.sessions == 3
    assert {"r1", "r1-cont", "r1-sub"} <= session_ids(hot)
    assert session_ids(archive) == MOVED_BY_AGE - {"r1", "r1-cont", "r1-sub"}


def test_nothing_to_move_says_so_and_exits_0(hot: Path, tmp_path: Path) -> None:
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    done = _cli("archive", "--db", hot, "--to", archive, "--older-than", "90d")
    assert done.exit_code == 0
    assert "nothing to archive" in done.output


def test_the_hot_file_shrinks(hot: Path, tmp_path: Path) -> None:
    """After `optimize --vacuum` once (incremental auto-vacuum), archive runs give the
    freed pages back to the file system in steps."""
    with Store.open(str(hot)) as store:
        store.create_session("big", "cli", started_at=1_000_000.0)
        store.append_messages(
            "big",
            [
                NewMessage(role="user", content=f"{i} " + "lorem ipsum " * 400, timestamp=1e6 + i)
                for i in range(300)
            ],
        )
        store.end_session("big", "done", ended_at=1_000_100.0)
    assert _cli("optimize", "--db", hot, "--vacuum").exit_code == 0
    size = hot.stat().st_size
    result = archive_sessions(str(hot), str(tmp_path / "a.db"), criterion(older_than="90d"))
    assert result.bytes_after < result.bytes_before
    assert hot.stat().st_size < size
    assert result.vacuum_needed_bytes == 0


def test_each_commit_of_a_batch_is_on_disk_before_the_next_step(
    hot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive's writes leave the WAL's flush out of the write lock (the agent does
    not wait for the disk), and flush it themselves right after: no step starts before
    the commit of the one before it is on disk (a power cut then loses no step's work)."""
    from hermes_store.archive import run as archive_run
    from hermes_store.sqlite import copy as sqlite_copy

    events: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def committed(conn: Any) -> None:
        raw = conn.connection.driver_connection
        if raw.execute("PRAGMA synchronous").fetchone()[0] == 1:  # NORMAL: deferred
            (_, _, name) = raw.execute("PRAGMA database_list").fetchone()
            events.append(("commit", name))

    monkeypatch.setattr(sqlite_copy.os, "fsync", fsync)
    # The compaction after the batches is resumable step by step: it flushes at checkpoints.
    monkeypatch.setattr(archive_run, "COMPACT_SHARE", 2.0)
    event.listen(Engine, "commit", committed)
    try:
        result = archive_sessions(str(hot), str(tmp_path / "a.db"), criterion(older_than="90d"))
    finally:
        event.remove(Engine, "commit", committed)
    assert result.moved.sessions
    commits = [i for i, (kind, _) in enumerate(events) if kind == "commit"]
    assert {events[i][1] for i in commits} == {str(hot), str(tmp_path / "a.db")}
    for i in commits:
        store = events[i][1]
        assert events[i + 1 : i + 2] == [("fsync", store + "-wal")], events[i : i + 3]
    with contextlib.closing(sqlite3.connect(hot)) as conn:  # the agent's setting untouched
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2


# -- refusals: one line, nothing changed, non-zero -------------------------------------------


def _refused(hot: Path, *args: str) -> str:
    before = hot.read_bytes()
    done = CliRunner().invoke(main, [str(a) for a in args])
    assert done.exit_code != 0, done.output
    assert not isinstance(done.exception, Exception) or isinstance(done.exception, SystemExit)
    lines = done.output.strip().splitlines()
    assert len(lines) == 1, done.output
    assert hot.read_bytes() == before
    return lines[0]


def test_an_archive_that_is_the_hot_store_is_refused(hot: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(hot)
    for target in (hot, link, Path(f"{hot}-wal"), Path(f"{hot}-shm")):
        said = _refused(hot, "archive", "--db", hot, "--to", target, "--older-than", "90d")
        assert "hot store" in said


def test_an_archive_at_another_revision_is_refused(hot: Path, tmp_path: Path) -> None:
    from legacy.build import build_legacy_store

    legacy = tmp_path / "legacy.db"
    build_legacy_store(legacy, 21)
    legacy_bytes = legacy.read_bytes()
    said = _refused(hot, "archive", "--db", hot, "--to", legacy, "--older-than", "90d")
    assert "hermes-store upgrade" in said
    assert legacy.read_bytes() == legacy_bytes
    older = tmp_path / "older.db"
    from hermes_store import migrate

    migrate.upgrade(str(older), revision="29")
    said = _refused(hot, "archive", "--db", hot, "--to", older, "--older-than", "90d")
    assert "hermes-store upgrade --db" in said


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--before", "2999-01-01"], "in the future"),
        (["--before", "yesterday"], "ISO date"),
        (["--older-than", "90"], "hours, days or weeks"),
        ([], "exactly one of"),
        (["--archived", "--older-than", "9d"], "exactly one of"),
    ],
)
def test_bad_criteria_are_refused(
    hot: Path, tmp_path: Path, options: list[str], words: str
) -> None:
    archive = tmp_path / "archive.db"
    said = _refused(hot, "archive", "--db", hot, "--to", archive, *options)
    assert words in said
    assert not archive.exists()


def test_restore_refusals(hot: Path, tmp_path: Path) -> None:
    archive = tmp_path / "archive.db"
    said = _refused(hot, "restore", "r1", "--db", hot, "--from", archive)
    assert "no such store" in said
    assert not archive.exists()
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    said = _refused(hot, "restore", "nope", "--db", hot, "--from", archive)
    assert "no session 'nope'" in said
    done = _cli("restore", "n1", "--db", hot, "--from", archive)
    assert done.exit_code == 0
    assert "in the hot store already" in done.output


def test_a_title_taken_in_the_hot_store_keeps_the_tree_archived(hot: Path, tmp_path: Path) -> None:
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    with Store.open(str(hot)) as store:
        store.create_session("new", "cli", title="old root")
    with pytest.raises(ArchiveRefused, match="same title"):
        restore_session("r1", str(hot), str(archive))
    assert "r1" in session_ids(archive)


# -- a full disk on either side ----------------------------------------------------------


@pytest.fixture
def page_limit() -> Iterator[Callable[[Path | None], None]]:
    """Cap every new connection to one store file at its current size (SQLITE_FULL)."""
    state: dict[str, Path | None] = {"path": None}

    def on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        limited = state["path"]
        name = dbapi_connection.execute("PRAGMA database_list").fetchone()[2]
        if limited is not None and os.path.realpath(name) == os.path.realpath(limited):
            pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
            dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    event.listen(Engine, "connect", on_connect)
    yield lambda path: state.__setitem__("path", path)
    event.remove(Engine, "connect", on_connect)


def test_a_full_archive_loses_nothing_and_the_same_command_finishes(
    hot: Path, tmp_path: Path, page_limit: Callable[[Path | None], None]
) -> None:
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="1000d"))  # creates it
    page_limit(archive)
    with pytest.raises(StoreError, match="run the same command again") as refused:
        archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    assert SECRET not in str(refused.value)
    union_equals(before, hot, archive)
    page_limit(None)
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    union_equals(before, hot, archive)
    assert session_ids(archive) == MOVED_BY_AGE
    _check(hot)
    _check(archive)


def test_a_full_hot_store_during_a_restore_loses_nothing(
    hot: Path, tmp_path: Path, page_limit: Callable[[Path | None], None]
) -> None:
    before = snapshot(hot)
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    assert _cli("optimize", "--db", hot, "--vacuum").exit_code == 0  # no free page left
    page_limit(hot)
    done = CliRunner().invoke(main, ["restore", "r1", "--db", str(hot), "--from", str(archive)])
    assert done.exit_code == 1
    assert "run the same command again" in done.output
    assert len(done.output.strip().splitlines()) == 1
    union_equals(before, hot, archive)
    page_limit(None)
    assert _cli("restore", "r1", "--db", hot, "--from", archive).exit_code == 0
    union_equals(before, hot, archive)
    assert {"r1", "r1-cont", "r1-sub"} <= session_ids(hot)
    _check(hot)
    _check(archive)


# -- the agent writing meanwhile ---------------------------------------------------------


def test_an_agent_writing_during_the_archive_loses_nothing(hot: Path, tmp_path: Path) -> None:
    """A writer thread creates sessions, appends to live ones and to an old one the run
    has chosen (as an agent resuming it would): every message it was told was stored is
    in exactly one store, unchanged, and a session it wrote to after being chosen was not
    moved from under it."""
    with Store.open(str(hot)) as store:  # more old trees, so the run has many batches
        for n in range(40):
            store.create_session(f"old-{n}", "cli", started_at=1_000_000.0 + n)
            store.append_messages(
                f"old-{n}",
                [
                    NewMessage(role="user", content=f"old {n} {i}", timestamp=1e6 + i)
                    for i in range(20)
                ],
            )
            store.end_session(f"old-{n}", "done", ended_at=1_000_100.0 + n)
    before = snapshot(hot)
    stop = threading.Event()
    written: dict[int, str] = {}
    failures: list[BaseException] = []

    def agent() -> None:
        with Store.open(str(hot)) as store:
            n = 0
            while not stop.is_set():
                try:
                    sid = f"live-{n % 5}"
                    if n < 5:
                        store.create_session(sid, "cli")
                    text = f"live message {n}"
                    (mid,) = store.append_messages(sid, [NewMessage(role="user", content=text)])
                    written[mid] = text
                    if n % 7 == 0 and n < 7 * 3:  # old chosen sessions resumed by the agent
                        target = f"old-{n // 7 * 13}"
                        with contextlib.suppress(StoreError):
                            text = f"late append {n}"
                            (mid,) = store.append_messages(
                                target, [NewMessage(role="user", content=text)]
                            )
                            written[mid] = text
                except BaseException as exc:
                    failures.append(exc)
                    return
                n += 1

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        result = archive_sessions(str(hot), str(tmp_path / "a.db"), criterion(older_than="90d"))
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    archive = tmp_path / "a.db"
    assert result.moved.batches > 1
    ids_hot, ids_archive = message_ids(hot), message_ids(archive)
    assert not ids_hot & ids_archive
    content = dict(rows_of(hot, "SELECT id, content FROM messages"))
    content.update(rows_of(archive, "SELECT id, content FROM messages"))
    for mid, text in written.items():
        assert content[mid] == text
    # Rows that existed before the run: in exactly one store, unchanged (or grown by the
    # agent's late appends, which stay with their session).
    for table in ("messages", "session_model_usage", "async_delegations", "system_prompts"):
        assert before[table] <= rows(hot, table) | rows(archive, table)
    union_sessions = {row[0] for row in rows(hot, "sessions") | rows(archive, "sessions")}
    assert {row[0] for row in before["sessions"]} <= union_sessions
    assert not session_ids(hot) & session_ids(archive)
    _check(hot)
    _check(archive)


def test_a_hot_store_not_at_head_is_refused(tmp_path: Path) -> None:
    from legacy.build import build_legacy_store

    hot = tmp_path / "legacy.db"
    build_legacy_store(hot, 21)
    archive = tmp_path / "archive.db"
    said = _refused(hot, "archive", "--db", hot, "--to", archive, "--older-than", "90d")
    assert f"hermes-store upgrade --db {hot}" in said or "hermes-store upgrade --db" in said
    assert not archive.exists()


def test_an_archive_that_cannot_be_a_store_is_refused(hot: Path, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    said = _refused(hot, "archive", "--db", hot, "--to", folder, "--older-than", "90d")
    assert "directory" in said
    said = _refused(
        hot, "archive", "--db", hot, "--to", tmp_path / "nowhere" / "a.db", "--older-than", "90d"
    )
    assert "does not exist" in said
    assert not (tmp_path / "nowhere").exists()
    text = tmp_path / "notes.txt"
    text.write_text("not a database, " * 100)
    said = _refused(hot, "archive", "--db", hot, "--to", text, "--older-than", "90d")
    assert text.read_text() == "not a database, " * 100
    assert "is not a SQLite store" in said


def test_a_title_the_archive_holds_keeps_the_tree_in_the_hot_store(
    hot: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "archive.db"
    archive_sessions(str(hot), str(archive), criterion(older_than="90d"))
    with Store.open(str(hot)) as store:  # the title is free in the hot store again
        store.create_session("r9", "cli", started_at=OLD, title="old root")
        store.append_messages("r9", [NewMessage(role="user", content="again", timestamp=OLD)])
        store.end_session("r9", "done", ended_at=OLD + 1)
    done = _cli("archive", "--db", hot, "--to", archive, "--older-than", "90d")
    assert done.exit_code == 0, done.output
    assert "kept 1 trees: the other store already has a session with the same title" in done.output
    assert "r9" in session_ids(hot)
    assert "r9" not in session_ids(archive)

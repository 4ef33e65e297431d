"""`hermes-store copy`: a whole store to another database and back, resumable, verified."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store
from parity_queries import PARITY_QUERIES
from sqlalchemy import Engine, create_engine, select, text

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.copy import (
    SAMPLE_QUERIES,
    CopyProgress,
    CopyRefused,
    copied_tables,
    copy_store,
    verify_copy,
)
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.errors import SchemaTooNew, StoreError
from hermes_store.models import Base
from hermes_store.revisions import head_revision

#: Small corpora: the 50k-message run belongs in benchmarks.
MESSAGES = 400
BATCH = 60


def _fill(path: Path, messages: int = MESSAGES, seed: int = 5) -> Path:
    """A store at head holding a corpus (multimodal messages, whose text starts with a NUL,
    included), a child session, usage rows, bytes and odd floats."""
    migrate.upgrade(str(path))
    data = corpus.generate(messages, seed)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA foreign_keys=ON")
        corpus.populate(conn, data)
        first, second = (str(s["id"]) for s in data.sessions[:2])
        # The child's id sorts before its parent's: parents must still be copied first.
        conn.execute(
            "INSERT INTO sessions (id, source, started_at, parent_session_id) "
            "VALUES ('0000-child', 'cli', 1.5, ?)",
            (second,),
        )
        conn.execute(
            "INSERT INTO session_model_usage (session_id, model, input_tokens, "
            "estimated_cost_usd) VALUES (?, 'gpt', 10, 0.1), (?, 'claude', 20, 1e-300)",
            (first, second),
        )
        conn.execute(
            "UPDATE messages SET display_identity = ?, token_count = NULL "
            "WHERE id = (SELECT min(id) FROM messages)",
            (b"\x00\xff identity",),
        )
        conn.execute("UPDATE messages SET display_order = NULL WHERE id % 7 = 0")
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('app.setting', 'kept')")
        conn.execute("INSERT INTO system_prompts (hash, prompt) VALUES ('h1', 'be brief')")
        conn.commit()
    return path


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fill(tmp_path_factory.mktemp("copy") / "source.db")


@pytest.fixture
def source(template: Path, tmp_path: Path) -> Path:
    path = tmp_path / "source.db"
    shutil.copyfile(template, path)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _content(path: Path) -> str:
    """What a SQLite store holds (its WAL included), whatever its file bytes."""
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        return hashlib.sha256("\n".join(conn.iterdump()).encode()).hexdigest()


def _rows(url: str, table: str) -> list[tuple[Any, ...]]:
    """Every row of a table as Python values, sorted in Python (collations differ)."""
    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    try:
        with engine.connect() as conn:
            model = Base.metadata.tables[table]
            rows = [tuple(row) for row in conn.execute(select(*model.columns))]
    finally:
        engine.dispose()
    return sorted(rows, key=repr)


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                row[0]
                for row in conn.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                )
            }
    finally:
        engine.dispose()


def _scalar(url: str, sql: str) -> Any:
    engine = create_store_engine(url, create=False)
    try:
        with engine.begin() as conn:
            return conn.execute(text(sql)).scalar()
    finally:
        engine.dispose()


class Stop(Exception):
    """Raised from the progress callback: the run stops right after a committed batch."""


def _stop_after(batches: int) -> Any:
    def progress(state: CopyProgress) -> None:
        if state.batches >= batches:
            raise Stop

    return progress


def test_sample_queries_come_from_the_parity_queries() -> None:
    assert all(query in PARITY_QUERIES for query in SAMPLE_QUERIES)


# --------------------------------------------------------------------------------------
# SQLite -> PostgreSQL -> SQLite
# --------------------------------------------------------------------------------------


@pytest.mark.postgresql
def test_sqlite_to_postgresql_copies_every_row_and_leaves_the_source_untouched(
    source: Path, pg_url: str
) -> None:
    before = _sha(source)
    seen: list[CopyProgress] = []
    result = copy_store(str(source), pg_url, batch_rows=BATCH, progress=seen.append)

    assert _sha(source) == before
    assert result.verification.ok, result.verification.as_dict()
    assert result.created_target
    assert not result.resumed
    assert seen
    assert seen[-1].rows == seen[-1].total
    for table in copied_tables():
        assert _rows(pg_url, table.name) == _rows(str(source), table.name) or (
            table.name == "state_meta"
        ), table.name
    source_meta = dict(_rows(str(source), "state_meta"))
    target_meta = dict(_rows(pg_url, "state_meta"))
    assert target_meta["app.setting"] == "kept"
    # Each database keeps the layout its own upgrade wrote; the report says so.
    assert source_meta["hermes_store.fts_layout"] == "external"
    assert target_meta["hermes_store.fts_layout"] == "expression"
    assert result.verification.markers["hermes_store.fts_layout"] == ("external", "expression")
    assert result.verification.revisions == ((head_revision(),), (head_revision(),))
    checks = {check.table: check for check in result.verification.tables}
    assert checks["messages"].source_rows == len(_rows(str(source), "messages"))
    assert checks["sessions"].source_sum == checks["sessions"].target_sum
    # The PostgreSQL search is not on main yet: reported, not taken for a difference.
    if result.verification.not_checked:
        assert "PostgreSQL search not available" in result.verification.not_checked[0]
    else:
        assert all(search.equal for search in result.verification.searches)

    # New messages on the target get fresh ids, past every copied one.
    top = max(row[0] for row in _rows(str(source), "messages"))
    engine = create_store_engine(pg_url, create=False)
    with engine.begin() as conn:
        new_id = conn.execute(
            text(
                "INSERT INTO messages (session_id, role, content, timestamp) "
                "VALUES ('0000-child', 'user', 'new', 2.0) RETURNING id"
            )
        ).scalar_one()
    engine.dispose()
    assert new_id == top + 1


@pytest.mark.postgresql
def test_postgresql_back_to_sqlite_passes_check(source: Path, pg_url: str, tmp_path: Path) -> None:
    copy_store(str(source), pg_url, batch_rows=BATCH)
    back = tmp_path / "back.db"
    result = copy_store(pg_url, str(back), batch_rows=BATCH)
    assert result.verification.ok, result.verification.as_dict()
    for table in copied_tables():
        if table.name != "state_meta":
            assert _rows(str(back), table.name) == _rows(str(source), table.name), table.name
    checked = CliRunner().invoke(main, ["check", "--db", str(back)])
    assert checked.exit_code == 0, checked.output
    # The SQLite copy's own search answers as the original store's does.
    assert all(search.equal for search in verify_copy(str(source), str(back)).searches)
    # And the legacy layout tools take it: the way back to the inline layout the legacy
    # application writes, then FTS5's own integrity check and the application's query.
    migrate.downgrade(str(back), "30")
    migrate.downgrade(str(back), "fts@-1")
    with contextlib.closing(sqlite3.connect(back)) as raw:
        declaration = raw.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'messages_fts'"
        ).fetchone()[0]
        assert "content=" not in declaration  # inline again: the legacy layout
        for index in ("messages_fts", "messages_fts_trigram"):
            raw.execute(f"INSERT INTO {index}({index}, rank) VALUES ('integrity-check', 1)")
        found = raw.execute(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'error'"
        ).fetchone()[0]
        assert found > 0


@pytest.mark.postgresql
def test_text_with_nul_characters_comes_back_the_same(tmp_path: Path, pg_url: str) -> None:
    path = _fill(tmp_path / "nul.db", 300, seed=1)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE messages SET content = char(0) || 'json:[]' WHERE id = 3")
        conn.execute("UPDATE messages SET tool_calls = 'a' || char(0) || 'b' WHERE id = 4")
        conn.commit()
    result = copy_store(str(path), pg_url)
    assert result.verification.ok, result.verification.as_dict()
    assert _rows(pg_url, "messages") == _rows(str(path), "messages")
    assert any(row[3] == "\x00json:[]" for row in _rows(pg_url, "messages"))


@pytest.mark.postgresql
def test_text_holding_the_noncharacters_of_the_servers_code_comes_back_the_same(
    source: Path, pg_url: str
) -> None:
    """U+FFFE (PostgreSQL's stand-in for NUL) and the escape's characters, with NUL."""
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute(
            "UPDATE messages SET content = 'x' || char(65534) || char(0) || char(65535) "
            "|| char(64976) || char(64977) WHERE id = 6"
        )
        conn.commit()
    result = copy_store(str(source), pg_url)
    assert result.verification.ok, result.verification.as_dict()
    copied = _rows(pg_url, "messages")
    assert copied == _rows(str(source), "messages")
    assert [row[3] for row in copied if row[0] == 6] == ["x\ufffe\x00\uffff\ufdd0\ufdd1"]


# --------------------------------------------------------------------------------------
# Resuming
# --------------------------------------------------------------------------------------


def test_a_stopped_copy_resumes_with_no_duplicate_and_no_gap(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target.db"
    with pytest.raises(Stop):
        copy_store(str(source), str(target), batch_rows=BATCH, progress=_stop_after(3))
    copied = _scalar(str(target), "SELECT count(*) FROM sessions") + _scalar(
        str(target), "SELECT count(*) FROM messages"
    )
    assert 0 < copied < len(_rows(str(source), "messages"))
    marker = _scalar(
        str(target), "SELECT value FROM state_meta WHERE key = 'hermes_store.copy.source'"
    )
    assert json.loads(marker)["state"] == "copying"

    result = copy_store(str(source), str(target), batch_rows=BATCH)
    assert result.resumed
    assert result.verification.ok, result.verification.as_dict()
    assert _rows(str(target), "messages") == _rows(str(source), "messages")
    # A finished copy keeps only the record of where it came from.
    keys = [row[0] for row in _rows(str(target), "state_meta")]
    assert [k for k in keys if k.startswith("hermes_store.copy.")] == ["hermes_store.copy.source"]
    # The SQLite target's sequence is past every copied id.
    top = max(row[0] for row in _rows(str(source), "messages"))
    assert _scalar(str(target), "SELECT seq FROM sqlite_sequence WHERE name = 'messages'") >= top

    again = copy_store(str(source), str(target))
    assert again.already_complete
    assert again.verification.ok


@pytest.mark.postgresql
def test_a_stopped_copy_to_postgresql_resumes(source: Path, pg_url: str) -> None:
    with pytest.raises(Stop):
        copy_store(str(source), pg_url, batch_rows=BATCH, progress=_stop_after(4))
    result = copy_store(str(source), pg_url, batch_rows=BATCH)
    assert result.resumed
    assert result.verification.ok, result.verification.as_dict()
    assert _rows(pg_url, "messages") == _rows(str(source), "messages")


def test_a_copy_resumes_through_another_name_of_its_source(source: Path, tmp_path: Path) -> None:
    """A source named through a linked directory is the same source on resume."""
    target = tmp_path / "target.db"
    linked = tmp_path / "linked"
    linked.symlink_to(source.parent, target_is_directory=True)
    with pytest.raises(Stop):
        copy_store(str(source), str(target), batch_rows=BATCH, progress=_stop_after(2))
    result = copy_store(str(linked / source.name), str(target), batch_rows=BATCH)
    assert result.resumed
    assert result.verification.ok, result.verification.as_dict()
    assert _rows(str(target), "messages") == _rows(str(source), "messages")


def test_resuming_from_another_source_is_refused(
    source: Path, tmp_path: Path, template: Path
) -> None:
    target = tmp_path / "target.db"
    with pytest.raises(Stop):
        copy_store(str(source), str(target), batch_rows=BATCH, progress=_stop_after(2))
    other = tmp_path / "other.db"
    shutil.copyfile(template, other)
    before = _content(target)
    with pytest.raises(CopyRefused, match="unfinished copy from"):
        copy_store(str(other), str(target))
    assert _content(target) == before


_KILLED_RUN = textwrap.dedent(
    """
    import sys
    from hermes_store.copy import copy_store
    copy_store(sys.argv[1], sys.argv[2], batch_rows=int(sys.argv[3]))
    """
)


def _run_until_killed(source: Path, target: str, min_messages: int) -> bool:
    """Run a copy in a real process and kill -9 it once the target holds ``min_messages``
    messages (wherever it is then, in a batch or between two); False if it finished first."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN, str(source), target, "20"],
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(Exception):
                if (_scalar(target, "SELECT count(*) FROM messages") or 0) >= min_messages:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    return True
            time.sleep(0.02)
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.postgresql
def test_kill_9_three_times_then_resume(source: Path, pg_url: str) -> None:
    before = _sha(source)
    kills = sum(_run_until_killed(source, pg_url, n) for n in (60, 150, 250))
    assert kills >= 1
    result = copy_store(str(source), pg_url)
    assert result.verification.ok, result.verification.as_dict()
    assert _rows(pg_url, "messages") == _rows(str(source), "messages")
    assert _sha(source) == before


# --------------------------------------------------------------------------------------
# Refusals: one line, nothing changed
# --------------------------------------------------------------------------------------


def test_a_target_holding_other_data_is_refused_without_append(
    source: Path, tmp_path: Path
) -> None:
    target = _fill(tmp_path / "busy.db", 200, seed=9)
    before = _content(target)
    with pytest.raises(CopyRefused, match="--append"):
        copy_store(str(source), str(target))
    assert _content(target) == before


def test_append_skips_identical_rows_and_refuses_colliding_ones(
    source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target.db"
    target.write_bytes(b"")
    migrate.upgrade(str(target))
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("INSERT INTO system_prompts (hash, prompt) VALUES ('h1', 'be brief')")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('zz-own', 'cli', 1)")
        conn.commit()
    result = copy_store(str(source), str(target), append=True)
    assert result.verification.ok, result.verification.as_dict()
    assert result.rows["system_prompts"] == 0  # the same prompt (same hash) was there
    assert ("zz-own", "cli") in {row[:2] for row in _rows(str(target), "sessions")}

    # An append copy stopped half-way resumes as one, without --append again.
    second = tmp_path / "second.db"
    shutil.copyfile(target, second)
    other = _fill(tmp_path / "other.db", 200, seed=13)
    with contextlib.closing(sqlite3.connect(other)) as conn:  # ids past the target's own
        conn.execute("UPDATE messages SET id = id + 100000")
        conn.execute("UPDATE sessions SET id = '0000-child-2' WHERE id = '0000-child'")
        conn.commit()
    with pytest.raises(Stop):
        copy_store(str(other), str(second), append=True, batch_rows=BATCH, progress=_stop_after(2))
    resumed = copy_store(str(other), str(second), batch_rows=BATCH)
    assert resumed.resumed
    assert resumed.verification.ok, resumed.verification.as_dict()

    clash = tmp_path / "clash.db"
    shutil.copyfile(source, clash)
    with contextlib.closing(sqlite3.connect(clash)) as conn:
        conn.execute("UPDATE system_prompts SET prompt = 'other' WHERE hash = 'h1'")
        conn.commit()
    before = _content(target)
    with pytest.raises(CopyRefused, match="never overwrites"):
        copy_store(str(clash), str(target), append=True)
    assert _content(target) == before


def test_the_same_store_on_both_sides_is_refused(source: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(source)
    before = _sha(source)
    for other in (str(source), f"sqlite:///{source}", str(link)):
        with pytest.raises(CopyRefused, match="same database"):
            copy_store(str(source), other)
    assert _sha(source) == before


def test_a_source_not_at_head_is_refused_with_the_upgrade_command(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.db"
    build_legacy_store(legacy, 21)
    before = _sha(legacy)
    target = tmp_path / "target.db"
    with pytest.raises(CopyRefused, match="hermes-store upgrade"):
        copy_store(str(legacy), str(target))
    assert not target.exists()
    assert _sha(legacy) == before


def test_a_target_newer_than_the_source_is_refused(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "newer.db"
    migrate.upgrade(str(target))
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'from_the_future'")
        conn.commit()
    before = _content(target)
    with pytest.raises(SchemaTooNew, match="newer"):
        copy_store(str(source), str(target))
    assert _content(target) == before


def test_an_unreachable_server_is_one_line(source: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        main, ["copy", "--from", str(source), "--to", "postgresql://nobody@127.0.0.1:1/none"]
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: ")
    assert "127.0.0.1" in lines[0]


def test_a_missing_source_is_refused_and_nothing_created(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such store"):
        copy_store(str(tmp_path / "nothing.db"), str(tmp_path / "target.db"))
    assert not (tmp_path / "target.db").exists()
    assert not (tmp_path / "nothing.db").exists()


# --------------------------------------------------------------------------------------
# Verification and the command
# --------------------------------------------------------------------------------------


def test_verification_finds_a_changed_row_and_the_command_exits_1(
    source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target.db"
    copy_store(str(source), str(target))
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("UPDATE messages SET timestamp = timestamp + 1e-6 WHERE id = 5")
        conn.commit()
    verification = verify_copy(str(source), str(target))
    assert not verification.ok
    assert [c.table for c in verification.tables if not c.equal] == ["messages"]

    result = CliRunner().invoke(
        main, ["copy", "--from", str(source), "--to", str(target), "--json"]
    )
    assert result.exit_code == 1
    document = json.loads(result.output)
    assert document["verification"]["ok"] is False


def test_the_command_prints_the_report_and_never_message_text(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target.db"
    result = CliRunner().invoke(main, ["copy", "--from", str(source), "--to", str(target)])
    assert result.exit_code == 0, result.output
    assert "verification passed" in result.output
    assert "hermes_store.fts_layout" in result.output
    with contextlib.closing(sqlite3.connect(source)) as conn:
        texts = [row[0] for row in conn.execute("SELECT content FROM messages LIMIT 50")]
    assert not any(t and len(t) > 12 and t in result.output for t in texts)

    as_json = CliRunner().invoke(
        main, ["copy", "--from", str(source), "--to", str(target), "--json"]
    )
    assert as_json.exit_code == 0
    assert json.loads(as_json.output)["already_complete"] is True


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.dispose()


def test_the_source_is_opened_read_only(source: Path) -> None:
    from hermes_store.copy import open_source

    engine = open_source(str(source))
    try:
        with engine.connect() as conn, pytest.raises(Exception, match="readonly"):
            conn.execute(text("DELETE FROM messages"))
    finally:
        engine.dispose()
    assert os.path.getsize(source) > 0


@pytest.mark.slow
def test_ctrl_c_stops_the_command_in_one_line_and_the_same_command_resumes(
    source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target.db"
    command = [
        sys.executable, "-m", "hermes_store.cli", "copy",
        "--from", str(source), "--to", str(target), "--batch-rows", "5",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(Exception):
            if (_scalar(str(target), "SELECT count(*) FROM messages") or 0) >= 40:
                break
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert stderr.strip().splitlines() == [
        "Error: interrupted; every committed batch is kept: run the same command again to resume"
    ]
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    assert "resumed" in again.stdout
    assert "verification passed" in again.stdout

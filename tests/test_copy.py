"""`hermes-store copy`: a whole store to another database and back, resumable, verified."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store
from rich.console import Console
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.copy import (
    CopyProgress,
    CopyRefused,
    Verification,
    copied_tables,
    copy_store,
    open_source,
    verify_copy,
)
from hermes_store.copy.rows import is_own_key, read_snapshot
from hermes_store.copy.verify import TableCheck, choose_searches
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.errors import SchemaTooNew, StoreError
from hermes_store.models import Base
from hermes_store.revisions import head_revision

#: Small corpora: the 50k-message run belongs in benchmarks.
MESSAGES = 400
BATCH = 60
#: Put into message text: it must never reach a log, an error or the report.
MARKER = "zq7SECRETmarker"
POSTGRESQL = pytest.mark.postgresql


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
        # Two peers of one session sharing a display identity: the display triggers
        # rewrite a message's peers when it changes.
        low, high = conn.execute(
            "SELECT min(id), max(id) FROM messages WHERE session_id = ? AND active = 1 "
            "AND content NOT LIKE char(0) || '%'",
            (first,),
        ).fetchone()
        conn.execute(
            "UPDATE messages SET display_identity = X'AA', display_order = ? WHERE id IN (?, ?)",
            (low, low, high),
        )
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
    assert target_meta["hermes_store.fts_layout"] == "stored"
    assert result.verification.markers["hermes_store.fts_layout"] == ("external", "stored")
    assert result.verification.revisions == ((head_revision(),), (head_revision(),))
    checks = {check.table: check for check in result.verification.tables}
    assert checks["messages"].source_rows == len(_rows(str(source), "messages"))
    assert checks["sessions"].source_sum == checks["sessions"].target_sum
    # The sample searches ran on both databases, each with hits on the source.
    searches = result.verification.searches
    assert searches
    assert all(search.equal and search.source_hits > 0 for search in searches)
    assert result.verification.not_checked == []

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
    searches = verify_copy(str(source), str(back)).searches
    assert searches
    assert all(search.equal for search in searches)
    # And the legacy layout tools take it: the way back to the inline layout the legacy
    # application writes, then FTS5's own integrity check and the application's query.
    migrate.downgrade(str(back), "30")
    migrate.downgrade(str(back), "fts@-1")  # fts2: nothing on SQLite
    migrate.downgrade(str(back), "fts@-1")  # fts1: inline again
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
    with pytest.raises(CopyRefused, match=r"holds an unfinished copy of .*--restart"):
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


_KILLED_IN_A_TABLE = textwrap.dedent(
    """
    import os, signal, sys
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.sql.dml import Delete, UpdateBase
    from hermes_store.copy import copy_store

    table, statements, kind = sys.argv[3], int(sys.argv[4]), sys.argv[5]
    seen = []

    @event.listens_for(Engine, "after_cursor_execute")
    def kill_inside_the_batch(conn, cursor, statement, parameters, context, executemany):
        written = getattr(getattr(context, "compiled", None), "statement", None)
        wanted = Delete if kind == "delete" else UpdateBase
        if isinstance(written, wanted) and written.table.name == table:
            seen.append(statement)
            if len(seen) >= statements:
                os.kill(os.getpid(), signal.SIGKILL)  # the batch's transaction is open

    copy_store(sys.argv[1], sys.argv[2], batch_rows=20, verify=False)
    sys.exit(3)  # finished before it wrote there
    """
)


def _kill_in(source: str, target: str, table: str, statements: int, kind: str = "any") -> None:
    """Run a copy in a real process, kill -9 it inside a write transaction of ``table``."""
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_IN_A_TABLE, source, target, table, str(statements), kind],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, (table, done.returncode, done.stderr[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=POSTGRESQL)])
def test_kill_9_in_each_table_while_the_source_changes_then_resume(
    kind: str, source: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Killed inside a batch of each table in turn (and of the deletes of a final pass),
    the source changing between the runs (a session that sorts first, edits, deletes):
    the next run brings the target to the source's final state, each row once, verified."""
    target = _target(kind, tmp_path, request)
    before = _content(source)
    tables = [t for t in copied_tables() if _scalar(str(source), f"SELECT count(*) FROM {t.name}")]
    assert [t.name for t in tables] == [
        "sessions", "state_meta", "system_prompts", "messages", "session_model_usage"
    ]  # fmt: skip
    for number, table in enumerate(tables):
        _kill_in(str(source), target, table.name, 2 if table.name == "messages" else 1)
        _change_source(str(source), f"k{number}")
    assert _content(source) != before
    copy_store(str(source), target, verify=False)
    _change_source(str(source), "final")
    _kill_in(str(source), target, "messages", 1, "delete")  # in the final pass's deletes
    result = copy_store(str(source), target)
    assert result.resumed
    assert result.verification.ok, result.verification.as_dict()
    assert_same_rows(str(source), target)
    checks = {check.table: check for check in result.verification.tables}
    assert checks["messages"].source_rows == len(_rows(str(source), "messages"))


@pytest.mark.slow
@pytest.mark.postgresql
def test_kill_9_of_a_copy_from_postgresql_while_it_changes_then_resume(
    source: Path, pg_url: str, tmp_path: Path
) -> None:
    copy_store(str(source), pg_url, verify=False)
    back = str(tmp_path / "back.db")
    _kill_in(pg_url, back, "messages", 2)
    _change_source(pg_url, "pg")
    result = copy_store(pg_url, back)
    assert result.verification.ok, result.verification.as_dict()
    assert_same_rows(pg_url, back)


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


def test_verification_finds_a_changed_row(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "target.db"
    copy_store(str(source), str(target))
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("UPDATE messages SET timestamp = timestamp + 1e-6 WHERE id = 5")
        conn.commit()
    verification = verify_copy(str(source), str(target))
    assert not verification.ok
    assert [c.table for c in verification.tables if not c.equal] == ["messages"]


def test_a_finished_copy_written_to_since_is_never_overwritten(
    source: Path, tmp_path: Path
) -> None:
    """An agent that already writes to the target: running the copy again would delete or
    overwrite its rows. Refused in one line; --restart is the way to overwrite."""
    target = tmp_path / "target.db"
    copy_store(str(source), str(target), verify=False)
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('new-one', 'cli', 9)")
        conn.execute("UPDATE messages SET token_count = 999 WHERE id = 5")  # fires no trigger
        conn.commit()
    before = _content(target)
    result = CliRunner().invoke(main, ["copy", "--from", str(source), "--to", str(target)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "was written to since the copy" in lines[0]
    assert "sessions, messages" in lines[0]
    assert "--restart" in lines[0]
    assert _content(target) == before

    again = copy_store(str(source), str(target), restart=True)
    assert again.verification.ok, again.verification.as_dict()
    assert again.changes["sessions"]["deleted"] == 1
    assert again.changes["messages"]["updated"] == 1
    assert _rows(str(target), "messages") == _rows(str(source), "messages")


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


# --------------------------------------------------------------------------------------
# A source that changes: a live agent, a kill in the middle, another store
# --------------------------------------------------------------------------------------


def _copied_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every copied table's rows (state_meta without the keys each side keeps of its own)."""
    found = {table.name: _rows(url, table.name) for table in copied_tables()}
    found["state_meta"] = [row for row in found["state_meta"] if not is_own_key(row[0])]
    return found


def assert_same_rows(source: str, target: str) -> None:
    """The target holds every row of the source, each exactly once, and nothing else."""
    mine, theirs = _copied_rows(source), _copied_rows(target)
    assert mine["messages"]
    assert mine["sessions"]
    for table, rows in mine.items():
        assert theirs[table] == rows, table


def _change_source(url: str, tag: str = "a") -> None:
    """What a live agent does meanwhile, through the store's own triggers: a session whose
    id sorts before every other, with messages; an edited message (the display triggers
    clear its peer, which the application then restores); a hidden message; a deleted
    message; a deleted session with its messages and usage; two titles swapped."""
    sessions = Base.metadata.tables["sessions"]
    messages = Base.metadata.tables["messages"]
    usage = Base.metadata.tables["session_model_usage"]
    engine = create_store_engine(url, create=False)
    try:
        with engine.begin() as conn:
            first = f"0000-{tag}-first"
            conn.execute(
                sessions.insert(),
                {"id": first, "source": "cli", "started_at": 0.5, "title": f"title {tag}"},
            )
            new = [{"session_id": first, "role": "user", "timestamp": 0.6 + i} for i in range(3)]
            for i, row in enumerate(new):
                row["content"] = f"arrived after the copy began {i}"
            conn.execute(messages.insert(), new)
            low, high = conn.execute(
                select(func.min(messages.c.id), func.max(messages.c.id)).where(
                    messages.c.display_identity == b"\xaa"
                )
            ).one()
            conn.execute(
                messages.update().where(messages.c.id == high).values(content="edited later")
            )
            conn.execute(
                messages.update()
                .where(messages.c.id == low)
                .values(display_identity=b"\xaa", display_order=low)
            )
            ids = sorted(conn.execute(select(messages.c.id)).scalars())
            conn.execute(messages.update().where(messages.c.id == ids[20]).values(active=0))
            conn.execute(messages.delete().where(messages.c.id == ids[30]))
            parents = select(sessions.c.parent_session_id).where(
                sessions.c.parent_session_id.is_not(None)
            )
            victim = conn.execute(
                select(sessions.c.id)
                .where(sessions.c.id.not_in(parents), sessions.c.id.not_like("0000%"))
                .order_by(sessions.c.id.desc())
                .limit(1)
            ).scalar_one()
            conn.execute(usage.delete().where(usage.c.session_id == victim))
            conn.execute(messages.delete().where(messages.c.session_id == victim))
            conn.execute(sessions.delete().where(sessions.c.id == victim))
            (a, title_a), (b, title_b) = conn.execute(
                select(sessions.c.id, sessions.c.title)
                .where(sessions.c.title.is_not(None), sessions.c.id != first)
                .order_by(sessions.c.id)
                .limit(2)
            ).all()
            for ident, title in ((a, None), (b, title_a), (a, title_b)):
                conn.execute(sessions.update().where(sessions.c.id == ident).values(title=title))
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=POSTGRESQL)])
def test_a_changed_source_is_brought_up_to_date_after_a_stop(
    kind: str, source: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Stopped in the messages, then the agent adds a session whose id sorts first, edits,
    hides and deletes messages, deletes a session and swaps two titles: the same command
    makes the target hold the source as it is now, every row once, and verifies."""
    target = str(tmp_path / "target.db") if kind == "sqlite" else request.getfixturevalue("pg_url")
    tables = [table.name for table in copied_tables()]
    messages_batch = tables.index("messages")

    def stop_in_messages(state: CopyProgress) -> None:
        if state.step == "copying" and state.table == "messages" and state.table_rows >= BATCH:
            raise Stop

    with pytest.raises(Stop):
        copy_store(str(source), target, batch_rows=BATCH, progress=stop_in_messages)
    assert 0 < _scalar(target, "SELECT count(*) FROM messages") < MESSAGES
    assert messages_batch > tables.index("sessions")
    _change_source(str(source))

    result = copy_store(str(source), target, batch_rows=BATCH)
    assert result.resumed
    assert result.verification.ok, result.verification.as_dict()
    assert_same_rows(str(source), target)
    assert result.changes["sessions"]["inserted"] >= 1  # the one that sorts first
    assert result.changes["sessions"]["deleted"] == 1
    assert result.changes["sessions"]["updated"] >= 2  # the titles


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=POSTGRESQL)])
def test_the_final_pass_writes_only_what_changed(
    kind: str, source: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target = str(tmp_path / "target.db") if kind == "sqlite" else request.getfixturevalue("pg_url")
    first = copy_store(str(source), target, batch_rows=BATCH)
    assert first.verification.ok
    assert sum(first.rows.values()) > MESSAGES
    _change_source(str(source))

    final = copy_store(str(source), target, batch_rows=BATCH)
    assert not final.already_complete
    assert final.verification.ok, final.verification.as_dict()
    assert_same_rows(str(source), target)
    written = sum(final.rows.values())
    deleted = sum(change["deleted"] for change in final.changes.values())
    assert 0 < written < 20, final.changes  # a few rows, not the store
    assert deleted > 0
    # Nothing changed since: nothing is written, and the copy verifies again.
    again = copy_store(str(source), target)
    assert again.already_complete
    assert again.changes == {}
    assert again.verification.ok


@pytest.mark.postgresql
def test_a_changed_postgresql_source_is_brought_up_to_date(
    source: Path, pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL -> SQLite: stopped in the messages, the server store changes, resumed."""
    copy_store(str(source), pg_url, verify=False)
    back = str(tmp_path / "back.db")

    def stop(state: CopyProgress) -> None:
        if state.step == "copying" and state.table == "messages":
            raise Stop

    with pytest.raises(Stop):
        copy_store(pg_url, back, batch_rows=BATCH, progress=stop)
    _change_source(pg_url)
    result = copy_store(pg_url, back, batch_rows=BATCH)
    assert result.verification.ok, result.verification.as_dict()
    assert_same_rows(pg_url, back)


def test_a_copy_while_the_agent_writes_then_a_final_pass(source: Path, tmp_path: Path) -> None:
    """The recommended move of a live store: copy while the agent writes (the run copies
    one snapshot, verifies it, and says the source moved on), then the final pass."""
    target = tmp_path / "target.db"
    stop = threading.Event()
    written: list[int] = []

    def agent() -> None:
        with contextlib.closing(sqlite3.connect(source, timeout=30)) as conn:
            conn.execute("PRAGMA foreign_keys=ON")
            n = 0
            while not stop.is_set():
                n += 1
                conn.execute(
                    "INSERT INTO messages (session_id, role, content, timestamp) "
                    "VALUES ('0000-child', 'assistant', 'live ' || ?, ?)",
                    (n, 10.0 + n),
                )
                conn.execute("UPDATE sessions SET message_count = ? WHERE id = '0000-child'", (n,))
                if n % 5 == 0:
                    conn.execute("DELETE FROM messages WHERE id = (SELECT min(id) FROM messages)")
                conn.commit()
                written.append(n)
                time.sleep(0.005)

    writer = threading.Thread(target=agent)
    writer.start()
    try:
        while not written:
            time.sleep(0.01)
        live = copy_store(str(source), str(target), batch_rows=BATCH)
    finally:
        stop.set()
        writer.join()
    assert live.verification.ok, live.verification.as_dict()  # the snapshot it copied
    assert live.source_changed is True
    final = copy_store(str(source), str(target), batch_rows=BATCH)
    assert final.source_changed is False
    assert final.verification.ok, final.verification.as_dict()
    assert_same_rows(str(source), str(target))
    assert 0 < sum(final.rows.values()) < len(written) + 10


def test_another_store_at_the_same_path_is_refused(
    source: Path, tmp_path: Path, template: Path
) -> None:
    """Replaced (another file), or overwritten in place by another store (same file):
    refused in one line with the command that makes the target a copy of it."""
    target = tmp_path / "target.db"
    copy_store(str(source), str(target), verify=False)
    other = _fill(tmp_path / "other.db", 120, seed=77)
    before = _content(target)

    replaced = tmp_path / "replaced.db"
    shutil.copyfile(other, replaced)
    os.replace(replaced, source)  # another file at the same path
    with pytest.raises(CopyRefused, match=r"another file .*--restart") as refused:
        copy_store(str(source), str(target))
    assert "\n" not in str(refused.value)
    assert _content(target) == before

    second = tmp_path / "second.db"
    shutil.copyfile(template, second)
    copy_store(str(second), str(target), restart=True, verify=False)  # a copy of that file
    with open(second, "r+b") as into, open(other, "rb") as data:  # same inode, other store
        into.write(data.read())
        into.truncate()
    with pytest.raises(CopyRefused, match=r"another store .*none of the .*--restart"):
        copy_store(str(second), str(target))

    result = CliRunner().invoke(
        main, ["copy", "--from", str(second), "--to", str(target), "--restart"]
    )
    assert result.exit_code == 0, result.output
    assert_same_rows(str(second), str(target))


@pytest.mark.postgresql
def test_a_recreated_postgresql_source_is_another_database(
    source: Path, pg_url: str, tmp_path: Path
) -> None:
    copy_store(str(source), pg_url, verify=False)
    back = tmp_path / "back.db"
    copy_store(pg_url, str(back), verify=False)
    admin = create_engine(_admin_url(pg_url), isolation_level="AUTOCOMMIT")
    name = make_url(pg_url).database
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    copy_store(str(source), pg_url, verify=False)  # the same rows, in another database
    with pytest.raises(CopyRefused, match="another database"):
        copy_store(pg_url, str(back))


def _admin_url(url: str) -> str:
    return make_url(url).set(database="postgres").render_as_string(hide_password=False)


# --------------------------------------------------------------------------------------
# Values no target can hold, and message text in errors
# --------------------------------------------------------------------------------------


def _target(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    return str(tmp_path / "target.db") if kind == "sqlite" else request.getfixturevalue("pg_url")


def _nothing_written(kind: str, target: str) -> bool:
    if kind == "sqlite":
        return not Path(target).exists()
    return _tables(target) == set()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=POSTGRESQL)])
def test_text_that_is_not_utf8_is_refused_by_table_column_and_id(
    kind: str, source: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """sqlite3's own error would quote the text; the refusal names where it is, before
    anything is written; once the row is fixed the same command completes."""
    target = _target(kind, tmp_path, request)
    secret = f"My AWS secret is {MARKER} "
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute(
            "UPDATE messages SET content = CAST(? AS TEXT) WHERE id = 7",
            (secret.encode() + b"\xff\xfe",),
        )
        conn.commit()
    command = ["copy", "--from", str(source), "--to", target]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1, result.output
    assert "messages.content of id 7 is not valid UTF-8" in result.output
    assert MARKER not in result.output
    with pytest.raises(CopyRefused) as refused:
        copy_store(str(source), target)
    assert MARKER not in "".join(traceback.format_exception(refused.value))
    assert _nothing_written(kind, target)

    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute("UPDATE messages SET content = 'rewritten' WHERE id = 7")
        conn.commit()
    fixed = CliRunner().invoke(main, command)
    assert fixed.exit_code == 0, fixed.output
    assert_same_rows(str(source), target)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=POSTGRESQL)])
def test_a_value_that_does_not_fit_its_column_is_named_before_anything_is_written(
    kind: str, source: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """TEXT in a REAL column (SQLite keeps it): named by table, column and key before the
    first batch, on a first copy and on a final pass alike; fixed, the command completes."""
    target = _target(kind, tmp_path, request)
    with contextlib.closing(sqlite3.connect(source)) as conn:
        last = conn.execute("SELECT max(id) FROM sessions").fetchone()[0]
        conn.execute("UPDATE sessions SET started_at = 'yesterday' WHERE id = ?", (last,))
        conn.execute("UPDATE messages SET token_count = 1.5 WHERE id = 9")
        conn.execute("UPDATE messages SET display_identity = 'text' WHERE id = 11")
        conn.commit()
    command = ["copy", "--from", str(source), "--to", target]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"sessions.started_at of id {last!r} holds text in a REAL column" in lines[0]
    assert "messages.token_count of id 9 holds a real number in an INTEGER column" in lines[0]
    assert "messages.display_identity of id 11 holds text in a BLOB column" in lines[0]
    assert "yesterday" not in lines[0]
    assert _nothing_written(kind, target)

    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute("UPDATE sessions SET started_at = 1.0 WHERE id = ?", (last,))
        conn.execute("UPDATE messages SET token_count = 2 WHERE id = 9")
        conn.execute("UPDATE messages SET display_identity = X'74' WHERE id = 11")
        conn.commit()
    assert CliRunner().invoke(main, command).exit_code == 0
    # On a final pass too: the bad value is named before any of the changes is written.
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute("UPDATE sessions SET started_at = 'today' WHERE id = ?", (last,))
        conn.execute("DELETE FROM messages WHERE id = 12")
        conn.commit()
    before = _copied_rows(target)
    again = CliRunner().invoke(main, command)
    assert again.exit_code == 1
    assert "sessions.started_at" in again.output
    assert _copied_rows(target) == before


def test_a_message_naming_a_missing_session_is_refused_before_anything(
    source: Path, tmp_path: Path
) -> None:
    """A store written without foreign keys enforced: named, not a batch refused forever."""
    with contextlib.closing(sqlite3.connect(source)) as conn:  # foreign keys off
        conn.execute("UPDATE messages SET session_id = 'gone' WHERE id = 13")
        conn.commit()
    target = tmp_path / "target.db"
    with pytest.raises(CopyRefused, match=r"messages\.session_id of id 13 names sessions 'gone'"):
        copy_store(str(source), str(target))
    assert not target.exists()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=POSTGRESQL)])
def test_no_log_record_output_or_error_of_a_copy_carries_message_text(
    kind: str,
    source: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name in ["sqlalchemy", "alembic", "hermes_store", *logging.root.manager.loggerDict]:
        caplog.set_level(logging.DEBUG, logger=name)
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute(
            "UPDATE messages SET content = content || ' ' || ? WHERE id % 3 = 0", (MARKER,)
        )
        conn.commit()
    target = _target(kind, tmp_path, request)
    outputs = []
    for arguments in (["--json"], []):  # the copy, then verified again
        result = CliRunner().invoke(
            main, ["copy", "--from", str(source), "--to", target, *arguments]
        )
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    back = tmp_path / "back.db"
    copy_store(target, str(back))  # and the way back
    with contextlib.closing(sqlite3.connect(source)) as conn:  # a value no target takes
        conn.execute("UPDATE messages SET timestamp = ? WHERE id = 3", (MARKER,))
        conn.commit()
    with pytest.raises(CopyRefused) as refused:
        copy_store(str(source), target)
    records = caplog.records
    assert any(record.name.startswith("sqlalchemy.engine") for record in records)
    for record in records:
        assert MARKER not in record.getMessage() + (record.exc_text or ""), record.name
    assert all(MARKER not in output for output in outputs)
    assert MARKER not in "".join(traceback.format_exception(refused.value))


# --------------------------------------------------------------------------------------
# Verification that cannot pass vacuously
# --------------------------------------------------------------------------------------


def test_sample_searches_come_from_the_source_and_each_has_hits(
    source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target.db"
    result = copy_store(str(source), str(target))
    searches = result.verification.searches
    assert len(searches) >= 10, searches  # most kinds found a query with hits
    assert all(search.source_hits > 0 and search.equal for search in searches)
    assert len({search.how for search in searches}) == len(searches)
    assert result.verification.not_checked == []
    # The queries' words come from messages: neither the report nor the JSON shows them.
    engine = open_source(str(source))
    try:
        with read_snapshot(engine) as conn:
            chosen, _, _ = choose_searches(conn)
    finally:
        engine.dispose()
    assert chosen
    for arguments in ([], ["--json"]):
        output = (
            CliRunner()
            .invoke(main, ["copy", "--from", str(source), "--to", str(target), *arguments])
            .output
        )
        assert "sample search 1 (a word of one message)" in output or '"number": 1' in output
        for search in chosen:
            assert json.dumps(search.arguments["query"]) not in output
            assert f" {search.arguments['query']} " not in output


def test_a_search_that_differs_fails_the_verification_and_the_command(
    source: Path, tmp_path: Path
) -> None:
    """The target's word index loses some rows (its tables still equal): the sample
    searches see it, and the command exits 1."""
    target = tmp_path / "target.db"
    assert copy_store(str(source), str(target)).verification.ok
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("DELETE FROM messages_fts_idx")  # an emptied index, tables untouched
        conn.commit()
    result = CliRunner().invoke(main, ["copy", "--from", str(source), "--to", str(target)])
    assert result.exit_code == 1, result.output
    assert "verification FAILED" in result.output
    verification = verify_copy(str(source), str(target))
    assert all(check.equal for check in verification.tables)
    assert verification.searches or verification.not_checked
    assert not verification.ok
    assert any(not s.equal for s in verification.searches) or verification.not_checked


def test_a_search_that_fails_is_not_checked_and_not_a_pass(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "target.db"
    copy_store(str(source), str(target))
    from hermes_store.copy import verify as copy_verify

    real = copy_verify._hits

    def failing_on_the_target(conn: Any, arguments: Any, limit: int) -> Any:
        if limit == copy_verify.TARGET_LIMIT:
            raise RuntimeError("boom")
        return real(conn, arguments, limit)

    monkeypatch.setattr(copy_verify, "_hits", failing_on_the_target)
    verification = verify_copy(str(source), str(target))
    assert all(check.equal for check in verification.tables)
    assert verification.not_checked
    assert all("the target's search failed (RuntimeError)" in i for i in verification.not_checked)
    assert not verification.ok
    result = CliRunner().invoke(main, ["copy", "--from", str(source), "--to", str(target)])
    assert result.exit_code == 1
    assert "not checked: sample search 1" in result.output
    assert "verification FAILED" in result.output


def test_nothing_verified_is_not_a_pass() -> None:
    assert not Verification().ok
    checked = Verification(tables=[TableCheck("t", 1, 1, "a", "a")], not_checked=["x"])
    assert not checked.ok
    assert Verification(tables=[TableCheck("t", 1, 1, "a", "a")]).ok


def test_a_source_without_text_to_search_says_so(tmp_path: Path) -> None:
    source = tmp_path / "empty.db"
    migrate.upgrade(str(source))
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1)")
        conn.commit()
    result = copy_store(str(source), str(tmp_path / "target.db"))
    assert result.verification.ok, result.verification.as_dict()
    assert result.verification.searches == []
    assert result.verification.no_searches == "the source holds no message text to search"


# --------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------


def test_progress_covers_the_comparison_the_copy_and_the_verification(
    source: Path, tmp_path: Path
) -> None:
    seen: list[CopyProgress] = []
    copy_store(str(source), str(tmp_path / "target.db"), batch_rows=BATCH, progress=seen.append)
    steps = [state.step for state in seen]
    assert steps
    order = ["comparing", "copying", "verifying", "searching"]
    assert [step for step in dict.fromkeys(steps)] == order
    last = {state.step: state for state in seen}
    assert last["verifying"].rows == last["verifying"].total > 0
    assert last["searching"].rows == last["searching"].total > 0


def test_the_command_shows_progress_on_a_terminal_only(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_store.cli import progress

    command = ["copy", "--from", str(source), "--to", str(tmp_path / "t.db")]
    assert CliRunner().invoke(main, command).stderr == ""  # piped: nothing extra
    screen = io.StringIO()
    monkeypatch.setattr(progress, "interactive", lambda: True)
    monkeypatch.setattr(
        progress,
        "console",
        lambda stderr=False: Console(file=screen, force_terminal=stderr, width=100),
    )
    result = CliRunner().invoke(main, [*command[:-1], str(tmp_path / "u.db")])
    assert result.exit_code == 0, result.output
    shown = screen.getvalue()
    for step in ("comparing", "copying", "verifying", "searching"):
        assert step in shown, step

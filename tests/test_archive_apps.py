"""Cold storage for a hot store an older application still runs on (`hermes-store upgrade
--app-version N`): old sessions move to an archive at head and back, and the application at
N keeps writing, reading and searching the hot store as it did."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store, system_prompt_hash
from sqlalchemy import create_engine, text

from hermes_store import migrate
from hermes_store.archive import archive_sessions, criterion, move
from hermes_store.cli import main
from hermes_store.store import Store

DAY = 86400.0
NOW = time.time()
OLD = NOW - 200 * DAY
RECENT = NOW - 1 * DAY
BEFORE = datetime.fromtimestamp(NOW - 100 * DAY, UTC).date().isoformat()
#: Put into message text: it must never reach an error.
SECRET = "zq7APPSsecret"
PROMPT = "You are Hermes at an older schema."

VERSIONS = [17, 21, 24, 30, "head"]


def _cli(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(arg) for arg in args], catch_exceptions=False)


def _connect(path: Path) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(sqlite3.connect(path, timeout=30))


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}


def app_writes_session(
    path: Path, sid: str, at: float, words: str, *, parent: str | None = None, ended: bool = True
) -> None:
    """A session and two messages, written as the application at the store's schema writes
    them: the prompt inline below 25, in system_prompts from 25 on; usage from 20 on."""
    with _connect(path) as conn, conn:
        columns = _columns(conn, "sessions")
        session: dict[str, Any] = {
            "id": sid,
            "source": "cli",
            "model": "anthropic/claude-sonnet-4",
            "started_at": at,
            "parent_session_id": parent,
            "message_count": 2,
        }
        if ended:
            session.update(ended_at=at + 100, end_reason="user_exit")
        if "system_prompt_hash" in columns:
            digest = system_prompt_hash(PROMPT)
            conn.execute(
                "INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?, ?)",
                (digest, PROMPT),
            )
            session["system_prompt_hash"] = digest
        else:
            session["system_prompt"] = PROMPT
        names = ", ".join(session)
        marks = ", ".join("?" for _ in session)
        conn.execute(f"INSERT INTO sessions ({names}) VALUES ({marks})", tuple(session.values()))
        for i, role in enumerate(("user", "assistant")):
            conn.execute(
                "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                (sid, role, f"{SECRET} {words} number {i}", at + 10 + i),
            )
        if "model" not in _columns(conn, "session_model_usage"):
            return  # below 20: no usage table
        conn.execute(
            "INSERT INTO session_model_usage (session_id, model, api_call_count, input_tokens, "
            "first_seen, last_seen) VALUES (?, 'anthropic/claude-sonnet-4', 1, 900, ?, ?)",
            (sid, at, at + 100),
        )


def app_finds(path: Path, word: str, trigram: str) -> set[int]:
    """The message ids the application's own FTS5 queries find (word and trigram index,
    which must agree), read back from messages."""
    with _connect(path) as conn:
        words = {
            row[0]
            for row in conn.execute(
                "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?", (word,)
            )
        }
        grams = {
            row[0]
            for row in conn.execute(
                "SELECT rowid FROM messages_fts_trigram WHERE messages_fts_trigram MATCH ?",
                (f'"{trigram}"',),
            )
        }
        assert words == grams
        found = {
            row[0]
            for row in conn.execute(
                f"SELECT id FROM messages WHERE id IN ({','.join('?' * len(words))})",
                tuple(words),
            )
        }
    assert found == words
    return words


def app_reads(path: Path, sid: str) -> list[str]:
    """The session's messages in order, and its prompt, as the application reads them."""
    with _connect(path) as conn:
        columns = _columns(conn, "sessions")
        if "system_prompt_hash" in columns:
            (prompt,) = conn.execute(
                "SELECT COALESCE(s.system_prompt, p.prompt) FROM sessions s "
                "LEFT JOIN system_prompts p ON p.hash = s.system_prompt_hash WHERE s.id = ?",
                (sid,),
            ).fetchone()
        else:
            (prompt,) = conn.execute(
                "SELECT system_prompt FROM sessions WHERE id = ?", (sid,)
            ).fetchone()
        assert prompt == PROMPT
        return [
            str(row[0])
            for row in conn.execute(
                "SELECT content FROM messages WHERE session_id = ? ORDER BY timestamp, id", (sid,)
            )
        ]


def _scalar(path: Path, sql: str, *args: Any) -> Any:
    with _connect(path) as conn:
        return conn.execute(sql, args).fetchone()[0]


def _revisions(path: Path) -> list[str]:
    with _connect(path) as conn:
        found = conn.execute("SELECT version_num FROM alembic_version")
        return sorted(str(row[0]) for row in found)


def build_hot(path: Path, version: int | str) -> Path:
    if version == "head":
        migrate.upgrade(str(path))
    else:
        assert isinstance(version, int)
        build_legacy_store(path, version)
        migrate.upgrade(str(path), app_version=version)
    path.chmod(0o600)
    app_writes_session(path, "old-root", OLD, "pelicanfjord")
    app_writes_session(path, "old-child", OLD + 200, "pelicanfjord child", parent="old-root")
    app_writes_session(path, "old-alone", OLD + 500, "walrusdelta")
    app_writes_session(path, "recent", RECENT, "pelicanfjord recent")
    app_writes_session(path, "open", OLD, "pelicanfjord open", ended=False)
    return path


def _check(path: Path) -> None:
    done = _cli("check", "--db", path)
    assert done.exit_code == 0, done.output
    assert _scalar(path, "PRAGMA integrity_check") == "ok"


def _sessions(path: Path) -> set[str]:
    with _connect(path) as conn:
        return {str(row[0]) for row in conn.execute("SELECT id FROM sessions")}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_application_at_its_version_keeps_working_on_an_archived_hot_store(
    version: int | str, tmp_path: Path
) -> None:
    hot = build_hot(tmp_path / "state.db", version)
    archive = tmp_path / "archive.db"
    schema = _scalar(hot, "SELECT version FROM schema_version")
    revisions = _revisions(hot)
    before = {sid: app_reads(hot, sid) for sid in ("old-root", "old-child", "old-alone")}

    done = _cli("archive", "--db", hot, "--to", archive, "--before", BEFORE)
    assert done.exit_code == 0, done.output
    assert SECRET not in done.output
    moved = {"old-root", "old-child", "old-alone"}
    assert _sessions(hot) == {"recent", "open"}
    assert _sessions(archive) == moved
    # The hot store stays at the application's version; the archive is an ordinary store.
    assert _scalar(hot, "SELECT version FROM schema_version") == schema
    assert _revisions(hot) == revisions
    _check(hot)
    _check(archive)
    # The archive holds what the application wrote, the prompt and the usage included.
    for sid, texts in before.items():
        assert app_reads(archive, sid) == texts
    usage = 0 if version == 17 else 3
    assert _scalar(archive, "SELECT count(*) FROM session_model_usage") == usage

    # The application at that version writes, reads back and finds with its own queries.
    app_writes_session(hot, "after", NOW, "kestrelquay")
    assert len(app_reads(hot, "after")) == 2
    assert len(app_finds(hot, "kestrelquay", "strelqu")) == 2
    assert len(app_finds(hot, "pelicanfjord", "icanfj")) == 4  # recent and open only
    _check(hot)

    # Searching with the archive finds the moved sessions too.
    with Store.open(str(hot), archives=[str(archive)]) as store:
        hits = store.search("pelicanfjord", limit=50)
    found = {hit["session_id"] for hit in hits}
    assert {"old-root", "old-child", "recent", "open"} <= found

    # Restore brings the tree back, and the application reads and finds it.
    done = _cli("restore", "old-child", "--db", hot, "--from", archive)
    assert done.exit_code == 0, done.output
    assert _sessions(hot) == {"recent", "open", "after", "old-root", "old-child"}
    assert _sessions(archive) == {"old-alone"}
    for sid in ("old-root", "old-child"):
        assert app_reads(hot, sid) == before[sid]
    assert len(app_finds(hot, "pelicanfjord", "icanfj")) == 8
    assert _scalar(hot, "SELECT version FROM schema_version") == schema
    assert _revisions(hot) == revisions
    _check(hot)
    _check(archive)
    # And goes on writing to it.
    with _connect(hot) as conn, conn:
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) "
            "VALUES ('old-root', 'user', 'ospreyglen continued', ?)",
            (NOW,),
        )
    assert len(app_finds(hot, "ospreyglen", "reygle")) == 1
    _check(hot)


def _snapshot(path: Path) -> list[Any]:
    with _connect(path) as conn:
        return [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("sessions", "messages", "session_model_usage", "state_meta")
        ]


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("UPDATE sessions SET pinned = 1 WHERE id = 'old-root'", "sessions.pinned"),
        (
            "UPDATE session_model_usage SET task = 'vision' WHERE session_id = 'old-child'",
            "session_model_usage.task",
        ),
        (
            "UPDATE sessions SET system_prompt = NULL, system_prompt_hash = 'a1b2' "
            "WHERE id = 'old-child'",
            "sessions.system_prompt_hash",
        ),
    ],
    ids=["pinned", "usage-task", "stored-prompt"],
)
def test_a_restore_that_would_lose_a_value_the_hot_store_has_no_column_for_is_refused(
    sql: str, named: str, tmp_path: Path
) -> None:
    hot = build_hot(tmp_path / "state.db", 21)
    archive = tmp_path / "archive.db"
    done = _cli("archive", "--db", hot, "--to", archive, "--before", BEFORE)
    assert done.exit_code == 0, done.output
    # The schema-30 application, reading the archive, sets a value schema 21 has no place for.
    with _connect(archive) as conn, conn:
        conn.execute(sql)
    hot_before, archive_before = _snapshot(hot), _snapshot(archive)
    args = ["restore", "old-root", "--db", str(hot), "--from", str(archive)]
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 1
    said = done.stderr.strip()
    assert len(said.splitlines()) == 1
    assert named in said
    assert "'old-" in said
    assert "--app-version" in said
    assert SECRET not in said
    assert "Traceback" not in said
    assert _snapshot(hot) == hot_before
    assert _snapshot(archive) == archive_before


def test_a_hot_store_at_an_older_search_layout_is_refused(tmp_path: Path) -> None:
    hot = tmp_path / "state.db"
    build_legacy_store(hot, 21)
    done = CliRunner().invoke(
        main, ["archive", "--db", str(hot), "--to", str(tmp_path / "a.db"), "--before", BEFORE]
    )
    assert done.exit_code == 1
    said = done.stderr.strip()
    assert len(said.splitlines()) == 1
    assert "--app-version" in said
    assert not (tmp_path / "a.db").exists()


class _Stopped(Exception):
    """The run stopped between the copy and the delete."""


def _stop_at(step: str) -> Any:
    def hook(name: str) -> None:
        if name == step:
            raise _Stopped

    return hook


@pytest.mark.parametrize(
    ("upgraded", "pinned"),
    [(None, False), (30, False), (24, False), (24, True)],
    ids=["same-version", "upgraded-to-30", "upgraded-to-24", "upgraded-to-24-and-pinned"],
)
def test_a_batch_stopped_after_its_copy_is_finished_by_the_next_run(
    upgraded: int | None, pinned: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hot = build_hot(tmp_path / "state.db", 21)
    archive = tmp_path / "archive.db"
    before = {sid: app_reads(hot, sid) for sid in ("old-root", "old-child", "old-alone")}
    monkeypatch.setattr(move, "STEP_HOOK", _stop_at("verified"))
    with pytest.raises(_Stopped):
        archive_sessions(str(hot), str(archive), criterion(before=BEFORE))
    monkeypatch.setattr(move, "STEP_HOOK", None)
    if upgraded is not None:
        # The operator upgrades the hot store before running the command again: from 25 on
        # its prompts move into system_prompts, so the batch's rows there changed.
        migrate.upgrade(str(hot), app_version=upgraded)
    if pinned:
        # ... and the application at 24 pins one of the batch's sessions: a value the copy,
        # read at 21, has no column for.
        with _connect(hot) as conn, conn:
            conn.execute("UPDATE sessions SET pinned = 1 WHERE id = 'old-root'")
    done = _cli("archive", "--db", hot, "--to", archive, "--before", BEFORE)
    assert done.exit_code == 0, done.output
    # Every session in exactly one store, as the application wrote it.
    held_hot, held_archive = _sessions(hot), _sessions(archive)
    assert held_hot.isdisjoint(held_archive)
    assert held_hot | held_archive == {"old-root", "old-child", "old-alone", "recent", "open"}
    assert held_archive == {"old-root", "old-child", "old-alone"}
    for sid, texts in before.items():
        assert app_reads(archive, sid) == texts
    if pinned:
        assert _scalar(archive, "SELECT pinned FROM sessions WHERE id = 'old-root'") == 1
    _check(hot)
    _check(archive)
    with _connect(hot) as conn:
        assert conn.execute(
            "SELECT count(*) FROM state_meta WHERE key LIKE 'hermes_store.archive%'"
        ).fetchone() == (0,)


@pytest.mark.postgresql
def test_a_postgresql_hot_store_at_21_archives_and_restores(pg_url: str, tmp_path: Path) -> None:
    migrate.upgrade(pg_url, app_version=21)
    engine = create_engine(pg_url)
    try:
        with engine.begin() as conn:
            for sid, at in (("old-root", OLD), ("recent", RECENT)):
                conn.execute(
                    text(
                        "INSERT INTO sessions (id, source, started_at, ended_at, system_prompt) "
                        "VALUES (:id, 'cli', :at, :end, :prompt)"
                    ),
                    {"id": sid, "at": at, "end": at + 100, "prompt": PROMPT},
                )
                conn.execute(
                    text(
                        "INSERT INTO messages (session_id, role, content, timestamp) "
                        "VALUES (:id, 'user', 'pelicanfjord on postgresql', :at)"
                    ),
                    {"id": sid, "at": at + 10},
                )
            before = conn.execute(text("SELECT version FROM schema_version")).scalar_one()
    finally:
        engine.dispose()
    archive = tmp_path / "archive.db"
    done = _cli("archive", "--db", pg_url, "--to", archive, "--before", BEFORE)
    assert done.exit_code == 0, done.output
    assert _sessions(archive) == {"old-root"}
    assert app_reads(archive, "old-root") == ["pelicanfjord on postgresql"]
    for store in (pg_url, archive):
        assert _cli("check", "--db", store).exit_code == 0
    done = _cli("restore", "old-root", "--db", pg_url, "--from", archive)
    assert done.exit_code == 0, done.output
    assert _sessions(archive) == set()
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            held = set(conn.scalars(text("SELECT id FROM sessions")))
            version = conn.execute(text("SELECT version FROM schema_version")).scalar_one()
    finally:
        engine.dispose()
    assert held == {"old-root", "recent"}
    assert version == before == 21
    assert _cli("check", "--db", pg_url).exit_code == 0

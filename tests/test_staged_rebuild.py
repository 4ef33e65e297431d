"""A legacy index that must be rebuilt keeps serving the application until the new one is in.

`upgrade --deferred-fts` on a store whose legacy indexes drifted (they cannot be converted
in place) leaves the legacy indexes where the application's own search reads them, fed by
their legacy triggers, and builds the external indexes beside them (`<index>_next`).
`optimize-storage` fills and merges them in short steps, swaps each in with one short
transaction, then empties and drops the swapped-out one (`<index>_retired`) in short steps.

Here the backfill is killed with SIGKILL inside a transaction at four points (filling,
merging, right after a swap, while the retired index is dropped). After each kill, the
application's own query (an FTS5 MATCH on `messages_fts` / `messages_fts_trigram`, with
plain sqlite3, as the legacy search runs it) finds at least what it found before the
upgrade for 20 sample queries, and a message the application writes then is found at once.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.revisions import FTS_EXTERNAL_REVISION
from hermes_store.search import search_messages
from hermes_store.sqlite import backfill, fts

MESSAGES = 3000
WORD, TRIGRAM = fts.INDEXES
#: 20 queries as the application sends them to FTS5 (already sanitised): index, expression.
QUERIES: list[tuple[str, str]] = [
    (WORD, "error"),
    (WORD, "docker"),
    (WORD, "traceback"),
    (WORD, '"no such file or directory"'),
    (WORD, "pyth*"),
    (WORD, "import NOT os"),
    (WORD, "error OR exception"),
    (WORD, "exit AND code"),
    (WORD, "terminal"),
    (WORD, "database"),
    (WORD, "config"),
    (WORD, "python"),
    (WORD, "return"),
    (WORD, "image_url"),
    (TRIGRAM, '"数据库"'),
    (TRIGRAM, '"服务器"'),
    (TRIGRAM, '"数据库" OR "服务器"'),
    (TRIGRAM, '"ありがとう"'),
    (TRIGRAM, '"ception"'),
    (TRIGRAM, '"rror"'),
]

#: Runs the backfill and kills itself (SIGKILL) inside the first transaction after the
#: store reaches the phase named by argv[2]; exits 3 if the run ends before that.
KILLER = textwrap.dedent(
    """
    import os, signal, sqlite3, sys
    from sqlalchemy import event
    from hermes_store.sqlite import backfill
    from hermes_store.engine import create_store_engine

    db, phase = sys.argv[1], sys.argv[2]
    engine = create_store_engine(db, create=False)
    state = {"armed": False, "ticks": 0, "seen": 0}

    def on_connect(dbapi, _record):
        def handler():
            if state["armed"]:
                state["ticks"] += 1
                if state["ticks"] >= 40:  # some way into the step's statements
                    os.kill(os.getpid(), signal.SIGKILL)
            return 0
        dbapi.set_progress_handler(handler, 200)

    event.listen(engine, "connect", on_connect)

    def reached():
        with sqlite3.connect(db, timeout=30) as plain:
            keys = dict(plain.execute("SELECT key, value FROM state_meta"))
            tables = {r[0] for r in plain.execute("SELECT name FROM sqlite_master")}
        filling = [k for k in keys if k.endswith("_next.backfill_indexed_upto")]
        if phase == "filling":
            return any(int(keys[k]) > 0 for k in filling)
        if phase == "merging":
            return not filling and any(k.endswith("_next.backfill_merging") for k in keys)
        retired = any(name.endswith("_retired") for name in tables)
        if phase == "swapped":
            return retired
        state["seen"] += retired
        return state["seen"] >= 3  # "retiring": a few steps into dropping it

    def progress(_report):
        if not state["armed"] and reached():
            state["armed"] = True

    backfill.run(engine, chunk_rows=60, max_lock_ms=4, progress=progress, sleep=lambda _s: None)
    sys.exit(3)
    """
)


def legacy_hits(path: Path) -> list[set[int]]:
    """Each sample query's ids, run as the legacy application runs its search."""
    out = []
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        for index, expression in QUERIES:
            rows = conn.execute(
                f"SELECT m.id, snippet({index}, 0, '>>>', '<<<', '...', 40) FROM {index} "
                f"JOIN messages m ON m.id = {index}.rowid "
                f"JOIN sessions s ON s.id = m.session_id "
                f"WHERE {index} MATCH ? ORDER BY rank",
                (expression,),
            ).fetchall()
            out.append({row[0] for row in rows})
    return out


def app_writes(path: Path, token: str) -> int:
    """The application appends a message (plain sqlite3, its triggers fire); its id."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn, conn:
        session, at = conn.execute(
            "SELECT session_id, max(timestamp) FROM messages GROUP BY session_id LIMIT 1"
        ).fetchone()
        cursor = conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
            (session, "user", f"please look at {token} again 数据库{token}", at + 1),
        )
        return int(cursor.lastrowid or 0)


def invoke(*args: str | Path) -> Any:
    """Run a `hermes-store ... --json` command in-process; its parsed output."""
    result = CliRunner().invoke(main, [*(str(a) for a in args), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def tables(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


@pytest.fixture
def drifted(tmp_path: Path) -> Path:
    """A legacy schema-21 store whose indexes lack one message in ten."""
    path = tmp_path / "state.db"
    build_legacy_store(path, 21)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        corpus.populate(conn, corpus.generate(MESSAGES, 99))
        conn.execute("COMMIT")
        for index in fts.INDEXES:
            conn.execute(
                f"DELETE FROM {index} WHERE rowid IN (SELECT id FROM messages WHERE id % 10 = 3)"
            )
        conn.execute("PRAGMA journal_mode=WAL")
    return path


@pytest.mark.slow
def test_the_application_search_never_loses_a_hit_while_its_index_is_rebuilt(
    drifted: Path, tmp_path: Path
) -> None:
    before = legacy_hits(drifted)
    assert sum(bool(hits) for hits in before) >= 18, [len(h) for h in before]
    with contextlib.closing(sqlite3.connect(drifted)) as conn:
        messages = conn.execute("SELECT count(*) FROM messages").fetchone()[0]

    result = migrate.upgrade(str(drifted), x={"fts_backfill": "deferred"})
    assert result.layout_after == "staging"
    assert {fts.staged_name(index) for index in fts.INDEXES} <= tables(drifted)
    with contextlib.closing(sqlite3.connect(drifted)) as conn:  # the legacy ones serve
        for index in fts.INDEXES:
            sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (index,)).fetchone()
            assert "content=" not in sql[0], sql
    assert all(a >= b for a, b in zip(legacy_hits(drifted), before, strict=True))

    written: dict[str, int] = {}
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    for number, phase in enumerate(("filling", "merging", "swapped", "retiring")):
        process = subprocess.run(
            [sys.executable, str(script), str(drifted), phase],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert process.returncode == -signal.SIGKILL, (phase, process.returncode, process.stderr)
        with contextlib.closing(sqlite3.connect(drifted)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        now = legacy_hits(drifted)
        lost = [
            (QUERIES[i], len(b - a))
            for i, (a, b) in enumerate(zip(now, before, strict=True))
            if not a >= b
        ]
        assert not lost, (phase, lost)
        token = f"zqxstaged{number}"
        written[token] = app_writes(drifted, token)
        with contextlib.closing(sqlite3.connect(drifted)) as conn:  # found at once
            found = conn.execute(
                f"SELECT rowid FROM {WORD} WHERE {WORD} MATCH ?", (token,)
            ).fetchall()
        assert found == [(written[token],)], (phase, found)
    assert any(name.endswith("_retired") for name in tables(drifted))  # killed mid-drop

    assert invoke("optimize-storage", "--db", drifted)["status"] == "done"
    assert not {t for t in tables(drifted) if t.endswith(("_next", "_retired"))}
    report = invoke("check", "--db", drifted)
    assert report["ok"], report
    assert report["skipped"] == {}, report
    assert set(report["checked"]) >= set(fts.INDEXES)  # both FTS5 checks (rank 1) pass
    after = legacy_hits(drifted)
    assert all(a >= b for a, b in zip(after, before, strict=True))
    with contextlib.closing(sqlite3.connect(drifted)) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == messages + 4
    engine = create_store_engine(drifted, create=False)
    try:
        with engine.connect() as conn:
            for token, message in written.items():
                assert [hit["id"] for hit in search_messages(conn, token)] == [message]
    finally:
        engine.dispose()


def test_downgrade_while_rebuilding_beside_keeps_the_legacy_index(drifted: Path) -> None:
    before = legacy_hits(drifted)
    assert sum(bool(hits) for hits in before) >= 18, [len(h) for h in before]
    migrate.upgrade(str(drifted), x={"fts_backfill": "deferred"})
    migrate.downgrade(str(drifted), "21")
    # The search layout's head first (fts2: nothing on SQLite, the staged build goes on),
    # then the conversion, back to the legacy index.
    staged = {t for t in tables(drifted) if t.endswith(("_next", "_retired"))}
    assert staged
    assert migrate.downgrade(str(drifted), "fts@-1")[1] == f"21, {FTS_EXTERNAL_REVISION}"
    assert {t for t in tables(drifted) if t.endswith(("_next", "_retired"))} == staged
    assert migrate.downgrade(str(drifted), "fts@-1")[1] == "21"
    assert not {t for t in tables(drifted) if t.endswith(("_next", "_retired"))}
    assert all(a >= b for a, b in zip(legacy_hits(drifted), before, strict=True))


def test_check_names_the_staged_objects_and_repair_restores_them(drifted: Path) -> None:
    before = legacy_hits(drifted)
    assert sum(bool(hits) for hits in before) >= 18, [len(h) for h in before]
    migrate.upgrade(str(drifted), x={"fts_backfill": "deferred"})
    with contextlib.closing(sqlite3.connect(drifted)) as conn:
        conn.execute("DROP TRIGGER messages_fts_next_insert")
        conn.execute("DROP TRIGGER messages_fts_trigram_delete")  # a legacy one
    result = CliRunner().invoke(main, ["check", "--db", str(drifted), "--json"])
    assert result.exit_code == 1, result.output
    problems = json.loads(result.stdout)["problems"]
    assert problems == {
        "trigger messages_fts_next_insert": fts.MISSING,
        "trigger messages_fts_trigram_delete": fts.MISSING,
    }
    repaired = invoke("check", "--repair", "--db", drifted)
    assert repaired["ok"], repaired
    assert "trigger messages_fts_next_insert" in repaired["repair"]["restored"]
    assert not {t for t in tables(drifted) if t.endswith(("_next", "_retired"))}
    assert all(a >= b for a, b in zip(legacy_hits(drifted), before, strict=True))


def test_an_index_the_application_replaced_meanwhile_is_left_alone(drifted: Path) -> None:
    """The Hermes application moved the word index to its own layout while it was being
    rebuilt beside itself: the backfill drops its staged table instead of swapping."""
    migrate.upgrade(str(drifted), x={"fts_backfill": "deferred"})
    with contextlib.closing(sqlite3.connect(drifted)) as conn, conn:
        for trigger in ("messages_fts_insert", "messages_fts_delete", "messages_fts_update"):
            conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        conn.execute(f"DROP TABLE {WORD}")
        conn.execute("CREATE VIEW messages_fts_src AS SELECT id, content, tool_name FROM messages")
        conn.execute(
            f"CREATE VIRTUAL TABLE {WORD} USING fts5(content, tool_name, "
            "content='messages_fts_src', content_rowid='id')"
        )
        conn.execute(f"INSERT INTO {WORD}({WORD}) VALUES ('rebuild')")
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('fts_storage_version', '1')")
    engine = create_store_engine(drifted, create=False)
    try:
        backfill.run(engine, sleep=lambda _s: None)
    finally:
        engine.dispose()
    names = tables(drifted)
    assert fts.staged_name(WORD) not in names
    with contextlib.closing(sqlite3.connect(drifted)) as conn:
        declaration = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (WORD,)
        ).fetchone()[0]
        assert "tool_name" in declaration  # the application's own table, untouched
        # its column filter still answers (a swapped-in table has no tool_name column)
        conn.execute(f"SELECT count(*) FROM {WORD} WHERE {WORD} MATCH 'tool_name:terminal'")
    assert "messages_fts_insert" not in names  # no trigger of ours put back on its table

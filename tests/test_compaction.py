"""Online compaction of the FTS5 indexes (`optimize --compact`, and archive runs that move
most of a store): the hot file shrinks, search stays exact throughout, kill -9 at any
step leaves a working store that the next `optimize` finishes."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from hermes_store import migrate
from hermes_store.archive import archive_sessions, criterion
from hermes_store.archive.run import COMPACT_SHARE
from hermes_store.cli import main
from hermes_store.engine import create_store_engine
from hermes_store.sqlite import backfill, compaction
from hermes_store.sqlite.optimize import optimize
from hermes_store.store import NewMessage, Store

pytestmark = pytest.mark.slow

DAY = 86400.0
NOW = time.time()
OLD = NOW - 200 * DAY
#: Sessions, and messages each: 40 old ones (80% of the messages) and 10 recent ones.
OLD_SESSIONS, NEW_SESSIONS, PER_SESSION = 40, 10, 60
#: Words every message draws from; KEYWORDS are what the searches compare.
KEYWORDS = [f"kw{i}" for i in range(12)]
_WORDS = [f"w{i:04d}x" for i in range(3000)]


def _text(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=60) + rng.sample(KEYWORDS, 2)
    rng.shuffle(words)
    return " ".join(words)


def _build(path: Path, *, incremental: bool = True) -> Path:
    """A store at head: old ended sessions holding 80% of the messages, recent ones, and
    one live session the writer appends to."""
    migrate.upgrade(str(path))
    rng = random.Random(7)
    with Store.open(str(path)) as store:
        for n in range(OLD_SESSIONS + NEW_SESSIONS):
            at = OLD + n * 60 if n < OLD_SESSIONS else NOW - DAY + n
            sid = f"s{n}"
            store.create_session(sid, "cli", started_at=at)
            store.append_messages(
                sid,
                [
                    NewMessage(role="user", content=_text(rng), timestamp=at + i)
                    for i in range(PER_SESSION)
                ],
            )
            store.end_session(sid, "done", ended_at=at + PER_SESSION + 1)
        store.create_session("live", "cli", started_at=NOW)
    if incremental:  # as `optimize --vacuum` leaves it
        engine = create_store_engine(str(path))
        try:
            optimize(engine, vacuum=True)
        finally:
            engine.dispose()
    return path


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("compaction")
    return {
        "incremental": _build(folder / "incremental.db"),
        "none": _build(folder / "none.db", incremental=False),
    }


def _copy(source: Path, target: Path) -> Path:
    with (
        contextlib.closing(sqlite3.connect(source)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)
    target.chmod(0o600)
    return target


def _bytes(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


#: Appends a message to the live session every few ms (one commit each, as the agent
#: does), and compares each index's answers with an exact scan in one read snapshot;
#: prints what it saw as JSON when the stop file appears (its longest wait is a figure
#: of benchmarks/archive_targets.py: no test asserts a wall-clock time).
_AGENT = textwrap.dedent(
    """
    import json, os, random, sqlite3, sys, time
    path, stop, keywords = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=10000")
    rng = random.Random(3)
    waits, rounds, wrong, written = [], 0, [], 0
    def compare():
        global rounds
        conn.execute("BEGIN")
        try:
            for word in keywords:
                scan = {r[0] for r in conn.execute(
                    "SELECT id FROM messages WHERE ' ' || content || ' ' LIKE ?",
                    (f"% {word} %",))}
                found = {r[0] for r in conn.execute(
                    "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?", (word,))}
                if found != scan:
                    wrong.append(["messages_fts", word, len(found), len(scan)])
                scan = {r[0] for r in conn.execute(
                    "SELECT id FROM messages WHERE content LIKE ?", (f"%{word}%",))}
                found = {r[0] for r in conn.execute(
                    "SELECT rowid FROM messages_fts_trigram WHERE messages_fts_trigram "
                    "MATCH ?", (f'"{word}"',))}
                if found != scan:
                    wrong.append(["messages_fts_trigram", word, len(found), len(scan)])
        finally:
            conn.execute("COMMIT")
        rounds += 1
    while not os.path.exists(stop):
        words = " ".join(rng.choices(keywords, k=3) + ["agentword"])
        began = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        waits.append(time.perf_counter() - began)
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) "
            "VALUES ('live', 'user', ?, ?)", (words, time.time()))
        conn.execute("COMMIT")
        written += 1
        if written % 5 == 0:
            compare()
        time.sleep(0.005)
    compare()
    print(json.dumps({"waits": max(waits), "rounds": rounds, "wrong": wrong[:20],
                      "written": written}))
    """
)


def _agent(path: Path, stop: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _AGENT, str(path), str(stop), ",".join(KEYWORDS)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _stopped(agent: subprocess.Popen[str], stop: Path) -> dict[str, object]:
    stop.touch()
    out, _ = agent.communicate(timeout=120)
    assert agent.returncode == 0
    return dict(json.loads(out))


def _checked(path: Path) -> None:
    """`hermes-store check`, FTS5's own integrity-check of each index, and no leftover."""
    done = CliRunner().invoke(main, ["check", "--db", str(path)])
    assert done.exit_code == 0, done.output
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for index in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {index}({index}, rank) VALUES ('integrity-check', 1)")
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        keys = {r[0] for r in conn.execute("SELECT key FROM state_meta")}
    assert not {n for n in names if n.endswith(("_next", "_retired"))}
    assert not {k for k in keys if k.startswith("messages_fts")}


def _exact(path: Path) -> None:
    """Store.search of each keyword finds exactly the messages holding it (the agent only
    appends meanwhile: its newer messages are left out)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = list(conn.execute("SELECT id, content FROM messages"))
    last = max(mid for mid, _text in rows)
    with Store.open(str(path)) as store:
        for word in KEYWORDS[:4]:
            found = store.search(word, limit=100_000)
            assert found.degraded is None
            hits = {hit["id"] for hit in found if hit["id"] <= last}
            assert hits == {mid for mid, text in rows if word in text.split()}, word


def test_archive_most_of_a_store_shrinks_the_hot_file(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    hot = _copy(templates["incremental"], tmp_path / "state.db")
    before = _bytes(hot)
    stop = tmp_path / "stop"
    agent = _agent(hot, stop)
    try:
        time.sleep(0.5)
        result = archive_sessions(
            str(hot), str(tmp_path / "archive.db"), criterion(older_than="90d")
        )
    finally:
        seen = _stopped(agent, stop)
    assert result.moved.sessions == OLD_SESSIONS
    assert result.compacted == ["messages_fts", "messages_fts_trigram"]
    assert result.index_bytes_after is not None
    assert result.index_bytes_before is not None
    assert result.index_bytes_after < result.index_bytes_before / 2
    assert result.vacuum_needed_bytes == 0
    after = _bytes(hot)
    assert after < 0.6 * before, (before, after)
    assert seen["wrong"] == []
    assert int(str(seen["rounds"])) > 0
    _checked(hot)
    _exact(hot)


def test_a_store_without_incremental_auto_vacuum_is_told_what_only_vacuum_returns(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    hot = _copy(templates["none"], tmp_path / "state.db")
    done = CliRunner().invoke(
        main, ["archive", "--db", str(hot), "--to", str(tmp_path / "a.db"), "--older-than", "90d"]
    )
    assert done.exit_code == 0, done.output
    assert "compacted the search indexes" in done.output
    assert "can only be returned by `hermes-store optimize --vacuum`" in done.output
    _checked(hot)
    _exact(hot)
    # Once vacuumed, the store has incremental auto-vacuum and gives its pages back.
    engine = create_store_engine(str(hot))
    try:
        assert optimize(engine, vacuum=True).bytes_after < _bytes(templates["none"]) * 0.6
    finally:
        engine.dispose()


_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from hermes_store.engine import create_store_engine
    from hermes_store.sqlite import backfill
    from hermes_store.sqlite.optimize import optimize

    path, name, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
    calls = []
    real = getattr(backfill, name)

    def killing(*args, **kwargs):
        calls.append(1)
        if len(calls) >= nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(backfill, name, killing)
    optimize(create_store_engine(path), vacuum=None, compact=True)
    sys.exit(3)  # never reached the step
    """
)


@pytest.mark.parametrize(
    ("step", "nth"),
    [("_chunk", 2), ("_chunk", 5), ("_merge_step", 3), ("swap_in", 1), ("retire_step", 2)],
)
def test_a_compaction_killed_at_a_step_is_finished_by_the_next_optimize(
    templates: dict[str, Path], tmp_path: Path, step: str, nth: int
) -> None:
    hot = _copy(templates["incremental"], tmp_path / "state.db")
    archive_sessions(str(hot), str(tmp_path / "archive.db"), criterion(older_than="90d"))
    with contextlib.closing(sqlite3.connect(hot)) as conn:  # an archive run below the share
        conn.execute("DELETE FROM messages WHERE session_id = 's45'")
        conn.commit()
    stop = tmp_path / "stop"
    agent = _agent(hot, stop)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _KILLED, str(hot), step, str(nth)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        # Killed midway: the store works and checks clean, the current index serving.
        engine = create_store_engine(str(hot))
        try:
            with engine.connect() as conn:
                assert compaction.in_progress(conn)
                rebuilding = compaction.compacting(conn)
            if rebuilding:  # the current index serves the search, complete
                from hermes_store.sqlite.search_state import index_tables

                with Store.open(str(hot)) as store:
                    with store.engine.connect() as conn:
                        assert index_tables(conn)[0]["messages_fts"] == "messages_fts"
            _exact(hot)
            check = CliRunner().invoke(main, ["check", "--db", str(hot)])
            assert check.exit_code == 0, check.output
            finished = optimize(engine, vacuum=None)  # no --compact: it goes on anyway
        finally:
            engine.dispose()
    finally:
        seen = _stopped(agent, stop)
    assert seen["wrong"] == []
    if step != "retire_step":
        assert finished.compacted
    _checked(hot)
    _exact(hot)


def test_swap_in_still_refuses_an_index_the_application_replaced(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    """A staged index that is not a compaction never replaces an external index."""
    hot = _copy(templates["incremental"], tmp_path / "state.db")
    engine = create_store_engine(str(hot))
    try:
        with engine.connect() as conn:
            with conn.begin():
                assert compaction.start(conn, "messages_fts")
                conn.exec_driver_sql(
                    "DELETE FROM state_meta WHERE key = 'messages_fts_next.compaction'"
                )
            backfill.run(engine)
            names = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master")}
    finally:
        engine.dispose()
    assert "messages_fts_next" not in names
    assert "messages_fts_retired" not in names
    _checked(hot)


def test_optimize_compact_rebuilds_the_indexes_and_says_so(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    hot = _copy(templates["incremental"], tmp_path / "state.db")
    with contextlib.closing(sqlite3.connect(hot)) as conn:
        conn.execute("DELETE FROM messages WHERE session_id < 's3'")  # 23 of 50 sessions
        conn.commit()
    runner = CliRunner()
    done = runner.invoke(main, ["optimize", "--db", str(hot), "--compact", "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert result["compacted"] == ["messages_fts", "messages_fts_trigram"]
    assert result["index_bytes_after"] < result["index_bytes_before"]
    refused = runner.invoke(main, ["optimize", "--db", str(hot), "--compact", "--vacuum"])
    assert refused.exit_code == 2
    assert "pick one" in refused.output
    _checked(hot)
    _exact(hot)


def test_an_archive_run_below_the_share_does_not_compact(
    templates: dict[str, Path], tmp_path: Path
) -> None:
    hot = _copy(templates["incremental"], tmp_path / "state.db")
    before = datetime.fromtimestamp(OLD + 330, UTC).isoformat()  # s0..s4: a tenth
    result = archive_sessions(str(hot), str(tmp_path / "a.db"), criterion(before=before))
    assert result.moved.sessions == 5
    assert result.moved.messages < COMPACT_SHARE * result.messages_before
    assert result.compacted == []
    assert result.as_dict()["compaction"]["indexes"] == []
    _checked(hot)

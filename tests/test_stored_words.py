"""The stored words of revision fts2 on PostgreSQL: kept exact on every write, filled
online for an existing store, resumed after kill -9, checked and repaired.

A store at fts1 (expression index) is upgraded while writers append and a searcher reads:
no writer sees an error, every search answers exactly what the rows of its snapshot hold,
first through the expression index and, after the switch, through the stored words.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from hermes_store import migrate
from hermes_store.declarations import LAYOUT_MARKER
from hermes_store.engine import ENV_BUSY_TIMEOUT, create_store_engine
from hermes_store.postgresql.check import check_server, repair_server
from hermes_store.search import search_messages
from hermes_store.store import NewMessage, Store

pytestmark = pytest.mark.postgresql

#: The revision before fts2: fts1's expression index, both branches joined.
BEFORE = "merge_30_fts1"
#: The state_meta key fts2 records its fill's progress under.
FILLED_KEY = "hermes_store.search_words_filled_upto"
#: An agent's busy timeout (ms) above what one of step 1's lock attempts may make it
#: queue (100 ms) and below what it could before (400 ms).
AGENT_BUSY_MS = "300"
#: Step 1's statement as pg_stat_activity shows it while it waits for the table's lock.
WAITING_STEP_1 = (
    "SELECT query_start FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
    " AND wait_event_type = 'Lock' AND query LIKE '%ADD COLUMN IF NOT EXISTS search_words%'"
)

WRITER = """
import json, sys, time
from hermes_store.store import NewMessage, Store
url, number, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
appended, errors = 0, []
with Store.open(url) as store:
    store.create_session(f"writer-{number}", "cli")
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            store.append_message(
                f"writer-{number}", NewMessage("user", f"writermark{number} note {appended}")
            )
            appended += 1
        except Exception as exc:  # counted, not raised: the test says which
            errors.append(type(exc).__name__)
            time.sleep(0.05)
print(json.dumps({"appended": appended, "errors": errors}), flush=True)
"""


def _scalar(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def _fill(engine: Engine, count: int) -> None:
    """``count`` messages in one session, each with the word `bulkword` and a word of its own."""
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO sessions (id, source, started_at) VALUES ('bulk', 'cli', 1)")
        )
        conn.execute(
            text(
                "INSERT INTO messages (session_id, role, content, timestamp)"
                " SELECT 'bulk', 'user', 'bulkword row' || g || ' return self.value', g"
                " FROM generate_series(1, :n) AS g"
            ),
            {"n": count},
        )


def _layout(engine: Engine) -> str:
    return str(_scalar(engine, f"SELECT value FROM state_meta WHERE key = '{LAYOUT_MARKER}'"))


def _exact(conn: Any, query: str, like: str) -> tuple[bool, str]:
    """Whether search answers, in this snapshot, exactly the rows whose text holds ``like``;
    and the layout the snapshot reads."""
    layout = conn.execute(
        text("SELECT value FROM state_meta WHERE key = :k"), {"k": LAYOUT_MARKER}
    ).scalar()
    hits = {hit["id"] for hit in search_messages(conn, query, limit=-1, include_inactive=True)}
    rows = {
        int(row_id)
        for (row_id,) in conn.execute(
            text("SELECT id FROM messages WHERE content LIKE :p"), {"p": f"%{like}%"}
        )
    }
    return hits == rows, str(layout)


def test_upgrade_under_writers_and_a_searcher_stays_exact(pg_url: str) -> None:
    migrate.upgrade(pg_url, BEFORE)
    engine = create_store_engine(pg_url, create=False)
    _fill(engine, 4_000)
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, pg_url, str(number), "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for number in range(4)
    ]
    for writer in writers:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
    seen: list[tuple[bool, str]] = []
    stop = threading.Event()

    def search_all_along() -> None:
        with engine.connect() as conn:
            while not stop.is_set():
                conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    seen.append(_exact(conn, '"return self" AND bulkword', "return self"))
                with conn.begin():
                    seen.append(_exact(conn, "writermark1", "writermark1 "))

    searcher = threading.Thread(target=search_all_along)
    searcher.start()
    try:
        while len(seen) < 2:
            time.sleep(0.05)
        result = migrate.upgrade(pg_url)
        assert result.after == (migrate.head_revision(),)
        after = len(seen)
        while len(seen) < after + 2:
            time.sleep(0.05)
    finally:
        stop.set()
        searcher.join(timeout=60)
    reports = []
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err[-2000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert [report["errors"] for report in reports] == [[]] * len(writers)
    assert all(exact for exact, _layout in seen), [x for x in seen if not x[0]][:3]
    assert {layout for _exact, layout in seen} == {"expression", "stored"}
    assert _scalar(engine, "SELECT count(*) FROM messages WHERE search_words IS NULL") == 0
    assert _scalar(engine, f"SELECT count(*) FROM state_meta WHERE key = '{FILLED_KEY}'") == 0
    with engine.connect() as conn:
        # The writers' rows may wait in GIN pending lists and be newer than the planner's
        # statistics (`optimize` mends both); nothing else may be wrong.
        problems = check_server(conn, quick=True).problems
        upkeep = ("pending list ", "statistics ")
        assert [item for item in problems if not item.startswith(upkeep)] == []
        for number, report in enumerate(reports):
            hits = search_messages(conn, f"writermark{number}", limit=-1)
            assert len(hits) == report["appended"] > 0
    engine.dispose()


def test_an_upgrade_killed_while_filling_resumes_and_search_stays_exact(pg_url: str) -> None:
    migrate.upgrade(pg_url, BEFORE)
    engine = create_store_engine(pg_url, create=False)
    rows = 60_000
    _fill(engine, rows)
    upgrade = subprocess.Popen(
        [sys.executable, "-m", "hermes_store.cli", "upgrade", "--db", pg_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and upgrade.poll() is None:
        if _scalar(engine, f"SELECT value FROM state_meta WHERE key = '{FILLED_KEY}'"):
            break
        time.sleep(0.01)
    assert upgrade.poll() is None, "the upgrade ended before its fill could be interrupted"
    os.kill(upgrade.pid, signal.SIGKILL)
    upgrade.wait()
    filled = _scalar(engine, f"SELECT value FROM state_meta WHERE key = '{FILLED_KEY}'")
    upto = int(str(filled).split()[0])
    assert 0 < upto < rows
    # Killed mid-fill: still fts1's layout, and its search is whole.
    assert _layout(engine) == "expression"
    assert _scalar(engine, "SELECT count(*) FROM messages WHERE search_words IS NULL") > 0
    with engine.connect() as conn:
        assert len(search_messages(conn, "bulkword", limit=-1)) == rows

    resumed = migrate.upgrade(pg_url)
    assert resumed.after == (migrate.head_revision(),)
    assert _layout(engine) == "stored"
    assert _scalar(engine, "SELECT count(*) FROM messages WHERE search_words IS NULL") == 0
    with engine.connect() as conn:
        assert len(search_messages(conn, "bulkword", limit=-1)) == rows
        assert len(search_messages(conn, '"return self"', limit=-1)) == rows
        assert check_server(conn, quick=True).ok
    engine.dispose()


def test_an_agent_appends_within_its_busy_timeout_while_step_1_waits_for_a_reader(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's open transaction (a long search) keeps step 1 from its lock; the agent's
    appends, which queue behind each waiting attempt, still end within a short busy
    timeout, attempt after attempt, and the upgrade goes on once the reader is done."""
    migrate.upgrade(pg_url, BEFORE)
    engine = create_store_engine(pg_url, create=False)
    _fill(engine, 10)
    monkeypatch.setenv(ENV_BUSY_TIMEOUT, AGENT_BUSY_MS)
    agent = Store.open(pg_url)
    monkeypatch.delenv(ENV_BUSY_TIMEOUT)
    agent.create_session("agent", "cli")
    reader = engine.connect()
    reader.begin()
    reader.execute(text("SELECT count(*) FROM messages"))  # holds its lock until it ends
    outcome: list[Any] = []
    upgrade = threading.Thread(target=lambda: outcome.append(_upgrade_or_error(pg_url)))
    upgrade.start()
    attempts: set[Any] = set()
    errors: list[str] = []
    appended = 0
    try:
        with engine.connect() as monitor:
            deadline = time.monotonic() + 60
            while appended + len(errors) < 5 and time.monotonic() < deadline:
                started = monitor.execute(text(WAITING_STEP_1)).scalar()
                monitor.rollback()
                if started is None or started in attempts:
                    time.sleep(0.005)
                    continue
                attempts.add(started)  # a new attempt waits: the append queues behind it
                try:
                    agent.append_message("agent", NewMessage("user", "queued turn"))
                    appended += 1
                except Exception as exc:  # counted, not raised: the assertion says which
                    errors.append(type(exc).__name__)
    finally:
        reader.rollback()
        reader.close()
        upgrade.join(timeout=120)
        agent.close()
    assert errors == []
    assert appended == 5
    assert len(attempts) >= 5  # each a new attempt, after the one before gave up
    assert outcome == [(migrate.head_revision(),)]
    assert _layout(engine) == "stored"
    with engine.connect() as conn:
        assert len(search_messages(conn, '"queued turn"', limit=-1)) == 5
    engine.dispose()


def _upgrade_or_error(url: str) -> Any:
    """The revisions an upgrade ends at, or the class name of what it raised."""
    try:
        return migrate.upgrade(url).after
    except Exception as exc:
        return type(exc).__name__


def test_every_write_keeps_the_words_and_a_downgrade_gives_back_fts1(pg_url: str) -> None:
    migrate.upgrade(pg_url)
    engine = create_store_engine(pg_url, create=False)
    _fill(engine, 20)
    with engine.begin() as conn:
        conn.execute(text("UPDATE messages SET content = 'zucchini soup' WHERE id = 1"))
        conn.execute(text("UPDATE messages SET tool_name = 'kettle' WHERE id = 2"))
        conn.execute(text("UPDATE messages SET active = 0 WHERE id = 3"))
    with engine.connect() as conn:
        assert [hit["id"] for hit in search_messages(conn, "zucchini")] == [1]
        assert search_messages(conn, '"row1 return"') == []  # the old words are gone
        assert [hit["id"] for hit in search_messages(conn, "kettle")] == [2]
        stale = conn.execute(
            text(
                "SELECT count(*) FROM messages WHERE search_words IS DISTINCT FROM"
                " hermes_search_words(hermes_search_document(content, tool_name, tool_calls))"
            )
        ).scalar_one()
        assert stale == 0
    migrate.downgrade(pg_url, "fts1")
    columns = _scalar(
        engine,
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'messages'"
        " AND column_name = 'search_words'",
    )
    assert columns == 0
    assert _layout(engine) == "expression"
    with engine.connect() as conn:
        assert [hit["id"] for hit in search_messages(conn, "kettle")] == [2]
        assert check_server(conn, quick=True).ok
    engine.dispose()


def test_check_names_missing_words_and_a_broken_trigger_and_repair_restores_them(
    pg_url: str,
) -> None:
    migrate.upgrade(pg_url)
    engine = create_store_engine(pg_url, create=False)
    _fill(engine, 50)
    with engine.begin() as conn:
        conn.execute(text("UPDATE messages SET search_words = NULL WHERE id <= 5"))
        conn.execute(
            text("UPDATE messages SET search_words = to_tsvector('simple', 'x') WHERE id = 50")
        )
        conn.execute(text("ALTER TABLE messages DISABLE TRIGGER messages_search_words"))
    with engine.connect() as conn:
        assert len(search_messages(conn, "bulkword", limit=-1)) == 44
        problems = check_server(conn, quick=True).problems
    assert "5 rows have no stored words" in problems["column messages.search_words"]
    assert "disabled" in problems["trigger messages_search_words"]
    assert (
        "rows hold other words than their text gives (ids 50)"
        in (problems["column messages.search_words"])
    )
    repaired = repair_server(engine, quick=True)
    assert repaired.after.ok, repaired.after.problems
    assert "trigger messages_search_words" in repaired.restored
    with engine.connect() as conn:
        assert len(search_messages(conn, "bulkword", limit=-1)) == 50
        assert search_messages(conn, "x") == []
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO messages (session_id, role, content, timestamp)"
                " VALUES ('bulk', 'user', 'fresh turnip', 99)"
            )
        )
    with engine.connect() as conn:
        assert len(search_messages(conn, "turnip")) == 1
    engine.dispose()

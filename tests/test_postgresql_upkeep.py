"""PostgreSQL upkeep: `copy` ends with VACUUM (ANALYZE) of what it filled, `check` names GIN
pending lists that are too long and tables without planner statistics, and `optimize`
clears both (see docs/operations.md, "PostgreSQL maintenance")."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from test_check_postgresql import invoke, invoke_json
from test_cli_postgresql import sql

from hermes_store import migrate
from hermes_store.copy import copy_store
from hermes_store.copy.rows import CopyProgress
from hermes_store.postgresql.upkeep import PENDING_LIST_BYTES, STATISTICS_ROWS

pytestmark = pytest.mark.postgresql

#: Rows enough for `check` to want statistics, and for a pending list over its threshold.
ROWS = 3 * STATISTICS_ROWS


def _sqlite_store(path: Path, messages: int = 50) -> Path:
    migrate.upgrade(str(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s1', 'cli', 1.0)")
        conn.executemany(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s1', ?, ?, ?)",
            [("user", f"docker compose error number {n}", float(n)) for n in range(messages)],
        )
        conn.commit()
    return path


def _analyzed(url: str, table: str) -> tuple[bool, bool]:
    """Whether the server recorded a manual ANALYZE and VACUUM of ``table``."""
    row = sql(
        url,
        "SELECT last_analyze IS NOT NULL, last_vacuum IS NOT NULL FROM pg_stat_user_tables"
        f" WHERE relname = '{table}'",
    )
    return bool(row[0][0]), bool(row[0][1])


def test_copy_into_postgresql_ends_with_vacuum_analyze_of_the_tables_it_filled(
    tmp_path: Path, pg_url: str
) -> None:
    source = _sqlite_store(tmp_path / "source.db")
    seen: list[CopyProgress] = []
    result = copy_store(str(source), pg_url, progress=seen.append)
    assert result.verification.ok, result.verification.as_dict()
    assert result.upkeep is not None
    assert result.upkeep.statement == "VACUUM (ANALYZE)"
    assert {"sessions", "messages"} <= set(result.upkeep.tables)
    assert result.upkeep.refused == {}
    assert result.as_dict()["upkeep"]["tables"] == result.upkeep.tables
    # However few rows it wrote (50 here), the statistics exist once it is done.
    assert _analyzed(pg_url, "messages") == (True, True)
    vacuuming = [state for state in seen if state.step == "vacuuming"]
    assert vacuuming
    assert vacuuming[-1].rows == vacuuming[-1].total == len(result.upkeep.tables)

    # One more message: the run that brings the target up to date does it again, and
    # the command says so; the check finds nothing wanting.
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) "
            "VALUES ('s1', 'user', 'one more', 99.0)"
        )
        conn.commit()
    out = invoke("copy", "--from", str(source), "--to", pg_url).stdout
    assert "VACUUM (ANALYZE) of " in out
    assert invoke_json("check", "--db", pg_url)["ok"] is True


def test_copy_into_sqlite_has_no_upkeep(tmp_path: Path, pg_url: str) -> None:
    source = _sqlite_store(tmp_path / "source.db", messages=5)
    copy_store(str(source), pg_url)
    back = copy_store(pg_url, str(tmp_path / "back.db"))
    assert back.verification.ok, back.verification.as_dict()
    assert back.upkeep is None
    assert back.as_dict()["upkeep"] is None


def _write(url: str, *statements: str) -> None:
    """Run ``statements`` in one transaction, with gin_pending_list_limit raised for it
    (the pending lists may grow), then have the server's counters of it published before
    the next connection reads them."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            with conn.begin():
                conn.execute(text("SET LOCAL gin_pending_list_limit = '64MB'"))
                for statement in statements:
                    conn.execute(text(statement))
            conn.execute(text("SELECT pg_stat_force_next_flush()"))
            conn.commit()
            conn.execute(text("SELECT 1"))  # the flush happens as the session goes idle
            conn.commit()
    finally:
        engine.dispose()


def _fill_without_upkeep(url: str, rows: int = ROWS) -> None:
    """Messages written with autovacuum off on messages and fastupdate on (the default)."""
    migrate.upgrade(url)
    sql(url, "ALTER TABLE messages SET (autovacuum_enabled = false)")
    _write(
        url,
        "INSERT INTO sessions (id, source, started_at) VALUES ('s1', 'cli', 1)",
        "INSERT INTO messages (session_id, role, content, timestamp) SELECT 's1', 'user',"
        " 'kubernetes pod ' || n || ' failed to pull image registry' || md5(n::text), n"
        f" FROM generate_series(1, {rows}) AS n",
    )


def test_check_names_missing_statistics_and_optimize_clears_them(pg_url: str) -> None:
    _fill_without_upkeep(pg_url)
    result = invoke_json("check", "--db", pg_url, expect=1)
    problem = result["problems"]["statistics messages"]
    assert "no planner statistics" in problem
    assert "run `hermes-store optimize`" in problem
    assert "statistics sessions" in result["checked"]  # one row: the planner needs none
    assert "statistics sessions" not in result["problems"]
    # Without pgstattuple the pending lists are estimated from what a search reads.
    pending = result["problems"]["pending list messages_fts_trigram"]
    assert "estimated without pgstattuple" in pending
    assert "run `hermes-store optimize`" in pending
    assert "GIN pending lists" not in result["skipped"]
    lines = invoke("check", "--db", pg_url, expect=1).stdout.splitlines()
    assert any(line.split()[:3] == ["statistics", "messages", "BROKEN"] for line in lines)
    assert any(line.split()[:3] == ["pending", "list", "messages_fts_trigram"] for line in lines)

    done = invoke_json("optimize", "--db", pg_url)
    assert sum(done["pending_pages_cleaned"].values()) > 0
    assert done["pending_rows_cleaned"] is None  # pgstattuple is not there to count them
    assert set(done["pending_pages_cleaned"]) == {"messages_fts_words", "messages_fts_trigram"}
    passed = invoke_json("check", "--db", pg_url)
    assert passed["ok"] is True
    assert "pending list messages_fts_trigram" in passed["checked"]


def test_a_pending_list_that_cannot_be_measured_is_said_never_passed(pg_url: str) -> None:
    """A GIN index whose operator class has no search to estimate it by, without
    pgstattuple: "not checked", with the rows written since the last vacuum."""
    _fill_without_upkeep(pg_url)
    sql(pg_url, "CREATE INDEX extra_gin ON sessions USING gin ((ARRAY[id]))")
    result = invoke_json("check", "--db", pg_url, expect=1)
    skipped = result["skipped"]["GIN pending lists"]
    assert skipped.startswith("extra_gin: could not be measured: the pgstattuple extension")
    assert "1 into sessions" in skipped
    assert "pending list extra_gin" not in result["checked"]
    lines = invoke("check", "--db", pg_url, expect=1).stdout.splitlines()
    assert any(line.startswith("GIN pending lists") and "not checked" in line for line in lines)


def test_check_measures_pending_lists_with_pgstattuple_and_optimize_cleans_them(
    pg_url: str,
) -> None:
    sql(pg_url, "CREATE EXTENSION IF NOT EXISTS pgstattuple")
    _fill_without_upkeep(pg_url)
    pages = sql(pg_url, "SELECT pending_pages FROM pgstatginindex('messages_fts_trigram')")
    assert pages[0][0] * 8192 > PENDING_LIST_BYTES  # the fixture made it long enough
    result = invoke_json("check", "--db", pg_url, expect=1)
    problem = result["problems"]["pending list messages_fts_trigram"]
    assert "pending list" in problem
    assert f"{ROWS:,} rows" in problem
    assert "run `hermes-store optimize`" in problem
    assert "GIN pending lists" not in result["skipped"]

    out = invoke("optimize", "--db", pg_url).stdout
    assert out.startswith("VACUUM (ANALYZE) of ")
    assert "GIN pending lists cleaned: " in out
    assert f"{2 * ROWS:,} rows" in out  # both indexes held every message
    after = sql(pg_url, "SELECT pending_pages FROM pgstatginindex('messages_fts_trigram')")
    assert after == [(0,)]
    assert _analyzed(pg_url, "messages") == (True, True)
    passed = invoke_json("check", "--db", pg_url)
    assert passed["ok"] is True
    assert "pending list messages_fts_trigram" in passed["checked"]


def test_check_repair_does_what_optimize_does_for_upkeep(pg_url: str) -> None:
    _fill_without_upkeep(pg_url)
    repaired = invoke_json("check", "--db", pg_url, "--repair")
    assert repaired["ok"] is True
    assert repaired["repair"]["repaired"]["statistics messages"] == "VACUUM (ANALYZE)"


def test_check_names_statistics_gone_stale(pg_url: str) -> None:
    _fill_without_upkeep(pg_url, rows=10)
    sql(pg_url, "ANALYZE messages")  # statistics of 10 rows...
    _write(
        pg_url,
        "INSERT INTO messages (session_id, role, content, timestamp) SELECT 's1', 'user',"
        f" 'more ' || n, n FROM generate_series(1, {ROWS}) AS n",
    )  # ...then many more
    problem = invoke_json("check", "--db", pg_url, expect=1)["problems"]["statistics messages"]
    assert "stale planner statistics" in problem
    assert "counted 10" in problem

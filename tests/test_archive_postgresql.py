"""Cold storage across databases: a PostgreSQL hot store with a SQLite archive, a SQLite hot
store with a PostgreSQL archive; the same guarantees, kill -9 included."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from archive_support import MOVED_BY_AGE, build_hot
from click.testing import CliRunner
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from hermes_store.archive import archive_sessions, criterion, restore_session
from hermes_store.archive.rows import OWNED_TABLES
from hermes_store.cli import main
from hermes_store.copy import copy_store
from hermes_store.copy.tables import copied_table
from hermes_store.engine import create_store_engine

pytestmark = pytest.mark.postgresql


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def _rows(url: str, table: str) -> set[tuple[Any, ...]]:
    """Every row of ``table``, as the data layer reads it (the same on both databases)."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            found = conn.execute(select(*copied_table(table).columns))
            return {tuple(_plain(value) for value in row) for row in found}
    finally:
        engine.dispose()


def _snapshot(url: str) -> dict[str, set[tuple[Any, ...]]]:
    return {table: _rows(url, table) for table in (*OWNED_TABLES, "system_prompts")}


def _exactly_once(before: dict[str, set[Any]], hot: str, archive: str) -> None:
    for table in OWNED_TABLES:
        here, there = _rows(hot, table), _rows(archive, table)
        assert not here & there, table
        assert here | there == before[table], table


def _ids(url: str) -> set[str]:
    return {row[0] for row in _rows(url, "sessions")}


def _check(url: str) -> None:
    done = CliRunner().invoke(main, ["check", "--db", url])
    assert done.exit_code == 0, done.output


@pytest.fixture
def stores(request: pytest.FixtureRequest, tmp_path: Path, pg_url: str) -> tuple[str, str]:
    """(hot, archive): one of them on PostgreSQL."""
    template = build_hot(tmp_path / "template.db")
    if request.param == "pg-hot":
        copy_store(str(template), pg_url)
        return pg_url, str(tmp_path / "archive.db")
    return str(template), pg_url


BOTH = pytest.mark.parametrize("stores", ["pg-hot", "pg-archive"], indirect=True)


@BOTH
def test_round_trip_across_databases(stores: tuple[str, str]) -> None:
    hot, archive = stores
    before = _snapshot(hot)
    result = archive_sessions(hot, archive, criterion(older_than="90d"))
    assert result.moved.sessions == len(MOVED_BY_AGE)
    assert _ids(archive) == MOVED_BY_AGE
    _exactly_once(before, hot, archive)
    _check(hot)
    _check(archive)
    for root in ("r1", "d1", "l2"):
        restore_session(root, hot, archive)
    assert _ids(archive) == set()
    assert _snapshot(hot) == before


_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from hermes_store.archive import archive_sessions, criterion, move

    def kill_at(name):
        if name == sys.argv[1]:
            os.kill(os.getpid(), signal.SIGKILL)

    move.STEP_HOOK = kill_at
    archive_sessions(sys.argv[2], sys.argv[3], criterion(older_than="90d"))
    sys.exit(3)
    """
)


@pytest.mark.slow
@BOTH
@pytest.mark.parametrize("step", ["copying", "verified", "deleted"])
def test_killed_across_databases_then_resumed(stores: tuple[str, str], step: str) -> None:
    hot, archive = stores
    before = _snapshot(hot)
    done = subprocess.run(
        [sys.executable, "-c", _KILLED, step, hot, archive],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    result = archive_sessions(hot, archive, criterion(older_than="90d"))
    assert result.moved.resumed
    _exactly_once(before, hot, archive)
    assert _ids(archive) == MOVED_BY_AGE
    _check(hot)
    _check(archive)


@pytest.fixture
def second_pg(pg_url: str) -> Iterator[str]:
    """Another empty database on the same server, dropped after the test."""
    url = make_url(pg_url)
    name = f"{url.database}_archive"
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_postgresql_to_postgresql(tmp_path: Path, pg_url: str, second_pg: str) -> None:
    copy_store(str(build_hot(tmp_path / "template.db")), pg_url)
    before = _snapshot(pg_url)
    archive_sessions(pg_url, second_pg, criterion(older_than="90d"))
    assert _ids(second_pg) == MOVED_BY_AGE
    _exactly_once(before, pg_url, second_pg)
    _check(second_pg)
    restore_session("d2", pg_url, second_pg)
    assert _ids(second_pg) == MOVED_BY_AGE - {"d1", "d2"}
    _exactly_once(before, pg_url, second_pg)

"""Shared fixtures: fresh stores, legacy stores built from frozen DDL, an isolated HERMES_HOME."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError

from hermes_store.engine import create_store_engine, to_url

#: The PostgreSQL server the tests use; by default the machine's own (trust authentication).
PG_URL_ENV = "HERMES_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
#: Set (to 1) by CI: no reachable server fails the PostgreSQL tests instead of skipping them.
REQUIRE_PG_ENV = "HERMES_REQUIRE_PG"


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own HERMES_HOME and no HERMES_STORE_URL from the caller's shell."""
    home = tmp_path / "hermes-home"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.delenv("HERMES_STORE_URL", raising=False)
    return home


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    """Path of a store file that does not exist yet."""
    return tmp_path / "state.db"


@pytest.fixture
def alembic_engine(tmp_path: Path) -> Iterator[Engine]:
    """The engine pytest-alembic runs revisions on: a real file, the project's own PRAGMAs."""
    engine = create_store_engine(tmp_path / "alembic.db")
    yield engine
    engine.dispose()


@pytest.fixture
def alembic_config() -> dict[str, str]:
    """pytest-alembic: the project's alembic.ini and revisions."""
    return {"file": str(Path(__file__).resolve().parent.parent / "alembic.ini")}


def _server_url() -> URL:
    return make_url(to_url(os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL))


@pytest.fixture(scope="session")
def pg_database(worker_id: str) -> Iterator[URL]:
    """A PostgreSQL database of this test worker's own, created for the session and dropped
    after it; skipped (with the reason) when no server answers, unless HERMES_REQUIRE_PG=1."""
    server = _server_url()
    name = f"hermes_store_test_{worker_id}_{os.getpid()}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except DBAPIError as exc:
        admin.dispose()
        reason = (
            f"no PostgreSQL server at {server.render_as_string(hide_password=True)} "
            f"({str(exc.orig).strip().splitlines()[0]}); set {PG_URL_ENV} to run these tests"
        )
        if os.environ.get(REQUIRE_PG_ENV, "") not in ("", "0"):
            pytest.fail(f"{reason} ({REQUIRE_PG_ENV} is set)", pytrace=False)
        pytest.skip(reason)
    try:
        yield server.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def pg_url(pg_database: URL) -> str:
    """The URL of an empty PostgreSQL database (its public schema recreated for each test)."""
    engine = create_engine(pg_database, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    return pg_database.render_as_string(hide_password=False)

"""Shared fixtures: fresh stores, legacy stores built from frozen DDL, an isolated HERMES_HOME."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from hermes_store.engine import create_store_engine


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

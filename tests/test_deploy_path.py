"""`alembic upgrade head` (the deploy step) and `hermes-store upgrade` leave the same store: the
text copies the conversion sets aside are freed by both, in the same short steps, so that a
plain VACUUM afterwards gives their pages back."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from migration_support import clone, legacy_corpus_store

from alembic import command
from hermes_store import migrate
from hermes_store.engine import create_store_engine
from hermes_store.sqlite import backfill, fts
from hermes_store.sqlite.storage import FTS_COPIES, storage_report

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


def schema(path: Path) -> list[tuple[Any, ...]]:
    return query(path, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")


def set_aside(path: Path) -> list[str]:
    return [
        row[0] for row in query(path, "SELECT name FROM sqlite_master WHERE name LIKE '%retired'")
    ]


def vacuumed_size(path: Path) -> int:
    """A plain VACUUM, as an operator would run it after the deploy; the file's size."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


@pytest.fixture(scope="module")
def legacy_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return legacy_corpus_store(tmp_path_factory.mktemp("deploy") / "legacy.db", 1200, 7)


def test_alembic_upgrade_head_leaves_what_hermes_store_upgrade_leaves(
    legacy_template: Path, tmp_path: Path
) -> None:
    deployed = clone(legacy_template, tmp_path / "deployed.db")
    upgraded = clone(legacy_template, tmp_path / "upgraded.db")
    reference = clone(legacy_template, tmp_path / "reference.db")
    engine = create_store_engine(reference, create=False)
    try:
        with engine.connect() as conn:
            copies = storage_report(conn).groups[FTS_COPIES]
    finally:
        engine.dispose()
    assert copies > 0
    legacy_size = vacuumed_size(reference)

    done = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(PROJECT_ROOT / "alembic.ini")]
        + ["-x", f"db={deployed}", "upgrade", "head"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    migrate.upgrade(str(upgraded))

    assert set_aside(deployed) == set_aside(upgraded) == []
    assert schema(deployed) == schema(upgraded)
    assert any(row[1] == "messages_fts" for row in schema(deployed))
    meta = "SELECT key, value FROM state_meta ORDER BY key"
    assert query(deployed, meta) == query(upgraded, meta)
    assert query(deployed, "SELECT version_num FROM alembic_version") == [
        (migrate.head_revision(),)
    ]

    deployed_size, upgraded_size = vacuumed_size(deployed), vacuumed_size(upgraded)
    # The copies are a third of a legacy store: a VACUUM after the deploy gives them back
    # (less the little the schema steps 22..30 add).
    assert deployed_size <= legacy_size - 0.9 * copies, (deployed_size, legacy_size, copies)
    assert abs(deployed_size - upgraded_size) <= 0.01 * upgraded_size


def test_both_paths_free_the_copies_in_the_same_short_steps(
    legacy_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: dict[str, list[tuple[str, int]]] = {"alembic": [], "hermes-store": []}
    retire_step = backfill.retire_step
    path_of = ["alembic"]

    def recorded(conn: Any, retired: str, rows: int) -> int:
        # Each step runs in a write transaction of its own, which nothing else shares.
        assert conn.in_transaction()
        steps[path_of[0]].append((retired, rows))
        return retire_step(conn, retired, rows)

    monkeypatch.setattr(backfill, "retire_step", recorded)
    deployed = clone(legacy_template, tmp_path / "deployed.db")
    command.upgrade(migrate.alembic_config(x={"db": str(deployed)}), "head")
    path_of[0] = "hermes-store"
    upgraded = clone(legacy_template, tmp_path / "upgraded.db")
    migrate.upgrade(str(upgraded))

    assert set_aside(deployed) == set_aside(upgraded) == []
    for name, taken in steps.items():
        tables = {table for table, _rows in taken}
        assert tables == {fts.retired_copy_name(index) for index in fts.INDEXES}, name
        # Bounded steps that start small, never one statement for a whole copy.
        assert len(taken) > len(tables), (name, taken)
        for table in tables:
            sizes = [rows for name_, rows in taken if name_ == table]
            assert sizes[0] == backfill.FIRST_RETIRE_ROWS, (name, taken)
            assert len(sizes) > 1, (name, taken)

"""The backend's maintenance section: one API for both databases, results neither owns."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hermes_store import migrate
from hermes_store.backend import backend_for, backend_of
from hermes_store.engine import create_store_engine
from hermes_store.errors import NotOnThisDatabase
from hermes_store.maintenance import GROUPS, CheckResult, RepairResult, StoreStats, Table


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    migrate.upgrade(str(path))
    return path


def test_a_postgresql_module_imports_no_sqlite_maintenance_module() -> None:
    code = (
        "import sys\n"
        "import hermes_store.postgresql.check, hermes_store.postgresql.maintenance\n"
        "import hermes_store.postgresql.storage\n"
        "wrong = [m for m in ('hermes_store.sqlite.maintenance', 'hermes_store.sqlite.storage')"
        " if m in sys.modules]\n"
        "print(','.join(wrong))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ""


def test_the_sqlite_backend_reports_through_the_shared_types(sqlite_store: Path) -> None:
    engine = create_store_engine(str(sqlite_store), create=False)
    try:
        backend = backend_of(engine)
        stats = backend.stats(engine)
        assert isinstance(stats, StoreStats)
        assert set(stats.as_dict()) >= {"sessions", "messages", "file_bytes", "wal_bytes"}
        assert stats.as_dict()["file_bytes"] == sqlite_store.stat().st_size
        report = backend.storage_report(engine)
        assert set(GROUPS) <= set(report.as_dict()["groups"])
        assert isinstance(report.records(), Table)
        assert any(isinstance(part, Table) for part in report.view())
        checked = backend.check(engine)
        assert isinstance(checked, CheckResult)
        assert checked.ok
        assert {record["status"] for record in checked.records()} <= {"ok", "not checked"}
        repaired = backend.repair(engine)
        assert isinstance(repaired, RepairResult)
        assert repaired.ok
        assert repaired.view() == ["nothing to repair: every check passed"]
    finally:
        engine.dispose()


def test_postgresql_refuses_what_it_cannot_do_in_the_one_wording() -> None:
    server = backend_for("postgresql+psycopg://root@127.0.0.1/test")
    # Refused before the engine is used: no server is needed for these.
    engine: Any = None
    refusals: list[tuple[Callable[[], object], str, str]] = [
        (lambda: server.repair(engine, backup_to=Path("b.db")), "--backup", "pg_dump"),
        (lambda: server.repair(engine, deferred=True), "--deferred", "CONCURRENTLY"),
        (lambda: server.optimize(engine, vacuum=True), "--vacuum", "VACUUM (ANALYZE)"),
        (
            lambda: server.finish_deferred(engine, chunk_rows=1, max_lock_ms=1, duty=1),
            "optimize-storage",
            "",
        ),
    ]
    for call, what, why in refusals:
        with pytest.raises(NotOnThisDatabase) as refused:
            call()
        message = str(refused.value)
        assert message.startswith(f"{what} is not available on PostgreSQL stores")
        assert why in message
        assert message.endswith("Nothing was changed")

"""The backend seam: the URL picks one backend, and a missing feature is refused in one wording."""

from __future__ import annotations

import pytest

from hermes_store.backend import Features, backend_for, backend_of
from hermes_store.errors import NotOnThisDatabase


def test_the_url_picks_the_backend_once() -> None:
    sqlite = backend_for("sqlite:////tmp/state.db")
    server = backend_for("postgresql+psycopg://root@127.0.0.1:5432/test")
    assert (sqlite.name, server.name) == ("sqlite", "postgresql")
    assert backend_for("sqlite:////tmp/other.db") is sqlite
    assert backend_for("postgres://root@127.0.0.1/test") is server


def test_an_unsupported_database_says_what_is_supported() -> None:
    with pytest.raises(NotOnThisDatabase, match="SQLite file or a postgresql"):
        backend_for("mysql://root@localhost/x")


def test_a_missing_feature_is_refused_in_one_wording_naming_why() -> None:
    server = backend_for("postgresql+psycopg://root@127.0.0.1/test")
    with pytest.raises(NotOnThisDatabase) as refused:
        server.require("file_backup", "--backup")
    message = str(refused.value)
    assert message.startswith("--backup is not available on PostgreSQL stores: ")
    assert "pg_dump" in message
    assert message.endswith("Nothing was changed")
    assert "\n" not in message
    backend_for("sqlite:////tmp/state.db").require("file_backup", "--backup")


def test_every_missing_feature_has_a_reason() -> None:
    for url in ("sqlite:////tmp/s.db", "postgresql+psycopg://root@127.0.0.1/test"):
        backend = backend_for(url)
        missing = [f for f in Features.__dataclass_fields__ if not getattr(backend.features, f)]
        assert all(backend.reasons.get(f) for f in missing), (backend.name, missing)


def test_an_engine_names_its_backend() -> None:
    from sqlalchemy import create_engine

    engine = create_engine("sqlite://")
    try:
        assert backend_of(engine).name == "sqlite"
    finally:
        engine.dispose()

"""The one Alembic chain on PostgreSQL: head from an empty database, `alembic check` clean,
down to base and up again, the display triggers, and the refusals an operator would see."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import create_engine, inspect, text

from alembic import command
from hermes_store import migrate
from hermes_store.engine import create_store_engine
from hermes_store.errors import StoreError
from hermes_store.revisions import LAST_APP_VERSION, head_revision

pytestmark = pytest.mark.postgresql

ALEMBIC_INI = Path(__file__).resolve().parent.parent / "alembic.ini"


def _alembic(url: str, **x: str) -> Config:
    """What `alembic -x db=URL ...` builds from the project's alembic.ini."""
    config = Config(str(ALEMBIC_INI))
    config.cmd_opts = argparse.Namespace(x=[f"db={url}", *(f"{k}={v}" for k, v in x.items())])
    config.attributes["configure_logging"] = False
    return config


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_head_from_empty_check_clean_then_base_and_back(pg_url: str) -> None:
    command.upgrade(_alembic(pg_url), "head")
    command.check(_alembic(pg_url))  # raises on any difference between models and database
    assert {"sessions", "messages", "state_meta", "async_delegations"} <= _tables(pg_url)

    command.downgrade(_alembic(pg_url), "base")
    assert _tables(pg_url) == {"alembic_version"}

    command.upgrade(_alembic(pg_url), "head")
    command.check(_alembic(pg_url))
    engine = create_store_engine(pg_url)
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == head_revision()
        indexes = {
            row[0]: row[1]
            for row in conn.execute(
                text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'messages'")
            )
        }
        columns = {c["name"]: c for c in inspect(conn).get_columns("messages")}
    engine.dispose()
    # The text is stored once; its words (lexemes and positions) in the one tsvector
    # column revision fts2 adds, with a GIN index over it; trigrams over the text itself.
    vectors = {
        name for name, column in columns.items() if "tsvector" in str(column["type"]).lower()
    }
    assert vectors == {"search_words"}
    assert "messages_fts" not in indexes
    assert "USING gin (search_words)" in indexes["messages_fts_words"]
    assert "gin_trgm_ops" in indexes["messages_fts_trigram"]


def test_timestamps_keep_their_precision_and_ids_are_64_bit(pg_url: str) -> None:
    command.upgrade(_alembic(pg_url), "head")
    engine = create_store_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', :t)"),
            {"t": 1764567890.123456},
        )
        conn.execute(
            text(
                "INSERT INTO messages (id, session_id, role, content, timestamp)"
                " VALUES (:id, 's', 'user', 'hi', 1.5)"
            ),
            {"id": 2**40},
        )
        started = conn.execute(text("SELECT started_at FROM sessions")).scalar_one()
        new_id = conn.execute(
            text(
                "INSERT INTO messages (session_id, role, content, timestamp)"
                " VALUES ('s', 'user', 'next', 2) RETURNING id"
            )
        ).scalar_one()
        big = conn.execute(text("SELECT content FROM messages WHERE id = :id"), {"id": 2**40})
        assert big.scalar_one() == "hi"  # a 64-bit id, as SQLite's INTEGER key holds
    engine.dispose()
    assert started == 1764567890.123456  # all the digits: DOUBLE PRECISION, not REAL
    assert new_id != 2**40


def _display_orders(url: str) -> list[tuple[int, int | None]]:
    """Insert, hide, show and delete messages with repeated display identities; return
    (id, display_order) as the display triggers leave them."""
    engine = create_store_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1)"))
        for number, identity in enumerate([b"a", b"b", b"a", b"a", b"c", b"b"], start=1):
            conn.execute(
                text(
                    "INSERT INTO messages (id, session_id, role, content, timestamp,"
                    " display_identity) VALUES (:id, 's', 'user', :c, :t, :ident)"
                ),
                {"id": number, "c": f"m{number}", "t": float(number), "ident": identity},
            )
        conn.execute(text("UPDATE messages SET active = 0 WHERE id = 1"))
        conn.execute(text("UPDATE messages SET active = 0 WHERE id = 2"))
        conn.execute(text("UPDATE messages SET active = 1 WHERE id = 2"))
        conn.execute(text("DELETE FROM messages WHERE id = 3"))
        conn.execute(text("UPDATE messages SET content = 'edited' WHERE id = 6"))
        rows = conn.execute(text("SELECT id, display_order FROM messages ORDER BY id")).all()
    engine.dispose()
    return [(int(i), None if o is None else int(o)) for i, o in rows]


def test_display_triggers_do_on_postgresql_what_they_do_on_sqlite(
    pg_url: str, tmp_path: Path
) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'state.db'}"
    migrate.upgrade(sqlite_url, create=True)
    command.upgrade(_alembic(pg_url), "head")
    expected = _display_orders(sqlite_url)
    assert expected != [(i, i) for i, _ in expected]  # the scenario moves display orders
    assert _display_orders(pg_url) == expected


def test_upgrade_and_downgrade_through_the_library(pg_url: str) -> None:
    result = migrate.upgrade(pg_url)
    assert result.before == ()
    assert result.after == (head_revision(),)
    assert (result.schema_after, result.layout_after) == (LAST_APP_VERSION, "stored")
    engine = create_store_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1)"))
    engine.dispose()
    with pytest.raises(StoreError, match="would delete 1 session"):
        migrate.downgrade(pg_url, "base")
    assert "sessions" in _tables(pg_url)
    before, after = migrate.downgrade(pg_url, "base", delete_data=True)
    assert (before, after) == (head_revision(), None)
    assert _tables(pg_url) == {"alembic_version"}


def test_a_database_of_someone_else_is_refused_untouched(pg_url: str) -> None:
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE invoices (id integer primary key)"))
    engine.dispose()
    with pytest.raises(CommandError, match="never upgraded by hermes-store"):
        command.upgrade(_alembic(pg_url), "head")
    assert _tables(pg_url) == {"invoices"}


def test_sqlite_only_options_are_refused_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="pg_dump"):
        migrate.upgrade(pg_url, backup_to=tmp_path / "backup.db")
    with pytest.raises(CommandError, match="not available on PostgreSQL stores"):
        command.upgrade(_alembic(pg_url, fts_backfill="deferred"), "head")
    assert _tables(pg_url) == set()


def test_a_revision_blocked_by_a_lock_gives_up_in_one_line_and_writers_go_on(
    pg_url: str,
) -> None:
    command.upgrade(_alembic(pg_url), "29")
    holder = create_engine(pg_url)
    writer = create_store_engine(pg_url)
    with holder.connect() as held:
        held.execute(text("SELECT count(*) FROM messages"))  # an open transaction reading it
        with pytest.raises(CommandError, match=r"waited 0\.5 s for a lock") as raised:
            command.upgrade(_alembic(pg_url, lock_timeout_ms="500"), "head")
        assert "\n" not in str(raised.value)
        # The writer was not queued behind the revision for longer than its timeout: it
        # writes now, while the long transaction is still open.
        with writer.begin() as conn:
            conn.execute(
                text("INSERT INTO sessions (id, source, started_at) VALUES ('w', 'cli', 1)")
            )
        held.rollback()
    holder.dispose()
    writer.dispose()
    engine = create_store_engine(pg_url)
    with engine.connect() as conn:
        # 30 (ALTER TABLE messages) was rolled back whole, and the search layout, which
        # comes after the application's steps (as `hermes-store upgrade` runs them), waits.
        assert migrate.current_revision(conn) == "29"
        assert "display_order" not in {c["name"] for c in inspect(conn).get_columns("messages")}
    engine.dispose()
    command.upgrade(_alembic(pg_url), "head")  # and it goes through once the lock is gone


def test_lock_timeout_must_be_positive(pg_url: str) -> None:
    with pytest.raises(CommandError, match="above 0"):
        command.upgrade(_alembic(pg_url, lock_timeout_ms="0"), "head")


def test_text_with_nul_round_trips_through_the_models(pg_url: str) -> None:
    """PostgreSQL text refuses NUL; the multimodal prefix and binary tool output have it."""
    from sqlalchemy import insert, select

    from hermes_store.models import AgentSession, Message

    command.upgrade(_alembic(pg_url), "head")
    engine = create_store_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(insert(AgentSession).values(id="s", source="cli", started_at=1.0))
        conn.execute(
            insert(Message).values(
                session_id="s", role="user", content='\x00json:[{"type": "text"}]', timestamp=1.0
            )
        )
        assert conn.execute(select(Message.content)).scalar_one() == '\x00json:[{"type": "text"}]'
    engine.dispose()

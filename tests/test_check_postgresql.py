"""`check` and `check --repair` on PostgreSQL cover every index and trigger the store's
revisions declare (the same list as on SQLite, derived from the revisions), restore each
one, and never quote a row in what they say."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from test_cli_postgresql import sql

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.declarations import POSTGRESQL
from hermes_store.declared import declared_objects
from hermes_store.revisions import LAST_APP_VERSION

pytestmark = pytest.mark.postgresql

SECRET = "zq7SECRETtitle"


def invoke(*args: str, expect: int | None = 0) -> Result:
    result = CliRunner().invoke(main, list(args))
    if expect is not None:
        assert result.exit_code == expect, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def invoke_json(*args: str, expect: int | None = 0) -> Any:
    return json.loads(invoke(*args, "--json", expect=expect).stdout)


def index_definitions(url: str) -> dict[str, str]:
    """Each index the revisions built, apart from the search indexes and the keys."""
    return {
        str(name): str(definition)
        for name, definition in sql(
            url,
            "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = "
            "current_schema() AND i.indexname NOT LIKE 'messages_fts%' AND NOT EXISTS ("
            "SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)",
        )
    }


def trigger_names(url: str) -> set[str]:
    return {str(row[0]) for row in sql(url, "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")}


@pytest.fixture
def pg_store(pg_url: str) -> str:
    """A PostgreSQL store at head with a few sessions and messages."""
    migrate.upgrade(pg_url)
    for number in range(3):
        sql(
            pg_url,
            "INSERT INTO sessions (id, source, started_at) "
            f"VALUES ('s{number}', 'cli', {1_700_000_000 + number})",
        )
        sql(
            pg_url,
            "INSERT INTO messages (session_id, role, content, timestamp) "
            f"VALUES ('s{number}', 'user', 'docker error {number}', {1_700_000_000 + number})",
        )
    return pg_url


def test_the_revisions_declare_on_sqlite_what_a_postgresql_store_has(pg_store: str) -> None:
    """The one list `check` derives for both databases matches what the PostgreSQL
    revisions built: every index and trigger, by name."""
    declared = declared_objects(LAST_APP_VERSION)
    indexes = {obj.name for obj in declared if obj.kind == "index"}
    triggers = {obj.name for obj in declared if obj.kind == "trigger"}
    assert len(indexes) > 10
    assert "messages_display_order_insert" in triggers
    assert set(index_definitions(pg_store)) == indexes
    # and the search layout's own triggers, which are PostgreSQL's alone (fts2).
    assert trigger_names(pg_store) == triggers | {t.name for t in POSTGRESQL.row_triggers}


def test_every_declared_index_and_trigger_dropped_is_named_and_restored(pg_store: str) -> None:
    indexes = index_definitions(pg_store)
    triggers = trigger_names(pg_store)
    assert indexes
    assert triggers
    for name in indexes:
        sql(pg_store, f'DROP INDEX "{name}"')
    for name in triggers:
        sql(pg_store, f'DROP TRIGGER "{name}" ON messages')

    data = invoke_json("check", "--db", pg_store, expect=1)
    assert set(data["problems"]) == {f"index {n}" for n in indexes} | {
        f"trigger {n}" for n in triggers
    }
    assert all(data["problems"][f"index {n}"].startswith("missing") for n in indexes)

    payload = invoke_json("check", "--db", pg_store, "--repair")
    assert payload["ok"] is True
    assert set(payload["repair"]["repaired"]) == set(indexes)
    assert set(payload["repair"]["restored"]) == {f"trigger {n}" for n in triggers}
    assert index_definitions(pg_store) == indexes  # each exactly as the revision built it
    # and the search layout's own triggers, which are PostgreSQL's alone (fts2).
    assert trigger_names(pg_store) == triggers | {t.name for t in POSTGRESQL.row_triggers}
    assert sql(pg_store, "SELECT bool_and(indisvalid AND indisready) FROM pg_index") == [(True,)]
    assert invoke_json("check", "--db", pg_store)["ok"] is True
    # The restored display trigger orders what the agent writes next.
    sql(
        pg_store,
        "INSERT INTO messages (session_id, role, content, timestamp) "
        "VALUES ('s0', 'user', 'after the repair', 1800000000)",
    )
    assert sql(
        pg_store, "SELECT display_order = id FROM messages WHERE content = 'after the repair'"
    ) == [(True,)]


def test_a_unique_index_the_rows_refuse_is_named_without_their_values(pg_store: str) -> None:
    sql(pg_store, "DROP INDEX idx_sessions_title_unique")
    sql(pg_store, "DROP TRIGGER messages_display_order_insert ON messages")
    sql(pg_store, f"UPDATE sessions SET title = '{SECRET}' WHERE id IN ('s0', 's1')")

    result = invoke("check", "--db", pg_store, "--repair", "--json", expect=1)
    assert SECRET not in result.stdout + result.stderr
    payload = json.loads(result.stdout)
    why = payload["repair"]["not_repaired"]["index idx_sessions_title_unique"]
    assert "sessions" in why
    assert "trigger messages_display_order_insert" in payload["repair"]["restored"]
    assert payload["problems"] == {
        "index idx_sessions_title_unique": "missing: --repair creates it again (CONCURRENTLY)"
    }
    # The failed concurrent build left no invalid index behind.
    assert sql(pg_store, "SELECT to_regclass('idx_sessions_title_unique')") == [(None,)]
    text_out = invoke("check", "--db", pg_store, "--repair", expect=1)
    assert SECRET not in text_out.stdout + text_out.stderr
    assert "not repaired" in text_out.stdout

    sql(pg_store, "UPDATE sessions SET title = NULL WHERE id = 's1'")
    assert invoke_json("check", "--db", pg_store, "--repair")["ok"] is True

"""The `hermes-store` command on PostgreSQL: what an operator sees from each command that
means something there, the one-line refusals of those that do not, and the one-line
errors of a server that does not answer or a database that is not there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.engine import create_store_engine
from hermes_store.sqlite.storage import FTS_COPIES, FTS_INDEX, MESSAGE_DATA

pytestmark = pytest.mark.postgresql

HEAD = migrate.head_revision()
SEARCH_INDEXES = ("messages_fts_words", "messages_fts_trigram")
#: fts1's indexes, before the words were stored.
EXPRESSION_INDEXES = ("messages_fts", "messages_fts_trigram")


def invoke(*args: str | Path, expect: int | None = 0, env: dict[str, str] | None = None) -> Result:
    """Run the command in-process; stdout and stderr are kept apart."""
    result = CliRunner(env=env).invoke(main, [str(a) for a in args])
    if expect is not None:
        assert result.exit_code == expect, (result.exit_code, result.output, result.exception)
    return result


def invoke_json(*args: str | Path, expect: int | None = 0) -> Any:
    return json.loads(invoke(*args, "--json", expect=expect).stdout)


def assert_one_line_error(result: Result, *fragments: str) -> str:
    """Exit 1, a single `Error: ...` line on stderr naming what went wrong, no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.output
    return lines[0]


def sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    """Rows of one statement, run outside the CLI (autocommit)."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            result = conn.execute(text(statement))
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def fill(url: str) -> None:
    """Three sessions from two sources and a few messages, through the models' tables."""
    engine = create_store_engine(url)
    with engine.begin() as conn:
        for number, source in enumerate(("cli", "telegram", "cli")):
            conn.execute(
                text("INSERT INTO sessions (id, source, started_at) VALUES (:id, :source, :t)"),
                {"id": f"s{number}", "source": source, "t": 1_700_000_000.0 + number},
            )
            for turn in range(4):
                conn.execute(
                    text(
                        "INSERT INTO messages (session_id, role, content, timestamp)"
                        " VALUES (:s, :role, :content, :t)"
                    ),
                    {
                        "s": f"s{number}",
                        "role": "user" if turn % 2 == 0 else "assistant",
                        "content": f"docker compose error number {number}-{turn}",
                        "t": 1_700_000_000.0 + number * 10 + turn,
                    },
                )
    engine.dispose()


@pytest.fixture
def pg_store(pg_url: str) -> str:
    """A PostgreSQL database at head holding three sessions and twelve messages."""
    migrate.upgrade(pg_url)
    fill(pg_url)
    return pg_url


def revision_of(url: str) -> list[str]:
    return [row[0] for row in sql(url, "SELECT version_num FROM alembic_version")]


# --------------------------------------------------------------------------------------
# upgrade, downgrade, current, history
# --------------------------------------------------------------------------------------


def test_upgrade_an_empty_database_then_again(pg_url: str) -> None:
    first = invoke("upgrade", "--db", pg_url).stdout
    assert f"(new store) -> {HEAD}" in first
    assert "application schema: - -> 30; search layout: missing -> stored" in first
    again = invoke_json("upgrade", "--db", pg_url)
    assert (again["from"], again["to"]) == (HEAD, HEAD)
    assert (again["schema_after"], again["layout_after"], again["backup"]) == (
        30,
        "stored",
        None,
    )
    assert "already at" in invoke("upgrade", "--db", pg_url).stdout
    assert revision_of(pg_url) == [HEAD]


def test_upgrade_stops_at_the_app_version_then_goes_on(pg_url: str) -> None:
    stopped = invoke_json("upgrade", "--db", pg_url, "--app-version", "21")
    assert (stopped["schema_after"], stopped["layout_after"]) == (21, "stored")
    assert sql(pg_url, "SELECT version FROM schema_version") == [(21,)]
    on = invoke_json("upgrade", "--db", pg_url)
    assert (on["schema_before"], on["schema_after"], on["to"]) == (21, 30, HEAD)


def test_postgres_scheme_and_the_environment_variable_name_the_same_store(pg_store: str) -> None:
    short = make_url(pg_store).set(drivername="postgres").render_as_string(hide_password=False)
    assert invoke_json("current", "--db", short)["revision"] == HEAD
    env_result = invoke("current", "--json", env={"HERMES_STORE_URL": pg_store})
    assert json.loads(env_result.stdout)["revision"] == HEAD


def test_downgrade_base_refuses_to_delete_conversations_then_does_it(pg_store: str) -> None:
    refused = invoke("downgrade", "base", "--db", pg_store, "--yes", expect=None)
    assert_one_line_error(refused, "would delete 3 session(s) and 12 message(s)")
    assert revision_of(pg_store) == [HEAD]
    done = invoke_json("downgrade", "base", "--db", pg_store, "--yes", "--i-know-this-deletes-data")
    undone = done.pop("undone")
    assert done == {"from": HEAD, "to": None, "backup": None}
    assert [step["revision"] for step in undone][-1] == "17"
    assert revision_of(pg_store) == []


def test_downgrade_the_search_branch_and_upgrade_again(pg_store: str) -> None:
    assert invoke("downgrade", "30", "--db", pg_store, "--yes").stdout.strip() == (
        f"{HEAD} -> 30, fts2"
    )
    # fts2's downgrade: fts1's expression index again, the stored words gone.
    data = invoke_json("downgrade", "fts@-1", "--db", pg_store, "--yes")
    assert (data["from"], data["to"]) == ("30, fts2", "30, fts1")
    info = invoke_json("current", "--db", pg_store)
    assert info["fts_layout"] == "expression"
    assert info["search_indexes"] == dict.fromkeys(EXPRESSION_INDEXES, "valid")
    assert invoke_json("storage", "--db", pg_store)["stored_words"] == {}
    assert invoke_json("check", "--db", pg_store)["ok"] is True
    stored = invoke_json("search", '"compose error"', "--db", pg_store)
    assert len(stored) == 12  # the expression path answers, every message
    data = invoke_json("downgrade", "fts@-1", "--db", pg_store, "--yes")
    assert (data["from"], data["to"]) == ("30, fts1", "30")
    assert invoke_json("current", "--db", pg_store)["search_indexes"] == dict.fromkeys(
        SEARCH_INDEXES, "missing"
    )
    assert sql(pg_store, "SELECT count(*) FROM messages") == [(12,)]
    assert invoke_json("upgrade", "--db", pg_store)["layout_after"] == "stored"
    assert invoke_json("current", "--db", pg_store)["search_indexes"] == dict.fromkeys(
        SEARCH_INDEXES, "valid"
    )


def test_downgrade_asks_first_and_names_the_database_without_its_password(pg_store: str) -> None:
    with_password = make_url(pg_store).set(password="s3cret").render_as_string(hide_password=False)
    # Trust authentication: the server ignores the password, the prompt must not show it.
    result = CliRunner().invoke(main, ["downgrade", "30", "--db", with_password], input="n\n")
    assert result.exit_code == 1
    assert "s3cret" not in result.output
    assert "***" in result.output
    assert revision_of(pg_store) == [HEAD]


def test_current_shows_revision_schema_layout_and_search_indexes(pg_store: str) -> None:
    info = invoke_json("current", "--db", pg_store)
    assert (info["revision"], info["head"], info["legacy_schema"], info["fts_layout"]) == (
        HEAD,
        HEAD,
        30,
        "stored",
    )
    assert info["search_indexes"] == dict.fromkeys(SEARCH_INDEXES, "valid")
    out = invoke("current", "--db", pg_store).stdout
    for fragment in (HEAD, "stored", "search index messages_fts_trigram"):
        assert fragment in out
    sql(
        pg_store,
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'messages_fts_words'::regclass",
    )
    states = invoke_json("current", "--db", pg_store)["search_indexes"]
    assert states["messages_fts_words"] == "invalid"


def test_history_marks_the_revision_of_the_database(pg_store: str) -> None:
    records = invoke_json("history", "--db", pg_store)
    assert [r["revision"] for r in records if r["current"]] == [HEAD]


def test_a_database_without_a_store_is_said_so(pg_url: str) -> None:
    for command in (["current"], ["stats"], ["storage"], ["check"], ["optimize"]):
        result = invoke(*command, "--db", pg_url, expect=None)
        assert_one_line_error(result, "holds no Hermes store", "hermes-store upgrade")
    assert sql(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == []


# --------------------------------------------------------------------------------------
# stats, storage, optimize
# --------------------------------------------------------------------------------------


def test_stats_counts_and_database_size(pg_store: str) -> None:
    result = invoke_json("stats", "--db", pg_store)
    assert (result["sessions"], result["messages"]) == (3, 12)
    assert result["sessions_by_source"] == {"cli": 2, "telegram": 1}
    database_bytes = sql(pg_store, "SELECT pg_database_size(current_database())")[0][0]
    assert 0 < result["database_bytes"] <= database_bytes * 2
    out = invoke("stats", "--db", pg_store).stdout
    assert "sessions from telegram" in out
    assert "database bytes" in out
    assert "MiB" in out


def test_storage_shows_the_text_stored_once_and_the_search_indexes(pg_store: str) -> None:
    report = invoke_json("storage", "--db", pg_store)
    assert report["text_stored_once"] is True
    assert report["tsvector_columns"] == []
    assert report["other_tables"] == []
    assert report["groups"][FTS_COPIES] == 0
    assert set(report["search_indexes"]) == set(SEARCH_INDEXES)
    sizes = dict(
        sql(
            pg_store,
            "SELECT relname::text, pg_relation_size(oid) FROM pg_class"
            " WHERE relname IN ('messages_fts_words', 'messages_fts_trigram')",
        )
    )
    assert report["search_indexes"] == sizes
    (words,) = sql(pg_store, "SELECT sum(pg_column_size(search_words)) FROM messages")[0]
    assert report["stored_words"] == {"messages.search_words": words}
    assert report["groups"][FTS_INDEX] == sum(sizes.values()) + words
    messages_bytes = sql(pg_store, "SELECT pg_table_size('messages')")[0][0]
    assert report["objects"]["messages"] == messages_bytes
    assert report["groups"][MESSAGE_DATA] >= messages_bytes - words
    assert report["total_bytes"] == sum(report["objects"].values())

    out = invoke("storage", "--db", pg_store).stdout
    assert "no copy table; its words stored as a tsvector" in out
    assert "stored words messages.search_words: " in out
    for name in SEARCH_INDEXES:
        assert f"search index {name}: " in out
    rows = invoke("storage", "--db", pg_store, "--nl").stdout.splitlines()
    by_name = {record["object"]: record for record in map(json.loads, rows)}
    assert by_name["messages_fts_words"]["kind"] == "index on messages"
    assert by_name["messages"]["kind"] == "table"


def test_storage_names_a_copy_of_the_text(pg_store: str) -> None:
    sql(pg_store, "CREATE TABLE messages_text_copy AS SELECT id, content FROM messages")
    sql(pg_store, "ALTER TABLE messages ADD COLUMN content_tsv tsvector")
    report = invoke_json("storage", "--db", pg_store)
    assert report["text_stored_once"] is False
    assert report["other_tables"] == ["messages_text_copy"]
    assert report["tsvector_columns"] == ["messages.content_tsv"]
    assert report["groups"][FTS_COPIES] > 0
    out = invoke("storage", "--db", pg_store).stdout
    assert "tsvector column messages.content_tsv" in out
    assert "table messages_text_copy" in out


def test_optimize_vacuums_and_analyzes_the_store_tables(pg_store: str) -> None:
    sql(pg_store, "DELETE FROM messages WHERE id % 2 = 0")
    result = invoke_json("optimize", "--db", pg_store)
    assert {"sessions", "messages", "state_meta"} <= set(result["tables"])
    assert result["vacuumed"] is True
    assert result["analyzed"] is True
    assert result["reclaimed"] == result["bytes_before"] - result["bytes_after"]
    vacuumed = sql(
        pg_store,
        "SELECT last_vacuum IS NOT NULL AND last_analyze IS NOT NULL FROM pg_stat_user_tables"
        " WHERE relname = 'messages'",
    )
    assert vacuumed == [(True,)]
    out = invoke("optimize", "--db", pg_store).stdout
    assert out.startswith("VACUUM (ANALYZE) of ")


def test_optimize_compact_says_there_is_nothing_to_rebuild(pg_store: str) -> None:
    out = invoke("optimize", "--db", pg_store, "--compact").stdout
    assert out.startswith("VACUUM (ANALYZE) of ")
    assert "--compact: nothing to rebuild on PostgreSQL" in out
    assert invoke_json("optimize", "--db", pg_store, "--compact")["notes"]


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------


def test_check_passes_on_a_healthy_store(pg_store: str) -> None:
    result = invoke_json("check", "--db", pg_store)
    assert result["ok"] is True
    assert result["problems"] == {}
    for item in (
        "index messages_fts_words",
        "index messages_fts_trigram",
        "column messages.search_words",
        "trigger messages_search_words",
        "index messages_pkey",
        "function hermes_search_words(text)",
        "extension pg_trgm",
        "trigger messages_display_order_insert",
    ):
        assert item in result["checked"]
    assert "amcheck extension is not installed" in result["skipped"]["amcheck"]
    lines = invoke("check", "--db", pg_store).stdout.splitlines()
    assert any(line.split()[:3] == ["index", "messages_fts_trigram", "ok"] for line in lines)
    assert any(line.startswith("amcheck") and "not checked" in line for line in lines)


def test_check_expects_only_what_the_store_revisions_create(pg_url: str) -> None:
    invoke("upgrade", "--db", pg_url, "--app-version", "21")
    at_21 = invoke_json("check", "--db", pg_url)
    assert at_21["ok"] is True
    assert "schema 30" in at_21["skipped"]["display triggers"]
    assert "index messages_fts_words" in at_21["checked"]
    invoke("upgrade", "--db", pg_url)
    invoke("downgrade", "30", "--db", pg_url, "--yes")
    invoke("downgrade", "fts@-1", "--db", pg_url, "--yes")
    at_fts1 = invoke_json("check", "--db", pg_url)
    assert at_fts1["ok"] is True
    assert "index messages_fts" in at_fts1["checked"]
    assert "column messages.search_words" not in at_fts1["checked"]
    invoke("downgrade", "fts@-1", "--db", pg_url, "--yes")
    no_search = invoke_json("check", "--db", pg_url)
    assert no_search["ok"] is True
    assert "fts1" in no_search["skipped"]["search indexes"]
    assert "trigger messages_display_order_insert" in no_search["checked"]
    out = invoke("check", "--db", pg_url).stdout
    assert "search indexes" in out


def test_check_verifies_btree_indexes_with_amcheck_when_installed(pg_store: str) -> None:
    sql(pg_store, "CREATE EXTENSION IF NOT EXISTS amcheck")
    result = invoke_json("check", "--db", pg_store)
    assert result["ok"] is True
    assert "amcheck messages_pkey" in result["checked"]
    assert "amcheck" not in result["skipped"]
    quick = invoke_json("check", "--db", pg_store, "--quick")
    assert "amcheck messages_pkey" not in quick["checked"]


def break_store(url: str) -> None:
    """Four kinds of damage: a search index gone, a search function changed, an index left
    invalid (as an interrupted concurrent build leaves it), a display trigger dropped."""
    sql(url, "DROP INDEX messages_fts_trigram")
    sql(
        url,
        "CREATE OR REPLACE FUNCTION hermes_search_lexemes(document text) RETURNS text"
        " LANGUAGE sql IMMUTABLE AS $$ SELECT lower($1) $$",
    )
    sql(
        url,
        "UPDATE pg_index SET indisvalid = false"
        " WHERE indexrelid = 'idx_messages_session'::regclass",
    )
    sql(url, "DROP TRIGGER messages_display_visibility_update ON messages")


def test_check_names_each_broken_object_and_exits_1(pg_store: str) -> None:
    break_store(pg_store)
    result = invoke("check", "--db", pg_store, expect=1)
    broken = result.stderr.strip().splitlines()
    assert len(broken) == 1
    assert broken[0].startswith("broken: ")
    for name in (
        "index messages_fts_trigram",
        "function hermes_search_lexemes(text)",
        "index idx_messages_session",
        "trigger messages_display_visibility_update",
    ):
        assert name in broken[0]
    problems = invoke_json("check", "--db", pg_store, expect=1)["problems"]
    assert set(problems) == {
        "index messages_fts_trigram",
        "function hermes_search_lexemes(text)",
        "index idx_messages_session",
        "trigger messages_display_visibility_update",
    }
    assert "invalid" in problems["index idx_messages_session"]
    assert "fts1" in problems["function hermes_search_lexemes(text)"]


def test_check_repair_rebuilds_and_restores_from_the_revisions(pg_store: str) -> None:
    break_store(pg_store)
    payload = invoke_json("check", "--db", pg_store, "--repair")
    assert payload["ok"] is True
    repair = payload["repair"]
    assert set(repair["repaired"]) == {"messages_fts_trigram", "idx_messages_session"}
    assert "REINDEX INDEX CONCURRENTLY" in repair["repaired"]["idx_messages_session"]
    assert set(repair["restored"]) == {
        "function hermes_search_lexemes(text)",
        "trigger messages_display_visibility_update",
    }
    assert invoke_json("check", "--db", pg_store)["ok"] is True
    valid = sql(pg_store, "SELECT bool_and(indisvalid AND indisready) FROM pg_index")
    assert valid == [(True,)]
    again = invoke("check", "--db", pg_store, "--repair").stdout
    assert "nothing to repair" in again


def test_check_repair_drops_what_an_interrupted_reindex_left(pg_store: str) -> None:
    # REINDEX CONCURRENTLY builds idx_ccnew beside idx; killed, it leaves that copy invalid.
    sql(pg_store, "CREATE INDEX idx_messages_session_ccnew ON messages (session_id, timestamp)")
    sql(
        pg_store,
        "UPDATE pg_index SET indisvalid = false"
        " WHERE indexrelid = 'idx_messages_session_ccnew'::regclass",
    )
    assert (
        "index idx_messages_session_ccnew"
        in invoke_json("check", "--db", pg_store, expect=1)["problems"]
    )
    repair = invoke_json("check", "--db", pg_store, "--repair")["repair"]
    assert repair["repaired"]["idx_messages_session_ccnew"].startswith("dropped")
    assert sql(pg_store, "SELECT to_regclass('idx_messages_session_ccnew')") == [(None,)]
    assert sql(pg_store, "SELECT to_regclass('idx_messages_session')::text") == [
        ("idx_messages_session",)
    ]


# --------------------------------------------------------------------------------------
# search and demo
# --------------------------------------------------------------------------------------


def test_search_finds_messages_on_postgresql(pg_store: str) -> None:
    hits = invoke_json("search", "--db", pg_store, "docker", "--source", "telegram")
    assert len(hits) == 4
    assert {hit["source"] for hit in hits} == {"telegram"}
    out = invoke("search", "--db", pg_store, "compose").stdout
    assert "session s1" in out


@pytest.mark.slow
def test_demo_copies_into_postgresql_and_compares_searches(pg_url: str, tmp_path: Path) -> None:
    out = invoke("demo", "--messages", "300", "--dir", tmp_path, "--db", pg_url).stdout
    assert "copied into PostgreSQL" in out
    assert "DIFFERENT" not in out
    assert revision_of(pg_url) == [HEAD]


def test_demo_refuses_a_database_that_is_not_empty(pg_store: str, tmp_path: Path) -> None:
    result = invoke("demo", "--dir", tmp_path, "--db", pg_store, expect=None)
    assert_one_line_error(result, "already holds tables", "empty database")
    assert not (tmp_path / "demo.db").exists()


def test_demo_db_takes_only_a_server_url(tmp_path: Path) -> None:
    result = invoke("demo", "--dir", tmp_path, "--db", tmp_path / "x.db", expect=None)
    assert_one_line_error(result, "PostgreSQL URL")


# --------------------------------------------------------------------------------------
# What refuses
# --------------------------------------------------------------------------------------

REFUSED = [
    (["stamp", "head"], "stamp is not available on PostgreSQL stores"),
    (["optimize-storage"], "optimize-storage is not available on PostgreSQL stores"),
    (["upgrade", "--backup", "{tmp}/b.db"], "--backup is not available on PostgreSQL stores"),
    (["upgrade", "--rebuild-fts"], "--rebuild-fts / --deferred-fts is not available on"),
    (["upgrade", "--deferred-fts"], "--rebuild-fts / --deferred-fts is not available on"),
    (["downgrade", "30", "--yes", "--backup", "{tmp}/b.db"], "pg_dump"),
    (["optimize", "--vacuum"], "VACUUM (ANALYZE)"),
    (["optimize", "--no-vacuum"], "VACUUM (ANALYZE)"),
    (["check", "--repair", "--backup", "{tmp}/b.db"], "pg_dump"),
    (["check", "--repair", "--deferred"], "CONCURRENTLY"),
]


@pytest.mark.parametrize(("command", "said"), REFUSED, ids=[" ".join(c) for c, _ in REFUSED])
def test_sqlite_only_commands_and_options_refuse_in_one_line(
    pg_store: str, tmp_path: Path, command: list[str], said: str
) -> None:
    before = sql(pg_store, "SELECT count(*) FROM messages")
    args = [part.replace("{tmp}", str(tmp_path)) for part in command]
    line = assert_one_line_error(invoke(*args, "--db", pg_store, expect=None), said)
    assert "Nothing was changed" in line or "nothing was changed" in line.lower()
    assert revision_of(pg_store) == [HEAD]
    assert sql(pg_store, "SELECT count(*) FROM messages") == before
    assert not (tmp_path / "b.db").exists()


# --------------------------------------------------------------------------------------
# Servers that do not answer, databases that are not there
# --------------------------------------------------------------------------------------

DEAD = "postgresql+psycopg://hermes:s3cret@127.0.0.1:1/hermes"
COMMANDS = (
    ["upgrade"],
    ["current"],
    ["stats"],
    ["storage"],
    ["optimize"],
    ["check"],
    ["search", "docker"],
    ["downgrade", "30", "--yes"],
    ["history", "--json"],
)


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_dead_server_is_one_line_without_the_password(command: list[str]) -> None:
    result = invoke(*command, "--db", DEAD, expect=None)
    if command[0] == "history":  # history lists the revisions without a store, quietly
        assert result.exit_code == 0
        assert "s3cret" not in result.output
        return
    line = assert_one_line_error(result, "127.0.0.1:1", "server is running")
    assert "s3cret" not in result.output
    assert "***" in line


def test_a_missing_database_is_one_line_without_the_password(pg_url: str) -> None:
    missing = (
        make_url(pg_url)
        .set(database="hermes_store_no_such_database", password="s3cret")
        .render_as_string(hide_password=False)
    )
    for command in (["current"], ["upgrade"], ["check"]):
        result = invoke(*command, "--db", missing, expect=None)
        assert_one_line_error(result, "hermes_store_no_such_database")
        assert "s3cret" not in result.output


def test_a_refused_login_is_one_line_without_the_password(pg_url: str) -> None:
    # The test server trusts every login it knows; an unknown role is refused like a
    # wrong password is, through the same path.
    refused = (
        make_url(pg_url)
        .set(username="hermes_store_no_such_role", password="s3cret")
        .render_as_string(hide_password=False)
    )
    result = invoke("stats", "--db", refused, expect=None)
    assert_one_line_error(result, "hermes_store_no_such_role", "lets this user in")
    assert "s3cret" not in result.output


def test_a_dead_server_in_a_real_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hermes_store.cli", "stats", "--db", DEAD],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("Error: ")
    assert "s3cret" not in done.stderr

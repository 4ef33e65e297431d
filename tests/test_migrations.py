"""The revision chain: pytest-alembic's built-in checks, a stairway over every revision, and
data tests that put rows in front of a revision and check what it did with them."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from legacy import ddl
from legacy.build import build_legacy_store, insert_legacy_rows
from legacy.schema import diff_snapshots, schema_snapshot, table_data
from pytest_alembic.tests import (  # noqa: F401  (collected by pytest from this module)
    test_model_definitions_match_ddl,
    test_single_head_revision,
    test_up_down_consistency,
    test_upgrade,
)
from sqlalchemy import Engine
from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateIndex

from hermes_store import migrate
from hermes_store.models import expression_indexes
from hermes_store.revisions import APP_VERSIONS, LAST_APP_VERSION

SCRIPT = migrate.script_directory()
#: Every revision, oldest first.
REVISIONS = [script.revision for script in reversed(list(SCRIPT.walk_revisions()))]


def test_revisions_are_the_application_versions_with_the_search_branch_and_one_head() -> None:
    numbered = [revision for revision in REVISIONS if revision.isdigit()]
    assert numbered == [str(version) for version in APP_VERSIONS]
    merges = [revision for revision in REVISIONS if SCRIPT.get_revision(revision).is_merge_point]
    assert merges == ["merge_30_fts1", "merge_30_fts2"]
    assert sorted(set(REVISIONS) - set(numbered) - set(merges)) == ["fts1", "fts2"]
    # The search layout branches off the first revision that has the FTS5 indexes, and the
    # one head joins it to the application's newest schema (merge_30_fts1 joined 30 and
    # fts1; each later merge joins the previous head and the new revision, of the
    # application's chain or of the search branch: merge_30_fts2 joined it and fts2).
    assert SCRIPT.get_revision("fts1").down_revision == "17"
    assert SCRIPT.get_revision("fts2").down_revision == "fts1"
    assert SCRIPT.get_revision("merge_30_fts1").down_revision == ("30", "fts1")
    assert SCRIPT.get_revision("merge_30_fts2").down_revision == ("merge_30_fts1", "fts2")
    head = SCRIPT.get_revision(migrate.head_revision())
    assert head.revision == merges[-1]
    below = {rev.revision for rev in SCRIPT.iterate_revisions(head.revision, "base")}
    assert {str(LAST_APP_VERSION), "fts2"} <= below


def _normalised_ddl(sql: str) -> str:
    """An index's DDL with case, spacing and IF NOT EXISTS left out."""
    text = " ".join(sql.lower().replace("if not exists ", "").split())
    return text.replace(" (", "(").replace("( ", "(").replace(" )", ")")


def test_the_models_indexes_that_autogenerate_skips_are_those_the_migrations_create(
    tmp_path: Path,
) -> None:
    """Autogenerate (test_model_definitions_match_ddl) cannot compare an index with DESC
    columns or an expression (SQLite does not reflect them: alembic warns and env.py leaves
    them out); the models' DDL for each must be what the chain leaves in a store at head."""
    path = tmp_path / "head.db"
    migrate.upgrade(str(path), "head")
    conn = sqlite3.connect(path)
    try:
        stored = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"))
    finally:
        conn.close()
    skipped = expression_indexes()
    assert "idx_sessions_effective_activity" in {index.name for index in skipped}
    for index in skipped:
        declared = str(CreateIndex(index).compile(dialect=sqlite.dialect()))
        assert index.name in stored, f"{index.name}: declared by the models, not created"
        assert _normalised_ddl(declared) == _normalised_ddl(stored[index.name]), index.name


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _query(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    """Rows of `sql` on a fresh stdlib connection to the engine's file (sees committed data)."""
    conn = sqlite3.connect(engine.url.database or "")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _tables(engine: Engine) -> set[str]:
    return {row[0] for row in _query(engine, "SELECT name FROM sqlite_master WHERE type='table'")}


def _schema_version(engine: Engine) -> list[tuple[Any, ...]] | None:
    """The rows of schema_version, or None when the table does not exist (at base)."""
    if "schema_version" not in _tables(engine):
        return None
    return _query(engine, "SELECT version FROM schema_version")


def _parents(revision: str) -> tuple[str, ...]:
    down = SCRIPT.get_revision(revision).down_revision
    if down is None:
        return ()
    return (down,) if isinstance(down, str) else tuple(down)


def _expected_version(revisions: tuple[str, ...]) -> list[tuple[int]] | None:
    """schema_version at a set of revisions: the application version of the relational head.

    The search branch never changes it: at (17, fts1) it is 17.
    """
    if not revisions:
        return None
    ancestry = {
        script.revision for head in revisions for script in SCRIPT.iterate_revisions(head, "base")
    }
    return [(max(int(rev) for rev in ancestry if rev.isdigit()),)]


def _snapshot(engine: Engine) -> dict[str, Any]:
    return schema_snapshot(engine.url.database or "")


def _file_fts_ids(path: Path, table: str, query: str) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        sql = f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid"
        return [row[0] for row in conn.execute(sql, (query,))]
    finally:
        conn.close()


def _fts_ids(engine: Engine, table: str, query: str) -> list[int]:
    rows = _query(engine, f"SELECT rowid FROM {table} WHERE {table} MATCH '{query}' ORDER BY rowid")
    return [row[0] for row in rows]


SESSION = {
    "id": "s1",
    "source": "telegram",
    "user_id": "u1",
    "model": "claude",
    "started_at": 1_700_000_000.5,
    "ended_at": 1_700_000_100.25,
    "title": "Paris trip",
    "input_tokens": 10,
    "output_tokens": 20,
}
CHILD = {"id": "s2", "source": "cli", "parent_session_id": "s1", "started_at": 1_700_000_200.0}
MESSAGES = [
    {"session_id": "s1", "role": "user", "content": "plan a trip to Paris", "timestamp": 1.0},
    {
        "session_id": "s1",
        "role": "assistant",
        "content": None,
        "tool_name": "web_search",
        "tool_calls": '[{"id": "c1", "function": {"name": "web_search"}}]',
        "timestamp": 2.0,
    },
    {"session_id": "s2", "role": "user", "content": '\x00json:[{"type": "text"}]', "timestamp": 3},
]


# --------------------------------------------------------------------------------------------
# Stairway
# --------------------------------------------------------------------------------------------


def _file_snapshot(path: Path) -> dict[str, Any]:
    return schema_snapshot(path)


def _file_version(path: Path) -> list[tuple[Any, ...]] | None:
    conn = sqlite3.connect(path)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if "schema_version" not in tables:
            return None
        return conn.execute("SELECT version FROM schema_version").fetchall()
    finally:
        conn.close()


def _up_to_parents(path: Path, revision: str) -> tuple[str, ...]:
    """Bring a new store to exactly the parents of ``revision``; return them."""
    parents = _parents(revision)
    path.touch()
    for parent in parents:
        migrate.upgrade(str(path), parent)
    return tuple(sorted(parents))


def _down_to_parents(path: Path, revision: str) -> None:
    """Undo ``revision`` alone (for a merge, undoing it leaves both parents)."""
    parents = _parents(revision)
    migrate.downgrade(str(path), parents[0] if parents else "base")


@pytest.mark.parametrize("revision", REVISIONS)
def test_stairway_up_down_up(tmp_path: Path, revision: str) -> None:
    """Upgrading to each revision, downgrading that step and upgrading again is lossless for
    the schema, and schema_version names the application version at every step."""
    path = tmp_path / "state.db"
    parents = _up_to_parents(path, revision)
    before = _file_snapshot(path)
    assert _file_version(path) == _expected_version(parents)

    result = migrate.upgrade(str(path), revision)
    after = _file_snapshot(path)
    assert _file_version(path) == _expected_version(result.after)
    if SCRIPT.get_revision(revision).is_merge_point:
        assert after == before  # a merge only joins the branches
    # 23, 26-29: the application changed no table; fts2 changes nothing on SQLite.
    elif revision not in ("23", "26", "27", "28", "29", "fts2"):
        assert after != before, f"revision {revision} changed nothing"

    _down_to_parents(path, revision)
    diff = diff_snapshots(before, _file_snapshot(path), ("before", "downgraded"))
    assert not diff, diff
    assert _file_version(path) == _expected_version(parents)

    migrate.upgrade(str(path), revision)
    diff = diff_snapshots(after, _file_snapshot(path), ("first upgrade", "re-upgrade"))
    assert not diff, diff
    assert _file_version(path) == _expected_version(result.after)


def test_downgrade_to_base_leaves_an_empty_file(
    alembic_runner: Any, alembic_engine: Engine
) -> None:
    alembic_runner.migrate_up_to("heads")
    alembic_runner.insert_into("sessions", dict(CHILD, parent_session_id=None))
    alembic_runner.migrate_down_to("base")
    assert _tables(alembic_engine) <= {"alembic_version", "sqlite_sequence"}


# --------------------------------------------------------------------------------------------
# Data tests
# --------------------------------------------------------------------------------------------


def _restricted(rows: list[dict[str, Any]], columns: set[str]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k in columns} for row in rows]


def _added_by_default(path: Path, table: str, before: list[dict[str, Any]]) -> dict[str, Any]:
    """The columns a revision added to ``table``, each with its declared default: the value
    existing rows get from a revision not described in ADDED_COLUMNS."""
    with sqlite3.connect(path) as conn:
        info = conn.execute(f"PRAGMA table_info({table})").fetchall()
    known = set(before[0]) if before else set()
    return {
        name: _literal(default) for _cid, name, _t, _nn, default, _pk in info if name not in known
    }


def _literal(default: str | None) -> Any:
    """The value of a column's DEFAULT as PRAGMA table_info spells it (NULL, 0, 'text')."""
    if default is None or default.upper() == "NULL":
        return None
    if default.startswith("'"):
        return default[1:-1].replace("''", "'")
    return float(default) if "." in default else int(default)


#: Columns a revision adds to sessions / messages, with the value existing rows get.
ADDED_COLUMNS: dict[str, dict[str, dict[str, Any]]] = {
    "18": {"sessions": {"display_name": None, "origin_json": None, "expiry_finalized": 0}},
    "24": {
        "sessions": {
            "git_metadata_generation": 0,
            "title_source": None,
            "last_activity_at": None,
            "last_activity_description": None,
            "last_activity_provenance": None,
            "compression_ineffective_count": 0,
            "compression_recovery_deadline": None,
            "profile_name": None,
            "pinned": 0,
            "hidden": 0,
            "last_read_at": None,
            "tool_names": None,
        },
        "messages": {
            "_compressed_summary": 0,
            "api_content": None,
            "display_kind": None,
            "display_metadata": None,
        },
    },
    "25": {"sessions": {"system_prompt_hash": None}},
    "30": {
        "sessions": {
            "created_source": None,
            "compression_overload_streak": 0,
            "transport_profile": None,
        },
        # The display triggers number messages that are inserted from 30 on, not older ones.
        "messages": {"display_identity": None, "display_order": None},
    },
}


@pytest.mark.parametrize("revision", REVISIONS[1:])
def test_rows_survive_the_revision_and_its_downgrade(tmp_path: Path, revision: str) -> None:
    path = tmp_path / "state.db"
    _up_to_parents(path, revision)
    insert_legacy_rows(path, [SESSION, CHILD], MESSAGES)
    before = {table: table_data(path, table) for table in ("sessions", "messages")}

    migrate.upgrade(str(path), revision)
    for table, rows in before.items():
        after = table_data(path, table)
        added = ADDED_COLUMNS.get(revision, {}).get(table)
        if added is None and revision.isdigit() and int(revision) > max(map(int, ADDED_COLUMNS)):
            added = _added_by_default(path, table, rows)
        added = added or {}
        assert after == [{**row, **added} for row in rows], f"{table} rows changed by {revision}"
    # Every message is still found by both indexes, whichever layout they are in.
    assert _file_fts_ids(path, "messages_fts", "paris") == [1]
    assert _file_fts_ids(path, "messages_fts", "web_search") == [2]
    assert _file_fts_ids(path, "messages_fts_trigram", "ari") == [1]

    _down_to_parents(path, revision)
    for table, rows in before.items():
        assert table_data(path, table) == rows, f"{table} rows changed by downgrading {revision}"
    assert _file_fts_ids(path, "messages_fts", "paris") == [1]
    assert _file_fts_ids(path, "messages_fts_trigram", "search") == [2]


def test_fts_conversion_keeps_the_legacy_trigger_names_and_drops_the_copies(
    alembic_runner: Any, alembic_engine: Engine
) -> None:
    alembic_runner.migrate_up_before("fts1")
    alembic_runner.insert_into("sessions", SESSION)
    alembic_runner.insert_into("messages", MESSAGES[:2])
    alembic_runner.migrate_up_one()
    triggers = {
        row[0]
        for row in _query(alembic_engine, "SELECT name FROM sqlite_master WHERE type='trigger'")
    }
    assert triggers == set(ddl.FTS_TRIGGER_NAMES)
    tables = _tables(alembic_engine)
    assert "messages_fts_content" not in tables
    assert "messages_fts_trigram_content" not in tables
    # The triggers keep the external indexes in step with later writes.
    alembic_runner.insert_into(
        "messages",
        {"session_id": "s1", "role": "user", "content": "louvre tickets", "timestamp": 9},
    )
    assert _fts_ids(alembic_engine, "messages_fts", "louvre") == [3]
    for table in ("messages_fts", "messages_fts_trigram"):
        assert (
            _query(alembic_engine, f"INSERT INTO {table}({table}) VALUES ('integrity-check')") == []
        )


USAGE_SESSIONS = [
    {  # every column set: copied as is
        "id": "full",
        "source": "cli",
        "model": "gpt-5",
        "billing_provider": "openrouter",
        "billing_base_url": "https://openrouter.ai/api/v1",
        "billing_mode": "api",
        "api_call_count": 3,
        "input_tokens": 100,
        "output_tokens": 50,
        "cache_read_tokens": 7,
        "cache_write_tokens": 5,
        "reasoning_tokens": 11,
        "estimated_cost_usd": 0.25,
        "actual_cost_usd": 0.5,
        "cost_status": "final",
        "cost_source": "provider",
        "started_at": 1000.0,
        "ended_at": 2000.0,
    },
    {  # NULLs everywhere but one counter: the COALESCE defaults
        "id": "nulls",
        "source": "telegram",
        "model": None,
        "api_call_count": None,
        "input_tokens": None,
        "output_tokens": None,
        "cache_read_tokens": 4,
        "cache_write_tokens": None,
        "reasoning_tokens": None,
        "started_at": 3000.0,
        "ended_at": None,
    },
    {"id": "reasoning-only", "source": "cli", "reasoning_tokens": 1, "started_at": 4000.0},
    {"id": "zero", "source": "cli", "model": "gpt-5", "api_call_count": 9, "started_at": 5000.0},
    {
        "id": "all-null",
        "source": "cli",
        "input_tokens": None,
        "output_tokens": None,
        "cache_read_tokens": None,
        "cache_write_tokens": None,
        "reasoning_tokens": None,
        "started_at": 6000.0,
    },
]

EXPECTED_USAGE = {
    "full": {
        "session_id": "full",
        "model": "gpt-5",
        "billing_provider": "openrouter",
        "billing_base_url": "https://openrouter.ai/api/v1",
        "billing_mode": "api",
        "api_call_count": 3,
        "input_tokens": 100,
        "output_tokens": 50,
        "cache_read_tokens": 7,
        "cache_write_tokens": 5,
        "reasoning_tokens": 11,
        "estimated_cost_usd": 0.25,
        "actual_cost_usd": 0.5,
        "cost_status": "final",
        "cost_source": "provider",
        "first_seen": 1000.0,
        "last_seen": 2000.0,
    },
    "nulls": {
        "session_id": "nulls",
        "model": "unknown",
        "billing_provider": "",
        "billing_base_url": "",
        "billing_mode": "",
        "api_call_count": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_tokens": 4,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
        "estimated_cost_usd": 0,
        "actual_cost_usd": 0,
        "cost_status": None,
        "cost_source": None,
        "first_seen": 3000.0,
        "last_seen": 3000.0,
    },
}


def _usage_by_session(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in table_data(path, "session_model_usage"):
        rows.setdefault(row["session_id"], []).append(row)
    return rows


def test_usage_seed_has_one_row_per_session_that_used_tokens(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    migrate.upgrade(str(path), "19")
    insert_legacy_rows(path, USAGE_SESSIONS, [])
    migrate.upgrade(str(path), "20")
    usage = _usage_by_session(path)
    assert sorted(usage) == ["full", "nulls", "reasoning-only"]
    assert usage["full"] == [EXPECTED_USAGE["full"]]
    assert usage["nulls"] == [EXPECTED_USAGE["nulls"]]
    assert usage["reasoning-only"][0]["model"] == "unknown"
    assert usage["reasoning-only"][0]["reasoning_tokens"] == 1
    assert usage["reasoning-only"][0]["last_seen"] == 4000.0


def test_usage_seed_is_idempotent_over_rows_the_legacy_application_wrote(tmp_path: Path) -> None:
    """A legacy v20 build that created and seeded the table but failed its FTS work left the
    store stamped 19: revision 20 then seeds again without duplicating or overwriting rows."""
    path = tmp_path / "state.db"
    build_legacy_store(path, 19)
    insert_legacy_rows(path, USAGE_SESSIONS, [])
    conn = sqlite3.connect(path)
    with conn:
        for statement in (*ddl.V20_TABLES, *ddl.V20_INDEXES):
            conn.execute(statement)
        # The application has recorded more usage since its own seed.
        conn.execute(
            "INSERT INTO session_model_usage (session_id, model, billing_provider,"
            " billing_base_url, billing_mode, input_tokens, first_seen, last_seen)"
            " VALUES ('full', 'gpt-5', 'openrouter', 'https://openrouter.ai/api/v1', 'api',"
            " 999, 1000.0, 2500.0)"
        )
    conn.close()

    assert migrate.upgrade(str(path), "20").after == ("20",)
    usage = _usage_by_session(path)
    assert sorted(usage) == ["full", "nulls", "reasoning-only"]
    assert len(usage["full"]) == 1
    assert usage["full"][0]["input_tokens"] == 999  # not overwritten by the seed
    assert usage["full"][0]["last_seen"] == 2500.0
    assert usage["nulls"] == [EXPECTED_USAGE["nulls"]]

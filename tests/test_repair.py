"""`check --repair` repairs every damage `check` names, and `check` names what it cannot.

Each FTS5 shadow table damaged the ways SQLite 3.40 lets a hand (or a hostile writer) damage
it: `check` names the index, `check --repair` (after its backup) re-creates the index from
the search branch's own declaration and rebuilds it from the view, in one transaction; after
it both FTS5 integrity checks pass, search answers exactly as a freshly rebuilt index does,
and the agent writes again, through the legacy application's own SQL and through the Store
API. Every index and trigger the store's revisions declare is checked and restored the same
way. Rows a writer stored as bytes that are not UTF-8 are named by id, never by content,
and left as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from migration_support import clone
from reliability_support import Proc, build_corpus_store, cli
from test_staged_rebuild import app_writes

from hermes_store import migrate
from hermes_store.engine import create_store_engine
from hermes_store.search import search_messages
from hermes_store.sqlite import fts, maintenance
from hermes_store.store import NewMessage, Store

WORD, TRIGRAM = fts.WORD_INDEX, fts.TRIGRAM_INDEX
INDEXES = (WORD, TRIGRAM)
VIEW = fts.SOURCE_VIEW
#: Queries whose every hit (id, snippet, order) is compared with a freshly rebuilt index.
QUERIES = ("error", "docker", "json", "test", "file", "the", "数据库", "err*", "docker OR json")
MARKER = "zq7SECRETmarker"
#: Each index's update trigger as the search branch's newest revision declares it.
UPDATE_TRIGGERS = {
    obj.index: obj.sql
    for obj in fts.head_objects()
    if obj.kind == "trigger" and obj.name.endswith("_update")
}

#: Damage to one index's shadow tables ({i}: the index), as SQLite 3.40 lets it be done.
SHADOW_DAMAGE: dict[str, tuple[str, ...]] = {
    "config version": ("UPDATE {i}_config SET v = 99 WHERE k = 'version'",),
    "config emptied": ("DELETE FROM {i}_config",),
    "config dropped": ("DROP TABLE {i}_config",),
    "idx dropped": ("DROP TABLE {i}_idx",),
    "docsize dropped": ("DROP TABLE {i}_docsize",),
    "data dropped": ("DROP TABLE {i}_data",),
    "structure deleted": ("DELETE FROM {i}_data WHERE id = 10",),
    "structure garbage": ("UPDATE {i}_data SET block = x'0102' WHERE id = 10",),
    "data garbage": ("UPDATE {i}_data SET block = zeroblob(length(block)) WHERE id > 10",),
    "docsize garbage": ("UPDATE {i}_docsize SET sz = x'ffffffff'",),
    "docsize rows lost": ("DELETE FROM {i}_docsize WHERE id % 5 = 0",),
    "rows lost": (
        "INSERT INTO {i}({i}, rowid, content) SELECT 'delete', id, content FROM "
        f"{VIEW} WHERE id % 7 = 0",
    ),
    "stale rows": (
        "INSERT INTO {i}(rowid, content) "
        "VALUES ((SELECT max(id) + 1000 FROM messages), 'phantom stalemarker')",
    ),
    "stale text": (  # edited while its update trigger was away, the trigger put back
        "DROP TRIGGER {i}_update",
        "UPDATE messages SET content = 'rewritten stalemarker' WHERE id % 9 = 0",
        "{update_trigger}",
    ),
}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def plain(path: Path) -> Iterator[sqlite3.Connection]:
    """A stdlib sqlite3 connection in autocommit mode, as the legacy application would use."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None, timeout=30)) as conn:
        yield conn


def rows(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with plain(path) as conn:
        return conn.execute(statement, params).fetchall()


def damage(path: Path, index: str, statements: tuple[str, ...]) -> None:
    with plain(path) as conn:
        for statement in statements:
            conn.execute(statement.format(i=index, update_trigger=UPDATE_TRIGGERS[index]))


def fts_checks(path: Path) -> dict[str, str | None]:
    """Both FTS5 integrity checks of each index (rank 0: its own structure; rank 1: against
    the view): the first error, or None."""
    found: dict[str, str | None] = {}
    with plain(path) as conn:
        for index in INDEXES:
            found[index] = None
            for rank in (0, 1):
                try:
                    conn.execute(
                        f"INSERT INTO {index}({index}, rank) VALUES ('integrity-check', {rank})"
                    )
                except sqlite3.DatabaseError as exc:
                    found[index] = found[index] or f"rank {rank}: {exc}"
    return found


HEALTHY = {WORD: None, TRIGRAM: None}


def messages_digest(path: Path) -> tuple[int, str]:
    """How many messages, and a SHA-256 of every byte of every row (text read as bytes)."""
    with plain(path) as conn:
        conn.text_factory = bytes
        table = conn.execute("SELECT * FROM messages ORDER BY id").fetchall()
    return len(table), hashlib.sha256(repr(table).encode()).hexdigest()


def answers(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every hit of each query (id, snippet, in order) and whether the index answered."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            for query in QUERIES:
                hits = search_messages(conn, query, limit=10_000, include_inactive=True)
                found[query] = [(hit["id"], hit["snippet"]) for hit in hits]
                found[query].append(("degraded", hits.degraded))
    finally:
        engine.dispose()
    return found


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.repair-*.bak"))


def assert_no_traceback(proc: Proc) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr


def store_api_writes(path: Path, word: str) -> int:
    """The agent appends a message through the Store API."""
    session = rows(path, "SELECT id FROM sessions ORDER BY id LIMIT 1")[0][0]
    with Store.open(str(path)) as store:
        return store.append_message(session, NewMessage("assistant", f"{word} 数据库{word}"))


def assert_the_agent_writes_again(path: Path) -> None:
    """Both ways of writing work, both indexes take the rows, search finds them."""
    written = {
        "legacyappmarker": app_writes(path, "legacyappmarker"),
        "storeapimarker": store_api_writes(path, "storeapimarker"),
    }
    assert fts_checks(path) == HEALTHY
    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            for word, message_id in written.items():
                for query in (word, f"数据库{word}"):  # the word index, then the trigram one
                    hits = search_messages(conn, query)
                    assert hits.degraded is None, hits.degraded
                    assert [hit["id"] for hit in hits] == [message_id], query
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------
# Stores
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A legacy 21 store with a corpus, upgraded to head."""
    directory = tmp_path_factory.mktemp("repair")
    path = build_corpus_store(directory / "template.db", 300, seed=23)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HERMES_HOME", str(directory / "home"))
        patch.delenv("HERMES_STORE_URL", raising=False)
        migrate.upgrade(str(path))
    with plain(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def rebuilt(template: Path, path: Path, changes: tuple[str, ...] = ()) -> Any:
    """What search answers on the template store with ``changes`` written to `messages`
    (its triggers at work), once both indexes are freshly rebuilt."""
    clone(template, path)
    with plain(path) as conn:
        for statement in changes:
            conn.execute(statement)
        for index in INDEXES:
            conn.execute(f"INSERT INTO {index}({index}) VALUES ('rebuild')")
            conn.execute(f"INSERT INTO {index}({index}) VALUES ('optimize')")
    found = answers(path)
    for query in QUERIES:
        assert len(found[query]) > 1, query  # hits besides the "degraded" line: it bites
    return found


@pytest.fixture(scope="module")
def rebuilt_answers(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """What search answers on the template store once both indexes are freshly rebuilt."""
    return rebuilt(template, tmp_path_factory.mktemp("rebuilt") / "state.db")


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Path:
    return clone(template, tmp_path / "state.db")


# --------------------------------------------------------------------------------------------
# FTS5 shadow tables
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", INDEXES)
@pytest.mark.parametrize("kind", list(SHADOW_DAMAGE))
def test_each_shadow_table_damage_is_named_and_repaired(
    template: Path, store: Path, tmp_path: Path, index: str, kind: str, rebuilt_answers: Any
) -> None:
    changes = tuple(s for s in SHADOW_DAMAGE[kind] if s.startswith("UPDATE messages"))
    expected = rebuilt(template, tmp_path / "rebuilt.db", changes) if changes else rebuilt_answers
    damage(store, index, SHADOW_DAMAGE[kind])
    before = messages_digest(store)
    assert fts_checks(store)[index] is not None

    checked = cli("check", "--db", store)
    assert checked.returncode == 1, checked
    assert_no_traceback(checked)
    assert checked.stderr.startswith("broken: ")
    assert f"{index} (" in checked.stderr

    repaired = cli("check", "--db", store, "--repair")
    assert repaired.returncode == 0, repaired
    assert_no_traceback(repaired)
    assert index in repaired.stdout
    (backup,) = backups(store)
    assert index in fts_checks(backup)
    assert fts_checks(backup)[index] is not None

    assert fts_checks(store) == HEALTHY
    assert cli("check", "--db", store).returncode == 0
    assert messages_digest(store) == before
    assert answers(store) == expected
    assert_the_agent_writes_again(store)


@pytest.mark.parametrize("kind", ["config version", "idx dropped", "data dropped"])
def test_a_deferred_repair_recreates_the_index_and_refills_it(
    store: Path, kind: str, rebuilt_answers: Any
) -> None:
    damage(store, WORD, SHADOW_DAMAGE[kind])
    repaired = cli("check", "--db", store, "--repair", "--deferred")
    assert repaired.returncode == 0, repaired
    assert "deferred backfill" in repaired.stdout
    assert fts_checks(store) == HEALTHY
    assert not rows(store, "SELECT key FROM state_meta WHERE key LIKE 'messages_fts%'")
    assert answers(store) == rebuilt_answers
    assert_the_agent_writes_again(store)


def test_both_indexes_damaged_at_once_are_repaired_in_one_run(
    store: Path, rebuilt_answers: Any
) -> None:
    damage(store, WORD, SHADOW_DAMAGE["config version"])
    damage(store, TRIGRAM, SHADOW_DAMAGE["docsize dropped"])
    data = json.loads(cli("check", "--db", store, "--json").stdout)
    assert set(INDEXES) <= set(data["problems"])
    repaired = cli("check", "--db", store, "--repair", "--json")
    assert repaired.returncode == 0, repaired
    payload = json.loads(repaired.stdout)
    assert set(payload["repair"]["repaired"]) == set(INDEXES)
    assert fts_checks(store) == HEALTHY
    assert answers(store) == rebuilt_answers


def test_check_names_the_missing_shadow_table(store: Path) -> None:
    """'SQL logic error' alone does not tell an operator what is wrong."""
    damage(store, TRIGRAM, SHADOW_DAMAGE["docsize dropped"])
    data = json.loads(cli("check", "--db", store, "--json").stdout)
    assert f"{TRIGRAM}_docsize" in data["problems"][TRIGRAM]
    assert "missing" in data["problems"][TRIGRAM]


def test_a_repair_that_fails_midway_leaves_the_store_as_it_was(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The damaged index is dropped, declared again and filled in one transaction: a failure
    after the drop (here: the fill) rolls all of it back, and the next run repairs it."""
    damage(store, WORD, SHADOW_DAMAGE["config version"])
    schema_before = rows(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    config_before = rows(store, f"SELECT k, v FROM {WORD}_config ORDER BY k")
    digest = messages_digest(store)

    def fail(_conn: Any, name: str) -> None:
        raise sqlite3.OperationalError(f"simulated failure while filling {name}")

    monkeypatch.setattr(fts, "rebuild_index", fail)
    engine = create_store_engine(store, create=False)
    try:
        with pytest.raises(Exception, match="simulated failure"):
            maintenance.repair(engine)
    finally:
        engine.dispose()
    assert rows(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema_before
    assert rows(store, f"SELECT k, v FROM {WORD}_config ORDER BY k") == config_before
    assert messages_digest(store) == digest

    monkeypatch.undo()
    assert cli("check", "--db", store, "--repair").returncode == 0
    assert fts_checks(store) == HEALTHY


@pytest.fixture(scope="module")
def inline_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A legacy 21 store (inline indexes, never upgraded) with a corpus."""
    path = build_corpus_store(tmp_path_factory.mktemp("repair-inline") / "legacy.db", 200, seed=29)
    with plain(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.mark.parametrize("kind", ["config version", "idx dropped", "data dropped"])
def test_a_legacy_inline_index_is_recreated_from_its_own_declaration(
    inline_template: Path, tmp_path: Path, kind: str
) -> None:
    path = clone(inline_template, tmp_path / "legacy.db")
    declaration = rows(path, "SELECT sql FROM sqlite_master WHERE name = ?", (WORD,))
    expected = rows(path, f"SELECT rowid FROM {WORD} WHERE {WORD} MATCH 'error' ORDER BY rowid")
    assert expected
    damage(path, WORD, SHADOW_DAMAGE[kind])
    assert cli("check", "--db", path).returncode == 1
    repaired = cli("check", "--db", path, "--repair")
    assert repaired.returncode == 0, repaired
    assert "re-indexed from messages" in repaired.stdout
    assert rows(path, "SELECT sql FROM sqlite_master WHERE name = ?", (WORD,)) == declaration
    assert fts_checks(path) == HEALTHY
    found = rows(path, f"SELECT rowid FROM {WORD} WHERE {WORD} MATCH 'error' ORDER BY rowid")
    assert found == expected
    app_writes(path, "legacyappmarker")
    assert rows(path, f"SELECT rowid FROM {WORD} WHERE {WORD} MATCH 'legacyappmarker'")


# --------------------------------------------------------------------------------------------
# Every index and trigger the store's revisions declare
# --------------------------------------------------------------------------------------------


def _fresh_head_objects() -> dict[str, tuple[str, str]]:
    """name -> (type, sql) of every index and trigger of a store created fresh at head,
    the search mechanism's apart (read from the file, not from the code under test)."""
    with tempfile.TemporaryDirectory(prefix="hermes-fresh-") as directory:
        path = Path(directory) / "fresh.db"
        with mock.patch.dict(os.environ, {"HERMES_HOME": str(Path(directory) / "home")}):
            migrate.upgrade(str(path))
        return {
            name: (kind, sql)
            for kind, name, sql in rows(
                path,
                "SELECT type, name, sql FROM sqlite_master WHERE type IN ('index', 'trigger') "
                "AND sql IS NOT NULL AND name NOT LIKE 'messages_fts%'",
            )
        }


FRESH = _fresh_head_objects()


def test_the_revisions_declare_display_triggers_and_indexes() -> None:
    kinds = {kind for kind, _sql in FRESH.values()}
    assert kinds == {"index", "trigger"}
    assert "messages_display_order_insert" in FRESH
    assert len([k for k, _s in FRESH.values() if k == "index"]) > 10


def test_every_view_of_a_fresh_store_is_one_check_compares(store: Path) -> None:
    """Views are the search mechanism's (compared with the FTS branch): a revision that
    adds another must be covered by check before this passes."""
    views = {row[0] for row in rows(store, "SELECT name FROM sqlite_master WHERE type = 'view'")}
    compared = {obj.name for obj in fts.head_objects() if obj.kind == "view"}
    assert views
    assert views <= compared


@pytest.mark.parametrize("name", sorted(FRESH))
def test_each_declared_index_and_trigger_dropped_is_named_and_restored(
    store: Path, name: str
) -> None:
    kind, sql = FRESH[name]
    with plain(store) as conn:
        conn.execute(f"DROP {kind.upper()} {name}")
    checked = cli("check", "--db", store)
    assert checked.returncode == 1, checked
    assert f"{kind} {name} (missing)" in checked.stderr
    data = json.loads(cli("check", "--db", store, "--json").stdout)
    assert data["problems"] == {f"{kind} {name}": "missing"}

    repaired = cli("check", "--db", store, "--repair")
    assert repaired.returncode == 0, repaired
    assert f"{kind} {name}" in repaired.stdout
    assert rows(store, "SELECT sql FROM sqlite_master WHERE name = ?", (name,)) == [(sql,)]
    assert cli("check", "--db", store).returncode == 0
    assert_the_agent_writes_again(store)


def test_a_display_trigger_with_another_body_is_named_and_restored(store: Path) -> None:
    with plain(store) as conn:
        conn.execute("DROP TRIGGER messages_display_order_insert")
        conn.execute(
            "CREATE TRIGGER messages_display_order_insert AFTER INSERT ON messages "
            "BEGIN SELECT 1; END"
        )
    data = json.loads(cli("check", "--db", store, "--json").stdout)
    assert data["problems"] == {"trigger messages_display_order_insert": fts.DIFFERS}
    assert cli("check", "--db", store, "--repair").returncode == 0
    message_id = app_writes(store, "displayordermarker")
    # The restored trigger gives the new message its display order, as revision 30 does.
    assert rows(store, "SELECT display_order FROM messages WHERE id = ?", (message_id,)) == [
        (message_id,)
    ]


def test_a_unique_index_the_rows_violate_is_said_not_repaired_and_the_rest_is(
    store: Path,
) -> None:
    with plain(store) as conn:
        conn.execute("DROP INDEX idx_sessions_title_unique")
        conn.execute("DROP TRIGGER messages_display_order_insert")
        conn.execute(
            "UPDATE sessions SET title = 'twin title' WHERE id IN "
            "(SELECT id FROM sessions ORDER BY id LIMIT 2)"
        )
    repaired = cli("check", "--db", store, "--repair", "--json")
    assert repaired.returncode == 1
    payload = json.loads(repaired.stdout)
    assert "trigger messages_display_order_insert" in payload["repair"]["restored"]
    why = payload["repair"]["not_repaired"]["index idx_sessions_title_unique"]
    assert "UNIQUE" in why
    assert "sessions" in why
    assert "twin title" not in repaired.stdout + repaired.stderr
    assert payload["problems"] == {"index idx_sessions_title_unique": "missing"}
    assert rows(
        store, "SELECT count(*) FROM sqlite_master WHERE name = 'messages_display_order_insert'"
    ) == [(1,)]


def test_an_unversioned_legacy_store_is_not_held_to_the_revisions(
    inline_template: Path, tmp_path: Path
) -> None:
    """The application's own schema is not this package's to judge until `upgrade` adopts
    it (adoption then adds what the revisions declare and the store lacks)."""
    path = clone(inline_template, tmp_path / "legacy.db")
    with plain(path) as conn:
        conn.execute("DROP INDEX idx_sessions_source")
    data = json.loads(cli("check", "--db", path, "--json").stdout)
    assert data["ok"] is True
    assert data["problems"] == {}
    migrate.upgrade(str(path))
    assert rows(path, "SELECT name FROM sqlite_master WHERE name = 'idx_sessions_source'")
    assert json.loads(cli("check", "--db", path, "--json").stdout)["ok"] is True


# --------------------------------------------------------------------------------------------
# Rows that cannot be read as UTF-8
# --------------------------------------------------------------------------------------------

#: "My AWS secret is zq7SECRETmarker" and an invalid byte, as a writer storing bytes left it.
UNDECODABLE = (MARKER.encode() + b" my secret \xff\xfe tail").hex()


def write_undecodable(path: Path) -> list[int]:
    """Two messages whose text is not UTF-8: one in content, one in tool_calls."""
    with plain(path) as conn:
        session = conn.execute("SELECT id FROM sessions ORDER BY id LIMIT 1").fetchone()[0]
        cursor = conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) "
            f"VALUES (?, 'user', CAST(x'{UNDECODABLE}' AS TEXT), 1)",
            (session,),
        )
        first = cursor.lastrowid
        second = conn.execute("SELECT min(id) FROM messages").fetchone()[0]
        conn.execute(
            f"UPDATE messages SET tool_calls = CAST(x'{UNDECODABLE}' AS TEXT) WHERE id = ?",
            (second,),
        )
    assert first is not None
    return sorted([first, second])


def test_rows_that_are_not_utf8_are_named_by_id_and_left_as_they_are(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ids = write_undecodable(store)
    digest = messages_digest(store)

    checked = cli("check", "--db", store)
    assert checked.returncode == 1, checked
    assert_no_traceback(checked)
    data = json.loads(cli("check", "--db", store, "--json").stdout)
    (item,) = [key for key in data["problems"] if key.startswith("messages")]
    why = data["problems"][item]
    assert f"{ids[0]} (content)" in why or f"{ids[0]} (tool_calls)" in why
    assert all(str(i) in why for i in ids)
    assert "UTF-8" in why

    damage(store, WORD, SHADOW_DAMAGE["config version"])  # something to repair beside them
    repaired = cli("check", "--db", store, "--repair", "--json")
    assert_no_traceback(repaired)
    assert repaired.returncode == 1  # the rows are still there, and said so
    payload = json.loads(repaired.stdout)
    assert WORD in payload["repair"]["repaired"]
    assert item in payload["repair"]["not_repaired"]
    assert payload["problems"] == {item: why}
    assert messages_digest(store) == digest
    assert fts_checks(store) == HEALTHY
    for proc in (checked, repaired):
        assert MARKER not in proc.stdout + proc.stderr
    assert MARKER not in caplog.text


def test_a_store_whose_only_problem_is_undecodable_rows_is_not_written(store: Path) -> None:
    write_undecodable(store)
    before = rows(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    digest = messages_digest(store)
    repaired = cli("check", "--db", store, "--repair")
    assert repaired.returncode == 1
    assert MARKER not in repaired.stdout + repaired.stderr
    assert not backups(store)
    assert messages_digest(store) == digest
    assert rows(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == before


# --------------------------------------------------------------------------------------------
# Nothing of a message in what check and repair say
# --------------------------------------------------------------------------------------------


def test_check_and_repair_never_say_a_message(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("sqlalchemy", "hermes_store"):
        caplog.set_level(logging.DEBUG, logger=name)
    with plain(store) as conn:
        conn.execute(
            "UPDATE messages SET content = content || ' ' || ? WHERE id % 3 = 0", (MARKER,)
        )
    write_undecodable(store)
    for index in INDEXES:
        damage(store, index, SHADOW_DAMAGE["stale text"])
    with plain(store) as conn:
        conn.execute("DROP TRIGGER messages_display_identity_update")
    outputs = [
        cli("check", "--db", store),
        cli("check", "--db", store, "--json"),
        cli("check", "--db", store, "--repair"),
        cli("check", "--db", store, "--repair", "--deferred", "--json"),
    ]
    for proc in outputs:
        assert_no_traceback(proc)
        assert MARKER not in proc.stdout + proc.stderr
    assert caplog.records
    for record in caplog.records:
        assert MARKER not in record.getMessage() + (record.exc_text or "")

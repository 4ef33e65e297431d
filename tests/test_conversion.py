"""Revision 22 on real-looking legacy stores: what the conversion leaves, and when it refuses.

Checked on both paths (verified in place, and rebuild forced): no `*_content` copies left,
both indexes external, every integrity check passing, the file smaller by the copies after
VACUUM. The in-place path is refused on drifted legacy indexes (the store then converts by
rebuilding and ends exact), already external indexes are left alone, and stores without the
trigram index or without FTS at all upgrade too. SQLite builds that lack the trigram
tokenizer or FTS5 are simulated by renaming the module / tokenizer in the statements the
upgrade's engine runs, so that SQLite itself refuses them the way such a build would.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from legacy import ddl
from legacy.build import build_legacy_store
from migration_support import clone, migration_log
from parity_queries import PARITY_QUERIES
from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc

from hermes_store import migrate
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.search import search_messages
from hermes_store.sqlite import fts
from hermes_store.sqlite import migration as sqlite_migration
from hermes_store.sqlite.storage import FTS_COPIES, storage_report
from hermes_store.store import NewMessage, Store

CORPUS_MESSAGES = 1200
CORPUS_SEED = 7
WORD, TRIGRAM = "messages_fts", "messages_fts_trigram"
INDEXES = (WORD, TRIGRAM)
SHADOWS = ("_data", "_idx", "_docsize", "_config")
SIX_TRIGGERS = sorted(ddl.FTS_TRIGGER_NAMES)
PATHS = [({}, "in place"), ({"fts_convert": "rebuild"}, "rebuild")]
PATH_IDS = ["in-place", "rebuild"]
#: The parity queries without the three 2048-character ones (costly, no class of their own here).
QUERIES = [q for q in PARITY_QUERIES if len(q["query"]) < 1000]
CJK_QUERIES = [q for q in QUERIES if re.search(r"[\u3000-\u9fff\uac00-\ud7af]", q["query"])]


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def logged(messages: list[str], name: str) -> str:
    """The one message the revision logged about index `name`."""
    found = [m for m in messages if m.startswith(f"{name}: ")]
    assert len(found) == 1, messages
    return found[0]


def build_store(path: Path, **options: bool) -> Path:
    """A legacy store at 21 (`fts`/`trigram` options of build_legacy_store) with a corpus."""
    build_legacy_store(path, 21, **options)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(CORPUS_MESSAGES, CORPUS_SEED))
    return path


@contextlib.contextmanager
def engine_of(path: Path) -> Iterator[Engine]:
    engine = create_store_engine(path, create=False)
    try:
        yield engine
    finally:
        engine.dispose()


def sql(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement with plain sqlite3 (as the legacy application would) and commit."""
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        return conn.execute(statement, params).fetchall()


def master(path: Path) -> dict[str, str]:
    """name -> type of every schema object."""
    return {name: kind for name, kind in sql(path, "SELECT name, type FROM sqlite_master")}


def shadow_digest(path: Path) -> str:
    """SHA-256 of every row of the FTS shadow tables that exist (the index itself)."""
    digest = hashlib.sha256()
    names = master(path)
    for index in INDEXES:
        for suffix in SHADOWS:
            table = index + suffix
            if table in names:
                for row in sql(path, f"SELECT * FROM {table} ORDER BY 1"):
                    digest.update(repr((table, row)).encode())
    return digest.hexdigest()


def search(path: Path, query: str, **filters: Any) -> list[int]:
    """Ids of the hits of search_messages, all of them."""
    with engine_of(path) as engine, engine.connect() as conn:
        return [hit["id"] for hit in search_messages(conn, query, limit=100_000, **filters)]


def answers(path: Path, queries: list[dict[str, Any]]) -> list[list[Any]]:
    with engine_of(path) as engine, engine.connect() as conn:
        return [list(search_messages(conn, **query)) for query in queries]


def check(path: Path) -> fts.CheckResult:
    with engine_of(path) as engine, engine.connect() as conn:
        return fts.integrity_check(conn)


def vacuumed_size(path: Path) -> int:
    """VACUUM, fold the WAL back into the file, and return the file's size."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    size = path.stat().st_size
    assert size == pages * page_size
    return size


def without_in_this_sqlite(monkeypatch: pytest.MonkeyPatch, feature: str) -> None:
    """Make the upgrade's engine behave like a SQLite build lacking `feature`.

    "trigram": every `tokenize='trigram'` names an unknown tokenizer instead; "fts5": every
    `USING fts5` names an unknown module. SQLite then refuses those statements with the
    errors such a build gives, probes included.
    """
    original = sqlite_migration.create_store_engine
    if feature == "trigram":
        pattern, replacement = re.compile(r"tokenize\s*=\s*'trigram'"), "tokenize='no_trigram'"
    else:
        pattern, replacement = re.compile(r"USING\s+fts5\b", re.IGNORECASE), "USING no_fts5"

    def patched(*args: Any, **kwargs: Any) -> Engine:
        engine = original(*args, **kwargs)

        @event.listens_for(engine, "before_cursor_execute", retval=True)
        def _hide(
            conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
        ) -> tuple[str, Any]:
            return pattern.sub(replacement, statement), params

        return engine

    monkeypatch.setattr(sqlite_migration, "create_store_engine", patched)


# --------------------------------------------------------------------------------------------
# Fixtures: one legacy store per flavour, built once per module, copied per test
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def _template(
    templates: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, kind: str
) -> Path:
    if kind not in templates:
        options = {"healthy": {}, "no-trigram": {"trigram": False}, "no-fts": {"fts": False}}
        path = tmp_path_factory.mktemp(f"conversion-{kind}") / "legacy.db"
        templates[kind] = build_store(path, **options[kind])
    return templates[kind]


@pytest.fixture
def healthy(
    templates: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> Path:
    return clone(_template(templates, tmp_path_factory, "healthy"), tmp_path / "state.db")


@pytest.fixture
def no_trigram(
    templates: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> Path:
    return clone(_template(templates, tmp_path_factory, "no-trigram"), tmp_path / "state.db")


@pytest.fixture
def no_fts(
    templates: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> Path:
    return clone(_template(templates, tmp_path_factory, "no-fts"), tmp_path / "state.db")


# --------------------------------------------------------------------------------------------
# What the conversion leaves, on both paths
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "expected"), PATHS, ids=PATH_IDS)
def test_upgrade_leaves_external_indexes_and_no_copies(
    healthy: Path, x: dict[str, str], expected: str
) -> None:
    assert {f"{n}_content" for n in INDEXES} <= set(master(healthy))
    with migration_log() as log:
        migrate.upgrade(healthy, x=x)
    for name in INDEXES:
        verb = "converted in place" if expected == "in place" else "re-created as external"
        assert verb in logged(log, name)

    names = master(healthy)
    assert [n for n in names if n.endswith("_content")] == []
    assert names["messages_fts_source"] == "view"
    with engine_of(healthy) as engine, engine.connect() as conn:
        assert fts.layout(conn) == "external"
        assert {n: fts.index_layout(conn, n) for n in INDEXES} == dict.fromkeys(INDEXES, "external")
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalars().all() == ["ok"]
        result = fts.integrity_check(conn)
        assert result.ok, result.problems
        assert result.checked == ["PRAGMA integrity_check", *INDEXES]
        for name in INDEXES:
            assert fts.check_index(conn, name) is None
            docs = conn.exec_driver_sql(f"SELECT count(*) FROM {name}_docsize").scalar_one()
            assert docs == conn.exec_driver_sql("SELECT count(*) FROM messages").scalar_one()
    # What the legacy application checks on open: the six trigger names, and a version at or
    # above its own.
    assert (
        sorted(n for n, kind in names.items() if kind == "trigger" and n.startswith("messages_fts"))
        == SIX_TRIGGERS
    )
    assert sql(healthy, "SELECT version FROM schema_version") == [(30,)]


@pytest.mark.parametrize(("x", "expected"), PATHS, ids=PATH_IDS)
def test_vacuumed_file_shrinks_by_the_two_copies(
    healthy: Path, x: dict[str, str], expected: str
) -> None:
    with engine_of(healthy) as engine, engine.connect() as conn:
        report = storage_report(conn)
    copies = report.groups[FTS_COPIES]
    assert copies == sum(report.objects[f"{n}_content"] for n in INDEXES) > 0
    before = vacuumed_size(healthy)

    # The conversion alone: later application versions add indexes of their own.
    migrate.upgrade(healthy, app_version=21, x=x)
    after = vacuumed_size(healthy)
    assert before - after >= copies - copies * 0.05, (before, after, copies)
    with engine_of(healthy) as engine, engine.connect() as conn:
        assert storage_report(conn).groups[FTS_COPIES] == 0


# --------------------------------------------------------------------------------------------
# In place refused on drifted legacy indexes: converted by rebuilding, and exact afterwards
# --------------------------------------------------------------------------------------------


def test_a_drifted_copy_refuses_in_place_for_that_index_only(healthy: Path) -> None:
    target = sql(
        healthy,
        "SELECT id FROM messages WHERE active = 1 AND content LIKE '% the %' ORDER BY id LIMIT 1",
    )[0][0]
    sql(
        healthy,
        "UPDATE messages_fts_content SET c0 = c0 || ' driftedwordzz' WHERE id = ?",
        (target,),
    )
    assert search(healthy, "the") != []
    with migration_log() as log:
        migrate.upgrade(healthy)
    assert "re-created as external content" in logged(log, WORD)
    assert "1 rows differ from their messages" in logged(log, WORD)
    assert "converted in place" in logged(log, TRIGRAM)

    assert check(healthy).ok
    assert search(healthy, "driftedwordzz") == []
    assert target in search(healthy, "the")


@pytest.mark.parametrize("triggers_restored", [False, True], ids=["still-absent", "restored"])
def test_messages_written_without_triggers_become_searchable(
    healthy: Path, triggers_restored: bool
) -> None:
    """The drifted legacy store: rows inserted while the FTS triggers were absent (a build
    without FTS5 drops them so that writes keep working) are missing from the legacy index."""
    for name in ddl.FTS_TRIGGER_NAMES:
        sql(healthy, f"DROP TRIGGER {name}")
    session = sql(healthy, "SELECT id FROM sessions ORDER BY started_at LIMIT 1")[0][0]
    missing = []
    for content, tool_name in (
        ("zyzzyvaquux unicorn cake 麒麟蛋糕店 opened", None),
        ("output of zyzzyvaquux", "zyzzyvatool"),
    ):
        with contextlib.closing(sqlite3.connect(healthy)) as conn, conn:
            cursor = conn.execute(
                "INSERT INTO messages (session_id, role, content, tool_name, timestamp) "
                "VALUES (?, 'user', ?, ?, 9e9)",
                (session, content, tool_name),
            )
            missing.append(cursor.lastrowid)
    if triggers_restored:
        for statement in (*ddl.FTS_WORD, *ddl.FTS_TRIGRAM):
            if "TRIGGER" in statement:
                sql(healthy, statement)
    assert search(healthy, "zyzzyvaquux") == []
    assert search(healthy, "麒麟蛋糕") == []
    assert search(healthy, "zyzzyvatool") == []

    with migration_log() as log:
        migrate.upgrade(healthy)
    for name in INDEXES:
        message = logged(log, name)
        assert "re-created as external content" in message
        assert f"holds {CORPUS_MESSAGES} rows" in message

    assert check(healthy).ok
    assert sorted(search(healthy, "zyzzyvaquux")) == missing
    assert search(healthy, "麒麟蛋糕") == missing[:1]
    assert search(healthy, "zyzzyvatool") == missing[1:]
    assert (
        sorted(
            n
            for n, kind in master(healthy).items()
            if kind == "trigger" and n.startswith("messages_fts")
        )
        == SIX_TRIGGERS
    )


# --------------------------------------------------------------------------------------------
# Already external: left as it is
# --------------------------------------------------------------------------------------------


def test_already_external_indexes_are_left_as_they_are(healthy: Path) -> None:
    migrate.upgrade(healthy)
    index = shadow_digest(healthy)
    schema = sql(healthy, "SELECT type, name, sql FROM sqlite_master ORDER BY name")

    with migration_log() as log:
        result = migrate.upgrade(healthy)
    assert result.before == result.after == (migrate.head_revision(),)
    assert [m for m in log if m.startswith("messages_fts")] == []
    assert shadow_digest(healthy) == index
    assert sql(healthy, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema

    # The conversion run again over external indexes (a store stamped back by hand, or
    # restored from a backup of the version table): nothing is re-indexed.
    sql(healthy, "UPDATE alembic_version SET version_num = '30'")
    with migration_log() as log:
        assert migrate.upgrade(healthy).before == ("30",)
    for name in INDEXES:
        assert "already external content, left as it is" in logged(log, name)
    assert shadow_digest(healthy) == index
    assert sql(healthy, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert check(healthy).ok


# --------------------------------------------------------------------------------------------
# Stores without the trigram index, or without FTS
# --------------------------------------------------------------------------------------------


def test_without_trigram_tokenizer_the_word_index_converts_alone(
    no_trigram: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = answers(no_trigram, QUERIES)
    without_in_this_sqlite(monkeypatch, "trigram")
    with migration_log() as log:
        migrate.upgrade(no_trigram)
    assert "converted in place" in logged(log, WORD)
    assert any("no trigram tokenizer" in m for m in log), log
    assert [m for m in log if m.startswith(f"{TRIGRAM}: ")] == []
    monkeypatch.undo()

    names = master(no_trigram)
    assert TRIGRAM not in names
    assert [n for n in names if n.endswith("_content")] == []
    assert sorted(
        n for n, kind in names.items() if kind == "trigger" and n.startswith("messages_fts")
    ) == sorted(("messages_fts_insert", "messages_fts_delete", "messages_fts_update"))
    result = check(no_trigram)
    assert result.ok
    assert result.checked == ["PRAGMA integrity_check", WORD]
    # CJK search still falls back to the LIKE scan: same answers as before, LIKE snippets
    # (no match markers), rewound rows included (the LIKE path ignores visibility).
    after = answers(no_trigram, QUERIES)
    assert after == before
    cjk = [hit for q, hits in zip(QUERIES, after, strict=True) if q in CJK_QUERIES for hit in hits]
    assert cjk
    assert all(">>>" not in (hit["snippet"] or "") for hit in cjk)


def test_without_trigram_index_on_a_sqlite_with_trigram_the_index_is_created(
    no_trigram: Path,
) -> None:
    """On a SQLite that has the tokenizer, the missing trigram index is created (and so the
    six trigger names the legacy application checks exist): CJK search uses it afterwards."""
    assert search(no_trigram, "数据库", include_inactive=True) != []
    with migration_log() as log:
        migrate.upgrade(no_trigram)
    assert "converted in place" in logged(log, WORD)
    assert "was missing; created as external content and built from the view" in logged(
        log, TRIGRAM
    )
    names = master(no_trigram)
    assert (
        sorted(n for n, kind in names.items() if kind == "trigger" and n.startswith("messages_fts"))
        == SIX_TRIGGERS
    )
    assert check(no_trigram).ok
    with engine_of(no_trigram) as engine, engine.connect() as conn:
        hits = search_messages(conn, "数据库")
    assert hits
    assert all(">>>数据库<<<" in (hit["snippet"] or "") for hit in hits)


def test_without_fts5_the_upgrade_succeeds_search_is_empty_and_writes_work(
    no_fts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_in_this_sqlite(monkeypatch, "fts5")
    with migration_log() as log:
        assert migrate.upgrade(no_fts).after == (migrate.head_revision(),)
    assert any("no FTS5" in m for m in log), log
    monkeypatch.undo()

    names = master(no_fts)
    assert not [n for n in names if n.startswith("messages_fts") and n != "messages_fts_source"]
    assert [
        n for n, kind in names.items() if kind == "trigger" and n.startswith("messages_fts")
    ] == []
    assert sql(no_fts, "SELECT version FROM schema_version") == [(30,)]
    assert search(no_fts, "def") == []
    assert search(no_fts, "import", include_inactive=True) == []
    assert search(no_fts, "数据库") == []

    with Store.open(no_fts) as store:
        store.create_session("after-upgrade", "cli", started_at=1.0)
        first = store.append_message("after-upgrade", NewMessage("user", "hello", timestamp=2.0))
        store.append_message("after-upgrade", NewMessage("tool", "out", tool_name="terminal"))
        store.edit_message(first, "hello again")
        assert store.set_message_flags([first], active=False) == 1
        assert [m.content for m in store.messages("after-upgrade")] == ["hello again", "out"]
        assert store.delete_session("after-upgrade") == 2
    assert check(no_fts).ok


def test_without_fts_on_a_sqlite_with_fts5_the_indexes_are_built(no_fts: Path) -> None:
    assert search(no_fts, "def") == []
    with migration_log() as log:
        migrate.upgrade(no_fts)
    for name in INDEXES:
        assert "was missing; created as external content" in logged(log, name)
    assert (
        sorted(
            n
            for n, kind in master(no_fts).items()
            if kind == "trigger" and n.startswith("messages_fts")
        )
        == SIX_TRIGGERS
    )
    assert check(no_fts).ok
    assert search(no_fts, "def") != []
    assert search(no_fts, "数据库") != []


# --------------------------------------------------------------------------------------------
# A full disk is no refusal
# --------------------------------------------------------------------------------------------


def _sqlite_full(tmp_path: Path) -> sqlite3.OperationalError:
    """A real SQLITE_FULL from SQLite: a store at its page limit."""
    raw = sqlite3.connect(tmp_path / "full.db")
    try:
        raw.execute("CREATE TABLE t(a)")
        raw.execute(f"PRAGMA max_page_count = {raw.execute('PRAGMA page_count').fetchone()[0]}")
        with pytest.raises(sqlite3.OperationalError, match="disk is full") as full:
            raw.execute("INSERT INTO t VALUES (zeroblob(100000))")
    finally:
        raw.close()
    return full.value


@pytest.mark.parametrize("full", [True, False], ids=["disk-full", "refused"])
def test_the_in_place_path_never_takes_a_full_disk_for_a_refusal(
    full: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Revision fts1 rebuilds when SQLite refuses to edit the schema; SQLITE_FULL there is
    raised instead, on any connection (a rebuild on a full disk writes far more)."""
    path = tmp_path / "state.db"
    build_legacy_store(path, 21)
    module = migrate.script_directory().get_revision("fts1").module
    driver_error = _sqlite_full(tmp_path) if full else sqlite3.OperationalError("not authorized")
    failure = sa_exc.OperationalError("UPDATE sqlite_master", {}, driver_error)

    def rewrite(_name: str, _sql: str) -> None:
        raise module.SchemaEditRefused(str(failure.orig)) from failure

    monkeypatch.setattr(module, "_rewrite_declaration", rewrite)
    with engine_of(path) as engine, engine.connect() as conn, conn.begin():
        with Operations.context(MigrationContext.configure(conn)):
            if full:
                with pytest.raises(module.SchemaEditRefused, match="disk is full"):
                    module._convert_in_place(WORD)
            else:
                why = module._convert_in_place(WORD)
                assert why.startswith("this SQLite refuses schema edits")

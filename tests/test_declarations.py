"""Each typed snapshot of `hermes_store.declarations` equals what its revision creates.

The library checks and repairs stores against these snapshots, never against a revision
module; the revisions keep their own frozen copy of the same DDL. Here the chain is run to
each snapshot's revision on a scratch SQLite file and a scratch PostgreSQL database, and
what the database then holds (sqlite_master, pg_catalog) is compared with the snapshot,
normalised as `check` normalises it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from hermes_store import declarations, migrate
from hermes_store.declarations import (
    POSTGRESQL_LAYOUTS,
    POSTGRESQL_TRIGGERS,
    SEARCH_LAYOUT,
    SQLITE_LAYOUTS,
    PostgreSQLLayout,
    PostgreSQLTriggers,
    SQLiteLayout,
)
from hermes_store.postgresql.check import ddl, function_body, index_expression
from hermes_store.revisions import LAST_APP_VERSION, fts_head_revision, script_directory
from hermes_store.sqlite import changelog
from hermes_store.sqlite.mechanism import normalise_sql


def revision_module(revision: str) -> ModuleType:
    script = script_directory().get_revision(revision)
    assert script is not None
    return script.module


def sqlite_revision(revision: str) -> str:
    """The revision whose module holds a layout's SQLite DDL: the layout's own, or the
    nearest below it on the search branch (fts2 changes nothing on SQLite and keeps none)."""
    while not hasattr(revision_module(revision), "EXTERNAL_TABLES"):
        down = script_directory().get_revision(revision).down_revision
        assert isinstance(down, str), revision
        revision = down
    return revision


def master(path: Path) -> dict[str, tuple[str, str]]:
    """name -> (type, sql) of every object with SQL in a SQLite store."""
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT name, type, sql FROM sqlite_master WHERE sql IS NOT NULL"
            )
            return {str(name): (str(kind), str(sql)) for name, kind, sql in rows}
    finally:
        engine.dispose()


def normalised(sql: str) -> str:
    return normalise_sql(sql).upper()


# -- one notion of head -----------------------------------------------------------------


def test_both_databases_expect_the_fts_branch_head() -> None:
    """SQLite's and PostgreSQL's checks follow one constant, and it names the branch head."""
    assert set(SQLITE_LAYOUTS) == set(POSTGRESQL_LAYOUTS)
    assert max(SQLITE_LAYOUTS) == SEARCH_LAYOUT
    assert declarations.SQLITE is SQLITE_LAYOUTS[SEARCH_LAYOUT]
    assert declarations.POSTGRESQL is POSTGRESQL_LAYOUTS[SEARCH_LAYOUT]
    assert declarations.SQLITE.revision == declarations.POSTGRESQL.revision
    assert declarations.SQLITE.revision == fts_head_revision()
    for version in SQLITE_LAYOUTS:
        assert SQLITE_LAYOUTS[version].version == POSTGRESQL_LAYOUTS[version].version == version
        assert SQLITE_LAYOUTS[version].revision == POSTGRESQL_LAYOUTS[version].revision


def test_the_postgresql_triggers_are_by_application_version_oldest_first() -> None:
    versions = [snapshot.app_version for snapshot in POSTGRESQL_TRIGGERS]
    assert versions == sorted(set(versions))
    assert declarations.postgresql_triggers(versions[0] - 1) is None
    assert declarations.postgresql_triggers(versions[-1]) is POSTGRESQL_TRIGGERS[-1]


# -- SQLite ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", SQLITE_LAYOUTS.values(), ids=lambda layout: layout.revision)
def test_the_sqlite_snapshot_is_what_its_revision_creates(
    layout: SQLiteLayout, tmp_path: Path
) -> None:
    store = tmp_path / "store.db"
    migrate.upgrade(str(store), layout.revision)
    found = master(store)
    assert found[layout.view] == ("view", found[layout.view][1])
    assert normalised(found[layout.view][1]) == normalised(layout.view_sql)
    created = {layout.view}
    for index in layout.indexes:
        assert normalised(found[index.name][1]) == normalised(index.external_sql), index.name
        created.add(index.name)
        for name, sql in zip(index.trigger_names, index.triggers, strict=True):
            assert found[name][0] == "trigger"
            assert normalised(found[name][1]) == normalised(sql), name
            created.add(name)
    # Nothing else of the search mechanism: the snapshot is the whole of it.
    shadows = {
        f"{index.name}{suffix}"
        for index in layout.indexes
        for suffix in ("_data", "_idx", "_docsize", "_config")
    }
    ours = {name for name in found if name.startswith("messages_fts")}
    assert ours - shadows == created


@pytest.mark.parametrize("layout", SQLITE_LAYOUTS.values(), ids=lambda layout: layout.revision)
def test_the_legacy_forms_are_what_the_application_chain_creates(
    layout: SQLiteLayout, tmp_path: Path
) -> None:
    """The inline declarations and triggers, broad (schema 17) and narrow (schema 30)."""
    base = script_directory().get_revision(sqlite_revision(layout.revision))
    assert base is not None
    broad, narrow = tmp_path / "broad.db", tmp_path / "narrow.db"
    migrate.upgrade(str(broad), str(base.down_revision))
    migrate.upgrade(str(narrow), str(LAST_APP_VERSION))
    for store, display in ((broad, False), (narrow, True)):
        found = master(store)
        for index in layout.indexes:
            assert normalised(found[index.name][1]) == normalised(index.inline_sql)
            for name, sql in zip(
                index.trigger_names, index.legacy_triggers_at(display), strict=True
            ):
                assert normalised(found[name][1]) == normalised(sql), (store.name, name)


@pytest.mark.parametrize("layout", SQLITE_LAYOUTS.values(), ids=lambda layout: layout.revision)
def test_the_derived_sqlite_forms_equal_the_revisions_own(layout: SQLiteLayout) -> None:
    """The staged forms (a deferred rebuild beside the legacy index), the suffixes and the
    change log's names, which only some stores ever hold, against the revision's copy."""
    module = revision_module(sqlite_revision(layout.revision))
    assert layout.staged_suffix == module.STAGED_SUFFIX
    assert layout.retired_suffix == module.RETIRED_SUFFIX
    assert layout.retired_copy_suffix == module.RETIRED_COPY_SUFFIX
    assert layout.marker == module.LAYOUT_EXTERNAL
    assert layout.application_marker == module.LAYOUT_APPLICATION
    assert declarations.LAYOUT_MARKER == module.LAYOUT_MARKER
    assert declarations.APPLICATION_VIEW == module.APPLICATION_VIEW
    log = layout.change_log
    assert (log.table, log.id_key, log.verified_key, log.exact) == (
        module.CHANGE_LOG,
        module.LOG_ID_KEY,
        module.VERIFIED_KEY,
        module.EXACT,
    )
    assert layout.indexed_expression("m") == " ".join(module.INDEXED_EXPRESSION.split())
    for index in layout.indexes:
        assert layout.staged_table(index.name) == module.STAGED_TABLES[index.name]
        assert layout.staged_trigger_names(index.name) == module.STAGED_TRIGGER_NAMES[index.name]
        staged = [normalised(sql) for sql in layout.staged_triggers(index.name)]
        assert staged == [normalised(sql) for sql in module.STAGED_TRIGGERS[index.name]]
        for display in (False, True):
            mine = [normalised(sql) for sql in index.legacy_triggers_at(display)]
            theirs = [normalised(sql) for sql in module.legacy_triggers(index.name, display)]
            assert mine == theirs


def test_the_library_and_the_revision_recognise_each_others_change_log(tmp_path: Path) -> None:
    """The upgrade installs the log with the library's code; the conversion revision trusts
    a verdict only with a log it recognises as its own."""
    store = tmp_path / "legacy.db"
    migrate.upgrade(str(store), "17")
    module = revision_module(sqlite_revision(declarations.SQLITE.revision))
    engine = sa.create_engine(f"sqlite:///{store}")
    try:
        with engine.begin() as conn:
            log_id = changelog.start_change_log(conn)
            assert module.current_log_id(conn) == log_id == changelog.current_log_id(conn)
            assert changelog.change_triggers(["messages"]) == module.change_triggers(["messages"])
            for index in declarations.SQLITE.indexes:
                assert changelog.verify_inline(conn, index.name) == module.verify_inline(
                    conn, index.name
                )
            changelog.drop_change_log(conn)
            assert module.current_log_id(conn) is None
            log_id = module.start_change_log(conn)
            assert changelog.current_log_id(conn) == log_id
            module.drop_change_log(conn)
    finally:
        engine.dispose()


# -- PostgreSQL ----------------------------------------------------------------------------


def pg_rows(url: str, statement: str) -> list[tuple[object, ...]]:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.text(statement))]
    finally:
        engine.dispose()


def pg_functions(url: str) -> dict[str, str]:
    """ "name(args)" (no spaces) -> prosrc of each function in the current schema."""
    rows = pg_rows(
        url,
        "SELECT p.oid::regprocedure::text, p.prosrc FROM pg_proc p"
        " WHERE p.pronamespace = current_schema()::regnamespace",
    )
    return {str(signature): str(source) for signature, source in rows}


def pg_triggers(url: str) -> dict[str, str]:
    rows = pg_rows(
        url,
        "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger"
        " WHERE tgrelid = 'messages'::regclass AND NOT tgisinternal",
    )
    return {str(name): str(definition) for name, definition in rows}


@pytest.mark.postgresql
@pytest.mark.parametrize("layout", POSTGRESQL_LAYOUTS.values(), ids=lambda layout: layout.revision)
def test_the_postgresql_snapshot_is_what_its_revision_creates(
    layout: PostgreSQLLayout, pg_url: str
) -> None:
    migrate.upgrade(pg_url, layout.revision)
    (schema,) = pg_rows(pg_url, "SELECT current_schema()")[0]
    extensions = dict(
        pg_rows(pg_url, "SELECT extname, extnamespace::regnamespace::text FROM pg_extension")
    )
    assert set(layout.extensions) <= set(extensions)
    unaccent = str(extensions["unaccent"])
    functions = pg_functions(pg_url)
    for signature, create in layout.functions.items():
        source = functions[signature.replace(" ", "")]
        assert " ".join(source.split()) == function_body(ddl(create, unaccent)), signature
    indexes = dict(
        pg_rows(
            pg_url,
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE 'messages_fts%'",
        )
    )
    assert set(indexes) == set(layout.indexes)
    for name, create in layout.indexes.items():
        found = index_expression(str(indexes[name]), str(schema))
        assert found == index_expression(ddl(create), str(schema)), name
    (marker,) = pg_rows(
        pg_url, f"SELECT value FROM state_meta WHERE key = '{declarations.LAYOUT_MARKER}'"
    )[0]
    assert marker == layout.marker
    vectors = pg_rows(
        pg_url,
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'messages'"
        " AND udt_name = 'tsvector'",
    )
    assert [name for (name,) in vectors] == ([layout.words_column] if layout.words_column else [])
    triggers = pg_triggers(pg_url)
    for trigger in layout.row_triggers:
        source = functions[f"{trigger.name}()"]
        assert " ".join(source.split()) == function_body(ddl(trigger.function_sql))
        printed = " ".join(triggers[trigger.name].split()).replace(f" ON {schema}.", " ON ")
        assert printed == " ".join(trigger.trigger_sql.split())


@pytest.mark.postgresql
@pytest.mark.parametrize(
    "snapshot", POSTGRESQL_TRIGGERS, ids=lambda snapshot: str(snapshot.app_version)
)
def test_the_postgresql_triggers_are_what_their_revision_creates(
    snapshot: PostgreSQLTriggers, pg_url: str
) -> None:
    """The functions' bodies as pg_proc holds them, and each trigger as the server prints it
    against the same trigger created again from the snapshot's DDL."""
    migrate.upgrade(pg_url, str(snapshot.app_version))
    functions = pg_functions(pg_url)
    created = pg_triggers(pg_url)
    assert set(created) == {trigger.name for trigger in snapshot.triggers}
    for trigger in snapshot.triggers:
        assert " ".join(functions[f"{trigger.name}()"].split()) == function_body(
            ddl(trigger.function_sql)
        ), trigger.name
    engine = sa.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            for trigger in snapshot.triggers:
                conn.execute(sa.text(f"DROP TRIGGER {trigger.name} ON messages"))
                conn.execute(sa.text(ddl(trigger.function_sql)))
                conn.execute(sa.text(ddl(trigger.trigger_sql)))
    finally:
        engine.dispose()
    assert pg_triggers(pg_url) == created

"""URL resolution, the engine factory's PRAGMAs, file modes, WAL fallback and transactions."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, event, inspect, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from hermes_store import migrate
from hermes_store.engine import (
    BEGIN_OPTION,
    BUSY_TIMEOUT_MS,
    create_store_engine,
    db_path,
    hermes_home,
    resolve_url,
    to_url,
    translate_error,
)
from hermes_store.errors import DiskFull, ServerUnavailable, StoreError, StoreNotFound
from hermes_store.sqlite.engine import WalUnavailableWarning
from hermes_store.store import NewMessage, Store


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """A usual umask, so that 0600 is the code's doing and 0644 the default."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def engine(db_file: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """An engine over a new store file, with the default busy timeout."""
    monkeypatch.delenv("HERMES_STORE_BUSY_TIMEOUT_MS", raising=False)
    built = create_store_engine(db_file)
    yield built
    built.dispose()


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


# -- URL resolution ------------------------------------------------------------------


def test_explicit_argument_wins_over_env_and_home(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_STORE_URL", to_url(tmp_path / "env.db"))
    explicit = tmp_path / "explicit.db"
    assert db_path(resolve_url(explicit)) == explicit
    assert db_path(resolve_url(str(explicit))) == explicit
    assert resolve_url("sqlite:////elsewhere/x.db") == "sqlite:////elsewhere/x.db"


def test_env_url_wins_over_home(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_STORE_URL", to_url(tmp_path / "env.db"))
    assert db_path(resolve_url()) == tmp_path / "env.db"
    # A plain path in the variable is accepted too.
    monkeypatch.setenv("HERMES_STORE_URL", str(tmp_path / "plain.db"))
    assert db_path(resolve_url()) == tmp_path / "plain.db"
    # An empty variable counts as unset.
    monkeypatch.setenv("HERMES_STORE_URL", "")
    assert db_path(resolve_url()) == isolated_home / "state.db"


def test_default_is_state_db_in_hermes_home(isolated_home: Path) -> None:
    assert hermes_home() == isolated_home
    assert db_path(resolve_url()) == isolated_home / "state.db"


def test_hermes_home_defaults_to_dot_hermes_created_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    monkeypatch.delenv("HERMES_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    (tmp_path / "user").mkdir()
    expected = tmp_path / "user" / ".hermes"
    assert hermes_home() == expected
    assert not expected.exists()
    assert db_path(resolve_url(create_home=False)) == expected / "state.db"
    assert not expected.exists()
    assert db_path(resolve_url()) == expected / "state.db"
    assert expected.is_dir()
    assert _mode(expected) == 0o700


def test_missing_hermes_home_is_created_with_its_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    home = tmp_path / "a" / "b" / "hermes"
    monkeypatch.setenv("HERMES_HOME", str(home))
    with create_store_engine().connect():
        pass
    assert (home / "state.db").is_file()
    assert _mode(home) == 0o700


# -- to_url / db_path ----------------------------------------------------------------


def test_to_url_makes_paths_absolute_and_passes_urls_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert to_url("rel/state.db").startswith("sqlite:////")
    assert db_path(to_url("rel/state.db")) == tmp_path / "rel" / "state.db"
    assert db_path(to_url(Path("state.db"))) == tmp_path / "state.db"
    assert db_path(to_url("~/x.db")) == tmp_path / "user" / "x.db"
    assert to_url("sqlite:///relative.db") == "sqlite:///relative.db"
    assert to_url("sqlite://") == "sqlite://"
    assert to_url(":memory:") == "sqlite://"


@pytest.mark.parametrize(
    "directory", ["with space", "100%20percent", "what?query=1", "hash#tag", "ünïcödé", "a@b:c"]
)
def test_awkward_directory_names_name_exactly_that_file(tmp_path: Path, directory: str) -> None:
    root = tmp_path / "stores"
    path = root / directory / "state db.sqlite"
    url = to_url(path)
    assert make_url(url).database == str(path)
    assert db_path(url) == path
    # End to end: the upgrade and the store open that very file and nothing else.
    migrate.upgrade(url)
    with Store.open(path) as store:
        store.create_session("s1", "cli")
    assert path.is_file()
    assert [p.name for p in root.iterdir()] == [directory]
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT id FROM sessions").fetchall() == [("s1",)]


def test_db_path(tmp_path: Path) -> None:
    assert db_path(f"sqlite:///{tmp_path}/s.db") == tmp_path / "s.db"
    assert db_path(f"sqlite:///file:{tmp_path}/s.db?mode=ro&uri=true") == tmp_path / "s.db"
    assert db_path("sqlite:///relative.db") == Path("relative.db")
    for memory in (
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:///file::memory:?uri=true",
        "sqlite:///file:shared?mode=memory&cache=shared&uri=true",
    ):
        assert db_path(memory) is None, memory
    assert db_path("postgresql+psycopg://host/db") is None  # a server, not a file
    with pytest.raises(ValueError, match="only supports SQLite and PostgreSQL"):
        db_path("mysql://host/db")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u:secret@h:5433/db", "postgresql+psycopg://u:secret@h:5433/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ],
)
def test_postgresql_urls_name_the_psycopg_driver(given: str, expected: str) -> None:
    assert to_url(given) == expected


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("mysql://root@h/db", "runs on SQLite"),
        ("postgresql+psycopg2://u@h/db", "psycopg 3 only"),
    ],
)
def test_other_databases_are_refused_in_one_line(given: str, says: str) -> None:
    with pytest.raises(StoreError, match=says):
        create_store_engine(given)


def test_an_unreachable_server_is_a_clear_error_without_the_password() -> None:
    engine = create_store_engine("postgresql://u:hunter2@127.0.0.1:1/db")
    with pytest.raises(ServerUnavailable, match="server is running") as raised:
        engine.connect()
    assert "hunter2" not in str(raised.value)
    engine.dispose()


def test_in_memory_store_keeps_its_data_between_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_store_engine(":memory:")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t(a)")
        assert "t" in _tables(engine)
    finally:
        engine.dispose()
    # A shared-cache memory URI is not mistaken for a file called "shared".
    monkeypatch.chdir(tmp_path / "hermes-home")
    create_store_engine("sqlite:///file:shared?mode=memory&cache=shared&uri=true").dispose()
    assert list(Path.cwd().iterdir()) == []


# -- PRAGMAs -------------------------------------------------------------------------


def test_connection_pragmas_are_in_force(engine: Engine) -> None:
    with engine.connect() as conn:
        pragma = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "foreign_keys", "recursive_triggers", "busy_timeout")
        }
    assert pragma == {
        "journal_mode": "wal",
        "foreign_keys": 1,
        "recursive_triggers": 1,
        "busy_timeout": BUSY_TIMEOUT_MS,
    }
    raw = engine.raw_connection()
    try:
        assert raw.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert raw.execute("PRAGMA recursive_triggers").fetchone()[0] == 1
    finally:
        raw.close()


# 1001 / 1000 * 1000 is 1000.999...: sqlite3.connect's timeout must not lose the millisecond.
@pytest.mark.parametrize("busy_ms", [1001, 1234])
def test_busy_timeout_and_wal_are_configurable(db_file: Path, busy_ms: int) -> None:
    engine = create_store_engine(db_file, busy_timeout_ms=busy_ms, wal=False)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == busy_ms
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
    finally:
        engine.dispose()


def test_foreign_keys_are_enforced(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE parent(id INTEGER PRIMARY KEY)")
        conn.exec_driver_sql("CREATE TABLE child(parent_id INTEGER REFERENCES parent(id))")
    with pytest.raises(IntegrityError, match="FOREIGN KEY constraint failed"):
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO child VALUES (42)")


# -- WAL fallback --------------------------------------------------------------------


def _write_and_read(url: str) -> tuple[str, list[str | None]]:
    """Use a store end to end; return its journal mode and what it read back."""
    with Store.open(url) as store:
        with store.engine.connect() as conn:
            mode = str(conn.exec_driver_sql("PRAGMA journal_mode").scalar())
        store.create_session("s1", "cli")
        store.append_message("s1", NewMessage("user", "still works"))
        return mode, [m.content for m in store.messages("s1")]


def test_a_file_system_that_refuses_wal_falls_back_with_a_warning(db_file: Path) -> None:
    # The unix-dotfile VFS (what SQLite uses where POSIX locks are missing) has no shared
    # memory, so SQLite refuses WAL on it exactly as on such network file systems.
    url = f"sqlite:///file:{db_file}?vfs=unix-dotfile&uri=true"
    with pytest.warns(WalUnavailableWarning, match="refused WAL"):
        migrate.upgrade(url)
    with pytest.warns(WalUnavailableWarning, match=str(db_file)):
        result = _write_and_read(url)
    assert result == ("delete", ["still works"])
    assert not db_file.with_name(db_file.name + "-wal").exists()


# -- creation and file modes ---------------------------------------------------------


def test_create_false_on_a_missing_file_raises_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nowhere" / "state.db"
    with pytest.raises(StoreNotFound, match=r"no such database.*hermes-store upgrade"):
        create_store_engine(missing, create=False)
    assert not missing.parent.exists()
    # Through the default location: neither the file nor HERMES_HOME appears.
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("HERMES_HOME", str(home))
    with pytest.raises(StoreNotFound, match=str(home / "state.db")):
        create_store_engine(create=False)
    assert not home.exists()
    with pytest.raises(StoreNotFound):
        Store.open()
    assert not home.exists()


def test_create_false_opens_an_existing_store(db_file: Path) -> None:
    create_store_engine(db_file).dispose()
    engine = create_store_engine(db_file, create=False)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        engine.dispose()


def test_a_new_store_file_is_private(db_file: Path) -> None:
    old = os.umask(0)  # even a permissive umask does not widen it
    try:
        engine = create_store_engine(db_file)
    finally:
        os.umask(old)
    try:
        assert _mode(db_file) == 0o600
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t(a)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            for suffix in ("-wal", "-shm"):
                side = db_file.with_name(db_file.name + suffix)
                assert side.exists()
                assert _mode(side) == 0o600, suffix
    finally:
        engine.dispose()


def test_an_existing_readable_store_and_its_wal_files_are_tightened(
    db_file: Path, umask_022: None
) -> None:
    holder = sqlite3.connect(db_file)  # keeps -wal and -shm alive while open
    try:
        holder.execute("PRAGMA journal_mode=WAL")
        holder.execute("CREATE TABLE t(a)")
        holder.execute("INSERT INTO t VALUES (1)")
        holder.commit()
        files = [db_file, *(db_file.with_name(db_file.name + s) for s in ("-wal", "-shm"))]
        for path in files:
            path.chmod(0o644)
        engine = create_store_engine(db_file)
        try:
            assert [_mode(path) for path in files] == [0o600, 0o600, 0o600]
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT a FROM t").scalar() == 1
        finally:
            engine.dispose()
    finally:
        holder.close()


def test_side_files_created_next_to_a_private_store_are_private_whatever_the_umask(
    db_file: Path, umask_022: None
) -> None:
    """Why opening a private store need not look at its -wal / -shm: SQLite gives the side
    files it creates the store's own mode, whoever creates them (here a plain sqlite3
    writer under umask 022, as the legacy application runs)."""
    create_store_engine(db_file).dispose()
    assert _mode(db_file) == 0o600
    writer = sqlite3.connect(db_file)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("CREATE TABLE t(a)")
        writer.commit()
        for suffix in ("-wal", "-shm"):
            assert _mode(db_file.with_name(db_file.name + suffix)) == 0o600, suffix
    finally:
        writer.close()


# -- transactions --------------------------------------------------------------------


class Boom(Exception):
    """Raised inside a transaction to roll it back."""


def _create_table_then_fail(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE x(a)")
        conn.exec_driver_sql("INSERT INTO x VALUES (1)")
        assert "x" in {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master")}
        raise Boom


def test_ddl_rolls_back_with_its_transaction(engine: Engine) -> None:
    with pytest.raises(Boom):
        _create_table_then_fail(engine)
    assert "x" not in _tables(engine)


def test_plain_sqlite3_autocommits_ddl_which_is_why_the_engine_begins_itself(
    db_file: Path,
) -> None:
    raw = sqlite3.connect(db_file)  # the stdlib default: no BEGIN before DDL
    try:
        raw.execute("CREATE TABLE x(a)")
        raw.rollback()
        assert raw.execute("SELECT name FROM sqlite_master").fetchall() == [("x",)]
    finally:
        raw.close()


def test_savepoints_roll_back_only_the_inner_work(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t(a)")
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        nested = conn.begin_nested()
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        nested.rollback()
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT a FROM t").scalars().all() == [1]


@pytest.fixture
def contender(db_file: Path, engine: Engine) -> Iterator[Engine]:
    """A second engine on the same store that gives up on a lock almost at once."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t(a)")
    other = create_store_engine(db_file, busy_timeout_ms=20)
    yield other
    other.dispose()


def test_begin_immediate_takes_the_write_lock_at_begin(engine: Engine, contender: Engine) -> None:
    with engine.connect().execution_options(**{BEGIN_OPTION: "IMMEDIATE"}) as holder:
        with holder.begin():  # nothing written yet: BEGIN IMMEDIATE alone holds the lock
            with pytest.raises(OperationalError, match="database is locked"):
                with contender.begin() as conn:
                    conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        # Released with the transaction.
        with contender.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (2)")


def test_default_begin_is_deferred(engine: Engine, contender: Engine) -> None:
    with engine.connect() as holder, holder.begin():
        with contender.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")


def test_store_writes_take_the_write_lock_at_begin(db_file: Path, contender: Engine) -> None:
    with Store.open(db_file) as store, store.orm_writer() as db, db.begin():
        db.connection()  # BEGIN IMMEDIATE is issued when the session gets its connection
        with pytest.raises(OperationalError, match="database is locked"):
            with contender.begin() as conn:
                conn.exec_driver_sql("INSERT INTO t VALUES (1)")


def test_an_unknown_begin_mode_is_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="sqlite_begin must be one of"):
        with engine.connect().execution_options(**{BEGIN_OPTION: "LATER"}) as conn:
            conn.begin()


# -- a full disk ---------------------------------------------------------------------


@pytest.fixture
def page_limited(engine: Engine) -> Engine:
    """The engine's store at its page limit (SQLITE_FULL, as on a full disk) from now on."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t(a)")
    engine.dispose()

    @event.listens_for(engine, "connect")
    def _limit(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    return engine


def test_a_full_disk_is_named_through_every_error_that_follows_it(page_limited: Engine) -> None:
    """SQLite rolls the whole transaction back: rolling back the savepoint then fails with
    'no such savepoint', which is a consequence, and is named as the full disk too."""
    with page_limited.connect() as conn:
        with pytest.raises(DiskFull, match="disk is full") as after:  # noqa: PT012
            with conn.begin():
                savepoint = conn.begin_nested()
                with pytest.raises(DiskFull, match="database or disk is full") as first:
                    conn.exec_driver_sql("INSERT INTO t VALUES (zeroblob(100000))")
                assert not isinstance(first.value, DBAPIError)  # no fallback catches it
                savepoint.rollback()  # outside the handler: nothing chains it to the first
        assert "then: no such savepoint" in str(after.value)
        # The next transaction starts afresh: its own errors are its own.
        with conn.begin():
            with pytest.raises(OperationalError, match="no such table"):
                conn.exec_driver_sql("SELECT * FROM missing")
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 0


def _second_error_after_a_full_disk(raw: sqlite3.Connection) -> None:
    """SQLITE_FULL, then, while handling it, the savepoint SQLite already rolled back."""
    try:
        raw.execute("INSERT INTO t VALUES (zeroblob(100000))")
    except sqlite3.OperationalError:
        raw.execute("ROLLBACK TO s")


def test_translate_error_reads_sqlite_codes_and_the_exception_chain(db_file: Path) -> None:
    raw = sqlite3.connect(db_file, isolation_level=None)
    try:
        raw.execute("CREATE TABLE t(a)")
        raw.execute(f"PRAGMA max_page_count = {raw.execute('PRAGMA page_count').fetchone()[0]}")
        raw.execute("BEGIN")
        raw.execute("SAVEPOINT s")
        with pytest.raises(sqlite3.OperationalError, match="no such savepoint") as later:
            _second_error_after_a_full_disk(raw)
    finally:
        raw.close()
    full = later.value.__context__
    assert isinstance(full, sqlite3.OperationalError)
    assert full.sqlite_errorname == "SQLITE_FULL"
    assert isinstance(translate_error(full, db_file), DiskFull)
    translated = translate_error(later.value, db_file)
    assert isinstance(translated, DiskFull)
    assert "database or disk is full" in str(translated)
    assert "\n" not in str(translated)
    # An error with no full disk behind it is left alone.
    assert translate_error(sqlite3.OperationalError("no such savepoint: s"), db_file) is None


# -- PostgreSQL passwords from the environment (nothing in argv) -----------------------

#: A password the test server (trust authentication) never checks: what matters is that
#: libpq sent it, read from where the operator put it, not from the URL.
ENV_PASSWORD = "from-the-environment"


def _password_sent(url: str) -> str | None:
    """The password the connection of a store engine used (libpq's PQpass)."""
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            driver_connection = conn.connection.driver_connection
            assert driver_connection is not None
            return driver_connection.info.password  # type: ignore[no-any-return]
    finally:
        engine.dispose()


@pytest.mark.postgresql
def test_a_url_without_a_password_takes_pgpassword(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    without = make_url(pg_url).set(password=None).render_as_string(hide_password=False)
    assert ENV_PASSWORD not in without
    monkeypatch.setenv("PGPASSWORD", ENV_PASSWORD)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent/pgpass")
    assert _password_sent(without) == ENV_PASSWORD
    # A password in the URL is the one sent, as libpq does.
    given = make_url(pg_url).set(password="in-the-url").render_as_string(hide_password=False)
    assert _password_sent(given) == "in-the-url"


@pytest.mark.postgresql
def test_a_url_without_a_password_takes_the_password_file(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = make_url(pg_url)
    passfile = tmp_path / "pgpass"
    passfile.write_text(
        f"{url.host}:{url.port or 5432}:{url.database}:{url.username}:{ENV_PASSWORD}\n"
    )
    passfile.chmod(0o600)  # libpq ignores a password file others may read
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    assert _password_sent(url.set(password=None).render_as_string(hide_password=False)) == (
        ENV_PASSWORD
    )
    # ~/.pgpass is libpq's default for PGPASSFILE.
    monkeypatch.delenv("PGPASSFILE")
    monkeypatch.setenv("HOME", str(tmp_path))
    passfile.rename(tmp_path / ".pgpass")
    assert _password_sent(url.set(password=None).render_as_string(hide_password=False)) == (
        ENV_PASSWORD
    )

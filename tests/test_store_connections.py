"""A store opened with ``Store.open`` runs on sqlite3 connections of its own.

Its engine is created only when something needs one (the ORM sessions, a search's rare
paths). What a user sees must not change: the same refusals and errors on opening, the
same PRAGMAs on every connection, each thread its own connection, nothing left open
once the store is closed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

from hermes_store import migrate
from hermes_store.engine import (
    BUSY_TIMEOUT_MS,
    ENV_BUSY_TIMEOUT,
    create_store_engine,
)
from hermes_store.errors import NotADatabase, StoreNotFound, UnsafePath
from hermes_store.models import Message
from hermes_store.prepared import StoreConnections, driver
from hermes_store.sqlite.engine import WalUnavailableWarning
from hermes_store.store import NewMessage, Store


@pytest.fixture(scope="module")
def head_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "state.db"
    migrate.upgrade(str(path))
    return path


@pytest.fixture
def store_file(head_template: Path, tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    shutil.copyfile(head_template, path)
    return path


def open_descriptors(path: Path) -> list[str]:
    """This process's open files that are the store or one of its side files."""
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("needs /proc/self/fd")
    found = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


def _pragmas(conn: Any) -> dict[str, Any]:
    return {
        name: conn.execute(f"PRAGMA {name}").fetchone()[0]
        for name in ("journal_mode", "foreign_keys", "recursive_triggers", "busy_timeout")
    }


# -- the connections -------------------------------------------------------------------


def test_an_opened_store_runs_on_connections_of_its_own(store_file: Path) -> None:
    with Store.open(store_file) as store:
        assert isinstance(store._connections, StoreConnections)
        store.create_session("s1", "cli")
        store.append_message("s1", NewMessage("user", "hello"))
        assert [m.content for m in store.messages("s1")] == ["hello"]
        assert store.get_session("s1") is not None
        assert [s.id for s in store.list_sessions()] == ["s1"]
        assert not store._connections.has_engine  # none of that needed the engine
        # The first search of a connection learns the layout through the engine; the
        # next ones run on the store's own connection alone.
        assert store.search("hello")[0]["session_id"] == "s1"
        checkouts: list[object] = []
        event.listen(store.engine.pool, "checkout", lambda *args: checkouts.append(args))
        for query in ("hello", "hel*", "nothing"):
            store.search(query)
        assert checkouts == []


def test_its_connections_are_set_up_as_the_engines_are(
    store_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.open(store_file) as store:
        with driver(store._connections) as db:
            own = _pragmas(db.connection)
        with store.engine.connect() as conn:
            engines = _pragmas(conn.connection.driver_connection)
    assert (
        own
        == engines
        == {
            "journal_mode": "wal",
            "foreign_keys": 1,
            "recursive_triggers": 1,
            "busy_timeout": BUSY_TIMEOUT_MS,
        }
    )
    monkeypatch.setenv(ENV_BUSY_TIMEOUT, "1234")
    with Store.open(store_file) as store, driver(store._connections) as db:
        assert _pragmas(db.connection)["busy_timeout"] == 1234
        assert store.engine.url == create_store_engine(store_file).url


def test_a_closed_store_leaves_no_connection_open(store_file: Path) -> None:
    store = Store.open(store_file)
    store.create_session("s1", "cli")
    store.append_message("s1", NewMessage("user", "hello"))
    with store.orm_session() as db:  # the engine's connections too
        assert db.scalar(select(func.count()).select_from(Message)) == 1
    assert open_descriptors(store_file)
    store.close()
    assert open_descriptors(store_file) == []
    # The last connection to close checkpointed the WAL and removed it, as SQLite does.
    assert not Path(f"{store_file}-wal").exists()
    # A closed store is still usable: it reconnects (and closes again).
    assert [m.content for m in store.messages("s1")] == ["hello"]
    store.close()
    assert open_descriptors(store_file) == []


def test_a_connection_in_use_when_the_store_closes_is_closed_when_given_back(
    store_file: Path,
) -> None:
    store = Store.open(store_file)
    with driver(store._connections) as db:
        store.close()
        # The caller's connection still works until its block ends ...
        assert db.run("SELECT count(*) FROM sessions").fetchone() == (0,)
    # ... and is closed then, not kept.
    assert open_descriptors(store_file) == []
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        db.connection.execute("SELECT 1")


def test_each_thread_gets_a_connection_of_its_own(store_file: Path) -> None:
    with Store.open(store_file) as store:
        store.create_session("s1", "cli")
        inside = threading.Barrier(3)
        seen: list[int] = []
        failures: list[BaseException] = []

        def work() -> None:
            try:
                with driver(store._connections) as db:
                    seen.append(id(db.connection))
                    inside.wait(timeout=10)  # all three hold a connection at once
                    db.run("SELECT count(*) FROM messages").fetchall()
                for i in range(20):
                    store.append_message("s1", NewMessage("user", f"from a thread {i}"))
                    store.messages("s1")
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)

        threads = [threading.Thread(target=work) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert len(set(seen)) == 3
        assert len(store.messages("s1")) == 60
        record = store.get_session("s1")
        assert record is not None
        assert record.message_count == 60


def test_the_engine_is_made_when_first_needed_and_shared(store_file: Path) -> None:
    with Store.open(store_file) as store:
        store.create_session("s1", "cli")
        with store.orm_writer() as db, db.begin():
            db.add(Message(session_id="s1", role="user", content="through the ORM", timestamp=1.0))
        assert store.engine is store.engine
        assert [m.content for m in store.messages("s1")] == ["through the ORM"]
        record = store.get_session("s1")
        assert record is not None
        assert record.message_count == 1  # the flush hook counted it
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM messages")).scalar() == 1


def test_a_search_that_needs_the_engine_gets_it(store_file: Path) -> None:
    with Store.open(store_file) as store:
        store.create_session("s1", "cli")
        ids = [store.append_message("s1", NewMessage("user", f"zanzibar {i}")) for i in range(3)]
    with sqlite3.connect(store_file) as conn:  # a damaged word index: searches scan instead
        conn.execute("DROP TRIGGER messages_fts_insert")
    with Store.open(store_file) as store:
        ids.append(store.append_message("s1", NewMessage("user", "zanzibar, unindexed")))
        for _ in range(2):
            results = store.search("zanzibar")
            assert results.degraded is not None
            assert sorted(hit["id"] for hit in results) == ids


def test_a_relative_url_names_the_file_of_the_directory_it_was_opened_in(
    store_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(store_file.parent)
    store = Store.open(f"sqlite:///{store_file.name}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # as an engine, the store keeps the file it was given
    try:
        store.create_session("s1", "cli")
        assert store.get_session("s1") is not None
        assert list(elsewhere.iterdir()) == []
    finally:
        store.close()


# -- opening refuses, warns and fails exactly as before ------------------------------


def _outcome(action: Callable[[], Any]) -> tuple[str, str]:
    """(exception type, message) an action raised, or ("ok", repr of what it returned)."""
    try:
        return "ok", repr(action())
    except Exception as exc:
        return f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc)


def _both_ways(url: Any, use: Callable[[Store], Any], **kwargs: Any) -> list[tuple[str, str]]:
    """What opening ``url`` and ``use``-ing the store gives: with Store.open, then with a
    Store over create_store_engine (how every store was opened before)."""
    results = []
    for opener in (
        lambda: Store.open(url, **kwargs),
        lambda: Store(create_store_engine(url, **kwargs)),
    ):
        opened: list[Store] = []

        def run(opener: Callable[[], Store] = opener, opened: list[Store] = opened) -> Any:
            opened.append(opener())
            return use(opened[0])

        results.append(_outcome(run))
        for store in opened:
            store.close()
    return results


def _read(store: Store) -> Any:
    return store.get_session("s1")


@pytest.mark.parametrize("create", [False, True])
def test_opening_a_directory_is_refused_the_same(tmp_path: Path, create: bool) -> None:
    first, second = _both_ways(tmp_path, _read, create=create)
    assert first == second
    assert first[0].endswith(NotADatabase.__name__)


def test_opening_a_missing_store_is_refused_the_same(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "state.db"
    first, second = _both_ways(missing, _read, create=False)
    assert first == second
    assert first[0].endswith(StoreNotFound.__name__)
    assert not missing.parent.exists()


@pytest.mark.parametrize("side", ["-wal", "-shm", "-journal"])
def test_a_link_at_a_side_file_is_refused_the_same(
    store_file: Path, tmp_path: Path, side: str
) -> None:
    Path(f"{store_file}{side}").symlink_to(tmp_path / "elsewhere")
    first, second = _both_ways(store_file, _read)
    assert first == second
    assert first[0].endswith(UnsafePath.__name__)


def test_a_dangling_link_is_refused_the_same(tmp_path: Path) -> None:
    link = tmp_path / "state.db"
    link.symlink_to(tmp_path / "gone.db")
    first, second = _both_ways(link, _read, create=True)
    assert first == second
    assert first[0].endswith(UnsafePath.__name__)
    assert not (tmp_path / "gone.db").exists()


def test_a_file_that_is_not_a_database_fails_the_same(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not a database, " * 100)
    first, second = _both_ways(path, _read)
    assert first == second
    assert "not a database" in first[1]


def test_a_store_not_at_head_fails_the_same(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    first, second = _both_ways(path, _read, create=True)
    assert first == second
    assert first[0] == "sqlalchemy.exc.OperationalError"
    assert "no such table: sessions" in first[1]


def test_a_store_locked_by_another_process_fails_the_same(
    store_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_BUSY_TIMEOUT, "50")
    with sqlite3.connect(store_file, isolation_level=None) as holder:
        holder.execute("PRAGMA journal_mode=DELETE")
        holder.execute("BEGIN EXCLUSIVE")  # nobody else may even read
        try:
            first, second = _both_ways(store_file, _read)
        finally:
            holder.execute("ROLLBACK")
    assert first == second
    assert "locked" in first[1]


def test_an_error_of_a_statement_is_the_same(store_file: Path) -> None:
    def append_to_nobody(store: Store) -> Any:
        if store.get_session("s1") is None:
            store.create_session("s1", "cli")
        return store.append_message("s1", NewMessage(role=None, content="secret"))  # type: ignore[arg-type]

    first, second = _both_ways(store_file, append_to_nobody)
    assert first[0] == second[0] == "sqlalchemy.exc.IntegrityError"
    assert first == second
    assert "secret" not in first[1]  # parameters hidden


def test_a_file_system_that_refuses_wal_warns_the_same(db_file: Path) -> None:
    url = f"sqlite:///file:{db_file}?vfs=unix-dotfile&uri=true"
    with pytest.warns(WalUnavailableWarning):
        migrate.upgrade(url)
    for n, opener in enumerate((lambda: Store.open(url), lambda: Store(create_store_engine(url)))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with opener() as store:
                store.create_session(f"s{n}", "cli")
                with driver(store._connections) as db:
                    assert _pragmas(db.connection)["journal_mode"] == "delete"
        assert [w.category for w in caught] == [WalUnavailableWarning]
        assert str(db_file) in str(caught[0].message)
    assert not Path(f"{db_file}-wal").exists()


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_store_created_by_open_is_private(umask_000: None, tmp_path: Path) -> None:
    path = tmp_path / "new" / "state.db"
    with Store.open(path, create=True) as store:
        with driver(store._connections) as db:
            db.run("CREATE TABLE t(a)")
            db.run("INSERT INTO t VALUES (1)")
            for suffix in ("", "-wal", "-shm"):
                assert Path(f"{path}{suffix}").stat().st_mode & 0o777 == 0o600, suffix
    loose = tmp_path / "loose.db"
    shutil.copyfile(path, loose)
    loose.chmod(0o644)
    Store.open(loose).close()
    assert loose.stat().st_mode & 0o777 == 0o600

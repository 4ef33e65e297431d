"""PostgreSQL keeps a search's statements prepared from one search to the next, plans the
index paths' statements once (a generic plan, not one per search's values), and a search
in the caller's transaction leaves its planner settings as it found them
(hermes_store/postgresql/reads.py).

psycopg forgets a connection's prepared statements at any ROLLBACK (ROLLBACK TO SAVEPOINT
too): a search that ended that way had the server parse and plan every statement again,
each time. Here the statements a search runs are still prepared after the next ones.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from test_search_postgresql import stores  # noqa: F401  (the module's stores, copied)

from hermes_store.search import search_messages
from hermes_store.store import Store

QUERIES = ("def", '"import os"', "pyth*", "数据库", "的")


def _prepared(conn: Connection) -> list[tuple[str, int, int]]:
    """Each prepared statement's text, and how many generic and custom plans it had."""
    sql = "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
    return [(str(row[0]), int(row[1]), int(row[2])) for row in conn.execute(text(sql))]


def _settings(conn: Connection) -> tuple[str, ...]:
    names = ("enable_seqscan", "enable_indexscan", "jit", "plan_cache_mode")
    return tuple(str(conn.execute(text(f"SHOW {name}")).scalar_one()) for name in names)


def test_a_search_s_statements_stay_prepared_across_searches(
    stores: tuple[Engine, Engine],  # noqa: F811
) -> None:
    _, server = stores
    store = Store.open(server.url.render_as_string(hide_password=False))
    try:
        for _ in range(8):  # past psycopg's threshold (5 runs of a statement)
            for query in QUERIES:
                assert store.search(query), query
        with store.engine.connect() as conn:  # the pool's one connection
            prepared = _prepared(conn)
    finally:
        store.close()
    searches = [plans for plans in prepared if "matches0" in plans[0]]
    assert searches, prepared
    assert any("current_setting" in statement for statement, _, _ in prepared), prepared
    # The word and trigram statements: planned once for any values, never for each search.
    assert all(generic > 0 and custom == 0 for _, generic, custom in searches), searches


def test_a_search_in_the_callers_transaction_gives_its_settings_back(
    stores: tuple[Engine, Engine],  # noqa: F811
) -> None:
    _, server = stores
    with server.connect() as conn:
        before = _settings(conn)
        for query in QUERIES:
            assert list(search_messages(conn, query)), query
        assert _settings(conn) == before
        conn.execute(text("SET LOCAL jit = on"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        conn.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))
        mine = _settings(conn)
        assert list(search_messages(conn, "python"))
        assert _settings(conn) == mine
        assert conn.execute(text("SELECT 1")).scalar_one() == 1


def test_a_search_in_its_own_transaction_leaves_the_pool_s_connection_as_it_was(
    stores: tuple[Engine, Engine],  # noqa: F811
) -> None:
    """A search's planner settings last as long as its transaction (the ranked trigram
    statement, a search's last, leaves them to end with it): the connection the pool gets
    back plans the application's next statement as before."""
    _, server = stores
    store = Store.open(server.url.render_as_string(hide_password=False))
    try:
        with store.engine.connect() as conn:  # the pool's one connection
            before = _settings(conn)
        for query in QUERIES:
            assert store.search(query), query
        with store.engine.connect() as conn:
            assert _settings(conn) == before
    finally:
        store.close()

"""PostgreSQL against SQLite on the same corpus: search latency by query class, and the
bytes of the tables plus their indexes (issue 12).

The SQLite side is the converted head store (`external`); the PostgreSQL side is the same
store copied with `hermes-store copy` into a database of its own. Each query class runs
the same queries through `search_messages` on both, with snippets and context rows.
Run one size with ``pytest benchmarks/test_bench_postgresql.py --bench-size N``; the
bytes are in each result's ``extra_info``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from benchmarks import layouts, workloads
from hermes_store.copy import copy_store
from hermes_store.engine import create_store_engine
from hermes_store.postgresql.storage import server_storage_report
from hermes_store.search import search_messages
from hermes_store.sqlite.storage import storage_report

pytestmark = pytest.mark.postgresql

DATABASES = ("sqlite", "postgresql")


@pytest.fixture(scope="module")
def databases(store_set: layouts.StoreSet, pg_server_url: str) -> Iterator[dict[str, Engine]]:
    """The external SQLite store and its copy in a PostgreSQL database made for the run."""
    sqlite_path = store_set.base(layouts.EXTERNAL)
    name = f"hermes_bench_pg_{os.getpid()}"
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(pg_server_url).set(database=name).render_as_string(hide_password=False)
    engines: dict[str, Engine] = {}
    try:
        copy_store(str(sqlite_path), url, verify=False)
        engines = {
            "sqlite": workloads.engine_for(sqlite_path),
            "postgresql": create_store_engine(url, create=False),
        }
        yield engines
    finally:
        for engine in engines.values():
            engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.mark.parametrize("query_class", list(workloads.QUERY_CLASSES))
@pytest.mark.parametrize("database", DATABASES)
def test_search_latency(
    benchmark: Any, databases: dict[str, Engine], database: str, query_class: str
) -> None:
    queries = workloads.QUERY_CLASSES[query_class]
    with databases[database].connect() as conn:

        def run() -> list[list[Any]]:
            return [search_messages(conn, query) for query in queries]

        answers = benchmark(run)
    benchmark.extra_info.update(database=database, query_class=query_class)
    assert any(answers), f"{database}: no query of {query_class!r} found anything"
    for hits in answers:
        assert all(hit["context"] for hit in hits)


def _bytes(database: str, engine: Engine) -> dict[str, Any]:
    """Bytes of the store's tables and indexes as each database counts them."""
    with engine.connect() as conn:
        if database == "postgresql":
            report = server_storage_report(conn)
            assert report.text_stored_once, (report.tsvector_columns, report.other_tables)
            return {
                "table_and_index_bytes": report.total_bytes,
                "search_index_bytes": sum(report.search_indexes.values()),
                "groups": report.groups,
            }
        sqlite_report = storage_report(conn)
        in_use = sqlite_report.file_bytes - sqlite_report.free_bytes
        return {"table_and_index_bytes": in_use, "groups": sqlite_report.groups}


@pytest.mark.parametrize("database", DATABASES)
def test_bytes_of_tables_and_indexes(
    benchmark: Any, databases: dict[str, Engine], database: str
) -> None:
    """One run: the report's own time, the bytes in extra_info."""
    figures = benchmark.pedantic(
        _bytes, args=(database, databases[database]), rounds=1, iterations=1
    )
    benchmark.extra_info.update(database=database, **figures)
    assert figures["table_and_index_bytes"] > 0

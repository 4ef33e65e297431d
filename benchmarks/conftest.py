"""Fixtures of the benchmarks: the corpus size, the layouts' stores (built once per session).

Run with ``pytest benchmarks`` (the root ``testpaths`` only names ``tests``). The size is
``--bench-size N`` or ``$BENCH_SIZE`` (default 1000, the CI smoke size):
``pytest benchmarks --benchmark-disable`` proves the code works without timing anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from benchmarks import layouts, workloads
from hermes_store.engine import to_url

DEFAULT_SIZE = 1000
#: The PostgreSQL server of the benchmarks that need one (they create and drop their own
#: databases): the tests' server by default, trust authentication.
PG_URL_ENV = "HERMES_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
#: Set (to 1) by CI: no reachable server fails those benchmarks instead of skipping them.
REQUIRE_PG_ENV = "HERMES_REQUIRE_PG"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hermes-store benchmarks")
    group.addoption(
        "--bench-size",
        type=int,
        default=None,
        help="messages in the generated corpus (default $BENCH_SIZE, else 1000)",
    )


@pytest.fixture(scope="session")
def bench_size(request: pytest.FixtureRequest) -> int:
    """Messages per generated corpus."""
    option = request.config.getoption("--bench-size")
    size = int(option if option is not None else os.environ.get("BENCH_SIZE") or DEFAULT_SIZE)
    if size < 200:
        raise pytest.UsageError(f"--bench-size must be at least 200 messages, got {size}")
    return size


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No upgrade reads or creates anything under the real ~/.hermes."""
    saved = {key: os.environ.get(key) for key in ("HERMES_HOME", "HERMES_STORE_URL")}
    home = tmp_path_factory.mktemp("hermes-home")
    workloads.isolate_environment(home)
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def store_set(bench_size: int, tmp_path_factory: pytest.TempPathFactory) -> layouts.StoreSet:
    """The base store of every layout (built on first use, kept for the session)."""
    return layouts.StoreSet(tmp_path_factory.mktemp("stores"), bench_size)


@pytest.fixture(scope="session")
def parity_queries() -> list[dict[str, Any]]:
    """The parity suite's queries (tests/parity_queries.py), pathological ones left out.

    A 512-term query takes about 20 s per store even at 1k messages (see
    ``workloads.PATHOLOGICAL_TERMS``); the report measures those separately.
    """
    regular, _pathological = workloads.split_parity_queries(workloads.load_parity_queries())
    return regular


@pytest.fixture(scope="session")
def inline_answers(store_set: layouts.StoreSet, parity_queries: list[dict[str, Any]]) -> list[Any]:
    """Every parity query's answer on the inline store: the reference."""
    return workloads.parity_answers(store_set.base(layouts.INLINE), parity_queries)


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """A PostgreSQL server that answers (its URL); skipped with the reason when none does,
    unless HERMES_REQUIRE_PG=1."""
    url = make_url(to_url(os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL))
    engine = create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except DBAPIError as exc:
        reason = (
            f"no PostgreSQL server at {url.render_as_string(hide_password=True)} "
            f"({str(exc.orig).strip().splitlines()[0]}); set {PG_URL_ENV}"
        )
        if os.environ.get(REQUIRE_PG_ENV, "") not in ("", "0"):
            pytest.fail(f"{reason} ({REQUIRE_PG_ENV} is set)", pytrace=False)
        pytest.skip(reason)
    finally:
        engine.dispose()
    return url.render_as_string(hide_password=False)

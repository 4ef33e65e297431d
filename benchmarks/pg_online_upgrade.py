"""Does the stored-words upgrade (revision fts2) block the agent on PostgreSQL?

A store at fts1's layout (expression indexes) is filled with ``--messages`` messages, then
``hermes-store upgrade`` runs while an agent-like writer appends through the Store API
(one transaction a message) and a searcher searches, each in its own process. The writer
records how long each append took; the figure is its longest append while the upgrade
ran (the target: under 1 s at 500k messages), with its p99, the searcher's longest search,
the upgrade's time and whether any process met an error::

    python -m benchmarks.pg_online_upgrade --messages 500000

PostgreSQL is the server at ``--pg`` (default ``$HERMES_BENCH_PG_URL``, else
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``); the run creates and drops a
database of its own there. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from hermes_store import migrate

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
BEFORE = "merge_30_fts1"

#: The agent: appends until told to stop (stdin closes), then prints its latencies.
WRITER = """
import json, sys, threading, time
from hermes_store.store import NewMessage, Store
url = sys.argv[1]
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
latencies, errors = [], []
with Store.open(url) as store:
    store.create_session("agent", "cli")
    print("ready", flush=True)
    n = 0
    while not done.is_set():
        started = time.monotonic()
        try:
            store.append_message("agent", NewMessage("user", f"agent turn {n} about tokens"))
        except Exception as exc:
            errors.append(type(exc).__name__)
        latencies.append((started, time.monotonic() - started))
        n += 1
        time.sleep(0.01)
print(json.dumps({"latencies": latencies, "errors": errors}), flush=True)
"""
#: The searcher: a phrase query in a loop, same protocol.
SEARCHER = """
import json, sys, threading, time
from hermes_store.store import Store
url = sys.argv[1]
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
latencies, errors = [], []
with Store.open(url) as store:
    print("ready", flush=True)
    while not done.is_set():
        started = time.monotonic()
        try:
            store.search('"return self"', limit=20)
        except Exception as exc:
            errors.append(type(exc).__name__)
        latencies.append((started, time.monotonic() - started))
print(json.dumps({"latencies": latencies, "errors": errors}), flush=True)
"""

#: Messages of a few hundred characters, of varied words (tokenising costs what it would).
FILL = """
INSERT INTO messages (session_id, role, content, timestamp)
SELECT 's' || (g / 50), CASE WHEN g % 2 = 0 THEN 'user' ELSE 'assistant' END,
       'turn ' || g || ' def handler' || (g % 997) || '(self): return self.value ' ||
       repeat('word' || (g % 131) || ' token' || (g % 17) || ' ', CAST(1 + g % 40 AS integer)), g
FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) AS g
"""


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _start(script: str, url: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", script, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise RuntimeError(process.stderr.read() if process.stderr else "did not start")
    return process


def _finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(input="", timeout=120)
    if process.returncode != 0:
        raise RuntimeError(err[-2000:])
    return dict(json.loads(out.strip().splitlines()[-1]))


def build(url: str, messages: int) -> None:
    """A store at fts1's layout holding ``messages`` messages, analysed."""
    migrate.upgrade(url, BEFORE)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sessions (id, source, started_at)"
                " SELECT 's' || g, 'cli', g FROM generate_series(0, CAST(:n AS bigint)) AS g"
            ),
            {"n": messages // 50 + 1},
        )
    for low in range(1, messages + 1, 50_000):
        with engine.begin() as conn:
            conn.execute(text(FILL), {"low": low, "high": min(low + 49_999, messages)})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (ANALYZE) messages"))
    engine.dispose()


def run(url: str) -> dict[str, Any]:
    """The upgrade to head under the writer and the searcher; their figures."""
    writer, searcher = _start(WRITER, url), _start(SEARCHER, url)
    time.sleep(2.0)
    started = time.monotonic()
    upgrade = subprocess.run(
        [sys.executable, "-m", "hermes_store.cli", "upgrade", "--db", url, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    ended = time.monotonic()
    time.sleep(1.0)
    writes, searches = _finish(writer), _finish(searcher)
    during = [lat for at, lat in writes["latencies"] if started <= at <= ended]
    searched = [lat for at, lat in searches["latencies"] if started <= at <= ended]
    return {
        "upgrade_exit": upgrade.returncode,
        "upgrade_said": (upgrade.stderr or upgrade.stdout).strip().splitlines()[-1:],
        "upgrade_seconds": round(ended - started, 1),
        "appends_during": len(during),
        "longest_append_s": round(max(during, default=0.0), 3),
        "append_p99_s": round(_percentile(during, 0.99), 3),
        "writer_errors": writes["errors"],
        "searches_during": len(searched),
        "longest_search_s": round(max(searched, default=0.0), 3),
        "searcher_errors": searches["errors"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--pg", default=os.environ.get("HERMES_BENCH_PG_URL", DEFAULT_PG))
    args = parser.parse_args()
    name = f"hermes_bench_online_{os.getpid()}"
    admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.pg).set(database=name).render_as_string(hide_password=False)
    try:
        built = time.monotonic()
        build(url, args.messages)
        result = {"messages": args.messages, "build_seconds": round(time.monotonic() - built, 1)}
        result.update(run(url))
        print(json.dumps(result, indent=2))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()

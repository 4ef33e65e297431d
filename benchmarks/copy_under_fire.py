"""Copy under fire: a generated store copied SQLite -> PostgreSQL, killed with kill -9 at
chosen points, resumed, verified; then an uninterrupted copy for the rate; then the final
pass of a live move: the source changes a little (messages added, edited, deleted, a
session added) and the same copy runs again, timed step by step.

    python -m benchmarks.copy_under_fire --messages 50000 \\
        --server postgresql+psycopg://postgres@127.0.0.1:5432/postgres

Creates (and drops first) the databases ``copy_fire`` and ``copy_rate`` on that server.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from hermes_store import migrate
from hermes_store.copy import CopyProgress, copy_store, verify_copy
from hermes_store.demo import corpus

_CHILD = "import sys; from hermes_store.copy import copy_store; " + (
    "copy_store(sys.argv[1], sys.argv[2], verify=False)"
)


def build(path: Path, messages: int) -> None:
    """A store at head holding ``messages`` generated messages (multimodal ones included)."""
    migrate.upgrade(str(path))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(messages, 0))
        conn.commit()


def fresh_database(server: str, name: str) -> str:
    """Drop and create ``name`` on the server; its URL."""
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(server).set(database=name).render_as_string(hide_password=False)


def copied_messages(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM messages")).scalar_one())
    except Exception:  # not created yet
        return 0
    finally:
        engine.dispose()


def change_a_little(path: Path, messages: int) -> int:
    """What an agent writes in a few minutes: a session with ``messages`` new messages, as
    many edited, a tenth as many deleted. Returns the rows changed."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('0-final', 'cli', 1)")
        conn.executemany(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
            [("0-final", "user", f"a new message {i}", 2.0 + i) for i in range(messages)],
        )
        top = conn.execute("SELECT max(id) FROM messages").fetchone()[0]
        step = top // (messages + 1)
        conn.executemany(
            "UPDATE messages SET content = coalesce(content, '') || ' (edited)' WHERE id = ?",
            [(step * (i + 1),) for i in range(messages)],
        )
        conn.executemany(
            "DELETE FROM messages WHERE id = ?",
            [(step * (i + 1) + 1,) for i in range(max(messages // 10, 1))],
        )
        conn.commit()
    return 1 + 2 * messages + max(messages // 10, 1)


class Steps:
    """Seconds spent in each step of a copy, from its progress reports."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.step: str | None = None
        self.since = time.perf_counter()

    def __call__(self, state: CopyProgress) -> None:
        if state.step != self.step:
            self.stop()
            self.step = state.step

    def stop(self) -> None:
        now = time.perf_counter()
        if self.step is not None:
            self.seconds[self.step] = self.seconds.get(self.step, 0.0) + now - self.since
        self.since = now

    def __str__(self) -> str:
        return ", ".join(f"{step} {seconds:.1f} s" for step, seconds in self.seconds.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--kill-at", type=float, nargs="*", default=[0.16, 0.4, 0.72])
    parser.add_argument("--changed", type=int, default=100, help="messages the final pass gets")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        source = Path(directory) / "source.db"
        started = time.perf_counter()
        build(source, args.messages)
        print(
            f"built {args.messages} messages in {time.perf_counter() - started:.1f} s, "
            f"{source.stat().st_size / 1e6:.0f} MB"
        )
        before = hashlib.sha256(source.read_bytes()).hexdigest()

        target = fresh_database(args.server, "copy_fire")
        started = time.perf_counter()
        for share in args.kill_at:
            child = subprocess.Popen([sys.executable, "-c", _CHILD, str(source), target])
            while child.poll() is None and copied_messages(target) < share * args.messages:
                time.sleep(0.05)
            child.send_signal(signal.SIGKILL)
            child.wait()
            print(f"kill -9 at {copied_messages(target)} messages")
        result = copy_store(str(source), target, verify=False)
        print(
            f"resumed={result.resumed}; copy with {len(args.kill_at)} kills "
            f"{time.perf_counter() - started:.1f} s"
        )
        verification = verify_copy(str(source), target)
        print(
            f"verification {verification.seconds:.1f} s, ok={verification.ok}, "
            f"not checked: {verification.not_checked or 'nothing'}"
        )
        same = hashlib.sha256(source.read_bytes()).hexdigest() == before
        print(f"source byte-identical: {same}")

        target = fresh_database(args.server, "copy_rate")
        steps = Steps()
        result = copy_store(str(source), target, progress=steps)
        steps.stop()
        rows = sum(result.rows.values())
        print(
            f"uninterrupted: {rows} rows in {result.seconds:.1f} s, "
            f"{rows / result.seconds:.0f} rows/s ({steps})"
        )
        changed = change_a_little(source, args.changed)
        steps = Steps()
        final = copy_store(str(source), target, progress=steps)
        steps.stop()
        written = sum(final.rows.values()) + sum(c["deleted"] for c in final.changes.values())
        print(
            f"final pass after {changed} rows changed: {written} rows written in "
            f"{final.seconds:.1f} s ({steps}), {result.seconds / final.seconds:.1f}x faster "
            f"than the whole copy; verified={final.verification.ok}"
        )
        if not (verification.ok and same and final.verification.ok):
            sys.exit(1)


if __name__ == "__main__":
    main()

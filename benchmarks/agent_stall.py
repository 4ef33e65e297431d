"""Does maintenance stall the agent? An application-like writer, a long reader, and every
maintenance command in turn, each in its own process, against one store.

The writer does what the Hermes application does for each message: one transaction
(`BEGIN IMMEDIATE`, insert the message, bump the session's counters, commit) with the
application's connection settings (busy timeout 1 s) and retry budget (15 attempts with a
short jittered sleep). It records how long each message waited from its first attempt to
its commit, and the messages it gave up on. The reader holds one read transaction open
(a slow search, a backup) for most of the run.

Run from the command line for the report's figure::

    python -m benchmarks.agent_stall --messages 200000 --seconds 60

It builds the store (legacy inline, then `hermes-store upgrade`) unless ``--store`` names
one, and prints JSON: the writer's longest wait, its p99, errors, and each command's exit
status, time and longest write lock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The application's write settings: busy timeout 1 s, 15 attempts.
BUSY_TIMEOUT_S = 1.0
ATTEMPTS = 15
#: Commands run in turn while the writer writes (each: `hermes-store <args> --db PATH --json`).
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("optimize",),
    ("check",),
    ("check", "--repair"),
    ("optimize-storage",),
)

WRITER = r"""
import json, random, sqlite3, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
timeout, attempts = float(sys.argv[3]), int(sys.argv[4])
conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
conn.execute("PRAGMA journal_mode=WAL")
session = f"stall-{time.time_ns()}"
conn.execute(
    "INSERT INTO sessions (id, source, started_at, message_count, tool_call_count) "
    "VALUES (?, 'cli', ?, 0, 0)", (session, time.time()))
waits, errors, written = [], [], 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    first = time.monotonic()
    for attempt in range(attempts):
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO messages (session_id, role, content, timestamp) "
                "VALUES (?, 'user', ?, ?)",
                (session, f"stall probe {written} the agent keeps writing", time.time()))
            conn.execute(
                "UPDATE sessions SET message_count = message_count + 1 WHERE id = ?", (session,))
            conn.execute("COMMIT")
            break
        except sqlite3.OperationalError as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            time.sleep(random.uniform(0.02, 0.15))
    else:
        errors.append(written)
        continue
    waits.append(time.monotonic() - first)
    written += 1
    time.sleep(0.01)
print(json.dumps({"written": written, "errors": len(errors), "waits": waits, "session": session}))
"""

READER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN")
conn.execute("SELECT count(*) FROM messages").fetchone()
print("reading", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("SELECT count(*) FROM messages").fetchone()
conn.execute("COMMIT")
"""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hermes_store.cli", *args]


def run(path: Path, seconds: float = 60.0, reader_seconds: float = 40.0) -> dict[str, Any]:
    """Run the scenario against ``path``; what the writer saw and what each command did."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(seconds), str(BUSY_TIMEOUT_S), str(ATTEMPTS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path), str(reader_seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    commands: list[dict[str, Any]] = []
    try:
        assert reader.stdout is not None
        reader.stdout.readline()  # its read transaction is open
        started = time.monotonic()
        while time.monotonic() - started < seconds - 5:
            for args in COMMANDS:
                if time.monotonic() - started >= seconds - 5:
                    break
                began = time.monotonic()
                done = subprocess.run(
                    _cli(*args, "--db", str(path), "--json"),
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
                report: dict[str, Any] = {}
                with contextlib.suppress(ValueError):
                    report = json.loads(done.stdout)
                commands.append(
                    {
                        "command": " ".join(args),
                        "exit": done.returncode,
                        "seconds": round(time.monotonic() - began, 3),
                        "longest_write_lock_s": report.get("longest_write_lock_s"),
                        "error": done.stderr.strip().splitlines()[-1:] if done.returncode else [],
                    }
                )
        out, _ = writer.communicate(timeout=seconds + 120)
        reader.wait(timeout=reader_seconds + 120)
    finally:
        for process in (writer, reader):
            if process.poll() is None:
                process.kill()
                process.wait()
    seen = json.loads(out)
    waits = sorted(seen["waits"])
    return {
        "writer_messages": seen["written"],
        "writer_errors": seen["errors"],
        "writer_longest_wait_s": round(waits[-1], 3) if waits else None,
        "writer_p99_wait_s": round(waits[int(len(waits) * 0.99) - 1], 3) if waits else None,
        "writer_session": seen["session"],
        "commands": commands,
    }


def build_store(directory: Path, messages: int) -> Path:
    """A legacy inline store of ``messages`` generated messages, upgraded by hermes-store."""
    from benchmarks import layouts
    from hermes_store.demo import corpus

    path = directory / "state.db"
    layouts.build_inline(path, corpus.generate(messages, 0))
    subprocess.run(_cli("upgrade", "--db", str(path)), check=True, capture_output=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--reader-seconds", type=float, default=40.0)
    parser.add_argument("--store", type=Path, default=None, help="use this store (a copy)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hermes-stall-") as folder:
        os.environ.setdefault("HERMES_HOME", folder)
        if args.store is not None:
            path = Path(folder) / "state.db"
            with contextlib.closing(sqlite3.connect(args.store)) as source:
                with contextlib.closing(sqlite3.connect(path)) as target:
                    source.backup(target)
        else:
            path = build_store(Path(folder), args.messages)
        random.seed(0)
        print(json.dumps(run(path, args.seconds, args.reader_seconds), indent=2))


if __name__ == "__main__":
    main()

"""Does cold storage stall the agent? The application-like writer of ``agent_stall`` writes
while `hermes-store archive` moves the old sessions out (among them one long conversation
of ``--big`` messages) and `hermes-store restore` brings that conversation back.

Run from the command line for the operations reference's figure::

    python -m benchmarks.archive_stall --messages 20000 --big 5000

It prints JSON: the writer's longest wait and p99, its errors, and each command's exit
status, time and longest write lock on the hot store.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.agent_stall import ATTEMPTS, BUSY_TIMEOUT_S, WRITER, build_store

BIG_SESSION = "stall-big-conversation"
#: agent_stall's writer, stopping early when a file named ``<store>.stop`` appears.
STOPPABLE_WRITER = WRITER.replace(
    "while time.monotonic() < end:",
    "while time.monotonic() < end and not __import__('os').path.exists(path + '.stop'):",
)
assert STOPPABLE_WRITER != WRITER


def _add_big(path: Path, messages: int) -> None:
    """An old, ended conversation of ``messages`` messages (one tree, moved in chunks)."""
    from hermes_store.store import NewMessage, Store

    with Store.open(str(path)) as store:
        store.create_session(BIG_SESSION, "cli", started_at=1_000_000.0)
        store.append_messages(
            BIG_SESSION,
            [
                NewMessage(
                    role="user" if i % 2 == 0 else "assistant",
                    content=f"step {i}: the docker compose file and the database index " * 8,
                    timestamp=1_000_000.0 + i,
                )
                for i in range(messages)
            ],
        )
        store.end_session(BIG_SESSION, "done", ended_at=1_000_000.0 + messages)


def run(path: Path, archive: Path) -> dict[str, Any]:
    """Archive (by age) then restore the big conversation while the writer writes."""
    commands = [
        ("archive", "--db", str(path), "--to", str(archive), "--before", "2025-04-19"),
        ("restore", BIG_SESSION, "--db", str(path), "--from", str(archive)),
    ]
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            STOPPABLE_WRITER,
            str(path),
            "1200",
            str(BUSY_TIMEOUT_S),
            str(ATTEMPTS),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    done_commands: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        for args in commands:
            began = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "hermes_store.cli", *args, "--json"],
                capture_output=True,
                text=True,
                timeout=1200,
                check=False,
            )
            report = json.loads(done.stdout) if done.returncode == 0 else {}
            moved = report.get("moved", {})
            done_commands.append(
                {
                    "command": args[0],
                    "exit": done.returncode,
                    "seconds": round(time.monotonic() - began, 3),
                    "sessions": moved.get("sessions"),
                    "messages": moved.get("messages"),
                    "longest_hot_write_lock_s": moved.get("longest_hot_write_lock_s"),
                    "longest_hot_write_lock_by_step_s": moved.get(
                        "longest_hot_write_lock_by_step_s"
                    ),
                    "error": done.stderr.strip().splitlines()[-1:] if done.returncode else [],
                }
            )
        Path(f"{path}.stop").touch()
        out, _ = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    seen = json.loads(out) if out.strip() else {"waits": [], "written": 0, "errors": -1}
    waits = sorted(seen["waits"])
    return {
        "writer_messages": seen["written"],
        "writer_errors": seen["errors"],
        "writer_longest_wait_s": round(waits[-1], 3) if waits else None,
        "writer_p99_wait_s": round(waits[int(len(waits) * 0.99) - 1], 3) if waits else None,
        "commands": done_commands,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--big", type=int, default=5_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hermes-archive-stall-") as folder:
        os.environ.setdefault("HERMES_HOME", folder)
        path = build_store(Path(folder), args.messages)
        _add_big(path, args.big)
        print(json.dumps(run(path, Path(folder) / "archive.db"), indent=2))


if __name__ == "__main__":
    main()

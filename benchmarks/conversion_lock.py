"""How long the in-place conversion keeps the agent from writing, at a large size.

    python -m benchmarks.conversion_lock --messages 500000 [--dir DIR] [--keep]

Builds a legacy store (schema 30, inline search layout, the corpus generator's messages, one
session per commit), then upgrades a copy of it while a second process polls `BEGIN
IMMEDIATE` every 0.5 ms (`workloads.lock_probe`): the longest stretch it was refused is the
longest time the agent could not write. Also reported: the upgrade's own
`longest_write_lock_s`, its wall time, both FTS5 integrity checks (rank 1: each index
against the view, which is what makes the in-place result exact), and the answers to the
parity queries, compared with the same store converted by the rebuild path when
`--reference` is given (costly: minutes at 500k).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import layouts, workloads
from hermes_store import migrate
from hermes_store.demo import corpus

SEED = 2026


def run(messages: int, directory: Path, *, reference: bool) -> dict[str, Any]:
    """Build, convert with the lock probe, check; the figures as a dict."""
    workloads.isolate_environment(directory / "home")
    legacy = directory / "legacy.db"
    started = time.perf_counter()
    built = layouts.build_inline(legacy, corpus.generate(messages, SEED))
    store = layouts.copy_store(legacy, directory / "state.db")
    size = store.stat().st_size
    with workloads.lock_probe(store) as probe:
        began = time.perf_counter()
        result = migrate.upgrade(str(store), "head")
        upgrade_seconds = time.perf_counter() - began
    figures: dict[str, Any] = {
        "messages": messages,
        "store_bytes": size,
        "build_seconds": round(built, 1),
        "upgrade_seconds": round(upgrade_seconds, 2),
        "longest_refused_write_s": round(probe.get("longest", 0.0), 3),
        "longest_write_lock_s": result.longest_write_lock_s,
        "layout_after": result.layout_after,
        "fts_problems": workloads.fts_problems(store),
    }
    queries = workloads.load_parity_queries()
    if reference:
        rebuilt = layouts.copy_store(legacy, directory / "rebuilt.db")
        layouts.upgrade(rebuilt, rebuild=True)
        compared = workloads.compare_answers(
            workloads.parity_answers(rebuilt, queries), workloads.parity_answers(store, queries)
        )
        figures["parity_queries"] = len(queries)
        figures["parity_differing"] = compared.differing
    figures["total_seconds"] = round(time.perf_counter() - started, 1)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    parser.add_argument("--reference", action="store_true", help="compare with the rebuild")
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    args = parser.parse_args(argv)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="hermes-conversion-lock-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        print(json.dumps(run(args.messages, directory, reference=args.reference), indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()

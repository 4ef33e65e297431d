"""Cold storage's targets: archive most of a store while the agent writes, then search.

One run, on a store of ``--messages`` generated messages (``agent_stall.build_store``:
the demo corpus, legacy inline, then `hermes-store upgrade`):

1. The cutoff is chosen from the data: the session trees that could move (ended, nothing
   using them, as `hermes-store archive` selects them) ordered by last activity, and the
   cutoff just after the tree at which ``--share`` of the messages is reached.
2. The store is copied aside as the *original*, and the hot store's search latency
   measured (each query class of ``workloads.QUERY_CLASSES`` through ``Store.search``).
3. `hermes-store archive --db HOT --to ARCHIVE --before CUTOFF --json` runs while
   ``agent_stall``'s application-like writer writes (one commit per message, busy
   timeout 1 s, 15 attempts); the writer stops when the command ends.
4. The hot file's bytes (file + wal) before and after, the hot store's search latency
   after, and search with the archive (``Store.open(hot, archives=[archive])``) against
   the original store: the latency ratio, and for each query whether the hits are the
   same messages (every hit, by id; the writer's new messages, which only the hot store
   holds, left out).
5. Last, what the hot file can shrink to: its bytes after `hermes-store optimize
   --vacuum` (which an operator runs with the agent stopped). The archive run's own
   steps give back free pages; when it moved a fifth of the messages it also compacts the
   search indexes online (FTS5 keeps a deleted row's entries, as delete markers, until
   its segments are merged), and the table gives the indexes' bytes before and after.

The figure of a query class is the median over ``--rounds`` rounds of the sum of its
queries' times (``limit`` 20, as the application searches). Run for the figure of
docs/benchmarks.md, "Cold storage at 200k messages"::

    python -m benchmarks.archive_targets --messages 200000 --share 0.8 --out DIR

With ``--vacuum-first`` the store is given `hermes-store optimize --vacuum` before anything
else (a store upgraded from the application's has no auto-vacuum, and an archive run then
leaves the freed pages in the file for that command). It prints a markdown table and
writes ``archive_targets.json`` and ``archive_targets.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import workloads
from benchmarks.agent_stall import ATTEMPTS, BUSY_TIMEOUT_S, build_store
from benchmarks.archive_stall import STOPPABLE_WRITER

ROUNDS = 5
#: Hits per timed search: the application's page.
PAGE = 20
JSON_NAME = "archive_targets.json"
MD_NAME = "archive_targets.md"


@dataclass(frozen=True)
class Cutoff:
    """The ``--before`` of the run, and what it selects by the data."""

    before: str
    messages: int
    of_messages: int
    #: The messages of every tree that could move (all of them at most: a tree with a
    #: session not ended stays whatever the cutoff).
    movable: int

    @property
    def share(self) -> float:
        return self.messages / self.of_messages if self.of_messages else 0.0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hermes_store.cli", *args]


def choose_cutoff(path: Path, share: float) -> Cutoff:
    """The cutoff at which the trees that can move hold ``share`` of the messages.

    The trees are those `hermes-store archive` would move with a cutoff of now, oldest
    first; the cutoff falls halfway between the last activity of the tree that reaches
    the share and the next tree's (so neither sits on the boundary). When the trees that
    can move hold less than the share, the cutoff takes them all.
    """
    from hermes_store.archive.select import criterion, select_trees
    from hermes_store.engine import create_store_engine

    engine = create_store_engine(path, create=False)
    try:
        with engine.connect() as conn:
            now = time.time()
            trees = select_trees(conn, criterion(before=None, older_than="1h", now=now)).trees
            total = int(conn.exec_driver_sql("SELECT count(*) FROM messages").scalar_one())
            conn.rollback()
    finally:
        engine.dispose()
    if not trees:
        raise SystemExit(f"{path}: no session tree could be archived; build a larger store")
    goal = share * total
    movable = sum(tree.messages for tree in trees)
    taken = 0
    for index, tree in enumerate(trees):
        taken += tree.messages
        if taken >= goal or index == len(trees) - 1:
            after = trees[index + 1].last_activity if index + 1 < len(trees) else now - 7200
            moment = (tree.last_activity + after) / 2
            return Cutoff(datetime.fromtimestamp(moment, UTC).isoformat(), taken, total, movable)
    raise AssertionError("unreachable")


def file_bytes(path: Path) -> int:
    """The store's bytes on disk: the file and its write-ahead log."""
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def checkpoint(path: Path) -> None:
    """Fold the write-ahead log into the file and truncate it."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def copy_store(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite store (the backup API), mode 0600."""
    with contextlib.closing(sqlite3.connect(source)) as src:
        with contextlib.closing(sqlite3.connect(target)) as dst:
            src.backup(dst)
    target.chmod(0o600)


def _queries() -> list[tuple[str, str]]:
    return [(cls, q) for cls, queries in workloads.QUERY_CLASSES.items() for q in queries]


def latency(stores: dict[str, Any], rounds: int) -> dict[str, dict[str, float]]:
    """Per store and query class: the median over ``rounds`` of the sum of the class's
    queries' times (ms), after one warm-up round; the stores interleaved query by query."""
    sums = {name: {cls: [] for cls in workloads.QUERY_CLASSES} for name in stores}
    for round_ in range(rounds + 1):
        spent = {name: dict.fromkeys(workloads.QUERY_CLASSES, 0.0) for name in stores}
        for cls, query in _queries():
            for name, store in stores.items():
                began = time.perf_counter()
                store.search(query, limit=PAGE)
                spent[name][cls] += time.perf_counter() - began
        if round_:
            for name, classes in spent.items():
                for cls, seconds in classes.items():
                    sums[name][cls].append(seconds * 1000)
    return {
        name: {cls: round(statistics.median(values), 3) for cls, values in classes.items()}
        for name, classes in sums.items()
    }


def every_hit(store: Any, query: str, limit: int) -> list[int]:
    """The ids of every hit of ``query`` (``limit`` covers the whole store)."""
    return [hit["id"] for hit in store.search(query, limit=limit)]


def compare_hits(original: Any, with_archive: Any, limit: int, last_id: int) -> dict[str, Any]:
    """Each query's hits on the original store and on the hot store with its archive:
    the same messages? (ids above ``last_id``, the writer's, are left out)."""
    per_query: list[dict[str, Any]] = []
    for cls, query in _queries():
        before = every_hit(original, query, limit)
        after = [i for i in every_hit(with_archive, query, limit) if i <= last_id]
        per_query.append(
            {
                "class": cls,
                "query": query,
                "original_hits": len(before),
                "with_archive_hits": len(after),
                "duplicates": len(after) - len(set(after)),
                "equal": sorted(before) == sorted(after),
            }
        )
    return {"all_equal": all(q["equal"] for q in per_query), "queries": per_query}


def _writer(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            STOPPABLE_WRITER,
            str(path),
            "86400",
            str(BUSY_TIMEOUT_S),
            str(ATTEMPTS),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def archive_under_writer(hot: Path, archive: Path, before: str) -> dict[str, Any]:
    """Run the archive command while the writer writes; what each saw."""
    writer = _writer(hot)
    try:
        time.sleep(1.0)
        began = time.monotonic()
        done = subprocess.run(
            _cli("archive", "--db", str(hot), "--to", str(archive), "--before", before, "--json"),
            capture_output=True,
            text=True,
            timeout=24 * 3600,
            check=False,
        )
        wall = time.monotonic() - began
        Path(f"{hot}.stop").touch()
        out, _ = writer.communicate(timeout=120)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
        raise SystemExit(f"hermes-store archive exited {done.returncode}: {last[0]}")
    report = json.loads(done.stdout)
    seen = json.loads(out) if out.strip() else {"waits": [], "written": 0, "errors": -1}
    waits = sorted(seen["waits"])
    moved = report["moved"]
    seconds = float(report["seconds"])
    return {
        "exit": done.returncode,
        "wall_seconds": round(wall, 3),
        "seconds": seconds,
        "sessions": moved["sessions"],
        "messages": moved["messages"],
        "batches": moved["batches"],
        "messages_per_s": round(moved["messages"] / seconds, 1) if seconds else None,
        "longest_hot_write_lock_s": moved["longest_hot_write_lock_s"],
        "longest_hot_write_lock_by_step_s": moved.get("longest_hot_write_lock_by_step_s", {}),
        "hot_writes_by_step": moved.get("hot_writes_by_step", {}),
        "changed_while_moving": moved["changed_while_moving"],
        "kept": report["kept"],
        "vacuum_needed_bytes": report["vacuum_needed_bytes"],
        # The search indexes rebuilt online after the batches, and their bytes around it.
        "compaction": report.get("compaction") or {},
        "writer_messages": seen["written"],
        "writer_errors": seen["errors"],
        "writer_longest_wait_s": round(waits[-1], 3) if waits else None,
        "writer_p99_wait_s": round(waits[max(int(len(waits) * 0.99) - 1, 0)], 3) if waits else None,
    }


def vacuum(hot: Path) -> None:
    """`hermes-store optimize --vacuum`: the store switches to incremental auto-vacuum, so
    an archive run can give the freed pages back."""
    subprocess.run(
        _cli("optimize", "--db", str(hot), "--vacuum", "--json"), check=True, capture_output=True
    )


def run(
    hot: Path, folder: Path, share: float, rounds: int = ROUNDS, *, vacuum_first: bool = False
) -> dict[str, Any]:
    """The whole scenario on the store ``hot`` (changed: archived); ``folder`` for the
    original's copy and the archive. ``vacuum_first``: `optimize --vacuum` it first."""
    from hermes_store.store import Store

    phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        began = time.monotonic()
        yield
        phases[name] = round(phases.get(name, 0.0) + time.monotonic() - began, 1)

    with phase("prepare"):
        if vacuum_first:
            vacuum(hot)
        checkpoint(hot)
        original = folder / "original.db"
        archive = folder / "archive.db"
        copy_store(hot, original)
        cutoff = choose_cutoff(hot, share)
        with contextlib.closing(sqlite3.connect(original)) as conn:
            last_id = int(conn.execute("SELECT max(id) FROM messages").fetchone()[0])
            auto_vacuum = int(conn.execute("PRAGMA auto_vacuum").fetchone()[0])
    with phase("search timed"), Store.open(str(hot)) as store:
        before_ms = latency({"hot": store}, rounds)["hot"]
    bytes_before = file_bytes(hot)
    with phase("archive"):
        archived = archive_under_writer(hot, archive, cutoff.before)
    bytes_after = file_bytes(hot)
    checkpoint(hot)
    bytes_after_checkpoint = file_bytes(hot)
    with phase("search timed"), Store.open(str(hot)) as store:
        after_ms = latency({"hot": store}, rounds)["hot"]
    with Store.open(str(original)) as plain, Store.open(str(hot), archives=[str(archive)]) as both:
        with phase("search timed"):
            against = latency({"original": plain, "with_archive": both}, rounds)
        with phase("hits compared"):
            hits = compare_hits(plain, both, last_id + 1, last_id)
    # Last, as an operator would with the agent stopped: what the file can shrink to.
    with phase("optimize --vacuum"):
        vacuum(hot)
    bytes_after_vacuum = file_bytes(hot)
    return {
        "messages": cutoff.of_messages,
        "share_asked": share,
        "cutoff": cutoff.before,
        "selected_messages": cutoff.messages,
        "selected_share": round(cutoff.share, 4),
        "movable_messages": cutoff.movable,
        "vacuum_first": vacuum_first,
        "auto_vacuum": {0: "none", 1: "full", 2: "incremental"}.get(auto_vacuum, auto_vacuum),
        "archive": archived,
        "hot_bytes_before": bytes_before,
        "hot_bytes_after": bytes_after,
        "hot_bytes_after_checkpoint": bytes_after_checkpoint,
        "hot_ratio": round(bytes_after / bytes_before, 4),
        "hot_ratio_after_checkpoint": round(bytes_after_checkpoint / bytes_before, 4),
        "hot_bytes_after_optimize_vacuum": bytes_after_vacuum,
        "hot_ratio_after_optimize_vacuum": round(bytes_after_vacuum / bytes_before, 4),
        "archive_bytes": file_bytes(archive),
        "search_ms": {
            "hot_before": before_ms,
            "hot_after": after_ms,
            "original": against["original"],
            "with_archive": against["with_archive"],
        },
        "hits": hits,
        "rounds": rounds,
        "phase_seconds": phases,
    }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "-"


def _compacted(archived: dict[str, Any]) -> str:
    """The compaction's indexes, their MiB before -> after and its seconds, or "no"."""
    done = archived.get("compaction") or {}
    if not done.get("indexes"):
        return "no"
    before, after = done.get("index_bytes_before"), done.get("index_bytes_after")
    sizes = (
        f"{before / 1048576:.1f} -> {after / 1048576:.1f} MiB, "
        if before is not None and after is not None
        else ""
    )
    held, after = done.get("longest_write_lock_s"), done.get("give_back_longest_write_lock_s")
    lock = f", longest write lock {held:.3f} s" if held is not None else ""
    lock += f" (after the batches, all steps: {after:.3f} s)" if after is not None else ""
    return f"{', '.join(done['indexes'])}: {sizes}{done.get('seconds', 0):.1f} s{lock}"


def markdown(result: dict[str, Any]) -> str:
    """The run as markdown: the archive and the writer, then search by query class."""
    a = result["archive"]
    ms = result["search_ms"]
    mib = 1024 * 1024
    lines = [
        f"Cold storage at {result['messages']:,} messages: `--before {result['cutoff']}` "
        f"selects {result['selected_share']:.1%} of them (asked {result['share_asked']:.0%}).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| messages moved | {a['messages']:,} ({a['sessions']:,} sessions, "
        f"{a['batches']} batches) |",
        f"| archive's time (s) | {a['seconds']:.1f} (command {a['wall_seconds']:.1f}) |",
        f"| archive's rate (messages/s) | {a['messages_per_s']:,} |",
        f"| longest write lock on the hot store (s) | {a['longest_hot_write_lock_s']:.3f} |",
        *(
            f"| … of its {a['hot_writes_by_step'].get(step, 0):,} `{step}` steps (s) | {held:.3f} |"
            for step, held in a.get("longest_hot_write_lock_by_step_s", {}).items()
        ),
        f"| writer: messages written | {a['writer_messages']:,} |",
        f"| writer: longest wait (s) | {a['writer_longest_wait_s']} |",
        f"| writer: p99 wait (s) | {a['writer_p99_wait_s']} |",
        f"| writer: errors | {a['writer_errors']} |",
        f"| hot file + wal before (MiB) | {result['hot_bytes_before'] / mib:.1f} |",
        f"| hot file + wal after (MiB) | {result['hot_bytes_after'] / mib:.1f} |",
        f"| hot after ÷ before | {result['hot_ratio']:.3f} |",
        f"| hot after a checkpoint ÷ before | {result['hot_ratio_after_checkpoint']:.3f} |",
        f"| hot after `optimize --vacuum` (agent stopped) ÷ before | "
        f"{result['hot_ratio_after_optimize_vacuum']:.3f} |",
        f"| free pages left for `optimize --vacuum` (MiB) | "
        f"{a['vacuum_needed_bytes'] / mib:.1f} (auto_vacuum {result['auto_vacuum']}) |",
        f"| search indexes compacted | {_compacted(a)} |",
        f"| archive file (MiB) | {result['archive_bytes'] / mib:.1f} |",
        f"| hits with the archive = original's, every query | "
        f"{'yes' if result['hits']['all_equal'] else 'NO'} |",
        "",
        f"Search, ms (median of {result['rounds']} rounds of the sum of a class's queries, "
        f"{PAGE} hits):",
        "",
        "| query class | hot before | hot after | after ÷ before | original | "
        "hot + archive | + archive ÷ original |",
        "|---|---|---|---|---|---|---|",
    ]
    for cls in workloads.QUERY_CLASSES:
        lines.append(
            f"| {cls} | {ms['hot_before'][cls]:.1f} | {ms['hot_after'][cls]:.1f} | "
            f"{_ratio(ms['hot_after'][cls], ms['hot_before'][cls])} | "
            f"{ms['original'][cls]:.1f} | {ms['with_archive'][cls]:.1f} | "
            f"{_ratio(ms['with_archive'][cls], ms['original'][cls])} |"
        )
    unequal = [q for q in result["hits"]["queries"] if not q["equal"]]
    for q in unequal:
        lines.append(
            f"\nDifferent hits: {q['class']} query {q['query']!r}: {q['original_hits']} on the "
            f"original, {q['with_archive_hits']} with the archive"
        )
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out: Path) -> None:
    """``archive_targets.json`` and ``.md`` in ``out`` (mode 0600)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in ((JSON_NAME, json.dumps(result, indent=2)), (MD_NAME, markdown(result))):
        target = out / name
        target.write_text(text + ("\n" if not text.endswith("\n") else ""))
        target.chmod(0o600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--share", type=float, default=0.8, help="of the messages to archive")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--store", type=Path, default=None, help="use this store (a copy)")
    parser.add_argument("--out", type=Path, required=True, help="directory for JSON and MD")
    parser.add_argument(
        "--vacuum-first",
        action="store_true",
        help="run `hermes-store optimize --vacuum` first (incremental auto-vacuum)",
    )
    args = parser.parse_args()
    if not 0 < args.share < 1:
        parser.error(f"--share must be between 0 and 1, got {args.share}")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hermes-archive-targets-") as name:
        folder = Path(name)
        os.environ.setdefault("HERMES_HOME", str(folder / "home"))
        if args.store is not None:
            hot = folder / "state.db"
            copy_store(args.store, hot)
        else:
            hot = build_store(folder, args.messages)
        built = time.monotonic() - began
        result = run(hot, folder, args.share, args.rounds, vacuum_first=args.vacuum_first)
    result["build_seconds"] = round(built, 1)
    result["total_seconds"] = round(time.monotonic() - began, 1)
    write(result, args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()

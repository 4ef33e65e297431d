"""The measured operations, shared by the pytest benchmarks and `python -m benchmarks.report`.

Everything writes through the library's API (``Store``, ``migrate.upgrade``,
``maintenance.optimize``) or reads through ``search_messages`` / ``storage_report``, as the
application does; only picking the rows to work on uses plain SQL. What the data layer is
measured against, the legacy application's own statements through the plain ``sqlite3``
module, is ``benchmarks/raw.py``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import multiprocessing
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine

from benchmarks import layouts
from hermes_store.demo import corpus as corpus_mod
from hermes_store.engine import create_store_engine
from hermes_store.search import accept_search_objects, sanitize_query, search_messages
from hermes_store.sqlite import fts, maintenance, storage
from hermes_store.store import NewMessage, Store

PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: Search queries per query class; each must route as its class says on the inline store.
QUERY_CLASSES: dict[str, tuple[str, ...]] = {
    "word": ("def", "error", "python", "return self", "terminal"),
    "phrase": ('"import os"', '"return self"', '"def __init__"', '"database is locked"'),
    "prefix": ("pyth*", "imp* ret*", "conf*", "sess*"),
    "boolean": ("error OR exception", "def AND return", "import NOT os", "self OR error NOT test"),
    "trigram CJK": ("数据库", "全文搜索", "テスト", "ありがとう", "합니다"),
    "LIKE fallback": ("的", "测试", "数据", "검색", "です"),
}

FLAG_ROWS = 100  # rows per flag-update call (a rewind or a compaction of a range)
EDITS = 20  # text edits per measurement, one transaction each
APPEND_SINGLE = 50  # messages appended one transaction each, per measurement
APPEND_BATCHES = 4  # batched appends per measurement ...
APPEND_BATCH_SIZE = 50  # ... of this many messages each
APPEND_SEED_OFFSET = 1_000  # the appended messages come from another corpus
BULK_APPEND = 20_000  # messages of one `append_messages` call, against the legacy writer


class Quiet:
    """Flush dirty pages and collect the garbage, then keep the collector off while timing.

    Without the sync, fsyncs of the timed transactions would also write back whatever a
    preceding file copy left dirty (ext4's ordered mode), which is noise, not layout cost.
    """

    def __enter__(self) -> None:
        os.sync()
        gc.collect()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        gc.enable()


def isolate_environment(home: Path) -> None:
    """Point HERMES_HOME at an empty directory so no upgrade reads the user's ~/.hermes."""
    home.mkdir(parents=True, exist_ok=True)
    os.environ["HERMES_HOME"] = str(home)
    os.environ.pop("HERMES_STORE_URL", None)


def engine_for(path: Path) -> Engine:
    """The library's engine for an existing store."""
    return create_store_engine(path, create=False)


# --------------------------------------------------------------------------------------
# Storage
# --------------------------------------------------------------------------------------


def storage_of(path: Path) -> storage.StorageReport:
    """Bytes per group (dbstat) of a finished (VACUUMed) store."""
    engine = engine_for(path)
    try:
        with engine.connect() as conn:
            report = storage.storage_report(conn)
            conn.rollback()
            return report
    finally:
        engine.dispose()


def physical_limit(inline: storage.StorageReport) -> float:
    """Smallest possible size ratio: the inline store without both *_content copies."""
    copies = inline.groups.get(storage.FTS_COPIES, 0)
    return (inline.file_bytes - copies) / inline.file_bytes


def fts_problems(path: Path) -> dict[str, str]:
    """PRAGMA integrity_check plus FTS5 'integrity-check' (rank 1) of every index."""
    engine = engine_for(path)
    try:
        with engine.connect() as conn:
            result = fts.integrity_check(conn)
            conn.rollback()
            return result.problems
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------
# Appends, flag updates, edits, deletes (through Store)
# --------------------------------------------------------------------------------------


@dataclass
class AppendBatch:
    """Messages to append to one new session."""

    session_id: str
    source: str
    started_at: float
    messages: list[NewMessage]


def _new_message(row: corpus_mod.Row) -> NewMessage:
    def text(key: str) -> str | None:
        value = row.get(key)
        return None if value is None else str(value)

    token_count = row.get("token_count")
    return NewMessage(
        role=str(row["role"]),
        content=text("content"),
        tool_calls=text("tool_calls"),
        tool_name=text("tool_name"),
        tool_call_id=text("tool_call_id"),
        timestamp=float(row["timestamp"]),  # type: ignore[arg-type]
        token_count=None if token_count is None else int(token_count),
        finish_reason=text("finish_reason"),
        reasoning=text("reasoning"),
        platform_message_id=text("platform_message_id"),
    )


def append_plan(n_messages: int, count: int, seed: int) -> list[AppendBatch]:
    """``count`` batches of ``n_messages`` realistic messages, each for a new session."""
    source = corpus_mod.generate(n_messages * count, seed + APPEND_SEED_OFFSET)
    rows = [_new_message(row) for row in source.messages]
    base_time = max(m.timestamp or 0.0 for m in rows) + 86_400.0
    plan = []
    for index in range(count):
        chunk = rows[index * n_messages : (index + 1) * n_messages]
        plan.append(AppendBatch(f"bench-append-{seed}-{index}", "cli", base_time + index, chunk))
    return plan


def prepare_session(store: Store, batch: AppendBatch) -> None:
    """Create the session a batch is appended to (not part of what is timed)."""
    store.create_session(batch.session_id, batch.source, started_at=batch.started_at)


def append_one_by_one(store: Store, batch: AppendBatch) -> list[int]:
    """Append each message in its own transaction, as the application writes."""
    return [store.append_message(batch.session_id, message) for message in batch.messages]


def append_batched(store: Store, batch: AppendBatch, batch_size: int) -> list[int]:
    """Append in transactions of ``batch_size`` messages."""
    ids: list[int] = []
    messages = batch.messages
    for start in range(0, len(messages), batch_size):
        ids += store.append_messages(batch.session_id, messages[start : start + batch_size])
    return ids


def session_counters(path: Path, session_id: str) -> tuple[int, int]:
    """A session's (message_count, tool_call_count)."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT message_count, tool_call_count FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
    finally:
        conn.close()
    return int(row[0]), int(row[1])


def message_count(path: Path, session_id: str | None = None) -> int:
    """Messages in a store (or in one session)."""
    conn = sqlite3.connect(path)
    try:
        if session_id is None:
            return int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
        return int(
            conn.execute(
                "SELECT count(*) FROM messages WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
        )
    finally:
        conn.close()


def flag_ids(path: Path, n: int = FLAG_ROWS) -> list[int]:
    """``n`` consecutive message ids from the middle of the store (one or two sessions)."""
    conn = sqlite3.connect(path)
    try:
        ids = [int(r[0]) for r in conn.execute("SELECT id FROM messages ORDER BY id")]
    finally:
        conn.close()
    start = max(0, len(ids) // 2 - n // 2)
    return ids[start : start + n]


def edit_ids(path: Path, n: int = EDITS) -> list[int]:
    """``n`` ids of messages with text, spread over the store, for text edits."""
    conn = sqlite3.connect(path)
    try:
        ids = [
            int(r[0])
            for r in conn.execute(
                "SELECT id FROM messages WHERE content IS NOT NULL AND content <> '' "
                "AND substr(content, 1, 1) <> char(0) ORDER BY id"
            )
        ]
    finally:
        conn.close()
    step = max(1, len(ids) // n)
    return ids[step // 2 :: step][:n]


def edited_text(path: Path, message_id: int, round_no: int) -> str:
    """The message's text with a marker appended (what an edit writes)."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT content FROM messages WHERE id = ?", (message_id,)).fetchone()
    finally:
        conn.close()
    return f"{row[0]} (edited {round_no})"


def delete_candidates(path: Path, count: int) -> list[tuple[str, int]]:
    """``count`` sessions whose message counts are closest to the median, with their counts.

    Only sessions without children, so every candidate deletes the same way everywhere.
    """
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT s.id, count(m.id) AS n FROM sessions AS s JOIN messages AS m "
            "ON m.session_id = s.id WHERE NOT EXISTS "
            "(SELECT 1 FROM sessions AS c WHERE c.parent_session_id = s.id) "
            "GROUP BY s.id HAVING n > 0 ORDER BY n, s.id"
        ).fetchall()
    finally:
        conn.close()
    if not rows:
        return []
    median = rows[len(rows) // 2][1]
    nearest = sorted(rows, key=lambda r: (abs(r[1] - median), r[0]))[:count]
    return [(str(r[0]), int(r[1])) for r in nearest]


# --------------------------------------------------------------------------------------
# Search
# --------------------------------------------------------------------------------------


def timed_search(conn: Connection, query: str, **kwargs: Any) -> tuple[float, list[Any]]:
    """One search as the application runs it (own read transaction); (seconds, hits)."""
    start = time.perf_counter()
    hits = search_messages(conn, query, **kwargs)
    conn.rollback()
    return time.perf_counter() - start, hits


def measure_search(conn: Connection, query: str, **kwargs: Any) -> tuple[float, float, list[Any]]:
    """Like :func:`timed_search`, also returning the thread's CPU seconds (wall, cpu, hits).

    CPU time leaves out the time the process waits for a core, which on a shared
    machine is most of the noise of a read served from the page cache.
    """
    cpu = time.thread_time()
    start = time.perf_counter()
    hits = search_messages(conn, query, **kwargs)
    conn.rollback()
    return time.perf_counter() - start, time.thread_time() - cpu, hits


def load_parity_queries() -> list[dict[str, Any]]:
    """tests/parity_queries.py's PARITY_QUERIES + UNENCODABLE_QUERIES (loaded by path)."""
    path = PROJECT_ROOT / "tests" / "parity_queries.py"
    spec = importlib.util.spec_from_file_location("_hermes_parity_queries", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot load the parity queries from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [*module.PARITY_QUERIES, *getattr(module, "UNENCODABLE_QUERIES", [])]


#: A query whose sanitised form has more terms than this is "pathological": FTS5's rank and
#: snippet cost grows with the square of the term count, and the search computes snippet()
#: for every match before LIMIT, so `"def " * 1000` (512 terms) takes about 20 s on a 1k
#: store, on every layout alike. Parity runs leave such queries out above the smallest size.
PATHOLOGICAL_TERMS = 64


def split_parity_queries(
    queries: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(regular, pathological) parity queries; see PATHOLOGICAL_TERMS."""
    regular: list[dict[str, Any]] = []
    pathological: list[dict[str, Any]] = []
    for kwargs in queries:
        query = kwargs.get("query")
        terms = len(sanitize_query(query).split()) if isinstance(query, str) else 0
        (pathological if terms > PATHOLOGICAL_TERMS else regular).append(kwargs)
    return regular, pathological


@dataclass(frozen=True, eq=False)
class Failed:
    """A query that raised instead of answering. Equal to nothing, itself included: two
    layouts failing alike are not answering alike (their answers are not compared)."""

    error: str


def parity_answers(path: Path, queries: Sequence[dict[str, Any]]) -> list[Any]:
    """Every parity query's full answer (rows, order, snippets, context) on one store; a
    query that raised, its :class:`Failed`."""
    engine = engine_for(path)
    answers: list[Any] = []
    try:
        with engine.connect() as conn:
            # The comparison-only variants differ from this package's search objects on
            # purpose: compare their answers, not a scan's.
            accept_search_objects(conn)
            for kwargs in queries:
                try:
                    answers.append(search_messages(conn, **kwargs))
                except Exception as exc:  # no answer: never equal to another
                    answers.append(Failed(f"{type(exc).__name__}: {exc}"))
                conn.rollback()
    finally:
        engine.dispose()
    return answers


@dataclass
class Parity:
    """How a layout's answers compare with inline's."""

    queries: int
    #: Queries answered otherwise than by inline, or that failed on either side.
    differing: list[int] = field(default_factory=list)
    #: Of those, the ones that failed (on either side).
    failed: list[int] = field(default_factory=list)
    with_hits: int = 0

    @property
    def changes_results(self) -> bool:
        """True when at least one query answers differently from inline."""
        return bool(self.differing)


def compare_answers(reference: Sequence[Any], answers: Sequence[Any]) -> Parity:
    """Count the queries whose answers differ from the reference."""
    parity = Parity(len(reference))
    for index, (expected, actual) in enumerate(zip(reference, answers, strict=True)):
        if expected != actual:  # a Failed is equal to nothing
            parity.differing.append(index)
        if isinstance(expected, Failed) or isinstance(actual, Failed):
            parity.failed.append(index)
        if isinstance(actual, list) and actual:
            parity.with_hits += 1
    return parity


# --------------------------------------------------------------------------------------
# Conversion to head (revision fts1) and the write lock it holds
# --------------------------------------------------------------------------------------


def _probe_main(path: str, ready: Any, stop: Any, results: Any) -> None:
    """In a second process: poll BEGIN IMMEDIATE; report the longest refused stretch."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute("PRAGMA busy_timeout=0")
    longest = 0.0
    blocked_since: float | None = None
    attempts = refused = 0
    ready.set()
    while True:
        stopping = stop.is_set()
        now = time.perf_counter()
        attempts += 1
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            if blocked_since is not None:
                longest = max(longest, now - blocked_since)
                blocked_since = None
        except sqlite3.OperationalError:
            refused += 1
            if blocked_since is None:
                blocked_since = now
        if stopping:
            break
        time.sleep(0.0005)
    if blocked_since is not None:
        longest = max(longest, time.perf_counter() - blocked_since)
    conn.close()
    results.put({"longest": longest, "attempts": attempts, "refused": refused})


@contextlib.contextmanager
def lock_probe(path: Path) -> Iterator[dict[str, float]]:
    """Measure the longest write-lock hold on ``path`` while the block runs.

    A second process polls ``BEGIN IMMEDIATE`` (busy_timeout 0) every 0.5 ms and records
    the longest stretch during which it was refused: the longest time any writer (the
    application, say) would have been blocked. The dict yielded is filled on exit.
    """
    ctx = multiprocessing.get_context("spawn")
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    process = ctx.Process(target=_probe_main, args=(str(path), ready, stop, results))
    process.start()
    outcome: dict[str, float] = {}
    try:
        if not ready.wait(60):
            raise RuntimeError("the lock probe did not start")
        yield outcome
    finally:
        stop.set()
        try:
            outcome.update(results.get(timeout=60))
        finally:
            process.join(60)
            if process.is_alive():
                process.kill()


@dataclass
class Conversion:
    """One conversion of a legacy copy to head."""

    path: str  # "in place" or "rebuild"
    seconds: float
    lock_seconds: float | None
    log: list[str]


def convert(path: Path, *, rebuild: bool, probe: bool = False) -> Conversion:
    """Upgrade a legacy copy to head; time the whole ``migrate.upgrade`` call.

    With ``probe`` a second process measures the longest write-lock hold meanwhile (its
    polling costs the upgrade a little, so the wall time is best taken without it).
    """
    lock: dict[str, float] = {}
    with lock_probe(path) if probe else contextlib.nullcontext(lock) as lock:
        start = time.perf_counter()
        log = layouts.upgrade(path, rebuild=rebuild)
        seconds = time.perf_counter() - start
    taken = [m for m in log if m.startswith("messages_fts")]
    expected = "re-created as external content" if rebuild else "converted in place"
    if len(taken) != 2 or not all(expected in m for m in taken):
        raise RuntimeError(f"expected both indexes to be {expected!r}, got {taken}")
    return Conversion(
        "rebuild" if rebuild else "in place", seconds, lock.get("longest") if probe else None, log
    )


# --------------------------------------------------------------------------------------
# Optimize
# --------------------------------------------------------------------------------------


def optimize(path: Path) -> tuple[float, maintenance.OptimizeResult]:
    """Time ``maintenance.optimize`` (FTS merge + checkpoint + VACUUM) on a store copy."""
    engine = engine_for(path)
    try:
        start = time.perf_counter()
        result = maintenance.optimize(engine)
        return time.perf_counter() - start, result
    finally:
        engine.dispose()


def scratch_dir(prefix: str) -> Path:
    """A new temporary directory (removed by the caller)."""
    return Path(tempfile.mkdtemp(prefix=prefix))

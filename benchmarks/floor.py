"""The data layer against the raw floor (``benchmarks/raw.py``), operation by operation.

Two copies of one store: the data layer (``Store``, whose ``search`` is
``search_messages``) works on one, raw ``sqlite3`` running the legacy application's
statements on the other. Both receive the same operations in the same order, so they
hold the same rows all along, and every sample's answer is compared across the two
(:class:`Mismatch` when they differ: then they did not do the same work).

:meth:`Floor.compare` runs every operation on both sides back to back, the side that goes
first alternating, for a warm-up round and then ``rounds`` measured ones, and keeps the
CPU time (``thread_time``: on a shared machine the time spent waiting for a core is not
the code's) and the wall time of each sample. The figure is the median over the rounds;
the ratio is data layer / raw of the medians. ``benchmarks.report`` holds the CPU ratio of
every operation marked ``target`` to at most :data:`MAX_RATIO`.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchmarks import layouts, raw, workloads
from hermes_store.records import NewMessage
from hermes_store.store import Store

#: The data layer may cost at most this much of raw sqlite3's CPU time per operation.
MAX_RATIO = 1.15
ROUNDS = 9
#: A side whose samples spread wider than this ((max - min) / median) is noisy: the
#: report shows its range.
NOISY_SPREAD = 0.25

DATA_LAYER = "data layer"
RAW = "raw sqlite3"
SIDES = (DATA_LAYER, RAW)

# What one sample of each operation does: enough work to time, little enough to repeat.
CREATES = 10  # sessions created, one transaction each
SINGLE_APPENDS = 50  # messages appended, one transaction each
BATCH_SIZE = 200  # messages appended in one transaction
REWINDS = 10  # rewind FLAG_ROWS messages, then restore them: two transactions each
DELETES = 2  # sessions of median length deleted, one transaction each
FETCHES = 10  # sessions of median length whose messages are read
LISTS = 20  # list_sessions calls
LIST_LIMIT = 50
OPENS = 10  # open the store, read one session, close it

#: The search classes: the report's query classes, then its word queries with the
#: options the agent's search tool passes.
_WORDS = workloads.QUERY_CLASSES["word"]
SEARCH_CLASSES: dict[str, tuple[tuple[str, dict[str, Any]], ...]] = {
    **{name: tuple((q, {}) for q in qs) for name, qs in workloads.QUERY_CLASSES.items()},
    "word, newest first": tuple((q, {"sort": "newest"}) for q in _WORDS),
    "word, oldest first": tuple((q, {"sort": "oldest"}) for q in _WORDS),
    "word, source and role filters": tuple(
        (q, {"source_filter": ["cli", "telegram"], "role_filter": ["user", "assistant"]})
        for q in _WORDS
    ),
    "word, second page": tuple((q, {"offset": 20}) for q in _WORDS),
}


class Side(Protocol):
    """One way to run the operations: the data layer, or raw sqlite3."""

    name: str
    path: Path

    def create_session(self, session_id: str, source: str, started_at: float) -> Any: ...
    def append_message(self, session_id: str, message: NewMessage) -> int: ...
    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]: ...
    def set_active(self, ids: Sequence[int], active: bool) -> int: ...
    def delete_session(self, session_id: str) -> int: ...
    def messages(self, session_id: str) -> Sequence[Any]: ...
    def list_sessions(self, limit: int) -> Sequence[Any]: ...
    def open_store(self, session_id: str) -> Any: ...
    def search(self, query: str, **kwargs: Any) -> Sequence[Any]: ...
    def close(self) -> None: ...


class DataLayer:
    """The operations through ``Store``, on its own copy of the store."""

    name = DATA_LAYER

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = Store.open(path)

    def create_session(self, session_id: str, source: str, started_at: float) -> Any:
        return self.store.create_session(session_id, source, started_at=started_at)

    def append_message(self, session_id: str, message: NewMessage) -> int:
        return self.store.append_message(session_id, message)

    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        return self.store.append_messages(session_id, messages)

    def set_active(self, ids: Sequence[int], active: bool) -> int:
        return self.store.set_message_flags(ids, active=active)

    def delete_session(self, session_id: str) -> int:
        return self.store.delete_session(session_id)

    def messages(self, session_id: str) -> Sequence[Any]:
        return self.store.messages(session_id)

    def list_sessions(self, limit: int) -> Sequence[Any]:
        return self.store.list_sessions(limit=limit)

    def open_store(self, session_id: str) -> Any:
        with Store.open(self.path) as store:
            return store.get_session(session_id)

    def search(self, query: str, **kwargs: Any) -> Sequence[Any]:
        return self.store.search(query, **kwargs)

    def close(self) -> None:
        self.store.close()


class Raw:
    """The operations through ``benchmarks.raw``, on its own copy of the store."""

    name = RAW

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = raw.connect(path)

    def create_session(self, session_id: str, source: str, started_at: float) -> Any:
        return raw.create_session(self.conn, session_id, source, started_at)

    def append_message(self, session_id: str, message: NewMessage) -> int:
        return raw.append_message(self.conn, session_id, message)

    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        return raw.append_messages(self.conn, session_id, messages)

    def set_active(self, ids: Sequence[int], active: bool) -> int:
        return raw.set_active(self.conn, ids, active)

    def delete_session(self, session_id: str) -> int:
        return raw.delete_session(self.conn, session_id)

    def messages(self, session_id: str) -> Sequence[Any]:
        return raw.messages(self.conn, session_id)

    def list_sessions(self, limit: int) -> Sequence[Any]:
        return raw.list_sessions(self.conn, limit)

    def open_store(self, session_id: str) -> Any:
        return raw.open_store(self.path, session_id)

    def search(self, query: str, **kwargs: Any) -> Sequence[Any]:
        return raw.search(self.conn, query, **kwargs)

    def close(self) -> None:
        self.conn.close()


@dataclass
class Plan:
    """The inputs of every round (the warm-up, 0, included), the same for both sides."""

    source: Path
    rounds: int = ROUNDS
    seed: int = 0
    singles: list[workloads.AppendBatch] = field(default_factory=list)
    batches: list[workloads.AppendBatch] = field(default_factory=list)
    fetch_sessions: list[str] = field(default_factory=list)
    delete_sessions: list[list[str]] = field(default_factory=list)
    flag_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        total = self.rounds + 1
        self.singles = workloads.append_plan(SINGLE_APPENDS, total, self.seed + 11)
        self.batches = workloads.append_plan(BATCH_SIZE, total, self.seed + 12)
        # Sessions of median length, without children; a small corpus may have fewer than
        # asked for, and then some rounds delete nothing.
        names = [
            sid for sid, _n in workloads.delete_candidates(self.source, FETCHES + DELETES * total)
        ]
        self.fetch_sessions = names[:FETCHES]
        rest = names[FETCHES:]
        self.delete_sessions = [rest[i * DELETES : (i + 1) * DELETES] for i in range(total)]
        self.flag_ids = workloads.flag_ids(self.source)


#: Prepare round n's sample of an operation on one side (untimed); the sample is timed.
Prepare = Callable[[Plan, Side, int], Callable[[], Any]]


def _key(row: Any) -> Any:
    """The id of a record (data layer) or of a row (raw: its first column)."""
    return row.id if hasattr(row, "id") else row[0]


def _ids_per_call(results: Sequence[Sequence[Any]]) -> list[list[Any]]:
    return [[_key(row) for row in rows] for rows in results]


def _hits_per_call(results: Sequence[Sequence[Any]]) -> list[list[dict[str, Any]]]:
    return [[dict(hit) for hit in hits] for hits in results]


@dataclass(frozen=True)
class Operation:
    """One measured operation."""

    name: str
    prepare: Prepare
    #: What one sample does, for people.
    sample: str
    #: What must be equal on both sides, from the sample's result.
    answer: Callable[[Any], Any] = lambda result: result
    #: Writes: the dirty pages of the other side are synced before each sample.
    writes: bool = False
    #: Held to MAX_RATIO by the report.
    target: bool = True
    #: Run on a pair of copies of its own, which no other operation writes. The data
    #: layer's batch is one multi-row INSERT where the legacy application runs one INSERT a
    #: row: FTS5 then leaves the two copies' segments in different shapes, and the next
    #: single appends pay different merge work for it (1.5x apart on the same code).
    own_copies: bool = False


def _create(plan: Plan, side: Side, n: int) -> Callable[[], Any]:
    names = [(f"floor-create-{n}-{i}", 1.7e9 + n * 100 + i) for i in range(CREATES)]
    return lambda: [side.create_session(sid, "cli", started) for sid, started in names]


def _append_single(plan: Plan, side: Side, n: int) -> Callable[[], Any]:
    batch = plan.singles[n]
    side.create_session(batch.session_id, batch.source, batch.started_at)
    return lambda: [side.append_message(batch.session_id, m) for m in batch.messages]


def _append_batch(plan: Plan, side: Side, n: int) -> Callable[[], Any]:
    batch = plan.batches[n]
    side.create_session(batch.session_id, batch.source, batch.started_at)
    return lambda: side.append_messages(batch.session_id, batch.messages)


def _rewind(plan: Plan, side: Side, _n: int) -> Callable[[], Any]:
    ids = plan.flag_ids
    return lambda: [side.set_active(ids, active) for _ in range(REWINDS) for active in (0, 1)]


def _delete(plan: Plan, side: Side, n: int) -> Callable[[], Any]:
    sessions = plan.delete_sessions[n]
    return lambda: [side.delete_session(sid) for sid in sessions]


def _fetch(plan: Plan, side: Side, _n: int) -> Callable[[], Any]:
    return lambda: [side.messages(sid) for sid in plan.fetch_sessions]


def _list(_plan: Plan, side: Side, _n: int) -> Callable[[], Any]:
    return lambda: [side.list_sessions(LIST_LIMIT) for _ in range(LISTS)]


def _open(plan: Plan, side: Side, _n: int) -> Callable[[], Any]:
    sid = plan.fetch_sessions[0]
    return lambda: [[side.open_store(sid)] for _ in range(OPENS)]


def _searcher(queries: Sequence[tuple[str, dict[str, Any]]]) -> Prepare:
    def prepare(_plan: Plan, side: Side, _n: int) -> Callable[[], Any]:
        return lambda: [side.search(query, **kwargs) for query, kwargs in queries]

    return prepare


#: Every operation, in the order a round runs them (writes first).
OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "create a session",
        _create,
        f"{CREATES} sessions, a transaction each",
        answer=len,
        writes=True,
        target=False,
    ),
    Operation(
        "append, one per transaction",
        _append_single,
        f"{SINGLE_APPENDS} messages, a transaction each",
        writes=True,
        own_copies=True,
    ),
    Operation(
        f"append, batch of {BATCH_SIZE}",
        _append_batch,
        f"{BATCH_SIZE} messages in one transaction",
        writes=True,
    ),
    Operation(
        f"rewind ({workloads.FLAG_ROWS} messages)",
        _rewind,
        f"{REWINDS} rewinds and restores, a transaction each",
        writes=True,
    ),
    Operation(
        "delete a session",
        _delete,
        f"{DELETES} sessions of median length, a transaction each",
        writes=True,
    ),
    Operation(
        "fetch a session's messages",
        _fetch,
        f"{FETCHES} sessions of median length",
        answer=_ids_per_call,
    ),
    Operation(
        "list recent sessions", _list, f"{LISTS} lists of {LIST_LIMIT}", answer=_ids_per_call
    ),
    Operation(
        "open a store", _open, f"{OPENS} opens, each reading a session", answer=_ids_per_call
    ),
    *(
        Operation(
            f"search: {name}",
            _searcher(queries),
            f"{len(queries)} queries",
            answer=_hits_per_call,
        )
        for name, queries in SEARCH_CLASSES.items()
    ),
)


class Mismatch(AssertionError):
    """The two sides answered an operation differently: they did not do the same work."""


@dataclass
class Samples:
    """One side's samples of one operation, in seconds."""

    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)


@dataclass
class Comparison:
    """Both sides' samples of one operation."""

    name: str
    sample: str
    target: bool
    sides: dict[str, Samples] = field(default_factory=lambda: {s: Samples() for s in SIDES})

    def median(self, side: str, clock: str) -> float:
        """Median sample of one side, ``clock`` "cpu" or "wall", in seconds."""
        return float(statistics.median(getattr(self.sides[side], clock)))

    def ratio(self, clock: str) -> float:
        """Data layer / raw, of the medians."""
        return self.median(DATA_LAYER, clock) / self.median(RAW, clock)

    def spread(self, side: str, clock: str) -> float:
        """(max - min) / median of one side's samples."""
        values = getattr(self.sides[side], clock)
        return (max(values) - min(values)) / self.median(side, clock)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form: the samples and the ratios."""
        return {
            "sample": self.sample,
            "target": self.target,
            "ratio": {"cpu": self.ratio("cpu"), "wall": self.ratio("wall")},
            "samples": {
                side: {"cpu": samples.cpu, "wall": samples.wall}
                for side, samples in self.sides.items()
            },
        }


def timed(sample: Callable[[], Any]) -> tuple[float, float, Any]:
    """(CPU seconds of this thread, wall seconds, result) of one sample."""
    cpu, wall = time.thread_time(), time.perf_counter()
    result = sample()
    return time.thread_time() - cpu, time.perf_counter() - wall, result


def checkpoint(path: Path) -> None:
    """Copy a store's WAL into it and empty the WAL (the sides' own connections are idle)."""
    with contextlib.closing(raw.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


class Floor:
    """Two copies of a store, one per side, and the plan both follow."""

    def __init__(self, directory: Path, source: Path, rounds: int = ROUNDS, seed: int = 0):
        directory.mkdir(parents=True, exist_ok=True)
        self.rounds = rounds
        self.plan = Plan(source, rounds, seed)
        self.directory, self.source = directory, source
        self.sides: dict[str, Side] = self._pair("")
        self.own: dict[str, dict[str, Side]] = {}

    def _pair(self, prefix: str) -> dict[str, Side]:
        return {
            DATA_LAYER: DataLayer(
                layouts.copy_store(self.source, self.directory / f"{prefix}data-layer.db")
            ),
            RAW: Raw(layouts.copy_store(self.source, self.directory / f"{prefix}raw.db")),
        }

    def sides_of(self, operation: Operation) -> dict[str, Side]:
        """The pair of copies an operation runs on (see Operation.own_copies)."""
        if not operation.own_copies:
            return self.sides
        if operation.name not in self.own:
            self.own[operation.name] = self._pair(f"own-{len(self.own)}-")
        return self.own[operation.name]

    def close(self) -> None:
        """Close both sides (of every pair)."""
        for pair in (self.sides, *self.own.values()):
            for side in pair.values():
                side.close()

    def __enter__(self) -> Floor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sample(self, operation: Operation, side: str, n: int) -> Callable[[], Any]:
        """Round n's sample of an operation on one side, prepared (the untimed part done)."""
        on = self.sides_of(operation)[side]
        prepared = operation.prepare(self.plan, on, n)
        if operation.writes:
            # Every sample starts from an empty WAL with nothing dirty: no automatic
            # checkpoint of earlier writes lands in it (one copies a few MiB and fsyncs,
            # several times a small sample's cost), and it pays for its own writes only.
            checkpoint(on.path)
            os.sync()
        return prepared

    def run_both(
        self, operation: Operation, n: int, *, raw_first: bool = False
    ) -> dict[str, tuple[float, float, Any]]:
        """Round n's sample on both sides, back to back; their answers compared."""
        measured = {
            side: timed(self.sample(operation, side, n))
            for side in (SIDES[::-1] if raw_first else SIDES)
        }
        answers = {side: operation.answer(result) for side, (_c, _w, result) in measured.items()}
        if answers[DATA_LAYER] != answers[RAW]:
            raise Mismatch(f"{operation.name}: the data layer and raw sqlite3 answered differently")
        return measured

    def compare(
        self,
        operations: Sequence[Operation] = OPERATIONS,
        log: Callable[[str], None] | None = None,
    ) -> list[Comparison]:
        """Every operation on both sides: a warm-up round, then ``rounds`` measured ones."""
        results = [Comparison(op.name, op.sample, op.target) for op in operations]
        for n in range(self.rounds + 1):
            if log is not None:
                log(f"floor: round {n} of {self.rounds} (0 is the warm-up)")
            with workloads.Quiet():
                for index, (operation, result) in enumerate(zip(operations, results, strict=True)):
                    measured = self.run_both(operation, n, raw_first=(n + index) % 2 == 1)
                    if n == 0:
                        continue
                    for side, (cpu, wall, _answer) in measured.items():
                        result.sides[side].cpu.append(cpu)
                        result.sides[side].wall.append(wall)
        return results

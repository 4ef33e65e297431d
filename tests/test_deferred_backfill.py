"""The deferred FTS backfill: `upgrade --deferred-fts`, then `hermes-store optimize-storage`.

One 20k-message store is built per session: a legacy schema-21 store whose inline indexes
drifted (the legacy triggers were missing while its messages were written, so the indexes
hold nothing), which revision 22 therefore cannot convert in place. Its deferred upgrade is
the base of every large test; its immediate-mode twin (the same legacy store upgraded with
`-x fts_convert=rebuild`) is the reference: once the backfill is done every parity query
must answer exactly as on the twin (ids, order, snippets, context), and while it runs every
query must find the twin's set of hits (the rows not indexed yet are searched by a scan,
whose BM25 ranks are not the index's, so only sets are compared then).

The real-process tests (`slow`) kill `optimize-storage` with SIGKILL at many points, and
write through the library from this process while it runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from legacy import ddl
from legacy.build import build_legacy_store
from parity_queries import PARITY_QUERIES, UNENCODABLE_QUERIES

from hermes_store import migrate
from hermes_store.cli import main
from hermes_store.demo import corpus
from hermes_store.engine import create_store_engine
from hermes_store.search import sanitize_query, search_messages
from hermes_store.sqlite import backfill, fts
from hermes_store.store import NewMessage, Store

N_MESSAGES = 20_000
SEED = 2025
SMALL_MESSAGES = 800
WORD, TRIGRAM = fts.INDEXES
#: Enough for every hit of any query below: sets are compared whole.
ALL = 100_000
#: Queries with more sanitised terms than this cost FTS5 seconds each (rank and snippet
#: grow with the square of the term count: `"def " * 1000` takes ~20 s per store even at
#: 1k messages, see benchmarks/workloads.PATHOLOGICAL_TERMS); left out of the parity runs.
PATHOLOGICAL_TERMS = 64
PARITY = [
    q
    for q in (*PARITY_QUERIES, *UNENCODABLE_QUERIES)
    if len(sanitize_query(q["query"]).split()) <= PATHOLOGICAL_TERMS
]

#: Searched at a dozen points of a backfill: each must find the immediate twin's hit set.
#: Every class the pending scan must get right: words, phrases, prefixes, OR / NOT, joined
#: terms ("_" separates unicode61 tokens), non-ASCII case and diacritics (unicode61 folds
#: both, LIKE neither), multimodal rows (their content starts with NUL, where LIKE stops),
#: a bare NEAR (a plain word), CJK through the trigram index, filters and inactive rows.
#: Selective queries run at every point; broad ones (thousands of hits, each put through a
#: temporary FTS5 table while pending, ~0.5-1 s per query) at a few.
SELECTIVE_QUERIES: list[dict[str, Any]] = [
    {"query": "Traceback"},
    {"query": '"no such file or directory"'},
    {"query": "os.path.join"},
    {"query": "naïve"},
    {"query": "Francois"},
    {"query": "HÄRING"},
    {"query": "image_url"},
    {"query": "NEAR(def return)"},
    {"query": "数据库"},
    {"query": "数据库 OR 服务器"},
    {"query": "python 数据库"},
    {"query": "ありがとう"},
]
BROAD_QUERIES: list[dict[str, Any]] = [
    {"query": "exit code"},
    {"query": "pyth*"},
    {"query": "import NOT os"},
    {"query": "error OR exception"},
    {"query": "error OR NEAR"},
    {"query": "__init__"},
    {"query": "error", "role_filter": ["tool"], "source_filter": ["cli", "slack"]},
    {"query": "terminal", "include_inactive": True},
]


# --------------------------------------------------------------------------------------------
# Stores
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stores:
    """A deferred store, its immediate-mode twin, and what its messages were."""

    deferred: Path
    immediate: Path
    rows: list[tuple[int, str]]  # (id, hash of the whole row) of every message, by id

    def copy(self, target: Path) -> Path:
        return copy_store(self.deferred, target)


def copy_store(source: Path, target: Path) -> Path:
    """A consistent copy (SQLite's backup API), in WAL mode like the original."""
    with (
        contextlib.closing(sqlite3.connect(source)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=WAL")
    return target


def message_rows(path: Path) -> list[tuple[int, str]]:
    """(id, sha256 of every column) of every message, in id order."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [
            (row[0], hashlib.sha256(repr(row).encode()).hexdigest())
            for row in conn.execute("SELECT * FROM messages ORDER BY id")
        ]


def markers(path: Path) -> dict[str, str]:
    """The backfill keys of state_meta, read with plain sqlite3, by the index they fill.

    A legacy index rebuilt beside itself is filled as `<index>_next` (its keys say so):
    here its keys are named after the index it replaces.
    """
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        keys = dict(
            conn.execute(
                "SELECT key, value FROM state_meta WHERE key LIKE 'messages_fts%backfill%'"
            )
        )
    staged = {f"{fts.staged_name(index)}.": f"{index}." for index in fts.INDEXES}
    for prefix, index in staged.items():
        keys = {key.replace(prefix, index, 1): value for key, value in keys.items()}
    return keys


def stage(keys: dict[str, str]) -> tuple[tuple[int, int], ...]:
    """How far each index is: (0, indexed_upto) filling, (1, 0) merging, (2, 0) done."""
    result = []
    for index in fts.INDEXES:
        if f"{index}.backfill_high_water" in keys:
            result.append((0, int(keys.get(f"{index}.backfill_indexed_upto") or 0)))
        elif f"{index}.backfill_merging" in keys:
            result.append((1, 0))
        else:
            result.append((2, 0))
    return tuple(result)


def integrity(path: Path) -> list[str]:
    """`PRAGMA integrity_check` on a fresh plain sqlite3 connection."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        return [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]


def invoke(*args: str | Path) -> Any:
    """Run a `hermes-store ... --json` command in-process; its parsed output."""
    result = CliRunner().invoke(main, [*(str(a) for a in args), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def answers(path: Path, queries: list[dict[str, Any]]) -> list[Any]:
    """Every query's full answer on one store (an exception is an answer too)."""
    engine = create_store_engine(path, create=False)
    out: list[Any] = []
    try:
        with engine.connect() as conn:
            for kwargs in queries:
                try:
                    out.append(search_messages(conn, **kwargs))
                except Exception as exc:  # compared like any answer
                    out.append(f"{type(exc).__name__}: {exc}")
                conn.rollback()
    finally:
        engine.dispose()
    return out


def hit_sets(conn: Any, queries: list[dict[str, Any]]) -> list[set[int]]:
    result = []
    for kwargs in queries:
        result.append({hit["id"] for hit in search_messages(conn, **{"limit": ALL, **kwargs})})
        conn.rollback()
    return result


def assert_finished_and_exact(path: Path) -> None:
    """No backfill left, both FTS5 integrity checks (rank 1) and the PRAGMA pass."""
    assert markers(path) == {}
    with contextlib.closing(sqlite3.connect(path)) as conn:  # swapped in, old ones dropped
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert not {name for name in tables if name.endswith(("_next", "_retired"))}, tables
    report = invoke("check", "--db", path)
    assert report["ok"], report["problems"]
    assert set(report["checked"]) >= {"PRAGMA integrity_check", WORD, TRIGRAM}
    assert report["skipped"] == {}
    assert invoke("current", "--db", path)["backfill"] == {}
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for index in fts.INDEXES:  # the fill's FTS5 settings were put back
            config = dict(conn.execute(f"SELECT k, v FROM {index}_config"))
            assert config.get("automerge") == backfill.DEFAULT_AUTOMERGE, index
            assert config.get("crisismerge") == backfill.DEFAULT_CRISISMERGE, index
            assert config.get("usermerge") == backfill.DEFAULT_USERMERGE, index


def _legacy_store(path: Path, messages: int, *, drifted: bool) -> None:
    """A legacy schema-21 store; `drifted`: written while its FTS triggers were missing."""
    build_legacy_store(path, 21)
    data = corpus.generate(messages, SEED)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        if drifted:
            for trigger in ddl.FTS_TRIGGER_NAMES:
                conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute("BEGIN")
        corpus.populate(conn, data)
        conn.execute("COMMIT")
        if drifted:  # the triggers are back, the index still lacks every message
            for statement in (*ddl.FTS_WORD[1:], *ddl.FTS_TRIGRAM[1:]):
                conn.execute(statement)


def _checkpoint(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@contextlib.contextmanager
def _private_home(directory: Path) -> Iterator[None]:
    """Session fixtures run before the per-test HERMES_HOME: give the upgrades their own."""
    home = directory / "home"
    home.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HERMES_HOME", str(home))
        patch.delenv("HERMES_STORE_URL", raising=False)
        yield


def _build(directory: Path, messages: int, *, drifted: bool, deferred_x: dict[str, str]) -> Stores:
    legacy = directory / "legacy.db"
    _legacy_store(legacy, messages, drifted=drifted)
    immediate = copy_store(legacy, directory / "immediate.db")
    deferred = copy_store(legacy, directory / "deferred.db")
    with _private_home(directory):
        migrate.upgrade(str(immediate), x={"fts_convert": "rebuild"})
        migrate.upgrade(str(deferred), x=deferred_x)
    for path in (immediate, deferred):
        _checkpoint(path)
    stores = Stores(deferred, immediate, message_rows(deferred))
    assert stores.rows == message_rows(immediate)
    return stores


@pytest.fixture(scope="session")
def large(tmp_path_factory: pytest.TempPathFactory) -> Stores:
    """20k messages; the drift alone sends revision 22 down the (deferred) rebuild path."""
    stores = _build(
        tmp_path_factory.mktemp("deferred-20k"),
        N_MESSAGES,
        drifted=True,
        deferred_x={"fts_backfill": "deferred"},
    )
    keys = markers(stores.deferred)
    assert stage(keys) == ((0, 0), (0, 0))
    assert int(keys[f"{WORD}.backfill_high_water"]) == stores.rows[-1][0]
    return stores


@pytest.fixture(scope="session")
def large_answers(large: Stores) -> list[Any]:
    """The immediate twin's answer to every parity query: the reference."""
    return answers(large.immediate, PARITY)


@pytest.fixture(scope="session")
def small(tmp_path_factory: pytest.TempPathFactory) -> Stores:
    """A healthy legacy store, its deferred path forced with fts_convert=rebuild."""
    return _build(
        tmp_path_factory.mktemp("deferred-small"),
        SMALL_MESSAGES,
        drifted=False,
        deferred_x={"fts_convert": "rebuild", "fts_backfill": "deferred"},
    )


class _Stop(Exception):
    """Raised by a progress callback to leave a backfill half done."""


def run_partly(path: Path, steps: int, **kwargs: Any) -> None:
    """Run the backfill in-process and stop it after `steps` committed steps."""
    engine = create_store_engine(path, create=False)

    def stop(progress: backfill.BackfillProgress) -> None:
        if progress.chunks >= steps:
            raise _Stop

    try:
        with contextlib.suppress(_Stop):
            backfill.run(engine, progress=stop, sleep=lambda _s: None, **kwargs)
    finally:
        engine.dispose()


def run_to_completion(path: Path, **kwargs: Any) -> backfill.BackfillProgress:
    engine = create_store_engine(path, create=False)
    try:
        return backfill.run(engine, sleep=lambda _s: None, **kwargs)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------
# Real processes: kill -9 at many points, then resume
# --------------------------------------------------------------------------------------------


def spawn_backfill(path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hermes_store.cli", "optimize-storage", "--db", str(path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition: Callable[[], bool], process: subprocess.Popen[str], limit: float) -> bool:
    """Poll `condition` every 5 ms until true (True) or the process exited / time ran out."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.005)
    raise AssertionError(f"condition not reached within {limit} s")


class Commits:
    """Counts the commits other connections make to a store (`PRAGMA data_version`)."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=30)
        self.start = self.version()

    def version(self) -> int:
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def seen(self) -> bool:
        return self.version() != self.start

    def close(self) -> None:
        self.conn.close()


#: Where each kill lands: a delay after the process started (before its first chunk: it is
#: still importing), a delay after its first committed step (between chunks or inside one:
#: with --max-lock-ms 20 and the default duty it holds the lock about half of the time),
#: or as soon as both fills are done (inside the final merge steps; that run goes at
#: --duty 1 to get there quickly), then once more a little into the merge.
KILLS: list[tuple[str, float, tuple[str, ...]]] = [
    ("spawn", 0.05, ()),
    ("commit", 0.0, ()),
    ("commit", 0.03, ()),
    ("commit", 0.1, ()),
    ("commit", 0.25, ()),
    ("commit", 0.5, ()),
    ("commit", 0.9, ()),
    ("commit", 1.4, ()),
    # Straight to the merge: larger steps fill the rest fast, then it is killed merging.
    ("merging", 0.0, ("--duty", "1", "--max-lock-ms", "200")),
    ("commit", 0.02, ()),
]


def fills_done(path: Path) -> bool:
    return all(phase >= 1 for phase, _ in stage(markers(path)))


@pytest.mark.slow
def test_kill_9_at_many_points_then_resume_loses_nothing(
    large: Stores, large_answers: list[Any], tmp_path: Path
) -> None:
    db = large.copy(tmp_path / "state.db")
    rng = random.Random(7)
    history = [stage(markers(db))]
    mid_run = merge_kills = 0
    for when, delay, args in KILLS:
        commits = Commits(db)
        process = spawn_backfill(db, "--max-lock-ms", "20", *args)
        try:
            if when == "commit":
                alive = wait_for(commits.seen, process, 60)
            elif when == "merging":
                alive = wait_for(lambda: fills_done(db), process, 300)
            else:
                alive = process.poll() is None
            time.sleep(delay + rng.uniform(0, 0.01))
            finished = process.poll() is not None
            if not finished:
                process.send_signal(signal.SIGKILL)
        finally:
            if process.poll() is None:  # a failed wait above: never leave the child running
                process.kill()
            process.wait(60)
            committed = commits.seen()
            commits.close()
        if finished or not alive:  # it completed before this kill: nothing left to kill
            assert process.returncode == 0, process.stderr.read() if process.stderr else ""
            break
        assert process.returncode == -signal.SIGKILL
        assert integrity(db) == ["ok"]
        status = invoke("current", "--db", db)
        assert status["revision"] in ("21, fts1", migrate.head_revision())
        now = stage(markers(db))
        for index, (phase, upto) in zip(fts.INDEXES, now, strict=True):
            filling = status["backfill"].get(fts.staged_name(index)) or status["backfill"][index]
            if phase == 0:  # `current` reports what the markers say
                assert filling["state"] == "filling"
                assert filling["indexed_upto"] == upto
            elif phase == 1:
                assert filling["state"] == "merging"
        assert all(a <= b for a, b in zip(history[-1], now, strict=True)), (history[-1], now)
        if now != history[-1] and now != ((2, 0), (2, 0)):
            mid_run += 1  # the markers moved in this run, and it was not finished
        if committed and all(phase == 1 for phase, _ in history[-1]) and now != ((2, 0), (2, 0)):
            merge_kills += 1  # killed after some merge steps, before the merge was done
        history.append(now)
    # Killed in the middle of the work several times (markers moved, not finished).
    assert mid_run >= 4, history
    process = spawn_backfill(db, "--json")  # resume to completion
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    assert json.loads(out)["status"] in ("done", "nothing to do")  # a kill may have come late
    print(f"\nkills: {len(history) - 1}, mid-run {mid_run}, in the merge {merge_kills}: {history}")

    assert integrity(db) == ["ok"]
    assert_finished_and_exact(db)
    assert message_rows(db) == large.rows  # no message lost or changed
    got = answers(db, PARITY)
    differing = [q for q, a, b in zip(PARITY, got, large_answers, strict=True) if a != b]
    assert not differing, differing
    assert invoke("optimize-storage", "--db", db)["status"] == "nothing to do"


# --------------------------------------------------------------------------------------------
# Real processes: the library writes while the backfill runs
# --------------------------------------------------------------------------------------------


@dataclass
class Expected:
    """What the writes should have left: per message id its content, visibility, existence."""

    content: dict[int, str] = field(default_factory=dict)  # edited or appended
    inactive: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    tokens: dict[str, int | None] = field(default_factory=dict)  # unique token -> its row
    pending_writes: int = 0  # writes to rows that neither index had yet
    indexed_writes: int = 0
    longest_wait: float = 0.0

    def live_marked(self) -> set[int]:
        """Rows whose text carries the common marker word."""
        return {i for i, text in self.content.items() if "kqmark" in text} - self.deleted


MARK_CJK = "并发标记"  # 4 CJK characters: searched through the trigram index


@pytest.mark.slow
def test_library_writes_during_the_backfill_are_neither_lost_nor_misindexed(
    large: Stores, tmp_path: Path
) -> None:
    db = large.copy(tmp_path / "state.db")
    rng = random.Random(11)
    with contextlib.closing(sqlite3.connect(db)) as raw:
        sessions = raw.execute(
            "SELECT session_id, min(id), max(id) FROM messages GROUP BY session_id "
            "ORDER BY min(id) DESC"
        ).fetchall()
        high = int(raw.execute("SELECT max(id) FROM messages").fetchone()[0])
    store = Store(create_store_engine(db, create=False, busy_timeout_ms=5000))
    store.create_session("kq-new", "cli")
    expected = Expected()
    serial = 0
    errors: list[str] = []

    def uptos() -> tuple[int, int]:
        """(lowest, highest) indexed_upto of the pending indexes; high once both are done."""
        keys = markers(db)
        values = [
            int(keys.get(f"{i}.backfill_indexed_upto") or 0)
            if f"{i}.backfill_high_water" in keys
            else high
            for i in fts.INDEXES
        ]
        return min(values), max(values)

    def timed(write: Callable[[], Any], target: int | None) -> None:
        started = time.perf_counter()
        try:
            write()
        except Exception as exc:  # a write refused beyond the busy timeout, or worse
            errors.append(f"{type(exc).__name__}: {exc}")
            raise
        expected.longest_wait = max(expected.longest_wait, time.perf_counter() - started)
        if target is not None:  # markers only grow: above them now means never indexed before
            if target > uptos()[1]:
                expected.pending_writes += 1
            else:
                expected.indexed_writes += 1

    def live_ids(low: int, upper: int) -> list[int]:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
            return [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM messages WHERE id > ? AND id <= ? AND session_id != 'kq-new'",
                    (low, upper),
                )
            ]

    def edit(message_id: int) -> None:
        nonlocal serial
        serial += 1
        token = f"kqedit{serial}"
        text = f"kqmark {token} edited while the backfill runs {MARK_CJK}"
        old = expected.content.get(message_id)
        timed(lambda: store.edit_message(message_id, text), message_id)
        if old is not None:  # its previous unique token is gone from the index
            expected.tokens[old.split()[1]] = None
        expected.content[message_id] = text
        expected.tokens[token] = message_id

    def check_search_now() -> None:
        with store.engine.connect() as conn:
            hits = {
                h["id"] for h in search_messages(conn, "kqmark", limit=ALL, include_inactive=True)
            }
            cjk = {
                h["id"] for h in search_messages(conn, MARK_CJK, limit=ALL, include_inactive=True)
            }
        assert hits == cjk == expected.live_marked()

    process = spawn_backfill(db, "--json")
    try:
        before = markers(db)
        assert wait_for(lambda: markers(db) != before, process, 60)
        deadline = time.monotonic() + 300
        operations = 0
        while (process.poll() is None or operations < 40) and time.monotonic() < deadline:
            low, upper = uptos()
            kind = operations % 6
            pending_ids = live_ids(upper + 50, high) if upper + 50 < high else []
            indexed_ids = live_ids(0, low)
            if kind == 0 and pending_ids:  # text of a row neither index has yet
                edit(rng.choice(pending_ids))
            elif kind == 1 and indexed_ids:  # text of an indexed row (triggers)
                edit(rng.choice(indexed_ids))
            elif kind == 2 and expected.content:  # edit an edited row again
                candidates = sorted(set(expected.content) - expected.deleted)
                if candidates:
                    edit(rng.choice(candidates))
            elif kind == 3 and pending_ids:  # flags only (no re-indexing either way)
                edited = sorted(set(expected.content) - expected.deleted - expected.inactive)
                # Every other time an edited row, whose marker the default search must hide.
                target = rng.choice(edited if edited and operations % 12 == 3 else pending_ids)
                timed(
                    lambda: store.set_message_flags([target], active=False, compacted=False),  # noqa: B023
                    target,
                )
                expected.inactive.add(target)
            elif kind == 4:  # delete a whole session: not yet indexed, or indexed
                choices = [s for s in sessions if s[1] > upper + 50] or [
                    s for s in sessions if s[2] <= low
                ]
                if choices:
                    victim = choices[rng.randrange(min(3, len(choices)))]
                    sessions.remove(victim)
                    gone = set(live_ids(victim[1] - 1, victim[2]))
                    timed(lambda: store.delete_session(victim[0]), victim[1])  # noqa: B023
                    expected.deleted |= gone
                    expected.inactive -= gone
            elif kind == 5:  # append: above the high-water mark, indexed by the triggers
                serial += 1
                token = f"kqedit{serial}"
                text = f"kqmark {token} appended while the backfill runs {MARK_CJK}"
                ids: list[int] = []
                timed(
                    lambda: ids.extend(  # noqa: B023
                        store.append_messages("kq-new", [NewMessage(role="user", content=text)])  # noqa: B023
                    ),
                    None,
                )
                expected.content[ids[0]] = text
                expected.tokens[token] = ids[0]
            operations += 1
            if operations % 25 == 0:
                check_search_now()  # complete while pending, too
            time.sleep(0.01)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(60)
    assert process.returncode == 0, err
    assert json.loads(out)["status"] == "done"
    assert not errors
    print(
        f"\n{operations} operations, {expected.pending_writes} on rows not indexed yet, "
        f"{expected.indexed_writes} on indexed rows; longest write {expected.longest_wait:.3f} s"
    )
    assert expected.pending_writes >= 5
    assert expected.indexed_writes >= 5
    assert expected.deleted
    assert expected.inactive

    assert integrity(db) == ["ok"]
    assert_finished_and_exact(db)
    # Every write is there, nothing else changed.
    with contextlib.closing(sqlite3.connect(db)) as raw:
        current = {
            row[0]: row[1:]
            for row in raw.execute("SELECT id, content, active, compacted FROM messages")
        }
    assert not expected.deleted & set(current)
    for message_id, text in expected.content.items():
        if message_id not in expected.deleted:
            assert current[message_id][0] == text
    for message_id in expected.inactive - expected.deleted:
        assert current[message_id][1] == 0
    touched = set(expected.content) | expected.inactive | expected.deleted
    assert [r for r in message_rows(db) if r[0] not in touched] == [
        r for r in large.rows if r[0] not in touched
    ]
    # The indexes hold exactly the new text: new tokens found where they are, old ones gone.
    check_search_now()
    with store.engine.connect() as conn:
        for token, owner in expected.tokens.items():
            hits = [h["id"] for h in search_messages(conn, token, include_inactive=True)]
            live = owner is not None and owner not in expected.deleted
            assert hits == ([owner] if live else []), token
        # Rewound rows (ours, and the corpus' own) are hidden from the default search.
        assert (expected.inactive - expected.deleted) & set(expected.content)
        visible = {h["id"] for h in search_messages(conn, "kqmark", limit=ALL)}
        assert visible == {i for i in expected.live_marked() if 1 in current[i][1:]}
    store.close()


# --------------------------------------------------------------------------------------------
# Search completeness during a backfill
# --------------------------------------------------------------------------------------------


def test_every_query_finds_the_oracles_hits_at_a_dozen_points_of_the_backfill(
    large: Stores, tmp_path: Path
) -> None:
    db = large.copy(tmp_path / "state.db")
    engine = create_store_engine(large.immediate, create=False)
    with engine.connect() as conn:
        oracle = {
            False: hit_sets(conn, SELECTIVE_QUERIES),
            True: hit_sets(conn, SELECTIVE_QUERIES + BROAD_QUERIES),
        }
    engine.dispose()
    assert all(oracle[True])  # every query has hits
    reader = create_store_engine(db, create=False)
    checked: list[str] = []
    thresholds = [k / 13 for k in range(1, 13)]
    broad_at = {6}  # the threshold where the broad queries run too (and first and merging)

    def compare(label: str, broad: bool) -> None:
        queries = SELECTIVE_QUERIES + (BROAD_QUERIES if broad else [])
        with reader.connect() as conn:
            got = hit_sets(conn, queries)
        differing = [
            (q["query"], len(a), len(b), sorted(a ^ b)[:5])
            for q, a, b in zip(queries, got, oracle[broad], strict=True)
            if a != b
        ]
        assert not differing, (label, differing)
        checked.append(label)

    def filled() -> float:
        with reader.connect() as conn:
            waiting = {item.logical: item for item in backfill.pending(conn)}
        return sum(
            waiting[i].indexed_upto / waiting[i].high_water if i in waiting else 1.0
            for i in fts.INDEXES
        ) / len(fts.INDEXES)

    def progress(_report: backfill.BackfillProgress) -> None:
        share = filled()
        passed = [t for t in thresholds if share >= t]
        if passed and share < 1:
            number = 13 - len(thresholds) + len(passed) - 1
            compare(f"{share:.0%} filled", broad=number in broad_at)
        del thresholds[: len(passed)]
        if share == 1 and not any(label == "merging" for label in checked):
            with reader.connect() as conn:
                if backfill.merging(conn):
                    compare("merging", broad=True)

    compare("nothing indexed", broad=True)
    writer = create_store_engine(db, create=False)
    try:
        backfill.run(writer, max_lock_ms=50, progress=progress, sleep=lambda _s: None)
    finally:
        writer.dispose()
    compare("done", broad=False)
    reader.dispose()
    assert len(checked) >= 12, checked


# --------------------------------------------------------------------------------------------
# The small paths
# --------------------------------------------------------------------------------------------


def test_a_deferred_upgrade_of_a_healthy_store_still_converts_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _legacy_store(path, 300, drifted=False)
    with _private_home(tmp_path):
        result = migrate.upgrade(str(path), x={"fts_backfill": "deferred"})
        assert result.after == (migrate.head_revision(),)
    assert markers(path) == {}
    status = invoke("current", "--db", path)
    assert status["fts_indexes"] == {WORD: "external", TRIGRAM: "external"}
    assert status["backfill"] == {}
    report = invoke("check", "--db", path)
    assert report["ok"]
    assert report["skipped"] == {}
    with contextlib.closing(sqlite3.connect(path)) as conn:  # the legacy data was reused
        docs = conn.execute(f"SELECT count(*) FROM {WORD}_docsize").fetchone()[0]
    assert docs == 300


def test_check_while_pending_skips_the_unfilled_indexes_and_exits_0(
    small: Stores, tmp_path: Path
) -> None:
    db = small.copy(tmp_path / "state.db")
    result = CliRunner().invoke(main, ["check", "--db", str(db)])
    assert result.exit_code == 0, result.output
    for index in fts.INDEXES:
        line = next(line for line in result.stdout.splitlines() if line.startswith(index + " "))
        assert "not checked" in line
        assert "optimize-storage" in line
    report = invoke("check", "--db", db)
    assert report["ok"]
    assert set(report["skipped"]) == set(fts.INDEXES)
    assert report["checked"] == ["PRAGMA integrity_check"]


def test_current_json_shows_the_progress(small: Stores, tmp_path: Path) -> None:
    db = small.copy(tmp_path / "state.db")
    high = small.rows[-1][0]
    start = invoke("current", "--db", db)["backfill"]
    assert start == {
        index: {
            "state": "filling",
            "high_water": high,
            "indexed_upto": 0,
            "rows_left": high,
            "table": fts.staged_name(index),  # rebuilt beside the drifted legacy index
        }
        for index in fts.INDEXES
    }
    run_partly(db, 3, chunk_rows=40)
    middle = invoke("current", "--db", db)["backfill"]
    moved = [i for i in fts.INDEXES if middle[i].get("indexed_upto", 0) > 0]
    assert moved
    for index in moved:
        status = middle[index]
        assert status["state"] == "filling"
        assert status["rows_left"] == high - status["indexed_upto"] > 0
    run_to_completion(db)
    assert invoke("current", "--db", db)["backfill"] == {}


def test_pending_search_sees_edits_deletes_and_flags_of_rows_not_indexed_yet(
    small: Stores, tmp_path: Path
) -> None:
    db = small.copy(tmp_path / "state.db")
    run_partly(db, 4, chunk_rows=50)
    keys = markers(db)
    upto = max(int(keys[f"{i}.backfill_indexed_upto"]) for i in fts.INDEXES)
    low = min(int(keys[f"{i}.backfill_indexed_upto"]) for i in fts.INDEXES)
    assert low > 0
    assert upto < small.rows[-1][0] - 100
    with contextlib.closing(sqlite3.connect(db)) as raw:
        sessions = raw.execute(
            "SELECT session_id, min(id) FROM messages GROUP BY session_id HAVING min(id) > ? "
            "ORDER BY min(id) LIMIT 1",
            (upto + 10,),
        ).fetchall()
    assert sessions
    gone_session = sessions[0][0]
    pending_id, hidden_id, indexed_id = upto + 1, upto + 2, 1
    store = Store(create_store_engine(db, create=False))
    in_session = [m.id for m in store.messages(gone_session)]
    store.edit_message(pending_id, "zqalpha 游标测试甲 first version")
    store.edit_message(pending_id, "zqbeta 游标测试乙 second version")
    store.edit_message(hidden_id, "zqhidden 隐藏的消息")
    store.set_message_flags([hidden_id], active=False, compacted=False)
    store.edit_message(indexed_id, "zqindexed 已经索引")
    store.edit_message(in_session[0], "zqgone 将被删除")
    assert store.delete_session(gone_session) == len(in_session)
    store.create_session("kq", "cli")
    appended = store.append_message("kq", NewMessage("user", "zqnew 新消息"))

    def ids(query: str, **kwargs: Any) -> list[int]:
        with store.engine.connect() as conn:
            return [h["id"] for h in search_messages(conn, query, limit=ALL, **kwargs)]

    def check() -> None:
        assert ids("zqalpha") == []
        assert ids("游标测试甲") == []
        assert ids("zqbeta") == [pending_id]
        assert ids("游标测试乙") == [pending_id]
        assert ids("zqhidden") == []
        assert ids("zqhidden", include_inactive=True) == [hidden_id]
        assert ids("zqindexed") == [indexed_id]
        assert ids("已经索引") == [indexed_id]
        assert ids("zqgone", include_inactive=True) == []
        assert ids("将被删除") == []
        assert ids("zqnew") == [appended]
        assert ids("新消息") == [appended]

    assert markers(db) == keys  # still pending: the scan answered for those rows
    check()
    # Paging over the merged hits: a negative limit is "no limit", offsets cut the front.
    everything = ids("Traceback")
    with store.engine.connect() as conn:
        assert len(search_messages(conn, "Traceback", limit=-1)) == len(everything) > 5
        assert len(search_messages(conn, "Traceback", limit=-1, offset=5)) == len(everything) - 5
        assert len(search_messages(conn, "Traceback", limit=3, offset=2)) == 3
    store.close()
    run_to_completion(db)
    assert_finished_and_exact(db)
    check()


def test_a_completed_backfill_answers_exactly_like_the_immediate_mode(
    small: Stores, tmp_path: Path
) -> None:
    db = small.copy(tmp_path / "state.db")
    report = run_to_completion(db, chunk_rows=64)
    assert report.rows_done == small.rows[-1][0]
    assert report.chunks > 20
    assert_finished_and_exact(db)
    assert message_rows(db) == small.rows
    assert answers(db, PARITY) == answers(small.immediate, PARITY)


def test_a_repair_restart_then_backfill_ends_exact(small: Stores, tmp_path: Path) -> None:
    db = small.copy(tmp_path / "state.db")
    run_to_completion(db)
    engine = create_store_engine(db, create=False)
    with engine.begin() as conn:
        for index in fts.INDEXES:
            backfill.start(conn, index)
    engine.dispose()
    assert stage(markers(db)) == ((0, 0), (0, 0))
    run_to_completion(db, chunk_rows=100)
    assert_finished_and_exact(db)
    assert answers(db, PARITY) == answers(small.immediate, PARITY)


#: Where the pending scan and the indexes used to disagree: a trigram term shorter than 3
#: characters (FTS5 makes it a phrase of no tokens: neutral beside other terms, nothing
#: alone), and a NUL (FTS5 reads a MATCH expression only up to it).
SHORT_AND_NUL_QUERIES = [
    {"query": q, "limit": 1000}
    for q in (
        "AI 数据库",
        "数据 数据库",
        "数据库 AI",
        "AI OR 数据库",
        "数据库 OR AI",
        "AI",
        "数据",
        "AI 数据库 迁移",
        "error\x00docker",
        "docker\x00",
        "\x00error",
        "error docker\x00search",
        "数据库\x00AI",
    )
]


def test_pending_search_is_exact_for_short_trigram_terms_and_nul(
    small: Stores, tmp_path: Path
) -> None:
    db = small.copy(tmp_path / "state.db")
    assert stage(markers(db)) == ((0, 0), (0, 0))  # nothing indexed yet: all pending
    got = answers(db, SHORT_AND_NUL_QUERIES)
    expected = answers(small.immediate, SHORT_AND_NUL_QUERIES)
    assert [sorted(hit["id"] for hit in a) if isinstance(a, list) else a for a in got] == [
        sorted(hit["id"] for hit in a) if isinstance(a, list) else a for a in expected
    ]
    assert any(isinstance(a, list) and a for a in expected[:3])  # the CJK queries find rows


_PIECES = st.sampled_from(
    [
        "AI",
        "数据",
        "数据库",
        "迁移",
        "error",
        "docker",
        "\x00",
        "OR",
        "NOT",
        "ab",
        "测试",
        "搜索中文",
    ]
)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, database=None, derandomize=True)
@given(pieces=st.lists(_PIECES, min_size=1, max_size=5))
def test_pending_search_equals_the_completed_store_on_mixed_queries(
    pieces: list[str], small: Stores, pending_small: Path
) -> None:
    # Every hit (the store has 800 messages): the sets compare, not a rank-cut page.
    query = [{"query": " ".join(pieces), "limit": 1000}]
    got, expected = answers(pending_small, query)[0], answers(small.immediate, query)[0]
    if isinstance(expected, list) and isinstance(got, list):
        assert {hit["id"] for hit in got} == {hit["id"] for hit in expected}, query
    else:
        assert got == expected, query


@pytest.fixture(scope="module")
def pending_small(small: Stores, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the small deferred store with nothing indexed yet (read-only use)."""
    return small.copy(tmp_path_factory.mktemp("pending-small") / "state.db")


def test_a_search_follows_a_backfill_started_on_its_own_connection(
    small: Stores, tmp_path: Path
) -> None:
    """The backfill markers a search keeps are read again when its own connection writes
    them (no other connection committed anything): emptied indexes are scanned at once."""
    path = copy_store(small.immediate, tmp_path / "state.db")
    engine = create_store_engine(path, create=False)
    queries = [{"query": "error", "limit": 1000}, {"query": "数据库", "limit": 1000}]
    try:
        with engine.connect() as conn:
            before = hit_sets(conn, queries)
            assert all(before)
            with conn.begin():
                for index in fts.INDEXES:
                    backfill.start(conn, index)
            assert hit_sets(conn, queries) == before
        with Store(engine) as store:  # its searches run on the driver: the same answers
            assert [{h["id"] for h in store.search(**q)} for q in queries] == before
    finally:
        engine.dispose()

"""One archive or restore run: finish a killed run's batch, choose, move in paced batches,
give the freed pages back."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hermes_store.archive.marker import read_marker
from hermes_store.archive.move import (
    LOCK_TARGET_S,
    MIN_PAUSE_S,
    PAUSE_SHARE,
    Moved,
    Mover,
)
from hermes_store.archive.resume import finish_in_flight
from hermes_store.archive.rows import OWNED_TABLES, read_batch
from hermes_store.archive.select import (
    Criterion,
    Tree,
    conflicts,
    select_trees,
    still_qualifies,
    tree_of,
)
from hermes_store.archive.shape import enter, leave, lost_values
from hermes_store.archive.stores import Side, open_pair
from hermes_store.errors import ArchiveRefused, DiskFull, Interrupted

__all__ = [
    "BATCH_MESSAGES",
    "LOCK_TARGET_S",
    "MoveResult",
    "archive_sessions",
    "restore_session",
]

#: The most messages one batch carries (a tree larger than this is one batch of its own).
BATCH_MESSAGES = 2000
#: The first batch's messages; each next batch is sized so that the fixed part of its last
#: write transaction on the hot store (see ``move``) stays under half of LOCK_TARGET_S.
FIRST_BATCH_MESSAGES = 200
#: Sessions per batch at most (their ids are one IN list per statement).
BATCH_SESSIONS = 200
#: A run that moved at least this share of the store's messages (counted before the run)
#: also compacts the search indexes it left (``optimize(compact=True)``: each rebuilt
#: online and swapped in). Below it, the bounded merges keep the index near its size (a
#: delete marker costs a few bytes a row), and a rebuild, one pass over the text still in
#: the store, would cost more than it returns.
COMPACT_SHARE = 0.2


@dataclass
class MoveResult:
    """What an archive or restore run did (or, with a dry run, would do)."""

    direction: str
    hot: str
    archive: str
    dry_run: bool
    criterion: dict[str, Any] | None
    #: What qualified: trees, sessions, messages, bytes of their rows.
    trees: int = 0
    sessions: int = 0
    messages: int = 0
    bytes: int = 0
    #: Trees that stay, by reason.
    kept: dict[str, int] = field(default_factory=dict)
    moved: Moved = field(default_factory=Moved)
    created_archive: bool = False
    #: The store the rows left: its bytes before the run and after the pages were given back.
    bytes_before: int = 0
    bytes_after: int = 0
    #: Free bytes only a full vacuum (`hermes-store optimize --vacuum`) can return.
    vacuum_needed_bytes: int = 0
    #: The search indexes rebuilt online after the batches (see COMPACT_SHARE), their
    #: bytes before and after (None: not measured) and the seconds it took.
    compacted: list[str] = field(default_factory=list)
    index_bytes_before: int | None = None
    index_bytes_after: int | None = None
    compact_seconds: float = 0.0
    #: The longest write lock of the give-back after the batches (compaction, merges,
    #: vacuum steps), in seconds.
    give_back_lock_s: float = 0.0
    #: ... and of the compaction's steps alone.
    compact_lock_s: float = 0.0
    #: The store's messages before the run (what COMPACT_SHARE is a share of).
    messages_before: int = 0
    #: A batch a stopped run left, which the next run finishes (dry runs only).
    in_flight: str = ""
    #: restore: the session is in the hot store already (nothing to move).
    in_hot: bool = False
    seconds: float = 0.0

    @property
    def nothing_to_move(self) -> bool:
        return self.trees == 0 and not self.moved.batches

    def as_dict(self) -> dict[str, Any]:
        moved = self.moved
        return {
            "direction": self.direction,
            "hot": self.hot,
            "archive": self.archive,
            "dry_run": self.dry_run,
            "criterion": self.criterion,
            "selected": {
                "trees": self.trees,
                "sessions": self.sessions,
                "messages": self.messages,
                "bytes": self.bytes,
            },
            "kept": self.kept,
            "moved": {
                "batches": moved.batches,
                "sessions": moved.sessions,
                "messages": moved.messages,
                "rows": moved.rows,
                "bytes": moved.bytes,
                "changed_while_moving": moved.changed,
                "longest_hot_write_lock_s": round(moved.longest_lock_s, 3),
                "longest_hot_write_lock_by_step_s": {
                    step: round(held, 3)
                    for step, held in sorted(moved.longest_lock_by_step.items())
                },
                "hot_writes_by_step": dict(sorted(moved.writes_by_step.items())),
            },
            "resumed": moved.resumed or None,
            "in_flight": self.in_flight or None,
            "created_archive": self.created_archive,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "vacuum_needed_bytes": self.vacuum_needed_bytes,
            "compaction": {
                "indexes": self.compacted,
                "index_bytes_before": self.index_bytes_before,
                "index_bytes_after": self.index_bytes_after,
                "seconds": round(self.compact_seconds, 3),
                "longest_write_lock_s": round(self.compact_lock_s, 3),
                "give_back_longest_write_lock_s": round(self.give_back_lock_s, 3),
                "messages_before": self.messages_before,
                "threshold_share": COMPACT_SHARE,
            },
            "nothing_to_move": self.nothing_to_move,
            "in_hot_store_already": self.in_hot,
            "seconds": round(self.seconds, 3),
        }


def _size(side: Side) -> int:
    return sum(side.backend.stats(side.reader).sizes.values())


def _measure(side: Side, result: MoveResult) -> None:
    """The store's bytes and messages before the run."""
    stats = side.backend.stats(side.reader)
    result.bytes_before = sum(stats.sizes.values())
    result.messages_before = stats.messages


def _give_back(side: Side, result: MoveResult) -> None:
    """The bounded ``optimize`` on the store the rows left: the index segments the deletes
    added merged in short steps (or, past COMPACT_SHARE, each index rebuilt online and
    swapped in), the WAL checkpointed, free pages returned in steps; the bytes only a full
    vacuum could return recorded."""
    moved = result.moved.messages
    compact = moved > 0 and moved >= COMPACT_SHARE * result.messages_before
    shown = side.backend.optimize(side.reader, vacuum=None, compact=compact)
    result.vacuum_needed_bytes = int(getattr(shown, "vacuum_needed_bytes", 0))
    result.compacted = list(getattr(shown, "compacted", []))
    result.index_bytes_before = getattr(shown, "index_bytes_before", None)
    result.index_bytes_after = getattr(shown, "index_bytes_after", None)
    result.compact_seconds = float(getattr(shown, "compact_seconds", 0.0))
    result.give_back_lock_s = float(getattr(shown, "longest_write_lock_s", 0.0))
    result.compact_lock_s = float(getattr(shown, "compact_longest_lock_s", 0.0))


def _finish(src: Side, result: MoveResult) -> None:
    """After the batches: the space given back on the store the rows left (also when only
    a compaction a stopped run left is to finish), and its size."""
    if result.moved.batches or src.backend.compaction_pending(src.reader):
        _give_back(src, result)
    result.bytes_after = _size(src)


def _ended_by(exc: DiskFull | KeyboardInterrupt, result: MoveResult) -> DiskFull | Interrupted:
    """What a run a full disk or an interrupt stopped says: the command to run again."""
    return _rerun(exc) if isinstance(exc, DiskFull) else _stopped(result.moved)


def _close(shaped: Any, src: Side, dst: Side | None) -> None:
    """The hot store's shape let go and both stores' engines disposed."""
    leave(shaped)
    src.dispose()
    if dst is not None:
        dst.dispose()


def _rerun(exc: DiskFull) -> DiskFull:
    """A full disk, told with what the run guarantees and the command that finishes it."""
    said = str(exc).split("; the step in progress", 1)[0]
    return DiskFull(
        f"{said}; nothing was lost: the batch in flight was rolled back, or is finished by "
        "the next run, and every session is in exactly one store. Free space, then run the "
        "same command again"
    )


def _stopped(moved: Moved) -> Interrupted:
    return Interrupted(
        f"interrupted after {moved.sessions} sessions in {moved.batches} batches; every "
        "session is in exactly one store, and a batch in flight is finished by the next run: "
        "run the same command again"
    )


def _batches(trees: list[Tree], budget: int) -> tuple[list[Tree], list[Tree]]:
    """The next batch (at least one tree) and the trees after it."""
    taken, messages, sessions = 0, 0, 0
    for tree in trees:
        if taken and (
            messages + tree.messages > budget or sessions + len(tree.sessions) > BATCH_SESSIONS
        ):
            break
        taken += 1
        messages += tree.messages
        sessions += len(tree.sessions)
    return trees[:taken], trees[taken:]


def _in_flight(first: Side, second: Side | None) -> str:
    for side in (first, second):
        if side is None:
            continue
        with side.reading() as conn:
            found = read_marker(conn)
        if found is not None:
            return (
                f"{side.shown} records a batch of {len(found.get('sessions', []))} sessions in "
                f"flight from {found.get('from')} to {found.get('to')}; the next run finishes it"
            )
    return ""


def archive_sessions(
    hot: str | None,
    to: str,
    rule: Criterion,
    *,
    dry_run: bool = False,
    batch_messages: int = BATCH_MESSAGES,
    progress: Callable[[Moved, int], None] | None = None,
) -> MoveResult:
    """Move the session trees of ``hot`` that qualify by ``rule`` into the archive ``to``
    (created when missing), in verified batches; then give the hot store's freed pages back.
    ``dry_run``: say what would move, changing nothing (the archive is not created)."""
    started = time.perf_counter()
    src, dst = open_pair(hot, to, other_option="--to", create_other=True, missing_ok=dry_run)
    result = MoveResult(
        "archive", src.shown, dst.shown if dst is not None else to, dry_run, rule.as_dict()
    )
    result.created_archive = dst is not None and dst.created
    shaped = enter(src.shape)
    try:
        _measure(src, result)
        if dry_run:
            result.in_flight = _in_flight(src, dst)
        elif dst is not None:
            finish_in_flight(src, dst, src, result.moved)
        now = time.time()
        with src.reading() as conn:
            selection = select_trees(conn, rule, now=now)
        trees = selection.trees
        result.kept = dict(selection.kept)
        if dst is not None:
            with src.reading() as src_conn, dst.reading() as dst_conn:
                refused = conflicts(dst_conn, src_conn, trees)
            for why in refused.values():
                result.kept[why] = result.kept.get(why, 0) + 1
            trees = [tree for i, tree in enumerate(trees) if i not in refused]
        result.trees = len(trees)
        result.sessions = sum(len(tree.sessions) for tree in trees)
        result.messages = sum(tree.messages for tree in trees)
        if dry_run:
            result.bytes = _bytes(src, trees)
        else:
            assert dst is not None
            _move_all(src, dst, trees, rule, result, batch_messages, progress)
            result.bytes = result.moved.bytes
        _finish(src, result)
    except (DiskFull, KeyboardInterrupt) as exc:
        raise _ended_by(exc, result) from exc
    finally:
        _close(shaped, src, dst)
    result.seconds = time.perf_counter() - started
    return result


def _bytes(side: Side, trees: list[Tree]) -> int:
    total = 0
    rest = trees
    while rest:
        batch, rest = _batches(rest, BATCH_MESSAGES)
        with side.reading() as conn:
            total += read_batch(conn, [sid for tree in batch for sid in tree.sessions]).bytes()
    return total


def _move_all(
    src: Side,
    dst: Side,
    trees: list[Tree],
    rule: Criterion,
    result: MoveResult,
    most: int,
    progress: Callable[[Moved, int], None] | None,
) -> None:
    """Move ``trees`` in batches sized to keep the hot store's write lock short."""
    mover = Mover(src, dst, src, result.moved)
    budget = min(FIRST_BATCH_MESSAGES, most)
    rest = trees
    #: Trees of a batch that changed while being moved, each tried once more on its own:
    #: one session the agent wrote to keeps only its own tree back.
    alone: list[Tree] = []
    total = sum(len(tree.sessions) for tree in trees)
    while rest or alone:
        if alone:
            batch, alone = alone[:1], alone[1:]
        else:
            batch, rest = _batches(rest, budget)
        ids = [sid for tree in batch for sid in tree.sessions]
        moved = mover.move(ids, lambda rows: still_qualifies(rows, rule, time.time()))
        if not moved and len(batch) > 1:
            alone.extend(batch)
            result.moved.changed -= 1  # counted per tree when tried alone
        # Its messages leave in chunks sized by time: what the batch's size decides is the
        # rest of its last transaction (the checks of its rows, its sessions' delete).
        fixed = mover.fixed_lock_s
        if fixed > LOCK_TARGET_S / 2:
            budget = max(1, budget // 2)
        elif fixed < LOCK_TARGET_S / 8:
            budget = min(most, budget * 2)
        held = mover.last_lock_s
        if progress is not None:
            progress(result.moved, total)
        if rest or alone:
            time.sleep(max(MIN_PAUSE_S, held * PAUSE_SHARE))


def restore_session(
    session_id: str,
    hot: str | None,
    from_: str,
    *,
    dry_run: bool = False,
) -> MoveResult:
    """Bring the session ``session_id`` of the archive ``from_``, with its whole tree,
    back into ``hot``: copied, verified, then deleted from the archive."""
    started = time.perf_counter()
    dst, src = open_pair(hot, from_, other_option="--from", create_other=False)
    assert src is not None
    result = MoveResult("restore", dst.shown, src.shown, dry_run, None)
    shaped = enter(dst.shape)
    try:
        _measure(src, result)
        if dry_run:
            result.in_flight = _in_flight(dst, src)
        else:
            finish_in_flight(dst, src, dst, result.moved)
        with src.reading() as conn:
            tree = tree_of(conn, session_id)
        if tree is None:
            with dst.reading() as conn:
                here = tree_of(conn, session_id) is not None
            if not here:
                raise ArchiveRefused(
                    f"--from {src.shown} holds no session {session_id!r}, nor does the hot "
                    "store; nothing was changed"
                )
            result.in_hot = True
        else:
            with src.reading() as src_conn, dst.reading() as dst_conn:
                refused = conflicts(dst_conn, src_conn, [tree])
            if refused:
                raise ArchiveRefused(
                    f"session {session_id!r} cannot be restored: {refused[0]} (a session of "
                    "its tree); nothing was changed"
                )
            if dst.shape is not None:
                with src.reading() as conn:
                    lost = lost_values(conn, dst.shape, OWNED_TABLES, tree.sessions)
                if lost:
                    raise ArchiveRefused(
                        f"session {session_id!r} cannot be restored into --db {dst.shown}: "
                        f"its tree holds a value in {lost}, which the hot store's schema "
                        "has no place for and would lose; upgrade the hot store (`hermes-store "
                        "upgrade --app-version N`, N the version that has it). Nothing was "
                        "changed"
                    )
            result.trees, result.sessions, result.messages = 1, len(tree.sessions), tree.messages
            if dry_run:
                result.bytes = _bytes(src, [tree])
            else:
                Mover(src, dst, dst, result.moved).move(list(tree.sessions))
                result.bytes = result.moved.bytes
        _finish(src, result)
    except (DiskFull, KeyboardInterrupt) as exc:
        raise _ended_by(exc, result) from exc
    finally:
        _close(shaped, src, dst)
    result.seconds = time.perf_counter() - started
    return result

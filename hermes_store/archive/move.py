"""One batch of session trees moved from one store to the other, and a batch in flight
finished after a kill.

A batch goes in these steps, each a transaction of its own (see ``marker`` for what a
kill between any two leaves, and how the next run finishes it):

1. the marker, in the store the batch leaves, with the row count and checksum of each
   table's rows of the batch as read there;
2. the rows copied into the other store, read back and verified against those checksums,
   and its marker, in one transaction (a copy that reads back different is rolled back);
3. under the first store's write lock: the batch's sessions locked, its rows checked
   against the checksums again (unchanged since they were read, no new child session),
   then deleted, with the marker;
4. the second store's marker cleared.

A batch whose rows changed in the first store since they were read (the agent wrote to one
of its sessions) is taken back out of the second store, once that copy is checked to be
unchanged, and stays where it was. A copy the agent writes to after it committed (a
restored session continued) is the newer one: the first store's rows are deleted as
checked, whatever the second store's rows became.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, func, select
from sqlalchemy.exc import IntegrityError

from hermes_store.archive.marker import clear_marker, put_marker, read_marker
from hermes_store.archive.rows import (
    OWNED_TABLES,
    BatchRows,
    delete_rows,
    owned_condition,
    read_batch,
    write_batch,
)
from hermes_store.archive.stores import Side
from hermes_store.archive.verify import Sums, batch_sums, differences
from hermes_store.copy.tables import copied_table
from hermes_store.errors import ArchiveRefused

__all__ = ["STEP_HOOK", "Moved", "Mover", "reached"]

#: Called with the name of each step a batch reaches (``marked``, ``copying`` inside the
#: copy's transaction, ``copied``, ``verified``, ``deleting`` inside the delete's
#: transaction, ``deleted``, ``done``): the kill tests stop the process there.
STEP_HOOK: Callable[[str], None] | None = None


def reached(step: str) -> None:
    """Tell :data:`STEP_HOOK` a batch reached ``step``."""
    if STEP_HOOK is not None:
        STEP_HOOK(step)


class _Changed(Exception):
    """The batch's rows changed between the copy and the delete."""


class _CopyDiffers(Exception):
    """The copy, read back in its transaction, differs from the rows read (by table)."""


@dataclass
class Moved:
    """What the batches of one run moved."""

    batches: int = 0
    sessions: int = 0
    messages: int = 0
    #: Rows moved, by table (system prompts: copied where missing).
    rows: dict[str, int] = field(default_factory=dict)
    #: Bytes of the moved rows' values.
    bytes: int = 0
    #: Trees left where they were because they changed while being moved.
    changed: int = 0
    #: What finishing a batch a killed run left did ("" when there was none).
    resumed: str = ""
    #: The longest write transaction on the hot store, in seconds.
    longest_lock_s: float = 0.0

    def add(self, deleted: dict[str, int], size: int) -> None:
        self.batches += 1
        self.sessions += deleted.get("sessions", 0)
        self.messages += deleted.get("messages", 0)
        self.bytes += size
        for name, count in deleted.items():
            self.rows[name] = self.rows.get(name, 0) + count


def _locked_sessions(conn: Connection, ids: Sequence[str]) -> list[str]:
    """The batch's sessions, locked against writers until the transaction ends (FOR
    UPDATE where the database locks rows; SQLite's write lock covers them already)."""
    sessions = copied_table("sessions")
    query = select(sessions.c.id).where(owned_condition(sessions, ids)).with_for_update()
    return list(conn.scalars(query))


def _new_children(conn: Connection, ids: Sequence[str]) -> int:
    """Sessions outside the batch whose parent is in it (started since it was chosen)."""
    sessions = copied_table("sessions")
    query = (
        select(func.count())
        .select_from(sessions)
        .where(sessions.c.parent_session_id.in_(list(ids)), ~sessions.c.id.in_(list(ids)))
    )
    return int(conn.scalar(query) or 0)


def _held(conn: Connection, ids: Sequence[str]) -> int:
    sessions = copied_table("sessions")
    return int(
        conn.scalar(
            select(func.count()).select_from(sessions).where(owned_condition(sessions, ids))
        )
        or 0
    )


class Mover:
    """Moves batches from ``src`` to ``dst``; ``hot`` is the store the agent writes to
    (its write transactions are timed)."""

    def __init__(self, src: Side, dst: Side, hot: Side, moved: Moved) -> None:
        self.src = src
        self.dst = dst
        self.hot = hot
        self.moved = moved
        #: How long the last batch held the hot store's write lock.
        self.last_lock_s = 0.0

    def _timed(self, side: Side, started: float) -> None:
        if side is self.hot:
            held = time.perf_counter() - started
            self.last_lock_s = max(self.last_lock_s, held)
            self.moved.longest_lock_s = max(self.moved.longest_lock_s, held)

    def _write(self, side: Side, work: Callable[[Connection], Any]) -> Any:
        """One write transaction on ``side``; on the hot store, how long it held the write
        lock (from the BEGIN that took it to the COMMIT) is kept."""
        with side.writer.connect() as conn:
            transaction = conn.begin()  # waits for the write lock (the busy timeout)
            started = time.perf_counter()
            try:
                result = work(conn)
                transaction.commit()
            except BaseException:
                transaction.rollback()
                raise
            finally:
                self._timed(side, started)
            return result

    # -- a new batch ----------------------------------------------------------------------

    def move(self, ids: Sequence[str], check: Callable[[BatchRows], bool] | None = None) -> bool:
        """Move the sessions ``ids`` (whole trees); False when they changed meanwhile (or
        no longer pass ``check``, given the rows as read for the copy) and stay where they
        were."""
        self.last_lock_s = 0.0
        token = secrets.token_hex(8)
        with self.src.reading() as conn:
            rows = read_batch(conn, sorted(ids))
            high = self.src.backend.message_id_high_water(conn)
        if check is not None and not check(rows):
            self.moved.changed += 1
            return False
        marker: dict[str, Any] = {
            "batch": token,
            "from": self.src.name,
            "to": self.dst.name,
            "sessions": rows.ids,
            "hashes": rows.hashes,
            "sums": rows.sums(),
        }
        self._write(self.src, lambda conn: put_marker(conn, marker))
        reached("marked")

        def copy(conn: Connection) -> None:
            write_batch(conn, rows)
            # Verified before it commits: read back, the copy's rows are the rows read.
            differ = differences(batch_sums(conn, rows.ids, rows.hashes), marker["sums"])
            if differ:
                raise _CopyDiffers(differ)
            self.dst.backend.raise_message_ids(conn, high)
            put_marker(conn, marker)
            reached("copying")

        try:
            self._write(self.dst, copy)
        except (IntegrityError, _CopyDiffers) as exc:
            self._write(self.src, lambda conn: clear_marker(conn, token))
            if isinstance(exc, _CopyDiffers):
                reason = f"read back, {', '.join(exc.args[0])} differed"
            else:
                reason = self.dst.backend.write_refusal_reason(exc.orig)
            raise ArchiveRefused(
                f"{self.dst.option} {self.dst.shown} refused the batch of sessions "
                f"{rows.ids[0]!r}.. ({reason}); it was rolled back and every session is where "
                "it was. Fix the cause, then run the same command again"
            ) from None
        reached("copied")
        return self.finish(marker, size=rows.bytes())

    # -- verify, delete, clear ------------------------------------------------------------

    def finish(self, marker: dict[str, Any], *, size: int = 0) -> bool:
        """Delete a batch ``dst`` holds a verified copy of from ``src``, once ``src`` is
        checked, under its write lock, to hold what was copied (``marker["sums"]``); a
        batch that changed there since is taken back out of ``dst`` instead (False)."""
        ids: list[str] = marker["sessions"]
        token: str = marker["batch"]
        hashes: list[str] = marker["hashes"]
        copied: Sums = {name: (int(n), str(h)) for name, (n, h) in marker["sums"].items()}
        reached("verified")

        def delete(conn: Connection) -> dict[str, int]:
            _locked_sessions(conn, ids)
            if _new_children(conn, ids) or differences(batch_sums(conn, ids, hashes), copied):
                raise _Changed
            deleted = delete_rows(conn, ids, hashes)
            if any(deleted[name] != copied[name][0] for name in OWNED_TABLES):
                raise _Changed  # a row arrived between the check and the delete
            clear_marker(conn, token)
            reached("deleting")
            return deleted

        try:
            deleted = self._write(self.src, delete)
        except _Changed:
            self._take_back(marker, copied)
            return False
        reached("deleted")
        self._write(self.dst, lambda conn: clear_marker(conn, token))
        reached("done")
        if size == 0:
            with self.dst.reading() as conn:
                size = read_batch(conn, ids).bytes()
        self.moved.add(deleted, size)
        return True

    def _take_back(self, marker: dict[str, Any], copied: Sums) -> None:
        """Delete a batch's copy from ``dst`` (with its marker), then ``src``'s marker; a
        copy that was written to since (both stores changed) is left, and refused."""
        ids: list[str] = marker["sessions"]
        token: str = marker["batch"]
        hashes: list[str] = marker["hashes"]

        def remove(conn: Connection) -> None:
            _locked_sessions(conn, ids)
            if _new_children(conn, ids) or differences(batch_sums(conn, ids, hashes), copied):
                raise ArchiveRefused(
                    f"the batch of sessions {ids[0]!r}.. was written to in both "
                    f"{self.src.shown} and {self.dst.shown} while it moved; nothing more was "
                    "changed, both copies are kept with the batch's marker. Decide which "
                    "copy to keep, delete the other's sessions, and run the command again"
                )
            delete_rows(conn, ids, hashes)
            clear_marker(conn, token)

        self._write(self.dst, remove)
        self._write(self.src, lambda conn: clear_marker(conn, token))
        self.moved.changed += 1


def finish_in_flight(first: Side, second: Side, hot: Side, moved: Moved) -> None:
    """Finish the batch a killed run left between these two stores, whichever way it was
    going; refuse one that involves another store."""
    with first.reading() as conn:
        mine = read_marker(conn)
    with second.reading() as conn:
        theirs = read_marker(conn)
    if mine is None and theirs is None:
        return
    sides = {first.name: first, second.name: second}
    for side, found in ((first, mine), (second, theirs)):
        if found is not None and (found.get("from") not in sides or found.get("to") not in sides):
            raise ArchiveRefused(
                f"{side.shown} holds a batch in flight from {found.get('from')} to "
                f"{found.get('to')}: finish it first by running the command that started it "
                "again (an archive or restore between those two stores). Nothing was changed"
            )
    if mine is not None and theirs is not None and mine.get("batch") != theirs.get("batch"):
        raise ArchiveRefused(
            f"{first.shown} and {second.shown} record different batches in flight "
            f"({mine.get('batch')}, {theirs.get('batch')}); nothing was changed. Run "
            "`hermes-store check` on both and report this"
        )
    marker = mine if mine is not None else theirs
    assert marker is not None
    src, dst = sides[marker["from"]], sides[marker["to"]]
    at_src = mine if src is first else theirs
    at_dst = theirs if src is first else mine
    ids, token = marker["sessions"], marker["batch"]
    mover = Mover(src, dst, hot, moved)
    if at_src is not None and at_dst is not None:
        done = mover.finish(at_dst)
        moved.resumed = (
            f"finished the batch of {len(ids)} sessions a stopped run had copied to {dst.shown}"
            if done
            else f"took back the batch of {len(ids)} sessions a stopped run had copied to "
            f"{dst.shown} (they changed since)"
        )
        return
    if at_src is not None:  # the copy never committed
        with dst.reading() as conn:
            if _held(conn, ids):
                raise ArchiveRefused(
                    f"{dst.shown} holds sessions of a batch {src.shown} records as not copied "
                    f"(first {ids[0]!r}); nothing was changed. Run `hermes-store check` on both"
                )
        mover._write(src, lambda conn: clear_marker(conn, token))
        moved.resumed = f"forgot a batch of {len(ids)} sessions a stopped run had not copied yet"
        return
    with src.reading() as conn:  # the delete committed
        if _held(conn, ids):
            raise ArchiveRefused(
                f"{src.shown} still holds sessions of a batch {dst.shown} records as moved "
                f"(first {ids[0]!r}); nothing was changed. Run `hermes-store check` on both"
            )
    mover._write(dst, lambda conn: clear_marker(conn, token))
    moved.resumed = f"cleared the marker of a batch of {len(ids)} sessions a stopped run had moved"

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
   then deleted, with the marker; from the hot store, its messages a chunk at a time
   (each chunk sized by the time the last one held the write lock), the sessions and
   their other rows with the last;
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

from hermes_store.archive.marker import clear_marker, put_marker
from hermes_store.archive.rows import (
    OWNED_TABLES,
    BatchRows,
    delete_rows,
    insert_rows,
    owned_condition,
    present,
    prompt_condition,
    read_batch,
    row_bytes,
    write_batch,
)
from hermes_store.archive.shape import has, moved_columns
from hermes_store.archive.shape import table as copied_table
from hermes_store.archive.stores import Side
from hermes_store.archive.verify import Sums, batch_sums, differences
from hermes_store.copy.tablesum import RowHasher, TableChecksum, table_sum
from hermes_store.errors import ArchiveRefused
from hermes_store.sqlite.backfill import next_size

__all__ = [
    "FIRST_CHUNK_BYTES",
    "MAX_LOCK_MS",
    "STEP_HOOK",
    "Moved",
    "Mover",
    "held_sessions",
    "reached",
]

#: The longest a write transaction of the archive should hold the hot store's write lock:
#: each chunk of messages is sized (``backfill.next_size``, from the last chunk's hold) to
#: hold it for about half of this, so that a slow one (a busy machine) stays under it.
MAX_LOCK_MS = 150.0
#: The hold a batch's fixed part (the checks of its rows, the delete of its sessions and
#: their other rows) may take before the next batch is made smaller (run.py).
LOCK_TARGET_S = 0.1
#: A batch's messages enter or leave the hot store in chunks, each its own transaction,
#: weighed in bytes (a message's values, plus MESSAGE_OVERHEAD: indexing and deleting one
#: costs about its text); the first chunk weighs FIRST_CHUNK_BYTES, each next one is sized
#: from how long the last held the write lock. A batch lighter than a chunk goes in one
#: transaction.
FIRST_CHUNK_BYTES = 32_768
MAX_CHUNK_BYTES = 16 << 20
MESSAGE_OVERHEAD = 256
#: Pause after a write transaction on the hot store, as a share of the time it held the
#: write lock, and at least MIN_PAUSE_S: the agent's writes get the lock in between.
PAUSE_SHARE = 1.0
MIN_PAUSE_S = 0.02
#: The tables a batch owns but its messages.
_OTHER_TABLES = tuple(name for name in OWNED_TABLES if name != "messages")

#: Called with the name of each step a batch reaches (``marked``, ``copying`` inside the
#: copy's transaction, ``copied``, ``verified``, ``deleting-chunk`` inside each chunk of a
#: large batch's delete and ``chunk-committed`` after it, ``copying-chunk`` inside each
#: chunk of a large batch's copy, ``deleting`` inside the (last) delete's
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
    #: The longest write transaction on the hot store by step (``marker``, ``copy``,
    #: ``copy-chunk``, ``delete``, ``delete-chunk``, ``put-back``, ``take-back``).
    longest_lock_by_step: dict[str, float] = field(default_factory=dict)
    #: Write transactions on the hot store, by step.
    writes_by_step: dict[str, int] = field(default_factory=dict)

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


def _message_digests(conn: Connection, ids: Sequence[str]) -> dict[int, int]:
    """Each message of the sessions ``ids``, by id: the checksum of its row."""
    return {key: digest for key, (digest, _) in _message_sums(conn, ids).items()}


def _message_sums(conn: Connection, ids: Sequence[str]) -> dict[int, tuple[int, int]]:
    """Each message of the sessions ``ids``, by id: the checksum of its row, its weight."""
    messages = copied_table("messages")
    hasher = RowHasher(messages)
    query = select(*messages.columns).where(owned_condition(messages, ids))
    return {int(row.id): (hasher(row), weight(row)) for row in conn.execute(query)}


def _check_rest(conn: Connection, ids: Sequence[str], copied: Sums, messages_left: int) -> None:
    """Under the write lock: the batch's rows but its messages unchanged, no new child
    session, and exactly ``messages_left`` messages (none added)."""
    _locked_sessions(conn, ids)
    if _new_children(conn, ids):
        raise _Changed
    for name in present(_OTHER_TABLES):
        table = copied_table(name)
        check = table_sum(conn, table, owned_condition(table, ids))
        if (check.rows, check.hexdigest()) != copied[name]:
            raise _Changed
    messages = copied_table("messages")
    count = conn.scalar(
        select(func.count()).select_from(messages).where(owned_condition(messages, ids))
    )
    if int(count or 0) != messages_left:
        raise _Changed


def _delete_messages(conn: Connection, chunk: Sequence[int], expected: dict[int, int]) -> None:
    """Delete these messages, each checked to be the copied row first."""
    if not chunk:
        return
    messages = copied_table("messages")
    hasher = RowHasher(messages)
    rows = conn.execute(select(*messages.columns).where(messages.c.id.in_(list(chunk)))).all()
    if len(rows) != len(chunk) or any(hasher(row) != expected[int(row.id)] for row in rows):
        raise _Changed
    done = conn.execute(messages.delete().where(messages.c.id.in_(list(chunk))))
    if done.rowcount != len(chunk):
        raise _Changed


def weight(row: Any) -> int:
    """What a message weighs in a chunk: the bytes of its values, plus MESSAGE_OVERHEAD."""
    return row_bytes(row) + MESSAGE_OVERHEAD


def _fitting(weights: Sequence[int], budget: int) -> int:
    """How many of the first items of these weights fit in ``budget`` (at least one)."""
    total = 0
    for taken, each in enumerate(weights):
        total += each
        if total > budget:
            return max(1, taken)
    return len(weights)


def _check_copied(conn: Connection, rows: Sequence[Any]) -> None:
    """Read back, these just inserted messages are the rows given."""
    messages = copied_table("messages")
    hasher = RowHasher(messages)
    wanted = {int(row.id): hasher(row) for row in rows}
    back = conn.execute(select(*messages.columns).where(messages.c.id.in_(list(wanted))))
    found = {int(row.id): hasher(row) for row in back}
    if found != wanted:
        raise _CopyDiffers(["messages"])


def held_sessions(conn: Connection, ids: Sequence[str]) -> int:
    """How many of the sessions ``ids`` the store of ``conn`` holds."""
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
        #: How long the last batch held the hot store's write lock, at the longest.
        self.last_lock_s = 0.0
        #: How long the last batch's fixed part held it: the checks of the batch's rows
        #: and the delete of its sessions and their other rows (what its size decides).
        self.fixed_lock_s = 0.0
        #: What a chunk of messages weighs, in bytes (see FIRST_CHUNK_BYTES).
        self.chunk_bytes = FIRST_CHUNK_BYTES
        #: How long the last write transaction held the hot store's write lock.
        self._held = 0.0

    def _chunk_write(
        self, side: Side, work: Callable[[Connection], Any], step: str, weighs: int
    ) -> Any:
        """One chunk's write transaction (its messages weigh ``weighs``), the next chunk
        sized by how long it held the lock, then the pause."""
        result = self.write(side, work, step)
        if side is self.hot:
            self._resize(self._held, weighs)
        time.sleep(max(MIN_PAUSE_S, self._held * PAUSE_SHARE))
        return result

    def _resize(self, held: float, weighs: int) -> None:
        """Size the next chunk so that it holds the lock for about half of MAX_LOCK_MS,
        from this one's hold (``held``, for messages weighing ``weighs``): a remainder
        much lighter than a chunk says little of what a chunk costs, unless it was slow."""
        if weighs <= 0 or (2 * weighs < self.chunk_bytes and held * 1000 <= MAX_LOCK_MS / 2):
            return
        as_full = held * 1000 * self.chunk_bytes / weighs
        self.chunk_bytes = max(
            MESSAGE_OVERHEAD, next_size(self.chunk_bytes, as_full, MAX_LOCK_MS, MAX_CHUNK_BYTES)
        )

    def _timed(self, side: Side, step: str, started: float) -> None:
        if side is self.hot:
            held = time.perf_counter() - started
            self._held = held
            self.last_lock_s = max(self.last_lock_s, held)
            moved = self.moved
            moved.longest_lock_s = max(moved.longest_lock_s, held)
            moved.longest_lock_by_step[step] = max(moved.longest_lock_by_step.get(step, 0), held)
            moved.writes_by_step[step] = moved.writes_by_step.get(step, 0) + 1

    def write(self, side: Side, work: Callable[[Connection], Any], step: str = "marker") -> Any:
        """One write transaction on ``side`` (a ``step`` of a batch); on the hot store, how
        long it held the write lock (from the BEGIN that took it to the COMMIT) is kept."""
        with side.writer.connect() as conn:
            # The commit's flush to disk is made below, once the lock is let go.
            deferred = side.backend.defer_commit_sync(conn)
            transaction = conn.begin()  # waits for the write lock (the busy timeout)
            started = time.perf_counter()
            try:
                result = work(conn)
                transaction.commit()
            except BaseException:
                transaction.rollback()
                raise
            finally:
                self._timed(side, step, started)
            if deferred:  # durable before the next step relies on it
                side.backend.sync_commits(conn, side.url)
        return result

    # -- a new batch ----------------------------------------------------------------------

    def move(self, ids: Sequence[str], check: Callable[[BatchRows], bool] | None = None) -> bool:
        """Move the sessions ``ids`` (whole trees); False when they changed meanwhile (or
        no longer pass ``check``, given the rows as read for the copy) and stay where they
        were."""
        self.last_lock_s = self.fixed_lock_s = 0.0
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
        columns = moved_columns()
        if columns is not None:
            marker["columns"] = columns
        weighs = sum(weight(row) for row in rows.owned["messages"])
        if self.dst is self.hot and weighs > self.chunk_bytes:
            return self._copy_in_chunks(rows, marker, high)
        self.write(self.src, lambda conn: put_marker(conn, marker))
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
            self.write(self.dst, copy, "copy")
        except (IntegrityError, _CopyDiffers) as exc:
            self.write(self.src, lambda conn: clear_marker(conn, token))
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

    # -- a large batch entering the hot store: its messages copied in chunks -------------

    def _copy_in_chunks(self, rows: BatchRows, marker: dict[str, Any], high: int) -> bool:
        """:meth:`move`'s copy for a batch too large for one short transaction in the hot
        store: the sessions, their other rows and the first chunk of messages (sized by
        their weight, see :data:`FIRST_CHUNK_BYTES`) in one transaction with the marker
        (``copying``), then the other messages chunk by chunk, each read back and checked
        in its transaction; the marker says ``copied`` with the last."""
        messages = copied_table("messages")
        ids = sorted(int(row.id) for row in rows.owned["messages"])
        with self.dst.reading() as conn:
            taken = conn.scalar(
                select(func.count()).select_from(messages).where(messages.c.id.in_(ids))
            )
        if taken:
            raise ArchiveRefused(
                f"{self.dst.option} {self.dst.shown} already holds {taken} message ids of the "
                f"batch of sessions {rows.ids[0]!r}..; nothing was changed"
            )
        self.write(self.src, lambda conn: put_marker(conn, marker))
        reached("marked")
        weights = [weight(row) for row in rows.owned["messages"]]
        taken_first = _fitting(weights, self.chunk_bytes)
        first = BatchRows(
            rows.ids,
            {**rows.owned, "messages": rows.owned["messages"][:taken_first]},
            rows.prompts,
        )

        def begin(conn: Connection) -> None:
            write_batch(conn, first)
            found = batch_sums(conn, rows.ids, rows.hashes)
            differ = [
                name
                for name in (*_OTHER_TABLES, "system_prompts")
                if found[name] != marker["sums"][name]
            ]
            if differ:
                raise _CopyDiffers(differ)
            _check_copied(conn, first.owned["messages"])
            self.dst.backend.raise_message_ids(conn, high)
            put_marker(conn, {**marker, "copying": True})
            reached("copying-chunk")

        try:
            self._chunk_write(self.dst, begin, "copy-chunk", sum(weights[:taken_first]))
        except (IntegrityError, _CopyDiffers):
            self.write(self.src, lambda conn: clear_marker(conn, marker["batch"]))
            raise ArchiveRefused(
                f"{self.dst.option} {self.dst.shown} refused the batch of sessions "
                f"{rows.ids[0]!r}.. (its rows read back different, or a key or title is "
                "taken); it was rolled back. Fix the cause, then run the same command again"
            ) from None
        self._copy_messages(marker, rows.owned["messages"][len(first.owned["messages"]) :])
        reached("copied")
        return self.finish(marker, size=rows.bytes())

    def _copy_messages(self, marker: dict[str, Any], rows: Sequence[Any]) -> None:
        """Copy these messages into ``dst`` chunk by chunk, each read back and checked; the
        last transaction (or one of its own) records the batch as ``copied``."""
        messages = copied_table("messages")
        rest = list(rows)
        weights = [weight(row) for row in rest]
        while True:
            taken = _fitting(weights, self.chunk_bytes) if rest else 0
            chunk, rest = rest[:taken], rest[taken:]
            weighs, weights = sum(weights[:taken]), weights[taken:]
            last = not rest

            def step(conn: Connection, chunk: Sequence[Any] = chunk, last: bool = last) -> None:
                if chunk:
                    insert_rows(conn, messages, chunk)
                    _check_copied(conn, chunk)
                if last:
                    put_marker(conn, marker)
                    reached("copying")
                else:
                    reached("copying-chunk")

            self._chunk_write(self.dst, step, "copy-chunk", weighs)
            if last:
                return

    def resume_copy(self, marker: dict[str, Any]) -> None:
        """Finish a chunked copy a stopped run left half done: the messages ``dst`` lacks
        copied from ``src``, which must hold what the batch's checksums say."""
        ids: list[str] = marker["sessions"]
        copied: Sums = {name: (int(n), str(h)) for name, (n, h) in marker["sums"].items()}
        messages = copied_table("messages")
        with self.src.reading() as conn:
            if differences(batch_sums(conn, ids, marker["hashes"]), copied):
                raise ArchiveRefused(
                    f"{self.src.shown} changed while a copy of the batch of sessions "
                    f"{ids[0]!r}.. into {self.dst.shown} was half done; nothing was changed. "
                    "Run `hermes-store check` on both"
                )
            query = select(*messages.columns).where(owned_condition(messages, ids))
            rows = {int(row.id): row for row in conn.execute(query)}
        with self.dst.reading() as conn:
            held = set(_message_digests(conn, ids))
        clean = {key: value for key, value in marker.items() if key != "copying"}
        self._copy_messages(clean, [rows[i] for i in sorted(set(rows) - held)])

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
        if marker.get("deleting") or self.src is self.hot:
            return self._finish_in_chunks(marker, copied, size)

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
            deleted = self.write(self.src, delete, "delete")
        except _Changed:
            self.take_back(marker, copied)
            return False
        reached("deleted")
        self.write(self.dst, lambda conn: clear_marker(conn, token))
        reached("done")
        if size == 0:
            with self.dst.reading() as conn:
                size = read_batch(conn, ids).bytes()
        self.moved.add(deleted, size)
        return True

    # -- a batch leaving the hot store: its messages deleted in chunks -------------------

    def _finish_in_chunks(self, marker: dict[str, Any], copied: Sums, size: int) -> bool:
        """:meth:`finish` for a batch leaving the hot store (or one a stopped run left
        half deleted): its messages deleted a chunk at a time (see
        :data:`FIRST_CHUNK_BYTES`), each chunk checked (the batch's other rows unchanged,
        no message added, the chunk's rows the copied ones) in the transaction that
        deletes it; the last chunk and the batch's other rows in a last transaction, with
        the marker (a batch lighter than a chunk: that one alone). A batch that changed
        midway gets its deleted messages back from the copy, then is taken back out of
        ``dst``."""
        ids: list[str] = marker["sessions"]
        token: str = marker["batch"]
        hashes: list[str] = marker["hashes"]
        with self.dst.reading() as conn:
            found = _message_sums(conn, ids)
        expected = {key: digest for key, (digest, _) in found.items()}
        weights = {key: weighs for key, (_, weighs) in found.items()}
        whole = TableChecksum(copied_table("messages"))
        for digest in expected.values():
            whole.add_digest(digest)
        if (whole.rows, whole.hexdigest()) != copied["messages"]:
            raise ArchiveRefused(
                f"{self.dst.shown} no longer holds the copy of the batch of sessions "
                f"{ids[0]!r}.. it verified (its messages changed); nothing was changed, both "
                "stores keep the batch's marker. Run `hermes-store check` on both"
            )
        with self.src.reading() as conn:
            remaining = sorted(_message_digests(conn, ids))
        deleted_messages = 0
        try:
            if not set(remaining) <= expected.keys():
                raise _Changed
            while True:
                taken = _fitting([weights[key] for key in remaining], self.chunk_bytes)
                if taken >= len(remaining):
                    break
                chunk = remaining[:taken]

                def step(
                    conn: Connection, chunk: list[int] = chunk, left: int = len(remaining)
                ) -> None:
                    _check_rest(conn, ids, copied, left)
                    _delete_messages(conn, chunk, expected)
                    put_marker(conn, {**marker, "deleting": True})
                    reached("deleting-chunk")

                weighs = sum(weights[key] for key in chunk)
                self._chunk_write(self.src, step, "delete-chunk", weighs)
                remaining = remaining[len(chunk) :]
                deleted_messages += len(chunk)
                reached("chunk-committed")
            spent: list[float] = []

            def last(conn: Connection, left: list[int] = remaining) -> dict[str, int]:
                _check_rest(conn, ids, copied, len(left))
                if has("system_prompts"):
                    prompts = table_sum(
                        conn, copied_table("system_prompts"), prompt_condition(hashes)
                    )
                    if (prompts.rows, prompts.hexdigest()) != copied["system_prompts"]:
                        raise _Changed
                started = time.perf_counter()
                _delete_messages(conn, left, expected)
                spent.append(time.perf_counter() - started)
                deleted = delete_rows(conn, ids, hashes)
                if any(deleted[name] != copied[name][0] for name in _OTHER_TABLES):
                    raise _Changed
                clear_marker(conn, token)
                reached("deleting")
                return deleted

            deleted = self.write(self.src, last, "delete")
            self.fixed_lock_s = max(0.0, self._held - sum(spent))
        except _Changed:
            self._give_back_messages(ids, expected)
            self.take_back(marker, copied)
            return False
        deleted["messages"] = deleted_messages + len(remaining)
        reached("deleted")
        self.write(self.dst, lambda conn: clear_marker(conn, token))
        reached("done")
        if size == 0:
            with self.dst.reading() as conn:
                size = read_batch(conn, ids).bytes()
        self.moved.add(deleted, size)
        return True

    def _give_back_messages(self, ids: Sequence[str], expected: dict[int, int]) -> None:
        """Copy the messages a chunked delete already took out of ``src`` back from
        ``dst``'s copy, chunk by chunk, each read back and checked."""
        with self.src.reading() as conn:
            present = set(_message_digests(conn, ids))
        missing = sorted(set(expected) - present)
        if not missing:
            return
        messages = copied_table("messages")
        with self.dst.reading() as conn:
            found = {
                int(row.id): row
                for row in conn.execute(select(*messages.columns).where(messages.c.id.in_(missing)))
            }
        while missing:
            taken = _fitting([weight(found[key]) for key in missing], self.chunk_bytes)
            chunk, missing = missing[:taken], missing[taken:]
            rows = [found[key] for key in chunk]

            def put_back(
                conn: Connection, rows: list[Any] = rows, chunk: list[int] = chunk
            ) -> None:
                insert_rows(conn, messages, rows)
                back = conn.execute(select(*messages.columns).where(messages.c.id.in_(chunk)))
                hasher = RowHasher(messages)
                if sorted(hasher(row) for row in back) != sorted(expected[i] for i in chunk):
                    raise ArchiveRefused(
                        f"{self.src.shown}: messages put back from {self.dst.shown} read back "
                        "different; both stores are kept with the batch's marker. Run "
                        "`hermes-store check` on both"
                    )

            self._chunk_write(self.src, put_back, "put-back", sum(weight(row) for row in rows))

    def take_back(self, marker: dict[str, Any], copied: Sums) -> None:
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

        self.write(self.dst, remove, "take-back")
        self.write(self.src, lambda conn: clear_marker(conn, token))
        self.moved.changed += 1

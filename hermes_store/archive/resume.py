"""A batch a stopped run left in flight, finished by the next run between the same stores.

The two markers (``hermes_store.archive.marker``) say how far it got: the first store's
alone, the copy never committed (the marker is cleared); both, the copy committed (it is
finished: a chunked copy completed, then the first store checked and its rows deleted,
or the copy taken back when they changed); the second store's alone, the delete
committed (the marker is cleared). It is finished over the columns the marker says the
batch was read with (the hot store may have been upgraded since).
"""

from __future__ import annotations

from typing import Any

from hermes_store.archive.marker import clear_marker, read_marker
from hermes_store.archive.move import Moved, Mover, held_sessions
from hermes_store.archive.rows import OWNED_TABLES
from hermes_store.archive.shape import Shape, lost_values, narrowed, using
from hermes_store.archive.stores import Side
from hermes_store.errors import ArchiveRefused

__all__ = ["finish_in_flight"]


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
    cut = narrowed(hot.shape, marker.get("columns"))
    with using(cut):
        _finish(marker, mine, theirs, sides, first, hot, moved, cut)


def _gained(hot: Side, cut: Shape | None, ids: list[str]) -> bool:
    """Whether the batch's rows in the hot store hold a value beyond the columns it was
    read with (``cut``): the hot store was upgraded since, and written to."""
    if cut is None or hot.shape is None or cut is hot.shape:
        return False
    with hot.reading() as conn:
        return bool(lost_values(conn, cut, OWNED_TABLES, ids, read=hot.shape))


def _finish(
    marker: dict[str, Any],
    mine: dict[str, Any] | None,
    theirs: dict[str, Any] | None,
    sides: dict[str, Side],
    first: Side,
    hot: Side,
    moved: Moved,
    cut: Shape | None,
) -> None:
    """Finish the batch of ``marker`` (``mine``: as ``first`` records it; ``theirs``: as
    the other store does), over the columns it was read with (``cut``)."""
    src, dst = sides[marker["from"]], sides[marker["to"]]
    at_src = mine if src is first else theirs
    at_dst = theirs if src is first else mine
    ids, token = marker["sessions"], marker["batch"]
    mover = Mover(src, dst, hot, moved)
    if at_src is not None and at_dst is not None:
        if at_dst.get("copying"):
            mover.resume_copy(at_dst)
            at_dst = {key: value for key, value in at_dst.items() if key != "copying"}
        if src is hot and _gained(src, cut, ids) and not at_src.get("deleting"):
            # The hot store was upgraded since, and the application wrote to a column (or
            # table) the copy has no value of: the copy is taken back, the batch stays.
            copied = {name: (int(n), str(h)) for name, (n, h) in at_dst["sums"].items()}
            mover.take_back(at_dst, copied)
            moved.resumed = (
                f"took back the batch of {len(ids)} sessions a stopped run had copied to "
                f"{dst.shown} (they changed since)"
            )
            return
        done = mover.finish({**at_dst, "deleting": bool(at_src.get("deleting"))})
        moved.resumed = (
            f"finished the batch of {len(ids)} sessions a stopped run had copied to {dst.shown}"
            if done
            else f"took back the batch of {len(ids)} sessions a stopped run had copied to "
            f"{dst.shown} (they changed since)"
        )
        return
    if at_src is not None:  # the copy never committed
        with dst.reading() as conn:
            if held_sessions(conn, ids):
                raise ArchiveRefused(
                    f"{dst.shown} holds sessions of a batch {src.shown} records as not copied "
                    f"(first {ids[0]!r}); nothing was changed. Run `hermes-store check` on both"
                )
        mover.write(src, lambda conn: clear_marker(conn, token))
        moved.resumed = f"forgot a batch of {len(ids)} sessions a stopped run had not copied yet"
        return
    with src.reading() as conn:  # the delete committed
        if held_sessions(conn, ids):
            raise ArchiveRefused(
                f"{src.shown} still holds sessions of a batch {dst.shown} records as moved "
                f"(first {ids[0]!r}); nothing was changed. Run `hermes-store check` on both"
            )
    mover.write(dst, lambda conn: clear_marker(conn, token))
    moved.resumed = f"cleared the marker of a batch of {len(ids)} sessions a stopped run had moved"

"""Cold storage: old session trees moved out of the hot store into an archive store, and
back, losing nothing.

`archive_sessions(hot, to, rule)` moves every session tree of the hot store that
qualifies (``select``: whole trees, ended, older than the cutoff or flagged archived, not
in use) into the archive, an ordinary store at head (created when missing; the hot
store is at head or at an application version with the search layout at head);
`restore_session(session_id, hot, from_)` brings one tree back. Both move in batches of
whole trees (``move``): copied into the other store and verified there by checksums of
the batch's rows (``verify``), checked again in the first store under its write lock, then
deleted from it in one short transaction (or, for a large batch in the hot store, in
chunks of messages), with pauses. The marker (``marker``) in each store records the batch
in flight, so that after a kill at any instant the next run finishes or takes back that
batch (``resume``): every session ends in exactly one store. Which rows belong to a
session, and which are shared, is ``rows``; opening and checking the two stores,
``stores``; the hot store's own tables and columns, which a run moves (it may be at an
older application version), ``shape``; one run's order of steps, ``run``.
"""

from hermes_store.archive.move import Moved
from hermes_store.archive.run import MoveResult, archive_sessions, restore_session
from hermes_store.archive.select import Criterion, criterion

__all__ = ["Criterion", "MoveResult", "Moved", "archive_sessions", "criterion", "restore_session"]

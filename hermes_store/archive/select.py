"""Which sessions move: the criterion, the session trees, and what keeps a tree where it is.

A **tree** is every session linked to another, whichever way: a parent and its children
(``parent_session_id``: compression continuations, subagents, delegated runs), and the
sessions one delegation names (``async_delegations``: the delegating session, its parent
and UI session). Trees move whole, and only when every member qualifies:

- it has ended (``ended_at`` set): a session still open never moves;
- by the criterion: its last activity (the newest of its messages' timestamps,
  ``ended_at`` and ``last_activity_at``) is before the cutoff, or the application flagged
  it ``archived``;
- nothing still uses it: no unexpired compression lock or turn lease names it, no
  delegation naming it is still running (``completed_at`` unset), and no gateway route
  (``gateway_routing.entry_json``) names it.

A tree the other store cannot take (a session id it already holds, a title one of its
sessions already has: titles are unique) stays too; the run says how many and why.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Connection, func, select

from hermes_store.archive.rows import DELEGATION_LINKS, owned_condition, present
from hermes_store.archive.shape import column, has
from hermes_store.archive.shape import table as copied_table
from hermes_store.errors import ArchiveRefused

__all__ = ["Criterion", "Selection", "Tree", "conflicts", "criterion", "select_trees", "tree_of"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([hdw])\s*$")
_UNITS = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}

#: Why a tree stays, in the words a run reports.
NOT_ENDED = "a session has not ended"
TOO_RECENT = "a session was active after the cutoff"
NOT_ARCHIVED = "a session is not flagged archived"
IN_USE = "a lock or turn lease is held on a session"
DELEGATING = "a delegation is still running"
ROUTED = "the gateway still routes to a session"


@dataclass(frozen=True)
class Criterion:
    """What makes a session old enough to move."""

    #: ``before`` / ``older-than`` (by last activity), or ``archived`` (the flag).
    kind: str
    #: The cutoff (seconds since the epoch, UTC) of the two age criteria.
    cutoff: float | None
    #: How the operator gave it.
    shown: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cutoff": self.cutoff, "given": self.shown}


def _parse_instant(value: str) -> float:
    """An ISO date (midnight UTC) or ISO datetime (UTC unless it says otherwise)."""
    text = value.strip()
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ArchiveRefused(
            f"--before {value!r}: expected an ISO date (2025-01-31) or datetime in UTC "
            "(2025-01-31T12:00:00); nothing was changed"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def criterion(
    *,
    before: str | None = None,
    older_than: str | None = None,
    archived: bool = False,
    now: float | None = None,
) -> Criterion:
    """The one criterion given; refuses none, several, a future date or a bad duration."""
    given = [name for name, on in (("--before", before), ("--older-than", older_than)) if on]
    if archived:
        given.append("--archived")
    if len(given) != 1:
        raise ArchiveRefused(
            "give exactly one of --before DATE, --older-than AGE (90d, 12h, 2w) or "
            f"--archived{' (got ' + ', '.join(given) + ')' if given else ''}; nothing was changed"
        )
    now = time.time() if now is None else now
    if before is not None:
        cutoff = _parse_instant(before)
        if cutoff > now:
            raise ArchiveRefused(
                f"--before {before}: that is in the future, and every session would qualify "
                "by age; give a past date. Nothing was changed"
            )
        return Criterion("before", cutoff, before)
    if older_than is not None:
        found = _DURATION.match(older_than)
        if found is None or float(found[1]) <= 0:
            raise ArchiveRefused(
                f"--older-than {older_than!r}: expected a positive number of hours, days or "
                "weeks (12h, 90d, 2w); nothing was changed"
            )
        return Criterion("older-than", now - float(found[1]) * _UNITS[found[2]], older_than)
    return Criterion("archived", None, "--archived")


@dataclass(frozen=True)
class Tree:
    """Linked sessions that move together."""

    #: Parents first.
    sessions: tuple[str, ...]
    messages: int
    #: The newest activity of any member.
    last_activity: float


@dataclass
class Selection:
    """The trees that qualify (oldest first) and, by reason, how many trees stay."""

    trees: list[Tree] = field(default_factory=list)
    kept: dict[str, int] = field(default_factory=dict)

    @property
    def sessions(self) -> int:
        return sum(len(tree.sessions) for tree in self.trees)

    @property
    def messages(self) -> int:
        return sum(tree.messages for tree in self.trees)


class _Links:
    """Union-find over session ids."""

    def __init__(self, ids: Iterable[str]) -> None:
        self.parent = {sid: sid for sid in ids}

    def find(self, sid: str) -> str:
        root = sid
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[sid] != root:
            self.parent[sid], sid = root, self.parent[sid]
        return root

    def join(self, a: str, b: str) -> None:
        if a in self.parent and b in self.parent:
            first, second = self.find(a), self.find(b)
            if first != second:
                self.parent[max(first, second)] = min(first, second)

    def groups(self) -> list[list[str]]:
        found: dict[str, list[str]] = defaultdict(list)
        for sid in self.parent:
            found[self.find(sid)].append(sid)
        return list(found.values())


def _strings(value: Any) -> Iterable[str]:
    """Every string inside a decoded JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


@dataclass
class _Facts:
    """What a store says of each session, read once."""

    sessions: dict[str, Any]
    activity: dict[str, float]
    messages: dict[str, int]
    links: _Links
    blocked: dict[str, str]


def _read_facts(conn: Connection, now: float) -> _Facts:
    sessions_t = copied_table("sessions")
    rows = conn.execute(
        select(
            sessions_t.c.id,
            sessions_t.c.parent_session_id,
            sessions_t.c.ended_at,
            column(sessions_t, "last_activity_at"),
            sessions_t.c.archived,
        )
    ).all()
    sessions = {row.id: row for row in rows}
    messages_t = copied_table("messages")
    per = conn.execute(
        select(messages_t.c.session_id, func.max(messages_t.c.timestamp), func.count()).group_by(
            messages_t.c.session_id
        )
    ).all()
    newest = {sid: float(ts) for sid, ts, _ in per if ts is not None}
    counts = {sid: int(n) for sid, _, n in per}
    activity = {}
    for sid, row in sessions.items():
        times = [t for t in (newest.get(sid), row.ended_at, row.last_activity_at) if t is not None]
        activity[sid] = max(float(t) for t in times) if times else float("-inf")
    links = _Links(sessions)
    for row in rows:
        if row.parent_session_id is not None:
            links.join(row.id, row.parent_session_id)
    blocked: dict[str, str] = {}
    _delegations(conn, sessions, links, blocked)
    for name, key in (
        ("compression_locks", "session_id"),
        ("session_turn_leases", "conversation_id"),
    ):
        if not has(name):
            continue
        table = copied_table(name)
        for sid, expires in conn.execute(select(table.c[key], table.c.expires_at)):
            if sid in sessions and expires is not None and float(expires) > now:
                blocked.setdefault(sid, IN_USE)
    _routes(conn, sessions, blocked)
    return _Facts(sessions, activity, counts, links, blocked)


def _delegations(
    conn: Connection, sessions: dict[str, Any], links: _Links, blocked: dict[str, str]
) -> None:
    """Join the sessions each delegation names; block those of one still running."""
    if not has("async_delegations"):
        return
    delegations = copied_table("async_delegations")
    named_columns = [column(delegations, name) for name in DELEGATION_LINKS]
    for link in conn.execute(select(*named_columns, delegations.c.completed_at)):
        named = [sid for sid in link[: len(DELEGATION_LINKS)] if sid in sessions]
        for other in named[1:]:
            links.join(named[0], other)
        if link.completed_at is None:
            for sid in named:
                blocked.setdefault(sid, DELEGATING)


def _routes(conn: Connection, sessions: dict[str, Any], blocked: dict[str, str]) -> None:
    """Block the sessions a gateway route names."""
    if not has("gateway_routing"):
        return
    routing = copied_table("gateway_routing")
    for (entry,) in conn.execute(select(routing.c.entry_json)):
        try:
            named_ids = set(_strings(json.loads(entry)))
        except (TypeError, ValueError):
            continue
        for sid in named_ids & sessions.keys():
            blocked.setdefault(sid, ROUTED)


def _parents_first(ids: Sequence[str], facts: _Facts) -> tuple[str, ...]:
    def depth(sid: str) -> int:
        seen, level, parent = {sid}, 0, facts.sessions[sid].parent_session_id
        while parent in facts.sessions and parent not in seen:
            seen.add(parent)
            level += 1
            parent = facts.sessions[parent].parent_session_id
        return level

    return tuple(sorted(ids, key=lambda sid: (depth(sid), sid)))


def _why_kept(ids: Sequence[str], facts: _Facts, rule: Criterion) -> str | None:
    for sid in ids:
        if facts.sessions[sid].ended_at is None:
            return NOT_ENDED
    for sid in ids:
        if rule.kind == "archived":
            if not facts.sessions[sid].archived:
                return NOT_ARCHIVED
        elif rule.cutoff is not None and facts.activity[sid] >= rule.cutoff:
            return TOO_RECENT
    for sid in ids:
        if sid in facts.blocked:
            return facts.blocked[sid]
    return None


def _tree(ids: Sequence[str], facts: _Facts) -> Tree:
    return Tree(
        _parents_first(ids, facts),
        sum(facts.messages.get(sid, 0) for sid in ids),
        max(facts.activity[sid] for sid in ids),
    )


def select_trees(conn: Connection, rule: Criterion, *, now: float | None = None) -> Selection:
    """The trees of the store of ``conn`` that qualify by ``rule``, oldest first."""
    facts = _read_facts(conn, time.time() if now is None else now)
    selection = Selection()
    for ids in facts.links.groups():
        why = _why_kept(ids, facts, rule)
        if why is not None:
            selection.kept[why] = selection.kept.get(why, 0) + 1
            continue
        selection.trees.append(_tree(ids, facts))
    selection.trees.sort(key=lambda tree: (tree.last_activity, tree.sessions))
    return selection


def tree_of(conn: Connection, session_id: str) -> Tree | None:
    """The whole tree the session ``session_id`` belongs to, or None when there is none."""
    facts = _read_facts(conn, time.time())
    if session_id not in facts.sessions:
        return None
    root = facts.links.find(session_id)
    ids = [sid for sid in facts.sessions if facts.links.find(sid) == root]
    return _tree(ids, facts)


#: Why the other store cannot take a tree.
ID_TAKEN = "the other store already holds a session of the same id"
TITLE_TAKEN = "the other store already has a session with the same title"


def conflicts(other: Connection | None, src: Connection, trees: Sequence[Tree]) -> dict[int, str]:
    """The trees (by position) the store of ``other`` cannot take, and why."""
    if other is None or not trees:
        return {}
    sessions = copied_table("sessions")
    found: dict[int, str] = {}
    for start in range(0, len(trees), 200):
        chunk = trees[start : start + 200]
        ids = [sid for tree in chunk for sid in tree.sessions]
        held = set(other.scalars(select(sessions.c.id).where(owned_condition(sessions, ids))))
        titles = dict(
            src.execute(
                select(sessions.c.id, sessions.c.title).where(
                    owned_condition(sessions, ids), sessions.c.title.is_not(None)
                )
            ).all()
        )
        taken = (
            set(
                other.scalars(
                    select(sessions.c.title).where(sessions.c.title.in_(list(titles.values())))
                )
            )
            if titles
            else set()
        )
        for offset, tree in enumerate(chunk):
            if held.intersection(tree.sessions):
                found[start + offset] = ID_TAKEN
            elif any(titles.get(sid) in taken for sid in tree.sessions):
                found[start + offset] = TITLE_TAKEN
    return found


def still_qualifies(batch: Any, rule: Criterion, now: float) -> bool:
    """Whether the rows of a batch, as read for its copy, still qualify (the agent may
    have reopened or used a session since it was chosen)."""
    sessions = batch.owned.get("sessions", [])
    if not sessions or any(row.ended_at is None for row in sessions):
        return False
    newest: dict[str, float] = {}
    for row in batch.owned.get("messages", []):
        newest[row.session_id] = max(
            newest.get(row.session_id, float("-inf")), float(row.timestamp)
        )
    for row in sessions:
        if rule.kind == "archived":
            if not row.archived:
                return False
            continue
        last = getattr(row, "last_activity_at", None)
        times = [t for t in (newest.get(row.id), row.ended_at, last) if t is not None]
        if rule.cutoff is not None and max(float(t) for t in times) >= rule.cutoff:
            return False
    for name in present(("compression_locks", "session_turn_leases")):
        if any(float(row.expires_at) > now for row in batch.owned.get(name, [])):
            return False
    return all(row.completed_at is not None for row in batch.owned.get("async_delegations", []))

"""What the maintenance commands report, whichever database holds the store.

The backends (``hermes_store/sqlite/``, ``hermes_store/postgresql/``) fill these types; the
commands print them without asking which database filled them. A report says what it
shows a person as a :data:`View` (tables and lines, in order), so that the wording of
each database's report stays beside the code that measured it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sqlalchemy import Connection

# -- what a person is shown -------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """Records shown as one table (see ``cli/output.emit_records``)."""

    records: list[dict[str, Any]]
    columns: tuple[str, ...]
    title: str | None = None
    right: tuple[str, ...] = ()
    headers: Mapping[str, str] | None = None


#: What a report shows a person: tables and lines of text, in order.
View = list[Table | str]


class Shown(Protocol):
    """A result a command prints: JSON for programs, a view for people."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        ...

    def view(self) -> View:
        """What a person reads."""
        ...


class Measured(Shown, Protocol):
    """A report that is also one record per measured object (``--nl``, ``--csv``)."""

    def records(self) -> Table:
        """One record per object, with the columns to print."""
        ...


def human_bytes(size: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


# -- stats ------------------------------------------------------------------------------------


@dataclass
class StoreStats:
    """How much a store holds, and its size as its database measures it."""

    sessions: int
    messages: int
    sessions_by_source: dict[str, int] = field(default_factory=dict)
    #: What each size is called ("file bytes", "WAL bytes", "database bytes") -> bytes.
    sizes: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form: each size under its name in snake case ("wal_bytes")."""
        return {
            "sessions": self.sessions,
            "messages": self.messages,
            "sessions_by_source": dict(self.sessions_by_source),
            **{name.lower().replace(" ", "_"): size for name, size in self.sizes.items()},
        }

    def records(self, *, human: bool = False) -> list[dict[str, Any]]:
        """One record per count (sizes as "1.5 KiB" when ``human``)."""
        return [
            {"what": "sessions", "count": self.sessions},
            {"what": "messages", "count": self.messages},
            *(
                {"what": f"sessions from {source}", "count": count}
                for source, count in self.sessions_by_source.items()
            ),
            *(
                {"what": name, "count": human_bytes(size) if human else size}
                for name, size in self.sizes.items()
            ),
        ]


def store_counts(conn: Connection) -> StoreStats:
    """Sessions, messages and sessions per source (plain SQL: the same on every database)."""
    from sqlalchemy import text

    by_source = {
        str(source): int(count)
        for source, count in conn.execute(
            text("SELECT source, count(*) FROM sessions GROUP BY source ORDER BY count(*) DESC")
        )
    }
    messages = int(conn.execute(text("SELECT count(*) FROM messages")).scalar_one())
    return StoreStats(sum(by_source.values()), messages, by_source)


# -- storage report groups ----------------------------------------------------------------------

MESSAGE_DATA = "message data"
FTS_INDEX = "FTS index data"
FTS_COPIES = "redundant FTS text copies"
OTHER = "other"
#: The groups both storage reports file every table and index under, in this order.
GROUPS = (MESSAGE_DATA, FTS_INDEX, FTS_COPIES, OTHER)


# -- finishing a deferred index build (optimize-storage) --------------------------------------


@dataclass
class IndexBuild:
    """What `optimize-storage` did: the chunks of a deferred index build it ran."""

    rows_done: int = 0
    chunks: int = 0
    lock_seconds: float = 0.0
    longest_lock_s: float = 0.0
    paused_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    #: False when no deferred build was pending.
    pending: bool = True

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        if not self.pending:
            return {
                "rows_done": 0,
                "chunks": 0,
                "status": "nothing to do",
                "longest_write_lock_s": 0.0,
            }
        return {
            "rows_done": self.rows_done,
            "chunks": self.chunks,
            "lock_seconds": round(self.lock_seconds, 3),
            "longest_lock_ms": round(self.longest_lock_s * 1000, 1),
            "longest_write_lock_s": round(self.longest_lock_s, 3),
            "paused_seconds": round(self.paused_seconds, 3),
            "checkpoint_seconds": round(self.checkpoint_seconds, 3),
            "status": "done",
        }

    def view(self) -> View:
        """One line for a person."""
        if not self.pending:
            return ["no deferred index build is pending: nothing to do"]
        return [
            f"indexed {self.rows_done} rows in {self.chunks} transactions; longest lock "
            f"{round(self.longest_lock_s * 1000, 1)} ms, {self.lock_seconds:.1f} s locked in all"
        ]


# -- check and repair ---------------------------------------------------------------------------


@dataclass
class CheckResult:
    """Outcome of the integrity checks: what was checked and what is broken."""

    checked: list[str] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    #: Indexes not checked because a deferred backfill has not filled them yet.
    skipped: dict[str, str] = field(default_factory=dict)
    #: Where the FTS5 checks ran: "snapshot" (a private copy: the store's write lock is never
    #: taken) or "live" (each check a short write transaction on the store).
    fts_checked_on: str = "live"
    #: The longest time one of the checks held the store's write lock, in seconds.
    longest_write_lock_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return not self.problems

    def records(self) -> list[dict[str, str]]:
        """One record per check: the PRAGMA, each index, each wrong mechanism object (listed
        only when wrong, "trigger messages_fts_delete"), and each check not run."""
        mechanism = [item for item in self.problems if item != "database"]
        mechanism = [item for item in mechanism if item not in self.checked]
        records = []
        for item in self.checked:
            # The PRAGMA's problems are filed under "database".
            problem = self.problems.get("database" if item.startswith("PRAGMA") else item)
            records.append(
                {"item": item, "status": "BROKEN" if problem else "ok", "detail": problem or ""}
            )
        for item in mechanism:
            records.append({"item": item, "status": "BROKEN", "detail": self.problems[item]})
        for item, reason in self.skipped.items():
            records.append({"item": item, "status": "not checked", "detail": reason})
        return records

    def document(self, repaired: RepairResult | None = None) -> dict[str, Any]:
        """The JSON document of `check` (and of `check --repair`, with what it did)."""
        longest = self.longest_write_lock_s
        if repaired is not None:
            longest = max(longest, repaired.longest_write_lock_s)
        payload: dict[str, Any] = {
            "ok": self.ok,
            "checked": self.checked,
            "problems": self.problems,
            "skipped": self.skipped,
            "fts_checked_on": self.fts_checked_on,
            "longest_write_lock_s": round(longest, 3),
        }
        if repaired is not None:
            payload["repair"] = repaired.as_dict()
        return payload


@dataclass
class RepairResult:
    """What `check --repair` found, did, and what the check says afterwards."""

    before: CheckResult
    after: CheckResult
    #: Index -> how it was rebuilt.
    repaired: dict[str, str] = field(default_factory=dict)
    #: Search-mechanism object (``"trigger messages_fts_delete"``) -> what was wrong with it.
    restored: dict[str, str] = field(default_factory=dict)
    backup: Path | None = None
    #: Why nothing was repaired although the check failed, if so.
    refused: str | None = None
    #: Check item -> why this repair left it as it is (the rest was repaired).
    not_repaired: dict[str, str] = field(default_factory=dict)
    #: The longest time one repair transaction held the store's write lock, in seconds.
    longest_write_lock_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the final check passes."""
        return self.after.ok

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "before": asdict(self.before),
            "after": asdict(self.after),
            "repaired": self.repaired,
            "restored": self.restored,
            "backup": str(self.backup) if self.backup else None,
            "refused": self.refused,
            "not_repaired": self.not_repaired,
            "longest_write_lock_s": round(self.longest_write_lock_s, 3),
        }

    def view(self) -> View:
        """What the repair did, before the checks that follow it."""
        if not self.before.problems:
            return ["nothing to repair: every check passed"]
        shown: View = []
        if self.backup is not None:
            shown.append(f"backup of the store before the repair: {self.backup}")
        records = [
            {"item": item, "done": f"restored from this package's definition (it was: {was})"}
            for item, was in self.restored.items()
        ]
        records += [
            {"item": index, "done": f"repaired: {how}"} for index, how in self.repaired.items()
        ]
        records += [
            {"item": item, "done": f"not repaired: {why}"}
            for item, why in self.not_repaired.items()
        ]
        if records:
            shown.append(Table(records, ("item", "done"), headers={"done": ""}))
            shown.append("checks after the repair:")
        return shown


__all__ = [
    "FTS_COPIES",
    "FTS_INDEX",
    "GROUPS",
    "MESSAGE_DATA",
    "OTHER",
    "CheckResult",
    "IndexBuild",
    "Measured",
    "RepairResult",
    "Shown",
    "StoreStats",
    "Table",
    "View",
    "human_bytes",
    "store_counts",
]

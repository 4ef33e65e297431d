"""One run of the copy: claim the target, compare both sides, write what differs, verify.

See the package's docstring (``hermes_store.copy``) for what a run guarantees; this module
holds its order of steps and the decisions about whose copy the target holds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from hermes_store import migrate
from hermes_store.backend import CopyUpkeep
from hermes_store.copy.marker import (
    SOURCE_MARKER,
    fingerprint,
    identity_sample,
    read_marker,
    recognised,
    source_name,
)
from hermes_store.copy.rows import (
    CopyProgress,
    RowChecks,
    TableDiff,
    compare_table,
    copied_tables,
    count_rows,
    read_only,
    read_snapshot,
)
from hermes_store.copy.source import check_source, commits_seen, open_source, same_store
from hermes_store.copy.target import Plan, inspect_target, refuse_written_target
from hermes_store.copy.verify import Verification
from hermes_store.copy.verify import verify as verify_target
from hermes_store.copy.write import Writer
from hermes_store.engine import create_store_engine, display_url, to_url
from hermes_store.errors import CopyRefused
from hermes_store.revisions import head_revision

__all__ = ["BATCH_ROWS", "CopyResult", "Run", "copy_store"]

#: Rows per committed batch.
BATCH_ROWS = 2000


@dataclass
class CopyResult:
    """What one run of the copy did, and the verification that followed it."""

    source: str
    target: str
    revision: tuple[str, ...]
    rows: dict[str, int]
    resumed: bool
    created_target: bool
    already_complete: bool
    seconds: float
    verification: Verification
    #: Per table: rows inserted, updated and deleted by this run.
    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Whether the source changed while this run read it (the target is then a copy of it
    #: as it was when the run began): known for SQLite sources, None on PostgreSQL.
    source_changed: bool | None = None
    #: The target's upkeep after the writes (PostgreSQL: VACUUM (ANALYZE) of the tables
    #: filled); None when the target needs none or nothing was written.
    upkeep: CopyUpkeep | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "revision": list(self.revision),
            "rows_copied": self.rows,
            "changes": self.changes,
            "resumed": self.resumed,
            "created_target": self.created_target,
            "already_complete": self.already_complete,
            "source_changed_during_copy": self.source_changed,
            "seconds": round(self.seconds, 3),
            "verification": self.verification.as_dict(),
            "upkeep": None if self.upkeep is None else self.upkeep.as_dict(),
        }


def copy_store(
    source: str,
    target: str,
    *,
    append: bool = False,
    restart: bool = False,
    batch_rows: int = BATCH_ROWS,
    progress: Callable[[CopyProgress], None] | None = None,
    verify: bool = True,
) -> CopyResult:
    """Bring ``target`` (a URL or path) to what ``source`` holds, then verify both.

    A target holding an unfinished or finished copy of this source is brought up to date
    (only what differs is written); one holding other data is refused unless ``append``;
    one holding a copy of another store (or of another file at the same path) is refused
    unless ``restart``, which makes it a copy of this source. Raises :class:`CopyRefused`
    (or another StoreError) with one line that says what to do, with nothing changed by
    the refused step.
    """
    started = time.perf_counter()
    source_url, target_url = to_url(source), to_url(target)
    if same_store(source_url, target_url):
        raise CopyRefused(
            f"--from and --to name the same database ({display_url(source_url)}); nothing "
            "was changed"
        )
    reader_engine = open_source(source_url)
    try:
        with reader_engine.connect() as conn:
            conn = read_only(conn)
            with conn.begin():
                before = commits_seen(conn)
                run = Run(conn, source_url, target_url, batch_rows, progress)
                result = run.execute(append=append, restart=restart, verify=verify)
            if before is not None:
                result.source_changed = commits_seen(conn) != before
    finally:
        reader_engine.dispose()
    result.seconds = time.perf_counter() - started
    return result


class Run:
    """One run of the copy, reading the source through one snapshot (``src``)."""

    def __init__(
        self,
        src: Connection,
        source_url: str,
        target_url: str,
        batch_rows: int,
        progress: Callable[[CopyProgress], None] | None,
    ) -> None:
        self.src = src
        self.source_url = source_url
        self.target_url = target_url
        self.batch_rows = batch_rows
        self.progress = progress
        self.name = source_name(source_url)
        self.tables = copied_tables()

    def execute(self, *, append: bool, restart: bool, verify: bool) -> CopyResult:
        revision = check_source(self.src, self.source_url, head_revision())
        plan = inspect_target(self.target_url, revision)
        marker = read_marker(plan.markers, SOURCE_MARKER)
        state, resuming, complete = self._claim(plan, marker, append=append, restart=restart)
        append = bool(state["append"])
        diffs = self._compare(None if plan.create else self.target_url, append)
        if complete and not append:
            refuse_written_target(self.target_url, marker, diffs, self.name)
        if plan.create:
            migrate.upgrade(self.target_url, revision=revision[0])
        nothing = complete and "sums" in (marker or {}) and all(diff.empty for diff in diffs)
        writer = Writer(self, state, plan.markers.get(SOURCE_MARKER), diffs)
        writer.write(finish=not nothing)
        verification = Verification()
        if verify:
            verification = verify_target(
                self.src, self.target_url, append=append, progress=self.progress
            )
        return CopyResult(
            source=self.name,
            target=display_url(self.target_url),
            revision=revision,
            rows={diff.table.name: writer.upserted.get(diff.table.name, 0) for diff in diffs},
            resumed=resuming,
            created_target=plan.create,
            already_complete=nothing,
            seconds=0.0,
            verification=verification,
            changes=writer.changes(),
            upkeep=writer.upkeep,
        )

    def report(self, state: CopyProgress) -> None:
        """Tell the caller's progress callback where the copy is."""
        if self.progress is not None:
            self.progress(state)

    # ---- whose copy the target holds --------------------------------------------------

    def _claim(
        self, plan: Plan, marker: dict[str, Any] | None, *, append: bool, restart: bool
    ) -> tuple[dict[str, Any], bool, bool]:
        """The marker state this run writes, whether it resumes an unfinished copy, and
        whether the copy was complete; refuses a target holding another store's copy."""
        found = fingerprint(self.src, self.source_url)
        fresh = {
            "source": self.name,
            "fingerprint": found,
            "sample": identity_sample(self.src),
            "state": "copying",
            "append": append,
        }
        target = display_url(self.target_url)
        if marker is None:
            if plan.holds_data and not append:
                raise CopyRefused(
                    f"--to {target} already holds sessions or other data not from a copy of "
                    "this source; nothing was changed. Copy into an empty database, or pass "
                    "--append to add these rows (colliding keys refused)"
                )
            return fresh, False, False
        fresh["append"] = append or bool(marker.get("append"))
        if restart:  # whatever the target holds, it becomes a copy of this source
            return fresh, False, False
        why = self._other_source(marker, found)
        unfinished = marker.get("state") == "copying"
        if why is None:
            return fresh, unfinished, not unfinished
        if append and not unfinished:  # a new copy added to this target
            return fresh, False, False
        command = f"hermes-store copy --from {self.name} --to {target} --restart"
        raise CopyRefused(
            f"--to {target} holds {'an unfinished' if unfinished else 'a'} copy of {why}; "
            f"nothing was changed. Run `{command}` to make it a copy of this source instead "
            "(the rows it does not hold are deleted)"
        )

    def _other_source(self, marker: dict[str, Any], found: dict[str, Any]) -> str | None:
        """Why the marker's source is not this one (None when it is)."""
        if marker.get("source") != self.name:
            return f"{marker.get('source')}, not of {self.name}"
        recorded = marker.get("fingerprint")
        if recorded is not None and recorded != found:
            what = "file" if "file" in recorded else "database (its system identifier or oid)"
            return (
                f"another {what} than the one now at {self.name} (the store there was "
                "replaced since)"
            )
        sample = marker.get("sample") or []
        if sample and not recognised(self.src, sample):
            return (
                f"another store than the one now at {self.name}: it holds none of the "
                f"{len(sample)} rows the copy recorded to recognise its source"
            )
        return None

    # ---- comparing -----------------------------------------------------------------------

    def _compare(self, target_url: str | None, append: bool) -> list[TableDiff]:
        """Every table compared, every source row checked; refuses before any write."""
        checks = RowChecks(self.tables)
        engine = None if target_url is None else create_store_engine(target_url, create=False)
        try:
            dst_context = contextlib.nullcontext(None) if engine is None else read_snapshot(engine)
            with dst_context as dst:
                totals = {
                    t.name: count_rows(self.src, t) + (0 if dst is None else count_rows(dst, t))
                    for t in self.tables
                }
                total, done, diffs = sum(totals.values()), 0, []
                for table in self.tables:

                    def tick(rows: int, name: str = table.name, base: int = done) -> None:
                        whole = (base + rows, total, 0, "comparing")
                        self.report(CopyProgress(name, rows, totals[name], *whole))

                    tick(0)
                    diffs.append(
                        compare_table(
                            self.src, dst, table, append=append, checks=checks, progress=tick
                        )
                    )
                    tick(totals[table.name])
                    done += totals[table.name]
        finally:
            if engine is not None:
                engine.dispose()
        refusal = checks.refusal()
        if refusal is not None:
            raise refusal
        return diffs

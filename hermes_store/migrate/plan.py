"""The planner: which Alembic steps an upgrade or a downgrade runs, decided before it runs.

Reads the revision graph only (through ScriptDirectory's public methods), never a store:
the workflow gives it the heads the store is at. Both `hermes-store upgrade` and the bare
`alembic upgrade head` take their steps from here, so both leave the same store.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationStep
from alembic.script import Script, ScriptDirectory
from alembic.script.revision import MultipleHeads, RangeNotAncestorError, RevisionError
from alembic.util import CommandError

from hermes_store.errors import StoreError, UnknownRevision
from hermes_store.migrate.state import StoreState
from hermes_store.revisions import (
    APP_VERSIONS,
    FIRST_APP_VERSION,
    FTS_EXTERNAL_REVISION,
    LAST_APP_VERSION,
    fts_head_revision,
    head_revision,
    require_script_location,
    script_directory,
)

log = logging.getLogger(__name__)


def _x_parser() -> argparse.ArgumentParser:
    """The `-x KEY=VALUE` option of the `alembic` command line, and nothing else."""
    parser = argparse.ArgumentParser(prog="alembic", add_help=False)
    parser.add_argument("-x", action="append", default=[])
    return parser


def alembic_config(url: str | None = None, *, x: Mapping[str, str] | None = None) -> Config:
    """An Alembic config for this project's revisions, without reading alembic.ini's URL.

    ``x`` are the options revisions read with ``context.get_x_argument`` (fts_convert,
    fts_backfill, hermes_home); ``url`` is ``-x db=URL``. They are given to Alembic the way
    its Config documents: as ``cmd_opts``, the parse of `-x` options by argparse.
    """
    x_args = dict(x or {})
    if url is not None:
        x_args["db"] = url
    argv = [word for key, value in x_args.items() for word in ("-x", f"{key}={value}")]
    cfg = Config(cmd_opts=_x_parser().parse_args(argv))
    cfg.set_main_option("script_location", str(require_script_location()))
    cfg.attributes["configure_logging"] = False
    return cfg


def parse_app_version(value: object) -> int:
    """An application schema version this package supports, or a StoreError saying which are."""
    try:
        version = int(str(value).strip())
    except ValueError:
        version = -1
    if version not in APP_VERSIONS:
        raise StoreError(
            f"--app-version {value}: hermes-store supports the application's schema "
            f"{FIRST_APP_VERSION} to {LAST_APP_VERSION}; give the version the agent you run "
            "writes (the `schema_version` it creates)"
        )
    return version


def targets(revision: str | None, app_version: int | None) -> list[str]:
    """The Alembic targets one upgrade runs, in order."""
    if revision is not None and app_version is not None:
        raise StoreError("give either a target revision or an application version, not both")
    if revision is not None:
        return [revision]
    # The relational steps first, then the search layout: an upgrade that fails midway
    # leaves the relational schema at a version the application knows, the layout untouched.
    if app_version is not None and app_version < LAST_APP_VERSION:
        # The relational schema stops at the agent's version; the search layout goes on.
        return [str(app_version), fts_head_revision()]
    return [str(LAST_APP_VERSION), "head"]


def refuse_going_back(state: StoreState, app_version: int | None, store: str) -> None:
    """An upgrade that would stop below the application schema the store has: refused."""
    if app_version is None or state.legacy_version is None:
        return
    if state.legacy_version > app_version:
        raise StoreError(
            f"{store} is at the application's schema {state.legacy_version}, newer than "
            f"--app-version {app_version}: an upgrade never moves a schema back; nothing was "
            "changed. Run the agent that matches the store, or downgrade with "
            f"`alembic downgrade {app_version}`"
        )


def refuse_older_revision(state: StoreState, revision: str, store: str) -> None:
    """An upgrade to a revision the store is already past is a downgrade: refuse it."""
    if state.kind == "new" or revision in ("head", "heads") or revision[:1] in "+-":
        return
    script = script_directory()
    current = state.revisions or (
        (str(state.legacy_version),) if state.legacy_version is not None else ()
    )
    try:
        wanted = {rev.revision for rev in script.get_revisions(revision) if rev is not None}
        below = {rev.revision for rev in script.iterate_revisions(current, "base")}
    except Exception as exc:  # unknown revision: Alembic itself says so, below
        log.debug("revision check skipped: %s", exc)
        return
    if wanted <= set(current):
        return  # already there: nothing to do, said as such
    past = sorted(wanted & below - set(current))
    if past:
        raise StoreError(
            f"{store} is at revision {', '.join(current)}, already past {revision}: an "
            "upgrade never goes back; nothing was changed. To go back, run "
            f"`hermes-store downgrade {revision}`"
        )


def pending_revisions(state: StoreState, targets: Sequence[str]) -> set[str] | None:
    """The revisions an upgrade of a store in ``state`` to ``targets`` would run (adoption
    stamps a legacy store at its version first); None when that cannot be told (a relative
    or unknown target: Alembic says what is wrong with it)."""
    script = script_directory()
    try:
        applied = {rev.revision for rev in script.iterate_revisions(state.heads, "base")}
        wanted = {
            rev.revision
            for target in targets
            for rev in script.iterate_revisions(target, "base")
            if rev is not None
        }
    except Exception as exc:  # Alembic raises several kinds, and says which when it runs
        log.debug("space check skipped: %s", exc)
        return None
    return wanted - applied


#: A downgrade target relative to the store's revisions: ``-N``, or ``BRANCH@-N``.
RELATIVE = re.compile(r"(?:(?P<branch>[^@]+)@)?-(?P<steps>\d+)")
#: Any target Alembic reads as relative (``-N``, ``+N``, ``REV-N``, ``BRANCH@REV+N``).
_ANY_RELATIVE = re.compile(r"(?:(?P<branch>.+?)@)?(?P<symbol>\w+)?[+-]\d+")


def _unknown_revision(name: str) -> UnknownRevision:
    head = head_revision()
    return UnknownRevision(
        f"unknown revision {name!r}: this hermes-store has no revision or branch of that "
        f"name; `hermes-store history` lists them ({FIRST_APP_VERSION}..{LAST_APP_VERSION} "
        f"are the application's schema versions, {FTS_EXTERNAL_REVISION} the search layout, "
        f"{head} the newest). Nothing was changed"
    )


def check_revision(target: str) -> None:
    """Refuse a revision name this package does not have, in one line that points to
    `hermes-store history` (UnknownRevision); ``head``, ``base``, ``-1``, ``fts@-1`` pass."""
    script = script_directory()
    name = target.strip()
    if not name:  # Alembic asserts on an empty name instead of refusing it
        raise _unknown_revision(target)
    relative = _ANY_RELATIVE.fullmatch(name)
    if relative is not None:
        labels = {label for rev in script.walk_revisions() for label in rev.branch_labels}
        if relative["branch"] is not None and relative["branch"] not in labels:
            raise _unknown_revision(relative["branch"])
        names = [] if relative["symbol"] in (None, "head", "heads") else [relative["symbol"]]
    else:
        names = [name]
    for part in names:
        try:
            script.get_revisions(part)
        except (RevisionError, CommandError):
            raise _unknown_revision(part) from None


def upgrade_order() -> tuple[str, ...]:
    """Every revision, in the order `hermes-store upgrade` applies them to a new store: the
    application's chain to its newest version, then the search layout, then the merge."""
    script = script_directory()
    order: list[str] = []
    for target in (str(LAST_APP_VERSION), "heads"):
        for rev in reversed(list(script.iterate_revisions(target, "base"))):
            if rev is not None and rev.revision not in order:
                order.append(rev.revision)
    return tuple(order)


def applied_revisions(heads: Sequence[str]) -> set[str]:
    """The revisions a store at ``heads`` has: they and everything below them."""
    script = script_directory()
    applied: set[str] = set()
    todo = list(heads)
    while todo:
        name = todo.pop()
        if name not in applied:
            applied.add(name)
            down = _revision(script, name).down_revision
            todo.extend([down] if isinstance(down, str) else down or ())
    return applied


def heads_of(applied: set[str]) -> tuple[str, ...]:
    script = script_directory()
    return tuple(
        sorted(name for name in applied if not set(_revision(script, name).nextrev) & applied)
    )


def _revision(script: ScriptDirectory, name: str) -> Script:
    found = script.get_revision(name)
    assert found is not None
    return found


@dataclass(frozen=True)
class DowngradePlan:
    """What one downgrade undoes, resolved against the store's revisions before it runs."""

    target: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    #: The revisions undone, in the order their downgrades run (newest first).
    undone: tuple[str, ...]

    def describe(self) -> list[dict[str, str]]:
        """Per revision undone: what it does, and what undoing it gives up (its docstring's
        paragraph about the downgrade, which each revision states)."""
        script = script_directory()
        described = []
        for name in self.undone:
            rev = _revision(script, name)
            if rev.is_merge_point:
                undoing = "Nothing to undo: it only joins the two branches."
            else:
                paragraphs = [" ".join(p.split()) for p in rev.longdoc.split("\n\n")]
                said = [p for p in paragraphs if p.startswith("Downgrade")]
                undoing = said[0] if said else "its docstring does not say what undoing it loses"
            described.append({"revision": name, "does": rev.doc.strip(), "undoing": undoing})
        return described

    def steps(self) -> list[MigrationStep]:
        """Alembic's steps for the revisions undone, in order."""
        script = script_directory()
        return [
            MigrationStep.downgrade_from_script(script.revision_map, _revision(script, name))
            for name in self.undone
        ]


def plan_downgrade(heads: Sequence[str], target: str) -> DowngradePlan:
    """Resolve a downgrade target against a store at ``heads`` (nothing is read or run).

    ``-N`` undoes N steps. One step is the newest revision of the store that changes it, in
    :func:`upgrade_order` (the application's schema versions, then the search layout): from
    the merge head that is the search layout's newest revision (fts2), with the merge above
    it, which changes nothing and is never a step of its own; then fts1 with its merge.
    ``BRANCH@-N`` takes the steps on that branch only (``fts@-1``). Every other target
    (``base``, a revision id, an application version, ``fts@17``) means what it means to
    Alembic: every revision of the store that depends on it is undone.
    Raises UnknownRevision (a name this package lacks) or StoreError (nothing to undo).
    """
    check_revision(target)
    script = script_directory()
    before = tuple(sorted(heads))
    applied = applied_revisions(before)
    relative = RELATIVE.fullmatch(target.strip())
    if relative is not None:
        undone = _walk_back(applied, int(relative["steps"]), relative["branch"], target)
    else:
        try:
            found = script.iterate_revisions(before, target, select_for_downgrade=True)
            undone = tuple(rev.revision for rev in found if rev is not None)
        except RangeNotAncestorError:
            raise StoreError(
                f"the store is at {', '.join(before) or 'base'}, which is not above {target}: "
                f"there is nothing to undo (`hermes-store upgrade --revision {target}` goes "
                "forward). Nothing was changed"
            ) from None
        except RevisionError as exc:
            raise StoreError(
                f"downgrade {target}: {exc}; name the revision to go back to (`hermes-store "
                "history`), or give -N steps. Nothing was changed"
            ) from None
    return DowngradePlan(target, before, heads_of(applied - set(undone)), undone)


def _walk_back(applied: set[str], steps: int, branch: str | None, target: str) -> tuple[str, ...]:
    """The revisions ``steps`` steps back from ``applied`` undo (see :func:`plan_downgrade`)."""
    script = script_directory()
    order = upgrade_order()
    left = set(applied)
    undone: list[str] = []
    for done in range(steps):
        candidates = [
            name
            for name in order
            if name in left
            and not _revision(script, name).is_merge_point
            and (branch is None or branch in _revision(script, name).branch_labels)
        ]
        if not candidates:
            where = f" on branch {branch}" if branch else ""
            raise StoreError(
                f"downgrade {target}: the store has {done} step(s) to undo{where}, not "
                f"{steps} (`hermes-store history` lists them; `downgrade base` undoes every "
                "one). Nothing was changed"
            )
        newest = candidates[-1]
        # What depends on it goes first: the merge above it, newest first.
        above = [
            name for name in reversed(order) if name in left and newest in applied_revisions([name])
        ]
        for name in above:
            left.discard(name)
            undone.append(name)
    return tuple(undone)


def steps_to(targets: Sequence[str], heads: tuple[str, ...]) -> list[MigrationStep]:
    """Alembic's own steps to each target in turn, from ``heads``: the relational chain to
    its version before the search layout (see :func:`targets`), whichever command runs.

    What `alembic upgrade TARGET` plans, from public API: the revisions between the heads
    and the target (``ScriptDirectory.iterate_revisions`` with ``implicit_base``, as the
    upgrade command reads it), oldest first, as upgrade steps.
    """
    script = script_directory()
    steps: list[MigrationStep] = []
    for target in targets:
        try:
            found = list(script.iterate_revisions(target, heads, implicit_base=True))
        except RangeNotAncestorError:
            raise CommandError(
                f"Destination {target} is not a valid upgrade target from current head(s)"
            ) from None
        except MultipleHeads as exc:
            raise CommandError(
                f"Multiple head revisions are present for given argument '{exc.argument}'; "
                "please specify a specific target revision"
            ) from None
        except RevisionError as exc:
            raise CommandError(str(exc.args[0])) from None
        # The steps an ``fn`` returns (EnvironmentContext documents ``fn``; Alembic has no
        # other constructor of its steps than these class methods).
        steps.extend(
            MigrationStep.upgrade_from_script(script.revision_map, rev) for rev in reversed(found)
        )
        heads = heads_of(applied_revisions(heads) | {rev.revision for rev in found})
    return steps


def plan_runner(plan: DowngradePlan) -> Callable[[tuple[str, ...]], list[MigrationStep]]:
    """The planned steps, refused when the store is no longer where the plan was made."""

    def steps(heads: tuple[str, ...]) -> list[MigrationStep]:
        if heads != plan.before:
            raise StoreError(
                f"the store moved from {', '.join(plan.before) or 'base'} to "
                f"{', '.join(heads) or 'base'} while the downgrade started; nothing was "
                "changed: run it again"
            )
        return plan.steps()

    return steps


def confirmed(plan: DowngradePlan, expect: DowngradePlan | None) -> DowngradePlan:
    if expect is not None and plan != expect:
        raise StoreError(
            f"the store moved since the downgrade was confirmed (it is at "
            f"{', '.join(plan.before) or 'base'}, not {', '.join(expect.before) or 'base'}); "
            "nothing was changed: run it again to see what it would undo"
        )
    return plan


def downgrade_command(
    store: Path | None, revision: str, plan: DowngradePlan | None, after: StoreState | None
) -> str:
    """The `hermes-store downgrade` command line that finishes an interrupted one: the same
    target, or for -N the steps of the plan still to undo."""
    target = revision
    relative = RELATIVE.fullmatch(revision.strip())
    if relative is not None and plan is not None and after is not None:
        done = applied_revisions(after.heads)
        script = script_directory()
        left = [
            name
            for name in plan.undone
            if name in done and not _revision(script, name).is_merge_point
        ]
        target = f"{relative['branch']}@-{len(left)}" if relative["branch"] else f"-{len(left)}"
    return f"hermes-store downgrade {target}" + (f" --db {store}" if store is not None else "")


def upgrade_command(
    store: Path | None, revision: str | None, app_version: int | None, x: Mapping[str, str]
) -> str:
    """The `hermes-store upgrade` command line that goes on with an upgrade."""
    words = ["hermes-store upgrade"]
    if store is not None:
        words.append(f"--db {store}")
    if revision is not None:
        words.append(f"--revision {revision}")
    if app_version is not None:
        words.append(f"--app-version {app_version}")
    if x.get("fts_convert") == "rebuild":
        words.append("--rebuild-fts")
    if x.get("fts_backfill") == "deferred":
        words.append("--deferred-fts")
    return " ".join(words)

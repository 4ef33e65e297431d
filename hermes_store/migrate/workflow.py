"""The one upgrade workflow: env.py's call, and the library's upgrade, downgrade and stamp.

Every command that runs revisions, `hermes-store upgrade` and the bare `alembic upgrade head`
alike, goes through env.py, whose one call is :func:`run`. The library's entry points
resolve the store once into a :class:`Request` and give it to env.py through the config's
``attributes``; the `alembic` command line gets one built from its ``-x`` options. Then,
once and on one connection: classification, the workflow's refusals, the backup, adoption,
the revisions (the steps from :mod:`hermes_store.migrate.plan`), and what follows them.
What differs between the databases is the backend's (its "migration" section).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext, MigrationStep
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, text

from hermes_store.engine import BEGIN_OPTION, joined_transaction, resolve_url
from hermes_store.errors import Interrupted, StoreError, StoreNotFound
from hermes_store.migrate.adoption import schema_differences
from hermes_store.migrate.plan import (
    DowngradePlan,
    alembic_config,
    check_revision,
    confirmed,
    downgrade_command,
    parse_app_version,
    plan_downgrade,
    plan_runner,
    refuse_going_back,
    refuse_older_revision,
    steps_to,
    targets,
    upgrade_command,
)
from hermes_store.migrate.state import (
    APP_VERSION_X,
    BACKUP_OVERWRITE_X,
    BACKUP_X,
    DELETE_DATA_X,
    Request,
    StoreState,
    Target,
    UpgradeResult,
    settle,
    truthy,
)
from hermes_store.progress import Phase, Report, Tracker, quiet
from hermes_store.revisions import OFFLINE_REFUSALS, head_revision, script_directory

log = logging.getLogger(__name__)

#: Where the library puts its :class:`Request` in ``config.attributes``, and env.py the result.
REQUEST = "hermes_store.request"
RESULT = "hermes_store.result"


# -- env.py -----------------------------------------------------------------------------------


def run(context: EnvironmentContext, **configure: Any) -> None:
    """env.py's one call: run the command Alembic is running, inside the workflow.

    ``configure`` are env.py's own `context.configure` options (the metadata and the
    autogenerate filters). Offline (``--sql``), the SQL is written for review. A caller's
    connection (``config.attributes["connection"]``, as pytest-alembic passes its engine)
    is used as it is. Commands that run no revision (current, check, history) only read.
    Everything else is :func:`migrate_store`.
    """
    config = context.config
    if context.is_offline_mode():
        _offline(context, configure)
        return
    given = config.attributes.get("connection")
    if given is not None:
        _on_given_connection(context, given, configure)
        return
    request: Request | None = config.attributes.get(REQUEST)
    try:
        if request is None:
            request = _command_line_request(context)
        if request is None:
            _reading(context, configure)
            return
        config.attributes[RESULT] = migrate_store(context, request, configure)
    except StoreError as exc:
        if request is not None and request.from_library:
            raise
        raise CommandError(str(exc)) from None  # one line from `alembic`, no traceback


def _run_migrations(context: EnvironmentContext, conn: Connection, configure: Any) -> None:
    """Each revision in its own transaction on ``conn`` (DDL included)."""
    context.configure(
        connection=conn,
        transactional_ddl=True,
        transaction_per_migration=True,
        render_as_batch=True,
        **configure,
    )
    with context.begin_transaction():
        context.run_migrations()


def _offline(context: EnvironmentContext, configure: Mapping[str, Any]) -> None:
    """Emit SQL for review (`alembic upgrade head --sql`)."""
    url = env_url(context.get_x_argument(as_dictionary=True))
    # Autogenerate's options (comparison, directives) compare a live database: not here.
    kept = ("target_metadata", "include_name", "include_object")
    options = {key: value for key, value in configure.items() if key in kept}
    context.configure(
        url=url, literal_binds=True, transactional_ddl=True, render_as_batch=True, **options
    )
    _refuse_what_needs_the_store(context)
    with context.begin_transaction():
        context.run_migrations()


def _refuse_what_needs_the_store(context: EnvironmentContext) -> None:
    """Offline, refuse in one line (before any SQL is written) when a revision to run reads
    the store to decide what to do: its SQL cannot be known without it."""
    migration = context.get_context()
    # The command's step planner, as its EnvironmentContext gave it (`MigrationContext.opts`
    # holds the configure options; Alembic has no public accessor for the planner).
    plan = migration.opts.get("fn")
    if plan is None:
        return
    for step in plan(migration.get_current_heads(), migration):
        revision: Any = getattr(step, "revision", None)
        why = OFFLINE_REFUSALS.get(getattr(revision, "revision", ""))
        if why:
            raise CommandError(
                f"revision {revision.revision} cannot be written as offline SQL: {why}. "
                "Run it online: `hermes-store upgrade`, or alembic without --sql"
            )


def _on_given_connection(
    context: EnvironmentContext, given: Connection | Engine, configure: Any
) -> None:
    """A caller's own connection or engine: its store is the caller's to prepare; a
    connection's store is adopted (SQLite) or checked as ours (PostgreSQL) first."""
    from hermes_store.backend import backend_of

    if isinstance(given, Engine):  # pytest-alembic passes its `alembic_engine`
        with given.connect() as conn:
            conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            _run_migrations(context, conn, configure)
        return
    if _destination(context)[0]:
        backend_of(given).prepare_given(given)
    _run_migrations(context, given, configure)


def _reading(context: EnvironmentContext, configure: Any) -> None:
    """current, check, history...: open the store without creating or adopting anything."""
    target = Target.resolve(context.get_x_argument(as_dictionary=True).get("db") or None)
    with target.backend.reading_connection(target) as conn:
        _run_migrations(context, conn, configure)


def _destination(context: EnvironmentContext) -> tuple[bool, str | None]:
    """Whether the command runs revisions, and to which (resolved: 'head' is the head's id,
    'base' is None)."""
    try:
        target = context.get_revision_argument()
    except KeyError:  # current, check, history...: nothing will run
        return False, None
    return True, target if target is None or isinstance(target, str) else ",".join(target)


def _alembic_command(context: EnvironmentContext) -> tuple[str | None, str | None]:
    """The verb (``upgrade``, ``downgrade``, ``stamp``...) and the revision argument as typed
    when the `alembic` command line runs (Alembic's own resolved argument drops a branch
    label: ``fts@-1`` reads ``-1``); (None, None) when called from code.

    Read from ``config.cmd_opts``, the parsed command line Alembic's Config documents;
    ``cmd`` is what its command line stores there for the command to run.
    """
    options = context.config.cmd_opts
    cmd = getattr(options, "cmd", None)
    verb = getattr(cmd[0], "__name__", None) if isinstance(cmd, tuple) and cmd else None
    raw = getattr(options, "revision", None)
    return verb, raw if isinstance(raw, str) else None


def _command_line_request(context: EnvironmentContext) -> Request | None:
    """The request of the bare `alembic` command (or `alembic.command` called from code
    with a config of ``-x`` options); None for a command that runs no revision."""
    runs, destination = _destination(context)
    if not runs:
        return None
    x = context.get_x_argument(as_dictionary=True)
    verb, raw = _alembic_command(context)
    target = Target.resolve(x.get("db") or None, create_home=True)
    _refuse_options_of_another_database(target, x)
    if raw is not None or destination is not None:
        check_revision(raw or destination or "")
    app_version = parse_app_version(x[APP_VERSION_X]) if x.get(APP_VERSION_X) else None
    if app_version is not None and destination != head_revision():
        raise StoreError(
            f"-x {APP_VERSION_X}=N says where to stop: run `alembic -x {APP_VERSION_X}=N "
            "upgrade head`, not another target"
        )
    words = f"alembic -x db={target.name} {verb or 'upgrade'} {raw or destination or 'base'}"
    common: dict[str, Any] = {
        "x": x,
        "backup_to": x.get(BACKUP_X) or None,
        "overwrite_backup": truthy(x.get(BACKUP_OVERWRITE_X)),
        "delete_data": truthy(x.get(DELETE_DATA_X)),
        "delete_how": f"`alembic -x {DELETE_DATA_X}=true downgrade base`",
        "finish": words,
        "from_library": False,
    }
    if verb == "downgrade" and raw is not None:
        # The same steps as `hermes-store downgrade` (see plan_downgrade): `-1` from the
        # merge head is one step, not Alembic's "Ambiguous walk".
        return Request(target, "downgrade", revision=raw, **common)
    if verb != "stamp" and destination == head_revision():
        # The steps `hermes-store upgrade` runs, in its order (Alembic's own order would
        # convert the search layout before the application's steps, and revision 23 then
        # records another flag): the same store either way.
        planned = tuple(targets(None, app_version))
        return Request(target, "upgrade", app_version=app_version, targets=planned, **common)
    # Another target, or a command Alembic plans itself (stamp; a downgrade from code).
    kind = "downgrade" if destination is None else (verb or "upgrade")
    planned = tuple(destination.split(",")) if destination else ()
    return Request(target, kind, targets=planned, own_steps=False, **common)


def _refuse_options_of_another_database(target: Target, x: Mapping[str, str]) -> None:
    """``-x`` options that mean something on one database only, refused in one wording."""
    if x.get(BACKUP_X):
        target.backend.require("file_backup", f"-x {BACKUP_X}")
    if x.get("fts_backfill"):
        target.backend.require("staged_backfill", "-x fts_backfill")


# -- the workflow -----------------------------------------------------------------------------


def migrate_store(
    context: EnvironmentContext, request: Request, configure: Mapping[str, Any]
) -> UpgradeResult | tuple[str | None, str | None]:
    """Classify, refuse, back up, adopt, run the revisions and finish: once, on one
    connection. Returns what an upgrade did, or a downgrade's (from, to) revisions.

    Interrupted (Ctrl-C), it raises Interrupted (a StoreError from `alembic`) whose message
    says what was done, what is left and the command that finishes it.
    """
    backend = request.target.backend
    tracker = Tracker(request.report)
    seen: dict[str, Any] = {}

    def admit(state: StoreState, refuse_deleting_data: Callable[[str], None]) -> None:
        seen["state"] = state
        seen["plan"] = _admit(request, state, refuse_deleting_data)

    path = request.target.path
    seen["created"] = path is not None and not path.exists()
    try:
        with backend.migration_connection(request, admit, tracker) as session:
            conn = session.conn
            if not request.upgrading:  # the revisions only: a downgrade may leave no table
                before = current_revision(conn)
                with backend.around_revisions(conn, request, tracker) as notes:
                    options = _with_planner(configure, request, seen, tracker, notes)
                    _run_migrations(context, conn, options)
                    settle(conn)
                return before, current_revision(conn)
            _before, schema_before, layout_before = backend.migration_facts(conn)
            with backend.around_revisions(conn, request, tracker) as notes:
                settle(conn)
                options = _with_planner(configure, request, seen, tracker, notes)
                _run_migrations(context, conn, options)
                settle(conn)
                healed, pending = backend.after_revisions(conn, request, tracker)
            after, schema_after, layout_after = backend.migration_facts(conn)
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):
            raise
        story = backend.interruption(
            request, tracker.last, seen.get("state"), created=seen.get("created", False)
        )
        if story is None:
            raise
        if request.from_library:
            raise Interrupted(story) from exc
        raise StoreError(story) from exc
    state = session.state
    return UpgradeResult(
        path=state.path,
        before=state.revisions,
        after=after,
        schema_before=state.legacy_version if state.kind != "new" else schema_before,
        schema_after=schema_after,
        app_version=request.app_version,
        layout_before=layout_before,
        layout_after=layout_after,
        backup=session.prepared.backup,
        adopted=session.prepared.adopted,
        restamped=session.prepared.restamped,
        pending_backfill=tuple(pending),
        rows_left=pending,
        healed=healed,
        longest_write_lock_s=round(max(session.locks), 3),
    )


def _admit(
    request: Request, state: StoreState, refuse_deleting_data: Callable[[str], None]
) -> DowngradePlan | None:
    """The workflow's refusals, from the classification: a downgrade is planned here (and
    one to base of a store holding conversations refused), an upgrade never goes back."""
    store = request.target.name
    if request.verb == "downgrade":
        if state.kind == "new" and request.own_steps:
            raise StoreNotFound(f"{store}: nothing to downgrade, the store is empty")
        plan = None
        if request.own_steps and request.revision is not None:
            plan = confirmed(plan_downgrade(state.heads, request.revision), request.expect)
        if (plan is None or not plan.after) and not request.delete_data:
            refuse_deleting_data(request.delete_how)
        return plan
    if request.upgrading:
        refuse_going_back(state, request.app_version, store)
        if request.revision is not None:
            refuse_older_revision(state, request.revision, store)
    return None


def _with_planner(
    configure: Mapping[str, Any],
    request: Request,
    seen: Mapping[str, Any],
    report: Report,
    notes: Mapping[str, str],
) -> dict[str, Any]:
    """env.py's options, with the steps the workflow planned (Alembic's own without)."""
    fn = _planner(request, seen.get("plan"), report, notes)
    return {**configure, **({"fn": fn} if fn is not None else {})}


def _planner(
    request: Request, plan: DowngradePlan | None, report: Report, notes: Mapping[str, str]
) -> Callable[[Any, Any], Iterator[MigrationStep]] | None:
    """The steps Alembic runs (its ``fn``), each announced; None: Alembic's own."""
    if not request.own_steps:
        return None
    if plan is not None:
        runner = plan_runner(plan)

        def undo(heads: Any, _context: Any) -> Iterator[MigrationStep]:
            return _announced(runner(tuple(sorted(heads))), report, notes)

        return undo
    planned = request.targets

    def forward(heads: Any, _context: Any) -> Iterator[MigrationStep]:
        return _announced(steps_to(planned, tuple(sorted(heads))), report, notes)

    return forward


def _announced(
    steps: Iterable[MigrationStep], report: Report, notes: Mapping[str, str]
) -> Iterator[MigrationStep]:
    """Alembic's steps, each reported just before it runs (Alembic pulls the next step from
    this iterator right before it begins that step's transaction); ``notes`` says more
    about some of them (how the search conversion will go)."""
    for step in steps:
        rev = getattr(step, "revision", None)
        name = getattr(rev, "revision", None) or str(step)
        doc = notes.get(name) or (getattr(rev, "doc", "") or "").strip()
        verb = "revision" if step.is_upgrade else "undoing revision"
        report(Phase("revision", f"{verb} {name}: {doc}".rstrip(": "), item=name))
        yield step


def _through_alembic(request: Request) -> Any:
    """Run env.py for ``request`` (which then runs :func:`run`), the way Alembic's own
    commands do: an EnvironmentContext around ``ScriptDirectory.run_env``. The package's
    one ScriptDirectory is used, so that its revision modules are the ones loaded."""
    cfg = alembic_config(x=request.x)
    cfg.attributes[REQUEST] = request
    script = script_directory()
    destination = request.revision or ("heads" if request.upgrading else "base")
    with EnvironmentContext(cfg, script, destination_rev=destination):
        script.run_env()
    return cfg.attributes[RESULT]


# -- the library's entry points ---------------------------------------------------------------


def upgrade(
    url: str | None = None,
    revision: str | None = None,
    *,
    app_version: int | None = None,
    x: Mapping[str, str] | None = None,
    backup_to: str | os.PathLike[str] | None = None,
    overwrite_backup: bool = False,
    create: bool = True,
    progress: Report | None = None,
) -> UpgradeResult:
    """Upgrade a store (adopting a legacy one) and say what was done.

    A store that does not exist is created (``create=False`` refuses it instead, with
    nothing created); when the upgrade of a store it created fails, the file and the
    directories made for it are removed. ``revision`` below the store's own is refused
    (that is a downgrade). A ``backup_to`` that cannot be used is refused before anything
    is opened.

    The relational schema goes to ``app_version`` (default: the newest the package
    supports) and the search layout to the FTS branch's head; ``revision`` names one
    Alembic target instead. The store is classified once, before anything is written;
    then, on one connection (on SQLite, one that holds the write lock), the backup
    (``backup_to``) is taken, the store adopted or restamped, and each revision run in its
    own transaction. A full disk, a read-only store or a lock held past the busy timeout
    raise DiskFull, StoreReadOnly or StoreBusy; the revision in progress is rolled back.

    ``progress`` is told each phase as it starts (and how far the counted ones got).
    Interrupted (Ctrl-C), it raises Interrupted, whose message says what was done, what
    is left and the command that finishes it.
    """
    x_args = dict(x or {})
    if app_version is None and x_args.get(APP_VERSION_X):
        app_version = parse_app_version(x_args.pop(APP_VERSION_X))
    elif app_version is not None:
        app_version = parse_app_version(app_version)
    if revision is not None:
        check_revision(revision)
    planned = tuple(targets(revision, app_version))
    target = Target.resolve(url)
    if backup_to is not None:
        target.backend.require("file_backup", "--backup")
    _refuse_options_of_another_database(target, x_args)
    request = Request(
        target,
        "upgrade",
        revision=revision,
        app_version=app_version,
        x=x_args,
        backup_to=backup_to,
        overwrite_backup=overwrite_backup,
        create=create,
        report=progress or quiet,
        targets=planned,
        finish=upgrade_command(target.path, revision, app_version, x_args),
    )
    result: UpgradeResult = _through_alembic(request)
    return result


def plan_store_downgrade(url: str | None, revision: str) -> DowngradePlan:
    """What ``downgrade(url, revision)`` would undo, read from the store without writing."""
    target = Target.resolve(url)
    if target.path is not None and not target.path.exists():
        raise StoreNotFound(f"{target.path}: no such store; nothing to downgrade")
    return plan_downgrade(target.backend.classify(target).heads, revision)


def downgrade(
    url: str | None = None,
    revision: str = "-1",
    *,
    x: Mapping[str, str] | None = None,
    backup_to: str | os.PathLike[str] | None = None,
    overwrite_backup: bool = False,
    delete_data: bool = False,
    expect: DowngradePlan | None = None,
    progress: Report | None = None,
) -> tuple[str | None, str | None]:
    """Undo revisions of a store (see :func:`plan_downgrade` for what REVISION means);
    return (from, to) revisions.

    Going to base drops every table: on a store that holds sessions or messages it is
    refused (StoreError, nothing changed) unless ``delete_data``. ``backup_to`` is checked
    before anything is opened and written before the first revision runs. ``expect`` (the
    plan a person confirmed) refuses the downgrade, nothing changed, when the store has
    moved since. Interrupted, it raises Interrupted saying where the store was left.
    """
    target = Target.resolve(url)
    if backup_to is not None:
        target.backend.require("file_backup", "--backup")
    check_revision(revision)
    holder: dict[str, DowngradePlan] = {}

    def finish(after: StoreState | None) -> str:
        return downgrade_command(target.path, revision, holder.get("plan") or expect, after)

    request = Request(
        target,
        "downgrade",
        revision=revision,
        x={**(x or {})},
        backup_to=backup_to,
        overwrite_backup=overwrite_backup,
        delete_data=delete_data,
        expect=expect,
        report=progress or quiet,
        finish=finish,
        delete_how=f"`hermes-store downgrade {revision} --yes --i-know-this-deletes-data`",
    )
    moved: tuple[str | None, str | None] = _through_alembic(request)
    return moved


def stamp(url: str | None, revision: str) -> tuple[str | None, str | None]:
    """Record ``revision`` in alembic_version without running anything; return (from, to).

    Refused (StoreError, nothing changed) unless the store really has the schema that
    revision declares (see :func:`schema_differences`): a stamp that lies would make the
    next upgrade skip or repeat steps.
    """
    check_revision(revision)
    target = Target.resolve(url)
    target.backend.require("stamp", "stamp")
    with target.backend.writing_connection(target) as conn:
        problems = schema_differences(conn, revision)
        if problems:
            more = f" (and {len(problems) - 4} more differences)" if len(problems) > 4 else ""
            raise StoreError(
                f"stamp {revision} refused, the store does not have that schema: "
                f"{'; '.join(problems[:4])}{more}. Nothing was changed. "
                "`hermes-store upgrade` adopts an unversioned store by itself"
            )
        before = current_revision(conn)
        with joined_transaction(conn):
            context = MigrationContext.configure(conn)
            if context.get_current_heads():  # what `alembic stamp --purge` does first
                conn.execute(text("DELETE FROM alembic_version"))
            context.stamp(script_directory(), revision)
        settle(conn)
        return before, current_revision(conn)


def current_revision(conn: Connection) -> str | None:
    """The Alembic revision(s) a connection's store is at, comma-separated (None: unversioned)."""
    with joined_transaction(conn):
        heads = MigrationContext.configure(conn).get_current_heads()
    return ", ".join(sorted(heads)) or None


def classify(url: str | None) -> StoreState:
    """Where a store is (its revisions, or its legacy schema), read without writing."""
    target = Target.resolve(url)
    return target.backend.classify(target)


def env_url(x_args: Mapping[str, str]) -> str:
    """The URL env.py uses: ``-x db=...``, else $HERMES_STORE_URL, else the legacy default."""
    return resolve_url(x_args.get("db") or None, create_home=False)

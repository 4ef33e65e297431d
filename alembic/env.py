"""Run hermes-store revisions: configuration, autogenerate filters, then one library call."""

from __future__ import annotations

import warnings
from logging.config import fileConfig
from typing import Any

from alembic.util import CommandError
from sqlalchemy import Column, Connection
from sqlalchemy.exc import SAWarning

from alembic import context
from hermes_store import migrate
from hermes_store.errors import StoreError
from hermes_store.models import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata

#: Objects the ORM does not own: FTS5 virtual tables and their shadow tables, SQLite's own.
UNOWNED_PREFIXES = ("messages_fts", "sqlite_")


#: Indexes with DESC columns: autogenerate cannot compare them, the schema tests do.
EXPRESSION_INDEXES = frozenset(
    str(index.name)
    for table in target_metadata.tables.values()
    for index in table.indexes
    if any(not isinstance(expr, Column) for expr in index.expressions)
)


# SQLite cannot reflect them; they are left out of the comparison above, so say nothing.
warnings.filterwarnings(
    "ignore", "Skipped unsupported reflection of expression-based index", SAWarning
)


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Keep autogenerate away from the FTS5 tables, their shadow tables and views."""
    if type_ == "table" and name is not None:
        return not name.startswith(UNOWNED_PREFIXES)
    return True


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Same filter, for objects; DESC indexes are compared by the schema tests instead."""
    if type_ == "index" and name in EXPRESSION_INDEXES:
        return False
    return include_name(name, type_, None)


def _target() -> tuple[bool, str | None]:
    """Whether the command runs revisions, and to which (resolved: 'head' is the head's id,
    'base' is None)."""
    try:
        target = context.get_revision_argument()
    except KeyError:  # current, check, history...: nothing will run
        return False, None
    return True, target if target is None or isinstance(target, str) else ",".join(target)


def run_migrations(connection: Connection, **overrides: Any) -> None:
    """Run each revision in its own transaction on ``connection`` (DDL included).

    ``overrides`` are further `configure` options from the library (the step planner of
    `-x app_version=N`).
    """
    context.configure(
        **overrides,
        connection=connection,
        target_metadata=target_metadata,
        transactional_ddl=True,
        transaction_per_migration=True,
        render_as_batch=True,
        include_name=include_name,
        include_object=include_object,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL for review (`alembic upgrade head --sql`)."""
    url = migrate.env_url(context.get_x_argument(as_dictionary=True))
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        transactional_ddl=True,
        render_as_batch=True,
        include_name=include_name,
        include_object=include_object,
    )
    _refuse_what_needs_the_store()
    with context.begin_transaction():
        context.run_migrations()


def _refuse_what_needs_the_store() -> None:
    """Offline, refuse in one line (before any SQL is written) when a revision to run reads
    the store to decide what to do: its SQL cannot be known without it."""
    migration = context.get_context()
    plan = migration.opts.get("fn")
    if plan is None:
        return
    for step in plan(migration.get_current_heads(), migration):
        revision = getattr(step, "revision", None)
        why = getattr(getattr(revision, "module", None), "OFFLINE_REFUSAL", None)
        if why:
            raise CommandError(
                f"revision {revision.revision} cannot be written as offline SQL: {why}. "
                "Run it online: `hermes-store upgrade`, or alembic without --sql"
            )


if context.is_offline_mode():
    run_migrations_offline()
else:
    # The workflow around the revisions (classify once, back up, adopt) is the library's.
    runs, destination = _target()
    try:
        migrate.run_env(
            config,
            run_migrations,
            x=context.get_x_argument(as_dictionary=True),
            runs_revisions=runs,
            destination=destination,
        )
    except StoreError as exc:
        if config.attributes.get("connection") is not None:
            raise  # the library runs these revisions, and reports its own errors
        raise CommandError(str(exc)) from None  # one line from `alembic`, no traceback

"""Run hermes-store revisions: configuration, autogenerate filters, then one library call."""

from __future__ import annotations

import warnings
from logging.config import fileConfig
from typing import Any

from alembic.operations.ops import AlterColumnOp, ModifyTableOps
from alembic.util import CommandError
from sqlalchemy import Connection
from sqlalchemy.exc import SAWarning

from alembic import context
from hermes_store import migrate
from hermes_store.errors import StoreError
from hermes_store.models import Base, expression_indexes

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata

#: Objects the ORM does not own: FTS5 virtual tables and their shadow tables, SQLite's own.
UNOWNED_PREFIXES = ("messages_fts", "sqlite_")


#: Indexes with DESC columns or expressions: autogenerate cannot compare them, a test does.
EXPRESSION_INDEXES = frozenset(str(index.name) for index in expression_indexes())


# SQLite cannot reflect them; they are left out of the comparison above, so say nothing.
warnings.filterwarnings(
    "ignore", "Skipped unsupported reflection of expression-based index", SAWarning
)


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Keep autogenerate away from the FTS5 tables, their shadow tables and views, and from
    PostgreSQL's search indexes (expression indexes the revisions own)."""
    if type_ in ("table", "index") and name is not None:
        return not name.startswith(UNOWNED_PREFIXES)
    return True


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Same filter, for objects; DESC indexes are compared by the schema tests instead."""
    if type_ == "index" and name in EXPRESSION_INDEXES:
        return False
    return include_name(name, type_, None)


def _keys_not_null_on_postgresql(context_: Any, _revision: Any, directives: list[Any]) -> None:
    """PostgreSQL makes every primary-key column NOT NULL; the models declare the legacy
    SQLite DDL (no NOT NULL on a TEXT key), so that difference is not one to migrate."""
    if context_.dialect.name != "postgresql":
        return
    for script in directives:
        for upgrade_ops in script.upgrade_ops_list:
            for table_ops in upgrade_ops.ops:
                if isinstance(table_ops, ModifyTableOps):
                    table_ops.ops = [op for op in table_ops.ops if not _key_nullability(op)]
            upgrade_ops.ops = [ops for ops in upgrade_ops.ops if not ops.is_empty()]


def _key_nullability(operation: object) -> bool:
    if not isinstance(operation, AlterColumnOp) or operation.modify_nullable is None:
        return False
    table = target_metadata.tables.get(operation.table_name)
    column = table.columns.get(operation.column_name) if table is not None else None
    others = (operation.modify_type, operation.modify_server_default, operation.modify_name)
    return column is not None and column.primary_key and all(o in (None, False) for o in others)


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
        process_revision_directives=_keys_not_null_on_postgresql,
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

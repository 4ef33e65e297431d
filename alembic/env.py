"""Run hermes-store revisions: URL resolution, transactional DDL, filters, legacy adoption."""

from __future__ import annotations

from logging.config import fileConfig

from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Column, Connection, Engine

from alembic import context
from hermes_store import migrate
from hermes_store.engine import (
    BEGIN_OPTION,
    create_store_engine,
    db_path,
    require_writable,
    sqlite_errors,
)
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


def _adopts() -> bool:
    """Adoption stamps unversioned legacy stores, but only when revisions will run."""
    try:
        return context.get_revision_argument() is not None
    except KeyError:  # current, check, history...: nothing will run
        return False


def run_on(connection: Connection) -> None:
    """Back up and adopt a store if asked / needed, then run each revision in its own transaction.

    ``-x backup=PATH`` (``-x backup_overwrite=true`` to replace an existing file) writes a
    consistent copy of the store to PATH before adoption or any revision touches it.
    """
    if _adopts():
        try:
            migrate.backup_before_revisions(connection, context.get_x_argument(as_dictionary=True))
            migrate.adopt(connection, ScriptDirectory.from_config(config))
        except StoreError as exc:
            raise CommandError(str(exc)) from None
    context.configure(
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
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run on the caller's connection, or open the store the URL resolution picks."""
    connection = config.attributes.get("connection")
    if isinstance(connection, Engine):  # pytest-alembic passes its `alembic_engine`
        with connection.connect() as conn:
            conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            run_on(conn)
        return
    if connection is not None:
        run_on(connection)
        return
    x_args = context.get_x_argument(as_dictionary=True)
    try:
        url, _state = migrate.prepare(x_args.get("db") or None)
        if _adopts():
            require_writable(db_path(url))
        engine = create_store_engine(url, create=_adopts())
    except StoreError as exc:
        raise CommandError(str(exc)) from None
    try:
        # A full disk, a read-only store or a held lock: one line from `alembic`, no traceback.
        with sqlite_errors(db_path(url)), engine.connect() as conn:
            conn.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
            run_on(conn)
    except StoreError as exc:
        raise CommandError(str(exc)) from None
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

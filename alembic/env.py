"""Run hermes-store revisions: configuration and autogenerate filters, then one library call.

The workflow around the revisions (classify the store once, refuse what cannot go on, back
up, adopt a legacy store, run the steps, finish) is the library's: `migrate.run`.
"""

from __future__ import annotations

import warnings
from logging.config import fileConfig
from typing import Any

from alembic.operations.ops import AlterColumnOp, ModifyTableOps
from sqlalchemy.exc import SAWarning

from alembic import context
from hermes_store import migrate
from hermes_store.backend import backend_of
from hermes_store.declarations import SEARCH_COLUMNS
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
    PostgreSQL's search indexes and stored words (the revisions own them)."""
    if type_ in ("table", "index") and name is not None:
        return not name.startswith(UNOWNED_PREFIXES)
    if type_ == "column":
        return name not in SEARCH_COLUMNS
    return True


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Same filter, for objects; DESC indexes are compared by the schema tests instead."""
    if type_ == "index" and name in EXPRESSION_INDEXES:
        return False
    return include_name(name, type_, None)


def keys_not_null(context_: Any, _revision: Any, directives: list[Any]) -> None:
    """Where every primary-key column is NOT NULL (PostgreSQL), a key's nullability is not
    a difference to migrate: the models declare the legacy SQLite DDL."""
    if backend_of(context_.connection).features.nullable_keys:
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


migrate.run(
    context,
    target_metadata=target_metadata,
    include_name=include_name,
    include_object=include_object,
    compare_type=True,
    process_revision_directives=keys_not_null,
)

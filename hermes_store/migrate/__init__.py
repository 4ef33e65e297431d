"""Upgrade, downgrade, stamp and classify stores: the library's migration API.

The modules: :mod:`~hermes_store.migrate.workflow` (the one upgrade workflow, env.py's call
and the entry points), :mod:`~hermes_store.migrate.plan` (which steps run),
:mod:`~hermes_store.migrate.adoption` (stores never under Alembic) and
:mod:`~hermes_store.migrate.state` (the types they share). What differs between SQLite and
PostgreSQL is in ``hermes_store/sqlite/migration.py`` and ``hermes_store/postgresql/migration.py``,
reached through the backend.
"""

from __future__ import annotations

from hermes_store.migrate.adoption import (
    adopt,
    inspect_file,
    reference_schema,
    restamp_misstamped,
    schema_differences,
)
from hermes_store.migrate.plan import (
    DowngradePlan,
    alembic_config,
    check_revision,
    parse_app_version,
    plan_downgrade,
    upgrade_order,
)
from hermes_store.migrate.state import (
    APP_VERSION_X,
    BACKUP_OVERWRITE_X,
    BACKUP_X,
    DELETE_DATA_X,
    FIRST_LEGACY,
    LAST_LEGACY,
    Prepared,
    Request,
    StoreState,
    Target,
    UpgradeResult,
)
from hermes_store.migrate.workflow import (
    classify,
    current_revision,
    downgrade,
    env_url,
    plan_store_downgrade,
    run,
    stamp,
    upgrade,
)
from hermes_store.revisions import head_revision, script_directory
from hermes_store.sqlite.backup import BackupResult, backup

__all__ = [
    "APP_VERSION_X",
    "BACKUP_OVERWRITE_X",
    "BACKUP_X",
    "DELETE_DATA_X",
    "FIRST_LEGACY",
    "LAST_LEGACY",
    "BackupResult",
    "DowngradePlan",
    "Prepared",
    "Request",
    "StoreState",
    "Target",
    "UpgradeResult",
    "adopt",
    "alembic_config",
    "backup",
    "check_revision",
    "classify",
    "current_revision",
    "downgrade",
    "env_url",
    "head_revision",
    "inspect_file",
    "parse_app_version",
    "plan_downgrade",
    "plan_store_downgrade",
    "reference_schema",
    "restamp_misstamped",
    "run",
    "schema_differences",
    "script_directory",
    "stamp",
    "upgrade",
    "upgrade_order",
]

"""Where this package's Alembic revisions are, and the application versions they cover.

The revisions stand apart from the library (they import none of it) and the library reads
no revision module as data: what `check` expects of the search layout is the typed
snapshot in `hermes_store.declarations` (tests/test_declarations.py holds it equal to what
its revision creates). :data:`LAST_APP_VERSION` is the one place that names the
application's newest schema (see docs/schema-versions.md). Alembic is imported only when
the revisions are read, so that the command's help can name the versions at no cost.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Final

from hermes_store.errors import StoreError

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

#: Where Alembic finds the revisions, as a package resource ("package:folder"): the
#: project's top-level `alembic/` folder, shipped inside the package as
#: `hermes_store/migrations` (a symbolic link to it in the source tree), so that an installed
#: wheel finds them wherever it is run from.
SCRIPT_LOCATION = "hermes_store:migrations"

#: The application's schema versions this package has revisions for (ids "17" and on).
FIRST_APP_VERSION = 17
#: The application's newest schema version: its revision is joined to the search layout's
#: branch by the merge revision that is the single head.
LAST_APP_VERSION = 30
APP_VERSIONS = tuple(range(FIRST_APP_VERSION, LAST_APP_VERSION + 1))


#: The revisions that read the store to decide what to do, and why: their SQL cannot be
#: written out offline (``alembic upgrade --sql``), so such a run is refused before any SQL
#: is written. Each revision says the same in its own ``OFFLINE_REFUSAL``;
#: tests/test_schema_versions.py holds the two equal.
OFFLINE_REFUSALS: Final[Mapping[str, str]] = {
    "18": (
        "it reads the gateway's sessions.json and the store's columns to backfill the "
        "gateway metadata"
    ),
    "22": ("it reads the columns of session_model_usage to decide how to rebuild it"),
    "23": ("it reads the word index's declaration to decide whether to set the flag"),
    "24": ("it adds only the columns each table of the store lacks, which it reads"),
    "25": (
        "it moves each session's system prompt into system_prompts with a hash computed in Python"
    ),
    "30": ("it reads the store's columns, triggers and search layout to decide what to change"),
    "fts1": ("it verifies the legacy index against the messages before converting it in place"),
    "fts2": ("it fills the stored words in batches sized by how long each one takes"),
}
#: The branch of the search layout, apart from the application's numbered chain.
FTS_BRANCH = "fts"
#: The revision of this package that first moved the indexes to external content.
FTS_EXTERNAL_REVISION = "fts1"


def require_script_location() -> Path:
    """The revisions folder, found as a package resource, or a StoreError that says why not."""
    folder = resources.files("hermes_store") / "migrations"
    if not isinstance(folder, Path) or not (folder / "env.py").is_file():
        raise StoreError(
            f"the Alembic revisions of hermes-store were not found in its package ({folder}); "
            "reinstall it (`pip install --force-reinstall hermes-store`)"
        )
    return folder


@functools.cache
def script_directory() -> ScriptDirectory:
    """The revision scripts of this package."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(require_script_location()))


def head_revision() -> str:
    """The newest revision this package knows (the single head of the graph)."""
    head = script_directory().get_current_head()
    assert head is not None
    return head


def is_app_version(revision: str) -> bool:
    """True for the numbered revisions that mirror the application's schema versions."""
    return revision.isdigit() and int(revision) in APP_VERSIONS


def fts_head_revision() -> str:
    """The newest revision of the search-layout branch (merges with the chain excluded).

    `fts@head` would name the merge revision that joins the branch to the application's
    chain, and so pull the relational schema along; this stops before it.
    """
    script = script_directory()
    current = script.get_revision(FTS_EXTERNAL_REVISION)
    assert current is not None
    while True:
        children = [script.get_revision(name) for name in current.nextrev]
        following = [child for child in children if child is not None and not child.is_merge_point]
        if not following:
            return current.revision
        current = following[0]


def app_version_range() -> str:
    """The application versions this package covers, as help texts name them: "17-30"."""
    return f"{FIRST_APP_VERSION}-{LAST_APP_VERSION}"

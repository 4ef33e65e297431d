"""Where this package's Alembic revisions are, and what the head of each branch declares.

The revisions stand apart from the library (they import none of it); the library reads
them, so that the search objects `check` expects are exactly the ones the FTS branch's
newest revision creates, never a second copy that could drift from it.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from types import ModuleType

from alembic.script import ScriptDirectory

from hermes_store.errors import StoreError

#: Where Alembic finds the revisions, as a package resource ("package:folder"): the
#: project's top-level `alembic/` folder, shipped inside the package as
#: `hermes_store/migrations` (a symbolic link to it in the source tree), so that an installed
#: wheel finds them wherever it is run from.
SCRIPT_LOCATION = "hermes_store:migrations"

#: The application's schema versions this package has revisions for (ids "17" .. "30").
FIRST_APP_VERSION = 17
LAST_APP_VERSION = 30
APP_VERSIONS = tuple(range(FIRST_APP_VERSION, LAST_APP_VERSION + 1))
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


@functools.cache
def fts_head() -> ModuleType:
    """The module of the newest revision on the search-layout branch."""
    script = script_directory().get_revision(fts_head_revision())
    assert script is not None
    return script.module


@functools.cache
def fts_conversion() -> ModuleType:
    """The module of the FTS branch's conversion revision (its verification helpers)."""
    script = script_directory().get_revision(FTS_EXTERNAL_REVISION)
    assert script is not None
    return script.module

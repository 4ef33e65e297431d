"""The application's newest schema version is named once, and the chain agrees with it.

docs/schema-versions.md is the recipe for the next version: a revision, its merge with
the search layout's branch, the models, the frozen legacy DDL and
`revisions.LAST_APP_VERSION`. These tests fail when one of them is left out: a numbered
revision the constant does not name, a head that is not the merge of the application's
newest revision with the search layout's head, or a chain whose newest schema is not the
application's (the models are compared with the head by test_migrations'
`test_model_definitions_match_ddl`).
"""

from __future__ import annotations

import re
from pathlib import Path

from legacy.build import LEGACY_VERSIONS, build_legacy_store
from legacy.schema import diff_snapshots, schema_snapshot

from hermes_store import migrate
from hermes_store.revisions import (
    APP_VERSIONS,
    FIRST_APP_VERSION,
    LAST_APP_VERSION,
    fts_head_revision,
    head_revision,
    script_directory,
)

PACKAGE = Path(__file__).resolve().parent.parent / "hermes_store"


def test_every_numbered_revision_is_an_application_version_the_constant_covers() -> None:
    numbered = sorted(
        int(script.revision)
        for script in script_directory().walk_revisions()
        if script.revision.isdigit()
    )
    assert numbered == list(APP_VERSIONS), (
        "the numbered revisions and revisions.LAST_APP_VERSION disagree: add the revision "
        "and move the constant together (docs/schema-versions.md)"
    )


def test_the_one_head_merges_the_newest_application_version_and_the_search_layout() -> None:
    script = script_directory()
    heads = script.get_heads()
    assert len(heads) == 1, f"{len(heads)} heads ({', '.join(heads)}): the merge is missing"
    head = script.get_revision(head_revision())
    assert head is not None
    assert head.is_merge_point, f"the head {head.revision} is not a merge revision"
    # The head joins revision LAST_APP_VERSION, or the merge that does (a new revision
    # of the search branch joins the previous head: merge_30_fts2 joins merge_30_fts1).
    joined, merge = False, head
    while merge is not None and merge.is_merge_point and not joined:
        parents = tuple(merge.down_revision or ())
        joined = str(LAST_APP_VERSION) in parents
        below = [script.get_revision(p) for p in parents]
        merge = next((rev for rev in below if rev is not None and rev.is_merge_point), None)
    assert joined, (
        f"the head {head.revision} does not join revision {LAST_APP_VERSION} "
        "(the application's newest version), nor does a merge it joins"
    )
    ancestors = {rev.revision for rev in script.iterate_revisions(head.revision, "base")}
    assert fts_head_revision() in ancestors
    # Nothing of the application's chain above its newest version: 31 added without its
    # constant would otherwise be a head of its own, or hidden under a merge.
    assert not any(
        revision.isdigit() and int(revision) > LAST_APP_VERSION for revision in ancestors
    )


def test_the_chain_at_the_newest_version_is_the_applications(tmp_path: Path) -> None:
    """The chain's newest schema equals the frozen DDL of the application at that version
    (tests/legacy/ddl.py): both are written for each new version."""
    assert LEGACY_VERSIONS[-1] == LAST_APP_VERSION, (
        f"tests/legacy has no frozen DDL for schema {LAST_APP_VERSION}"
    )
    legacy = tmp_path / "legacy.db"
    build_legacy_store(legacy, LAST_APP_VERSION, drift=True)
    chain = tmp_path / "chain.db"
    migrate.upgrade(str(chain), str(LAST_APP_VERSION))
    diff = diff_snapshots(schema_snapshot(legacy), schema_snapshot(chain), ("app", "chain"))
    assert not diff, "\n" + diff


#: The newest version spelt out: "30", '30', 17-30, 17 to 30, schema 30, revision 30 ...
_VERSION_LITERAL = re.compile(
    rf"""["']{LAST_APP_VERSION}["']|\b{FIRST_APP_VERSION}(?:-| to | \.\. ){LAST_APP_VERSION}\b"""
    rf"|\b(?:schema|version|revision)[ -]{LAST_APP_VERSION}\b",
    re.IGNORECASE,
)


def test_no_library_module_names_the_newest_version_but_the_constant() -> None:
    """Outside the revisions, the constant and the declarations' snapshots (which say from
    which version they hold), the package never spells out the newest version: the
    commands' help and the demo derive it from revisions.LAST_APP_VERSION."""
    allowed = {PACKAGE / "revisions.py", PACKAGE / "declarations.py"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts or path in allowed:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue  # a comment saying which version brought a column: history
            if _VERSION_LITERAL.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_library_knows_which_revisions_cannot_be_written_offline() -> None:
    """The library refuses `--sql` from its own table, never from a revision's attribute:
    the table and the revisions' OFFLINE_REFUSAL must say the same."""
    from hermes_store.revisions import OFFLINE_REFUSALS, script_directory

    declared = {
        script.revision: script.module.OFFLINE_REFUSAL
        for script in script_directory().walk_revisions()
        if getattr(script.module, "OFFLINE_REFUSAL", None)
    }
    assert declared, "no revision declares OFFLINE_REFUSAL: the table checks nothing"
    assert dict(OFFLINE_REFUSALS) == declared

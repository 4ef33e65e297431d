"""Revisions are frozen: they import only the standard library, `alembic` and `sqlalchemy`
(never `hermes_store`, whose models and code change after them), and document themselves."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

VERSIONS = Path(__file__).resolve().parent.parent / "alembic" / "versions"
REVISION_FILES = sorted(VERSIONS.glob("*.py"))
ALLOWED_PACKAGES = frozenset({"__future__", "alembic", "sqlalchemy"})
DYNAMIC_IMPORTERS = frozenset({"__import__", "import_module"})


def _allowed(module: str) -> bool:
    top = module.split(".", 1)[0]
    return top in ALLOWED_PACKAGES or top in sys.stdlib_module_names


def forbidden_imports(source: str) -> list[str]:
    """Every import in `source` outside the standard library, alembic and sqlalchemy."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if not _allowed(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append("." * node.level + (node.module or ""))
            elif not _allowed(node.module or ""):
                found.append(node.module or "")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in DYNAMIC_IMPORTERS and node.args:
                target = node.args[0]
                if not (isinstance(target, ast.Constant) and isinstance(target.value, str)):
                    found.append(f"{name}(<computed>)")
                elif not _allowed(target.value):
                    found.append(target.value)
    return found


def test_there_are_revisions_to_check() -> None:
    assert len(REVISION_FILES) >= 6


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import hermes_store", ["hermes_store"]),
        ("from hermes_store.models import Base", ["hermes_store.models"]),
        ("import hermes_store.sqlite.fts as fts", ["hermes_store.sqlite.fts"]),
        ("from . import helpers", ["."]),
        ("import requests, json", ["requests"]),
        (
            "import importlib\nimportlib.import_module('hermes_store.engine')",
            ["hermes_store.engine"],
        ),
        ("__import__('hermes_store')", ["hermes_store"]),
        ("def f():\n    from hermes_store import errors", ["hermes_store"]),
        (
            "from __future__ import annotations\nimport json, logging, os\n"
            "from collections.abc import Sequence\nimport sqlalchemy as sa\n"
            "from sqlalchemy.exc import OperationalError\nfrom alembic import context, op",
            [],
        ),
    ],
)
def test_the_check_finds_what_it_must(source: str, expected: list[str]) -> None:
    assert forbidden_imports(source) == expected


@pytest.mark.parametrize("path", REVISION_FILES, ids=lambda p: p.name)
def test_revision_imports_only_stdlib_alembic_and_sqlalchemy(path: Path) -> None:
    found = forbidden_imports(path.read_text(encoding="utf-8"))
    assert not found, f"{path.name} imports {found}: revisions must not depend on hermes_store"


def _first_word_is_imperative(line: str) -> bool:
    word = line.split()[0]
    if not (word.isalpha() and word[0].isupper()):
        return False
    return not word.endswith(("ed", "ing")) and (not word.endswith("s") or word.endswith("ss"))


@pytest.mark.parametrize("path", REVISION_FILES, ids=lambda p: p.name)
def test_revision_documents_itself_and_can_be_downgraded(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstring = ast.get_docstring(tree)
    assert docstring, f"{path.name} has no docstring"
    first_line = docstring.splitlines()[0].strip()
    assert first_line, f"{path.name}: the docstring's first line is empty"
    assert _first_word_is_imperative(first_line), (
        f"{path.name}: {first_line!r} should start with a verb in the imperative"
    )
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"upgrade", "downgrade"} <= functions, f"{path.name} lacks upgrade() or downgrade()"
    assigned = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    revision = assigned.get("revision")
    assert isinstance(revision, ast.Constant), f"{path.name} declares no revision id"
    assert path.name.startswith(f"{revision.value}_"), "the file name starts with its revision id"
    assert f"Revision ID: {revision.value}" in docstring


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        ("Create the legacy schema 17", True),
        ("Add gateway metadata", True),
        ("Adds gateway metadata", False),
        ("Added gateway metadata", False),
        ("adding gateway metadata", False),
        ("Process the index", True),
        ("17: baseline", False),
    ],
)
def test_the_imperative_check_itself(line: str, ok: bool) -> None:
    assert _first_word_is_imperative(line) is ok

"""The README's Python examples run as written.

Every ```python block of README.md is written to a file and run by this Python, in a
process of its own, in a fresh directory that is also its home and its HERMES_HOME: an
example can lean on nothing but the library (no other example's store, nothing of the
machine), so each must be self-contained. It passes when the process exits 0; the
examples assert what they show. A failing example fails the test with its README line and
the end of what it wrote on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = "```python"
#: Generous: an example builds its store from nothing (about a second here).
TIMEOUT_S = 120


@dataclass(frozen=True)
class PythonBlock:
    line: int  # of the README, where the code starts
    code: str


def python_blocks(text: str) -> list[PythonBlock]:
    """The fenced ```python blocks of a Markdown text, in order."""
    lines = text.splitlines()
    blocks: list[PythonBlock] = []
    number = 0
    while number < len(lines):
        if lines[number].strip() == FENCE:
            end = lines.index("```", number + 1)
            blocks.append(PythonBlock(number + 2, "\n".join(lines[number + 1 : end]) + "\n"))
            number = end
        number += 1
    return blocks


def run_example(code: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a script in ``directory``, with no store named by the environment."""
    script = directory / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("HERMES_") or key.startswith("HERMES_TEST")
    }
    env.update(HOME=str(directory), HERMES_HOME=str(directory / ".hermes"))
    return subprocess.run(
        [sys.executable, script.name],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_shows_the_store_api_and_an_orm_query() -> None:
    codes = [block.code for block in BLOCKS]
    assert any("Store.open(" in code and "NewMessage(" in code for code in codes), codes
    assert any(
        "hermes_store.models import" in code and "select(" in code and "order_by(" in code
        for code in codes
    ), codes


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: f"README line {block.line}")
def test_a_readme_python_example_runs_as_written(block: PythonBlock, tmp_path: Path) -> None:
    result = run_example(block.code, tmp_path)
    assert result.returncode == 0, (
        f"README line {block.line}: the example exited {result.returncode}",
        result.stderr[-3000:],
    )


def test_a_broken_example_fails(tmp_path: Path) -> None:
    """The runner itself: an example that raises, or whose assertion fails, is caught."""
    assert python_blocks("text\n```python\nprint(1)\n```\nmore\n") == [PythonBlock(3, "print(1)\n")]
    assert run_example("from hermes_store.store import Store\n", tmp_path).returncode == 0
    assert run_example("from hermes_store.store import NoSuchName\n", tmp_path).returncode != 0
    assert run_example("assert 1 + 1 == 3\n", tmp_path).returncode != 0

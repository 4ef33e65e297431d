"""The README's shell examples print what the README says they print; so do those of docs/.

Every fenced block of README.md that shows `$ hermes-store ...` with its output is run, in
the README's order, in a directory holding the stores the examples name (`state.db`, a
legacy schema-21 store of the demo's corpus, and `agent21.db`), and what each command
prints is compared with the README's lines. Numbers, sizes and ids are data (`#`), an
indented line (a snippet) is text of the corpus, and a `...` line in the README stands for
any lines; everything else must be the same, line for line. A block that needs what a
test cannot give (a small file system) is preceded by `<!-- illustrative: WHY -->`.

The same holds for each page of docs/ (docs/operations.md shows the commands' output too):
its examples run in its own order, in a directory of their own holding the same stores.

The demo example runs with fewer messages than the README's (its numbers are data); the
stores of the other examples hold the demo's own sessions, so their sessions per source
are the README's.
"""

from __future__ import annotations

import re
import shlex
import sqlite3
from contextlib import chdir, closing
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store

from hermes_store.cli import main
from hermes_store.demo import corpus

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The pages of docs/ whose examples are held to what they print, as the README's are.
DOCS = sorted((ROOT / "docs").glob("*.md"))
PROMPT = "$ hermes-store "
ILLUSTRATIVE = re.compile(r"<!-- illustrative: (.+?) -->")
#: The demo in the README writes to /tmp/rd; here it writes inside the test's directory.
DEMO_DIR = "/tmp/rd"
DEMO_MESSAGES = "300"


@dataclass(frozen=True)
class Example:
    line: int  # of the README, for the failure message
    command: str
    output: list[str]
    document: str = "README"


@dataclass(frozen=True)
class Block:
    line: int
    examples: list[Example]
    illustrative: str | None


def shell_blocks(text: str) -> list[Block]:
    """The fenced blocks without a language whose first line is a `$ hermes-store` prompt."""
    lines = text.splitlines()
    blocks: list[Block] = []
    number = 0
    while number < len(lines):
        if not lines[number].startswith("```"):
            number += 1
            continue
        end = lines.index("```", number + 1)
        body = lines[number + 1 : end]
        if lines[number] == "```" and body and body[0].startswith(PROMPT):
            before = next((line for line in reversed(lines[:number]) if line.strip()), "")
            marked = ILLUSTRATIVE.fullmatch(before.strip())
            blocks.append(
                Block(number + 1, _examples(body, number + 2), marked.group(1) if marked else None)
            )
        number = end + 1
    return blocks


def _examples(body: list[str], first_line: int) -> list[Example]:
    examples: list[Example] = []
    for offset, line in enumerate(body):
        if line.startswith(PROMPT):
            examples.append(Example(first_line + offset, line.removeprefix(PROMPT), []))
        elif line.strip():
            examples[-1].output.append(line)
    return examples


def normalised(line: str) -> str:
    """A line with its data replaced: numbers, ids and sizes are `#` and `UNIT`, an
    indented line (a snippet under a search hit) is any text."""
    if line[:1].isspace():
        return "<indented text>"
    line = re.sub(r"\d+(?:[.,:]\d+)*", "0", line)  # 12.5, 5,000, 11:17: one number each
    line = re.sub(r"\w*\d\w*", "#", line)
    line = re.sub(r"\b(?:B|KiB|MiB|GiB|TiB)\b", "UNIT", line)
    return " ".join(line.split())


def assert_prints(example: Example, printed: list[str]) -> None:
    """The README's lines, each segment between `...` lines found whole and in order."""
    got = [normalised(line) for line in printed if line.strip()]
    segments: list[list[str]] = [[]]
    for line in example.output:
        if line.strip() == "...":
            segments.append([])
        else:
            segments[-1].append(normalised(line))
    anchored_start = bool(segments[0])
    anchored_end = bool(segments[-1])
    context = f"{example.document} line {example.line}: `{example.command}`"
    where = 0
    for number, segment in enumerate(segments):
        if not segment:
            continue
        found = next(
            (
                start
                for start in range(where, len(got) - len(segment) + 1)
                if got[start : start + len(segment)] == segment
            ),
            None,
        )
        assert found is not None, (context, segment, got)
        if number == 0 and anchored_start:
            assert found == 0, (context, "printed before what the README shows", got[:found])
        where = found + len(segment)
    if anchored_end:
        assert where == len(got), (context, "printed after what the README shows", got[where:])


@pytest.fixture
def example_directory(tmp_path: Path) -> Path:
    """The stores the examples name: legacy schema-21 stores of the demo's corpus (its
    sessions, so its sources, and one message in eight: the counts are data)."""
    demo = corpus.generate(5000, 0)
    data = corpus.Corpus(demo.sessions, demo.messages[::8])
    for name, filled in (("state.db", True), ("agent21.db", False)):
        path = tmp_path / name
        build_legacy_store(path, 21)
        if filled:
            with closing(sqlite3.connect(path)) as conn:
                corpus.populate(conn, data)
                conn.commit()
    return tmp_path


def run(command: str, directory: Path) -> list[str]:
    args = shlex.split(command)
    if args[0] == "demo":
        args = [arg.replace(DEMO_DIR, str(directory / "rd")) for arg in args]
        args += ["--messages", DEMO_MESSAGES]
    result = CliRunner().invoke(main, args)
    assert result.exception is None, (command, result.output, result.exception)
    assert result.exit_code == 0, (command, result.output)
    assert result.stderr == "", (command, result.stderr)
    return (
        result.stdout.replace(DEMO_DIR, "<demo dir>")
        .replace(str(directory / "rd"), "<demo dir>")
        .splitlines()
    )


def runnable(document: Path) -> list[Block]:
    """The blocks of ``document`` a test runs: every one not marked illustrative."""
    blocks = shell_blocks(document.read_text(encoding="utf-8"))
    return [block for block in blocks if block.illustrative is None]


def run_document(document: Path, directory: Path) -> None:
    """Run every runnable example of ``document``, in its order, in ``directory``, and
    compare what each prints with what the document shows."""
    name = document.relative_to(ROOT).as_posix()
    with chdir(directory):
        for block in runnable(document):
            for example in block.examples:
                assert example.output, f"{name} line {example.line}: an example shows output"
                printed = run(example.command, directory)
                expected = Example(
                    example.line,
                    example.command,
                    [line.replace(DEMO_DIR, "<demo dir>") for line in example.output],
                    name,
                )
                assert_prints(expected, printed)


def test_the_readme_shell_examples_print_what_the_readme_shows(example_directory: Path) -> None:
    blocks = shell_blocks(README.read_text(encoding="utf-8"))
    run_blocks = [block for block in blocks if block.illustrative is None]
    assert len(run_blocks) >= 6, [block.line for block in blocks]
    run_document(README, example_directory)


@pytest.mark.parametrize(
    "document",
    [page for page in DOCS if runnable(page)],
    ids=lambda page: page.name,
)
def test_the_docs_shell_examples_print_what_they_show(
    document: Path, example_directory: Path
) -> None:
    run_document(document, example_directory)


def test_every_example_is_run_or_says_why_not() -> None:
    blocks = shell_blocks(README.read_text(encoding="utf-8"))
    assert blocks
    for page in (README, *DOCS):
        for block in shell_blocks(page.read_text(encoding="utf-8")):
            assert block.examples, (page.name, block.line)
            if block.illustrative is not None:
                assert len(block.illustrative) > 10, (page.name, block.line, "say why not run")


def test_a_changed_line_is_caught() -> None:
    """The comparison itself: what differs in words fails, what differs in data does not."""
    example = Example(1, "current", ["field  value", "revision  merge_30_fts1", "head  x"])
    assert_prints(example, ["field   value", "revision merge_31_fts2", "head x"])
    with pytest.raises(AssertionError):
        assert_prints(example, ["field value", "revision merge_30_fts1", "tail x"])
    with pytest.raises(AssertionError):  # a line the README does not show
        assert_prints(example, ["field value", "revision a1", "head x", "Warning: more"])
    elided = Example(1, "demo", ["== start", "...", "== end 5 MiB"])
    assert_prints(elided, ["== start", "anything", "== end 12.5 KiB"])
    with pytest.raises(AssertionError):
        assert_prints(elided, ["== start", "== end"])

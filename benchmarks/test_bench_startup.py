"""How fast the command starts: `hermes-store --version` and `--help` against
`python -c "import click"` in the same environment (the floor any click program pays).

Targets: `--version` within 3x and `--help` within 4x of the floor, each the median of
interleaved runs. Run ``pytest benchmarks/test_bench_startup.py --benchmark-only``; the
ratios are in each result's ``extra_info`` and printed. With ``--benchmark-disable`` (the
CI smoke run) each command runs once, to prove it works.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: (what, command line, target ratio against the floor).
COMMANDS = (
    ("--version", ["--version"], 3.0),
    ("--help", ["--help"], 4.0),
)
ROUNDS = 15


def _entry_point() -> list[str]:
    """The installed `hermes-store` script of this environment, as a user runs it."""
    script = Path(sys.executable).with_name("hermes-store")
    if script.exists():
        return [str(script)]
    found = shutil.which("hermes-store")
    return [found] if found else [sys.executable, "-m", "hermes_store.cli"]


def _seconds(argv: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


@pytest.mark.parametrize(("what", "args", "target"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_startup(benchmark, what: str, args: list[str], target: float) -> None:
    floor = [sys.executable, "-c", "import click"]
    command = [*_entry_point(), *args]
    rounds = 1 if benchmark.disabled else ROUNDS
    floors: list[float] = []
    runs: list[float] = []

    def one_round() -> None:  # interleaved: the machine's load hits both alike
        floors.append(_seconds(floor))
        runs.append(_seconds(command))

    benchmark.pedantic(one_round, rounds=rounds, iterations=1)
    assert len(runs) == rounds
    ratio = statistics.median(runs) / statistics.median(floors)
    benchmark.extra_info.update(
        floor_ms=round(statistics.median(floors) * 1000, 1),
        command_ms=round(statistics.median(runs) * 1000, 1),
        ratio=round(ratio, 2),
        target=target,
        met=ratio <= target,
    )
    print(f"\nhermes-store {what}: {ratio:.2f}x `import click` (target {target}x)")

"""The data layer against raw sqlite3 (``benchmarks/raw.py``), operation by operation.

Each operation is one benchmark group with two rows, ``data layer`` and ``raw sqlite3``:
pytest-benchmark's table states each row's times as a multiple of the group's fastest.
Each side works on its own copy of the ``external`` store and both run the same rounds
of the plan, so they hold the same rows. ``python -m benchmarks.report`` measures the same
operations with the two sides interleaved round by round and checks the targets.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks import floor, layouts


@pytest.fixture(scope="module")
def floor_stores(store_set, tmp_path_factory) -> Iterator[floor.Floor]:
    with floor.Floor(tmp_path_factory.mktemp("floor"), store_set.base(layouts.EXTERNAL)) as f:
        yield f


@pytest.mark.parametrize("side", floor.SIDES)
@pytest.mark.parametrize("operation", floor.OPERATIONS, ids=lambda op: op.name)
def test_floor(benchmark, floor_stores, operation, side):
    rounds = iter(range(floor.ROUNDS + 1))
    benchmark.group = operation.name
    benchmark.extra_info.update(side=side, target=operation.target)

    def setup():
        return (floor_stores.sample(operation, side, next(rounds)),), {}

    result = benchmark.pedantic(lambda sample: sample(), setup=setup, rounds=floor.ROUNDS)
    assert result is not None


def test_both_sides_answer_alike(store_set, tmp_path):
    """Every operation, once on each side of fresh copies: the same answers (the same work).

    Appends return the same ids, deletes and rewinds the same counts, fetches, lists and
    opens the same rows, searches the same hits with the same snippets and context.
    """
    with floor.Floor(tmp_path, store_set.base(layouts.EXTERNAL), rounds=1) as both:
        for operation in floor.OPERATIONS:
            both.run_both(operation, 1)  # raises floor.Mismatch
        searched = both.run_both(floor.OPERATIONS[-1], 1)[floor.DATA_LAYER][2]
    assert any(searched), "the searches found nothing: the comparison would be vacuous"

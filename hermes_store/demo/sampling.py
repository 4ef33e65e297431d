"""Draws from fixed tables, each consuming a fixed number of `random()` calls.

Plain arithmetic only, so that the same seed gives bit-identical values on every platform,
with no libm in the loop.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from typing import Generic, TypeVar

__all__ = ["Weighted", "below", "one", "quantile", "some"]

_T = TypeVar("_T")


class Weighted(Generic[_T]):
    """A fixed weighted choice that consumes exactly one `random()` per pick."""

    def __init__(self, pairs: Sequence[tuple[_T, float]]) -> None:
        self.items = [item for item, _ in pairs]
        self.cum: list[float] = []
        total = 0.0
        for _, weight in pairs:
            total += weight
            self.cum.append(total)
        self.total = total

    def pick(self, rng: random.Random) -> _T:
        """Return one item."""
        x = rng.random() * self.total
        return self.items[bisect.bisect_right(self.cum, x, 0, len(self.cum) - 1)]


def below(rng: random.Random, n: int) -> int:
    """Return an index below n using exactly one `random()` whatever n is."""
    return int(rng.random() * n)


def one(rng: random.Random, items: Sequence[str]) -> str:
    """Return one item of a sequence."""
    return items[int(rng.random() * len(items))]


def some(rng: random.Random, items: Sequence[str], k: int) -> list[str]:
    """Return k distinct items (all of them when there are fewer), one `random()` each."""
    left = list(items)
    return [left.pop(int(rng.random() * len(left))) for _ in range(min(k, len(left)))]


def quantile(rng: random.Random, knots: Sequence[float]) -> float:
    """Sample a piecewise-linear inverse CDF given by evenly spaced quantiles."""
    x = rng.random() * (len(knots) - 1)
    i = int(x)
    return knots[i] + (knots[i + 1] - knots[i]) * (x - i)

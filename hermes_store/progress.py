"""What long work says as it goes: the phase it is in and how far it got, for a person.

The library reports; the CLI draws (a rich spinner or bar on a terminal, nothing when
piped). The last phase reported is also what an interrupt's message starts from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    """One step of long work, as a person watching it would name it."""

    #: What kind of step: "classify", "backup", "adopt", "verify", "revision", "heal",
    #: "free", "merge", "checkpoint", "vacuum", "fill", "swap".
    kind: str
    #: What is being done ("revision 25: store each distinct system prompt once").
    label: str
    #: How far it got, of ``total``, in ``unit``; None when it cannot be counted (one
    #: statement, such as FTS5's 'rebuild' or VACUUM, says nothing until it ends).
    done: int | None = None
    total: int | None = None
    unit: str = ""
    #: What it is about, when it is one thing: a revision id, an index or table name.
    item: str | None = None


Report = Callable[[Phase], None]


class Tracker:
    """Passes each phase on to ``report`` (if any) and remembers the last one."""

    def __init__(self, report: Report | None = None) -> None:
        self.report = report
        self.last: Phase | None = None

    def __call__(self, phase: Phase) -> None:
        self.last = phase
        if self.report is not None:
            self.report(phase)

    @property
    def kind(self) -> str | None:
        """The kind of the last phase reported (None before the first)."""
        return None if self.last is None else self.last.kind


def quiet(_phase: Phase) -> None:
    """A report that shows nothing."""

"""The error budget: how many records one pass may lose to quarantined tasks, and the stop
that exceeding it records (core/quarantine.py applies both to the state)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_BUDGET = re.compile(r"(\d+)|(\d+(?:\.\d*)?|\.\d+)%")


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """How many records one pass may lose to quarantined tasks: `records`, or `percent` of
    the dataset's records (rounded down); neither means no limit."""

    records: int | None = None
    percent: Fraction | None = None

    def __post_init__(self) -> None:
        if self.records is not None and self.percent is not None:
            raise ValueError("an error budget is a record count or a percentage, not both")
        if self.records is not None and self.records < 0:
            raise ValueError(f"an error budget of {self.records} records is negative")
        if self.percent is not None and not 0 <= self.percent <= 100:
            raise ValueError(f"an error budget of {self.percent}% is not from 0% to 100%")

    @classmethod
    def parse(cls, text: str) -> ErrorBudget:
        """`unlimited`, a whole number of records (`10`) or a percentage (`0.1%`)."""
        s = text.strip()
        if s.lower() in ("unlimited", "none", ""):
            return cls()
        m = _BUDGET.fullmatch(s)
        if m is None:
            raise ValueError(
                f"{text!r} is not a record count (10), a percentage of the dataset (0.1%) "
                "or 'unlimited'"
            )
        if m.group(1) is not None:
            return cls(records=int(m.group(1)))
        return cls(percent=Fraction(m.group(2)))

    @property
    def unlimited(self) -> bool:
        return self.records is None and self.percent is None

    def __str__(self) -> str:
        if self.records is not None:
            return str(self.records)
        if self.percent is not None:
            p = self.percent
            return f"{p.numerator}%" if p.denominator == 1 else f"{float(p):g}%"
        return "unlimited"

    def limit(self, dataset_records: int | None) -> int | None:
        """The records a pass may lose; None: no limit (or a percentage of an unknown size)."""
        if self.records is not None:
            return self.records
        if self.percent is None or dataset_records is None:
            return None
        return int(self.percent * dataset_records / 100)


@dataclass(frozen=True, slots=True)
class JobStop:
    """The job stopped: pass `pass_id` lost `records` records to the quarantined `tasks`,
    over the `limit` of the error budget. `message` is what trainers get."""

    pass_id: int
    records: int
    limit: int
    tasks: tuple[int, ...]
    message: str

"""A clock the test moves: handed to the service (or a lease keeper) as its time source."""

from __future__ import annotations


class Clock:
    """Seconds that pass only when the test sets `now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

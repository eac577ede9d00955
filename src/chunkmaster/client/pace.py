"""How many tasks a trainer holds: enough to cover a round trip to the master at the pace it
reads them, and no more.

The fetcher asks for tasks once half of its slots are free, so the half still in hand must last
until the answer comes: slots >= 2 x round trip / (the trainer's time over a task). `Pace`
learns both. The trainer's time over a task: from one task done with to the next, less what it
waited for the master meanwhile (so a trainer starved by too few slots still shows how fast it
would go), averaged over windows of at least WINDOW seconds of such time (tasks are done with in
bursts: a shuffle buffer hands out the last records of many at once). The round trip: a moving
average of the requests the master answered with all the tasks asked (a long poll that waited
for a task says nothing about the network).

The slots it asks for are that need with a margin, never fewer than the minimum (2: one task
ahead of the one being read), never more than MAX_HELD, and at most twice the slots of the
request before (one mismeasure costs little). A client given `prefetch_tasks` holds exactly
1 + prefetch_tasks (minimum and cap). Beyond the minimum a trainer thus holds at most
2 x MARGIN round trips of its own work (round trips counted up to MAX_ROUND_TRIP: 0.75 s at
most): each held task's timeout runs on the master, and a slow trainer holding many tasks at
the end of a pass would hold the pass up. So a trainer of tasks that take a second each holds
the minimum, and one of thousands of tiny tasks a second holds enough of them to never wait
for the network.

Pure logic on times it is given; the buffer (the trainer's thread) and the fetcher feed it.
"""

from __future__ import annotations

import math

MAX_HELD = 128
"""Tasks a trainer holds at most when it sizes its requests itself: it asks for half of them
at a time, the master's largest batch (64 tasks a message)."""

MARGIN = 1.5
"""Slack over the computed need: round trips and tasks vary."""

WEIGHT = 0.2
"""Of a new round trip in their moving average (about the last ten count)."""

WINDOW = 0.1
"""Seconds of the trainer's time over tasks that one measure of its pace spans at least."""

MAX_ROUND_TRIP = 0.25
"""A longer answer is taken as this long: the master waited (no task was free), or stalled."""


class Pace:
    """The trainer's pace over tasks and the master's round trip; `slots()` sizes requests."""

    def __init__(self, minimum: int, cap: int = MAX_HELD) -> None:
        if minimum < 1:
            raise ValueError(f"a trainer holds at least one task, not {minimum}")
        self.minimum = minimum
        self.cap = max(cap, minimum)
        self.task_seconds: float | None = None  # the trainer's time over a task
        self.round_trip: float | None = None  # a request's time until its answer
        self._busy = 0.0  # the trainer's time over the tasks of the window being measured
        self._tasks = 0  # ... and how many
        self._granted = minimum  # the slots of the request before

    def task_took(self, seconds: float) -> None:
        """The trainer took `seconds` over a task (its waits for the master left out)."""
        self._busy += max(seconds, 0.0)
        self._tasks += 1
        if self._busy >= WINDOW:
            self.task_seconds = self._busy / self._tasks
            self._busy, self._tasks = 0.0, 0

    def answered(self, seconds: float, asked: int, got: int) -> None:
        """A request for `asked` tasks was answered with `got` after `seconds`."""
        if got >= asked:
            self.round_trip = _average(self.round_trip, min(max(seconds, 0.0), MAX_ROUND_TRIP))

    def slots(self) -> int:
        """Tasks to hold (the one being read included) until the next request."""
        task, trip = self.task_seconds, self.round_trip
        need = self.minimum
        if task is not None and trip is not None:
            need = math.ceil(2 * MARGIN * trip / max(task, 1e-6))
        slots = max(self.minimum, min(need, self.cap, 2 * self._granted))
        self._granted = slots
        return slots


def _average(old: float | None, sample: float) -> float:
    return sample if old is None else old + WEIGHT * (sample - old)

"""Records of several tasks read together, mixed at random.

A reader holding a few tasks of a shuffled job (core/record_order.py) draws its next few
records from one of them, chosen with odds proportional to the records each has left: a
uniform random merge of the tasks. Each task's records still come in its own order, so what is
consumed of a task is always a prefix of that order and its position stays one integer: the
mix changes which batch a record lands in, never which records a commit covers.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from chunkmaster.client.errors import TaskReadError
from chunkmaster.core.model import Task

Runs = Iterator[tuple[int, Iterator[Any], int]]
"""A task's runs of records, (first position, records, count), as TaskReader.runs gives them."""


@dataclass(slots=True)
class Lane:
    """One task being read: its runs, the run in hand and the records it has left."""

    key: Any
    runs: Runs
    at: int  # the position of its next record
    left: int  # records it has left (the odds of drawing it)
    run: Iterator[Any]
    run_left: int = 0


@dataclass(frozen=True, slots=True)
class Drawn:
    """Records first.. of the task `key`, in its order."""

    key: Any
    first: int
    records: list[Any]


@dataclass(frozen=True, slots=True)
class Failed:
    """The task `key` could not be read on from `at`; it is dropped from the mix."""

    key: Any
    at: int
    error: TaskReadError


class Interleave:
    """The tasks a reader holds, drawn from `run` records at a time (see the module's text)."""

    def __init__(self, rng: random.Random, run: int = 4) -> None:
        self._rng = rng
        self._run = run
        self._lanes: list[Lane] = []
        self.left = 0  # records left in all lanes

    def __len__(self) -> int:
        return len(self._lanes)

    def add(self, key: Any, task: Task, runs: Runs) -> None:
        left = max(0, task.num_records - task.start)
        self._lanes.append(Lane(key, runs, task.start, left, iter(())))
        self.left += left

    def draw(self) -> Drawn | Failed | None:
        """The next records of a lane drawn at random; None once every lane is read out. A
        lane whose task ends is dropped (the next draw picks among the others)."""
        while self._lanes:
            lane = self._pick()
            if not lane.run_left:
                try:
                    first, lane.run, lane.run_left = next(lane.runs)
                except StopIteration:
                    self._drop(lane)
                    continue
                except TaskReadError as exc:
                    self._drop(lane)
                    return Failed(lane.key, lane.at, exc)
                lane.at = first
            got = list(islice(lane.run, min(self._run, lane.run_left)))
            first = lane.at
            lane.at += len(got)
            lane.run_left = 0 if not got else lane.run_left - len(got)
            taken = min(len(got), lane.left)
            lane.left -= taken
            self.left -= taken
            if got:
                return Drawn(lane.key, first, got)
        return None

    def _pick(self) -> Lane:
        lanes = self._lanes
        if self.left <= 0 or len(lanes) == 1:
            return lanes[0]
        x = self._rng.random() * self.left
        for lane in lanes:
            x -= lane.left
            if x < 0:
                return lane
        return lanes[-1]

    def _drop(self, lane: Lane) -> None:
        self._lanes.remove(lane)
        self.left -= lane.left

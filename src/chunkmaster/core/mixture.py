"""Mixtures: which source each unit of a pass comes from, so that records follow the weights.

A mixture job reads several named sources, each a set of tasks of its own. Each source goes
through its own epochs: all its tasks once, in an order drawn per (seed, source, epoch), then
again. A job pass is a fixed number of units; each unit is the next task of one source, chosen
by weighted fair queueing *by records*: a source's virtual time is the records planned from it
divided by its weight, and the source whose next task would finish earliest in virtual time
comes next (ties to the first source). Over any stretch of the plan each source's share of the
records is within about one of its tasks of its weight, whatever the task sizes.

Weights change by a schedule: breakpoints by records planned, held (step) or interpolated
(linear) between them. At a change every source keeps how far ahead of its share it was, in
records, so a change neither rebounds on history nor favours a source.

Everything here is pure: the plan depends only on the sources' task sizes, the seed, the
weights and the cursors (per source: epoch, tasks planned in it, records planned), which the
master journals and checkpoints. Planning costs O(log sources) per unit.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from chunkmaster.core.shuffle import Permutation

LINEAR_STEP = 1000  # records between two evaluations of a linear schedule


class MixtureError(ValueError):
    """A mixture that cannot be planned (the text says why)."""


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """From `at` records planned (counted over the whole job), these weights (one per source,
    any non-negative numbers; they are normalised)."""

    at: int
    weights: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Weights:
    """A weight schedule: `points` by records planned, in order, the first at 0; between two
    points the weights are held ("step") or interpolated ("linear")."""

    points: tuple[Breakpoint, ...]
    mode: str = "step"

    @staticmethod
    def fixed(weights: Sequence[float]) -> Weights:
        return Weights((Breakpoint(0, tuple(float(w) for w in weights)),))

    def check(self, sources: int) -> Weights:
        """Raises MixtureError naming what is wrong; returns self."""
        if self.mode not in ("step", "linear"):
            raise MixtureError(f"weight schedule mode {self.mode!r} is neither step nor linear")
        if not self.points or self.points[0].at != 0:
            raise MixtureError("a weight schedule starts at record 0")
        last = -1
        for p in self.points:
            if p.at <= last:
                raise MixtureError(f"weight breakpoints must grow: {p.at} after {last}")
            last = p.at
            if len(p.weights) != sources:
                raise MixtureError(
                    f"{len(p.weights)} weight(s) at record {p.at} for {sources} source(s)"
                )
            if any(not math.isfinite(w) or w < 0 for w in p.weights):
                raise MixtureError(f"weights at record {p.at} must be finite and >= 0")
            if not sum(p.weights) > 0:
                raise MixtureError(f"weights at record {p.at} are all zero")
        return self

    def at(self, records: int) -> tuple[float, ...]:
        """The normalised weights in force once `records` are planned."""
        points = self.points
        i = len(points) - 1
        while points[i].at > records:
            i -= 1
        w = points[i].weights
        if self.mode == "linear" and i + 1 < len(points):
            a, b = points[i], points[i + 1]
            f = (records - a.at) / (b.at - a.at)
            w = tuple(x + (y - x) * f for x, y in zip(a.weights, b.weights, strict=True))
        total = sum(w)
        return tuple(x / total for x in w)

    def next_change(self, records: int) -> int | None:
        """The records count at which the weights next change (None: never)."""
        for p in self.points:
            if p.at > records:
                if self.mode == "linear":
                    return min(p.at, records + LINEAR_STEP)
                return p.at
        return None


@dataclass(slots=True)
class Cursor:
    """Where one source is: its epoch, how many of its tasks that epoch has planned, how many
    records were planned from it in all, and its lead over its share (records)."""

    epoch: int = 0
    next: int = 0
    planned: int = 0
    ahead: float = 0.0


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of a pass: task `task` of `source`, in that source's epoch `epoch`."""

    source: int
    task: int
    epoch: int


@dataclass
class Planner:
    """Plans units from sources whose tasks hold `task_records[s][t]` records, in an order per
    source epoch drawn from `seed` (none: task order) and the source's `names[s]`."""

    task_records: Sequence[Sequence[int]]
    names: Sequence[str]
    seed: int | None = None
    _orders: dict[int, tuple[int, array[int]]] = field(default_factory=dict)  # s -> its epoch

    def __post_init__(self) -> None:
        if len(self.task_records) != len(self.names) or not self.names:
            raise MixtureError("a mixture needs one name per source, and a source")
        for name, tasks in zip(self.names, self.task_records, strict=True):
            if not tasks:
                raise MixtureError(f"source {name!r} has no task")

    def task_of(self, source: int, epoch: int, index: int) -> int:
        """The `index`-th task of `source` in its epoch `epoch` (a source's order is drawn
        once per epoch: O(1) a task after that)."""
        if self.seed is None:
            return index
        held = self._orders.get(source)
        if held is None or held[0] != epoch:
            domain = b"source:" + self.names[source].encode()
            order = Permutation(len(self.task_records[source]), self.seed, epoch, domain)
            held = self._orders[source] = (epoch, array("q", order.images(0, order.n)))
        return held[1][index]

    def plan(self, cursors: list[Cursor], weights: Weights, count: int) -> list[Unit]:
        """The next `count` units; `cursors` are moved past them."""
        n = len(self.names)
        if len(cursors) != n:
            raise MixtureError(f"{len(cursors)} cursor(s) for {n} source(s)")
        out: list[Unit] = []
        total = sum(c.planned for c in cursors)
        while len(out) < count:
            w = weights.at(total)
            change = weights.next_change(total)
            # Within a stretch of constant weights a source's virtual time is its records
            # planned (counted from its lead at the stretch's start) per unit of weight; the
            # source whose next task ends earliest in virtual time goes first.
            virtual = [c.ahead + x * total for c, x in zip(cursors, w, strict=True)]
            nxt = [self.task_of(s, c.epoch, c.next) for s, c in enumerate(cursors)]
            heap = [
                ((virtual[s] + self.task_records[s][nxt[s]]) / x, s)
                for s, x in enumerate(w)
                if x > 0
            ]
            heapq.heapify(heap)
            while len(out) < count and (change is None or total < change):
                _, s = heapq.heappop(heap)
                c = cursors[s]
                task = nxt[s]
                records = self.task_records[s]
                r = int(records[task])
                out.append(Unit(s, task, c.epoch))
                c.next += 1
                if c.next == len(records):
                    c.epoch += 1
                    c.next = 0
                c.planned += r
                total += r
                virtual[s] += r
                nxt[s] = self.task_of(s, c.epoch, c.next)
                heapq.heappush(heap, ((virtual[s] + records[nxt[s]]) / w[s], s))
            for c, v, x in zip(cursors, virtual, w, strict=True):
                c.ahead = v - x * total  # each source keeps its lead, in records
        return out

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
import unicodedata
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.ids import TaskId
from chunkmaster.core.shuffle import Permutation

LINEAR_STEP = 1000  # records between two evaluations of a linear schedule
#: A weight is 0 or within these: 10,000 sources of the largest add up to a finite sum (and so
#: does any point between two of a linear schedule), and none is subnormal.
MIN_WEIGHT = 1e-300
MAX_WEIGHT = 1e300
#: The least share of its point's sum a weight above 0 may be: below it a source would be
#: planned (almost) never while its weight says otherwise.
MIN_SHARE = 1e-12
MAX_NAME = 255
"""Characters (code points, as the journal's and a checkpoint's JSON holds them) of a
source's name."""
#: Unicode categories a source's name may not hold: controls, format characters (zero-width,
#: bidirectional overrides), line and paragraph separators, surrogates: a name is shown in
#: logs, status, metrics' labels and terminals, one line as sent.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
#: Weights one schedule may hold (points x sources: a call's, or the schedule in force that
#: added sources widen), and all the schedules a job keeps (the one in force, and each pass
#: plan's: its start's and its re-plans'). Every weight is kept, journaled, snapshot and
#: replayed; these hold what one call costs the master (docs/limits.md, "Mixtures").
MAX_SCHEDULE_POINTS = 1_000
MAX_SCHEDULE_CELLS = 25_000
MAX_HELD_POINTS = 4_000
MAX_HELD_CELLS = 100_000


class MixtureError(ValueError):
    """A mixture that cannot be planned (the text says why)."""


def name_problem(name: str) -> str | None:
    """What makes `name` no source's name (None: nothing): its length in characters, or the
    first character of a refused category and its position (1-based)."""
    if not 1 <= len(name) <= MAX_NAME:
        return (
            f"source name {name[:40]!r} is {len(name)} characters long: a source's name is 1 "
            f"to {MAX_NAME} characters"
        )
    for i, ch in enumerate(name):
        category = unicodedata.category(ch)
        if category in _REFUSED_CATEGORIES:
            return (
                f"source name {name[:40]!r} holds U+{ord(ch):04X} ({category}, a control or "
                f"invisible character) at character {i + 1}: a source's name may not"
            )
    return None


def check_cells(points: int, sources: int) -> None:
    """MixtureError if a schedule of `points` points for `sources` sources is over
    MAX_SCHEDULE_POINTS points or MAX_SCHEDULE_CELLS weights (`Weights.check`'s first rule: a
    caller may apply it before building the schedule)."""
    if points > MAX_SCHEDULE_POINTS:
        raise MixtureError(
            f"a weight schedule of {points:,} points, over the {MAX_SCHEDULE_POINTS:,} a "
            "schedule may hold: fewer points (a linear schedule interpolates between them)"
        )
    if points * sources > MAX_SCHEDULE_CELLS:
        raise MixtureError(
            f"a weight schedule of {points:,} points for {sources:,} sources is "
            f"{points * sources:,} weights, over the {MAX_SCHEDULE_CELLS:,} a schedule may hold "
            "(points x sources): fewer points, or fewer sources"
        )


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """From `at` records planned (counted over the whole job), these weights (one per source,
    0 or from MIN_WEIGHT to MAX_WEIGHT, each above 0 at least MIN_SHARE of their sum; they
    are normalised)."""

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

    def check(self, names: Sequence[str], *, bounds: bool = True) -> Weights:
        """Raises MixtureError naming what is wrong (the source and its value); returns self.

        Every entry point holds weights to this before anything changes: a weight the
        planner cannot use (a sum that overflows to inf normalises every weight to 0 and
        leaves it nothing to choose; a share that rounds to 0 plans a source never) would
        otherwise fail or mislead mid-event. A schedule over MAX_SCHEDULE_CELLS weights is
        refused before any is looked at. `bounds` False (the core applying an event, a
        journal replayed, a checkpoint read): only what the planner cannot use at all is
        refused, so weights and schedules an older build took are still read."""
        if bounds:
            check_cells(len(self.points), len(names))
        if self.mode not in ("step", "linear"):
            raise MixtureError(f"weight schedule mode {self.mode!r} is neither step nor linear")
        if not self.points or self.points[0].at != 0:
            raise MixtureError("a weight schedule starts at record 0")
        last = -1
        for p in self.points:
            if p.at <= last:
                raise MixtureError(f"weight breakpoints must grow: {p.at} after {last}")
            last = p.at
            if len(p.weights) != len(names):
                raise MixtureError(
                    f"{len(p.weights)} weight(s) at record {p.at} for {len(names)} source(s)"
                )
            if _plainly_valid(p.weights):
                continue  # at C speed: the loops below name what is wrong
            for name, w in zip(names, p.weights, strict=True):
                if not bounds and (w == 0 or 0 < w < math.inf):
                    continue
                if not (w == 0 or MIN_WEIGHT <= w <= MAX_WEIGHT):  # NaN fails both
                    raise MixtureError(
                        f"source {name!r} has weight {w!r} at record {p.at}: a weight is 0 or "
                        f"a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}"
                    )
            total = sum(p.weights)  # as `at` adds them
            if not total > 0:
                raise MixtureError(f"weights at record {p.at} are all zero")
            if not math.isfinite(total):
                raise MixtureError(f"weights at record {p.at} add up to more than a float holds")
            for name, w in zip(names, p.weights, strict=True):
                if bounds and w and w / total < MIN_SHARE:
                    raise MixtureError(
                        f"source {name!r} has weight {w!r} at record {p.at}, {w / total:.3g} "
                        f"of their sum: a source's share is 0 (retired) or at least "
                        f"{MIN_SHARE:g}"
                    )
        return self

    def at(self, records: int) -> tuple[float, ...]:
        """The normalised weights in force once `records` are planned."""
        points = self.points
        i = bisect_right(points, records, key=_at) - 1  # O(log points) a stretch
        w = points[i].weights
        if self.mode == "linear" and i + 1 < len(points):
            a, b = points[i], points[i + 1]
            f = (records - a.at) / (b.at - a.at)
            w = tuple(x + (y - x) * f for x, y in zip(a.weights, b.weights, strict=True))
        total = sum(w)
        return tuple(x / total for x in w)

    def widened(self, more: int) -> Weights:
        """This schedule with `more` sources after its own, of weight 0 at every point (a
        source added to the job: the plans made before it stay as they were)."""
        if not more:
            return self
        zeros = (0.0,) * more
        return Weights(tuple(Breakpoint(p.at, p.weights + zeros) for p in self.points), self.mode)

    def next_change(self, records: int) -> int | None:
        """The records count at which the weights next change (None: never)."""
        i = bisect_right(self.points, records, key=_at)
        if i == len(self.points):
            return None
        at = self.points[i].at
        return min(at, records + LINEAR_STEP) if self.mode == "linear" else at


def _at(p: Breakpoint) -> int:
    return p.at


def _plainly_valid(weights: tuple[float, ...]) -> bool:
    """Every weight 0 or in bounds, their sum finite and above 0, each above 0 at least
    MIN_SHARE of it (`Weights.check`'s rules, at C speed; False: look one by one)."""
    total = sum(weights)
    if not (total > 0 and math.isfinite(total)) or min(weights) < 0:
        return False  # NaN or inf makes the sum not finite
    positive = [w for w in weights if w]
    low = min(positive)
    return max(positive) <= MAX_WEIGHT and low >= MIN_WEIGHT and low / total >= MIN_SHARE


@dataclass(slots=True)
class Cursor:
    """Where one source is: its epoch, how many of its tasks that epoch has planned, how many
    records were planned from it in all, and its lead over its share (records)."""

    epoch: int = 0
    next: int = 0
    planned: int = 0
    ahead: float = 0.0


class Unit(NamedTuple):
    """One unit of a pass: task `task` of `source`, in that source's epoch `epoch` (a tuple:
    a pass may plan a million, and a tuple is made faster than a dataclass)."""

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
            # Pop the next source, plan its task, push its next one: one heappushpop a unit.
            push, all_records = heapq.heappushpop, self.task_records
            item = heapq.heappop(heap)
            while len(out) < count and (change is None or total < change):
                s = item[1]
                c = cursors[s]
                task = nxt[s]
                records = all_records[s]
                r = int(records[task])
                out.append(Unit(s, task, c.epoch))
                c.next += 1
                if c.next == len(records):
                    c.epoch += 1
                    c.next = 0
                c.planned += r
                total += r
                virtual[s] += r
                nxt[s] = nt = self.task_of(s, c.epoch, c.next)
                item = push(heap, ((virtual[s] + records[nt]) / w[s], s))
            for c, v, x in zip(cursors, virtual, w, strict=True):
                c.ahead = v - x * total  # each source keeps its lead, in records
        return out


# ---- a mixture job's passes -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replan:
    """From unit `at` of its pass on, the units were planned again under `weights`."""

    at: int
    weights: Weights


@dataclass(frozen=True, slots=True)
class Replanned:
    """Units `at`.. of pass `pass_id` planned again under `weights` (`MixtureState.plan_again`):
    the re-plans before `at` it keeps, the records planned before `at` over the whole job, the
    sources' cursors after the pass, and the new units' global tasks (None: the pass's units
    are not computed, or `at` is its end)."""

    pass_id: int
    at: int
    weights: Weights
    kept: tuple[Replan, ...]
    effect: int
    cursors: list[Cursor]
    tail: array[int] | None


@dataclass(slots=True)
class PassPlan:
    """How one pass of a mixture is planned: from `start` (the sources' cursors when it began)
    under `weights` (the schedule in force then), and again from each re-plan's unit on under
    its weights. `units` (a global task ID a unit) follows from that: a snapshot stores it, a
    data checkpoint only the rest (None: not computed yet)."""

    start: tuple[Cursor, ...]
    weights: Weights
    replans: tuple[Replan, ...] = ()
    units: array[int] | None = None


def copy_cursors(cursors: Sequence[Cursor]) -> list[Cursor]:
    return [Cursor(c.epoch, c.next, c.planned, c.ahead) for c in cursors]


def widen_plan(plan: PassPlan, sources: int) -> PassPlan:
    """`plan` over `sources` sources: those it lacks (added to the job after it was made, the
    last ones) start at epoch 0 and have weight 0 in it, so it plans the same units: the
    planner never chooses a source of weight 0, and an added 0 changes no normalised weight."""
    more = sources - len(plan.start)
    if more < 0:
        raise MixtureError(f"a pass's plan of {len(plan.start)} sources for {sources}")
    if not more:
        return plan
    return PassPlan(
        (*plan.start, *(Cursor() for _ in range(more))),
        plan.weights.widened(more),
        tuple(Replan(r.at, r.weights.widened(more)) for r in plan.replans),
        plan.units,
    )


@dataclass
class MixtureState:
    """A mixture job's plans and per-source counts (part of core.master_state.MasterState).

    Each pass is `units` units; `passes` holds the plan of every pass a commit may still name
    (from the commit floor on) and, after a restore, those its data checkpoint recorded ahead
    of the current one. `cursors` are where the pass after the last one planned starts.
    `high` is 1 + the highest unit of the current pass ever handed out or committed: the units
    from it on were never handed out, and a weight change plans them again."""

    planner: Planner
    first_task: tuple[int, ...]  # each source's first global task, and one past the last
    units: int
    weights: Weights
    cursors: list[Cursor]
    passes: dict[int, PassPlan] = field(default_factory=dict)
    high: int = 0
    handed: list[int] = field(default_factory=list)  # records per source, the whole job
    consumed: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    #: Units of each source among the current pass's first `high` and their records, and the
    #: records of the current pass (all follow from its plan).
    reached: list[int] = field(default_factory=list)
    reached_records: list[int] = field(default_factory=list)
    records: int = 0

    @classmethod
    def create(
        cls,
        names: Sequence[str],
        task_records: Sequence[Sequence[int]],
        seed: int | None,
        weights: Weights,
        units: int,
    ) -> MixtureState:
        planner = Planner(task_records, names, seed)
        first = [0]
        for tasks in task_records:
            first.append(first[-1] + len(tasks))
        n = len(names)
        weights.check(names, bounds=False)
        return cls(
            planner,
            tuple(first),
            units,
            weights,
            [Cursor() for _ in range(n)],
            handed=[0] * n,
            consumed=[0] * n,
            committed=[0] * n,
            reached=[0] * n,
            reached_records=[0] * n,
        )

    @classmethod
    def of(cls, ds: Dataset) -> MixtureState:
        """A mixture dataset's state before its first pass: its sources' weights in force, a
        pass of as many units as the sources have tasks."""
        task_records = ds.task_records
        return cls.create(
            [s.name for s in ds.sources],
            [task_records[r.start : r.stop] for r in map(ds.source_tasks, range(len(ds.sources)))],
            ds.shuffle_seed,
            Weights.fixed([s.weight for s in ds.sources]),
            ds.num_tasks,
        )

    @property
    def names(self) -> Sequence[str]:
        return self.planner.names

    def add(self, names: Sequence[str], task_records: Sequence[Sequence[int]]) -> None:
        """Sources added to the job, after its own: each starts at epoch 0, with weight 0 in
        every plan and schedule so far (which plan the same units: `widen_plan`). A pass stays
        `units` units; new weights bring the sources in."""
        old = len(self.names)
        planner = Planner(
            [*self.planner.task_records, *task_records], [*self.names, *names], self.planner.seed
        )
        first = list(self.first_task)
        for tasks in task_records:
            first.append(first[-1] + len(tasks))
        n = len(planner.names)
        self.planner, self.first_task = planner, tuple(first)
        self.weights = self.weights.widened(n - old)
        self.cursors += [Cursor() for _ in range(n - old)]
        self.passes = {p: widen_plan(plan, n) for p, plan in self.passes.items()}
        for counts in (
            self.handed,
            self.consumed,
            self.committed,
            self.reached,
            self.reached_records,
        ):
            counts.extend([0] * (n - old))
        self.__dict__.pop("_task_records", None)  # made again with the new sources' tasks

    def check_held(self, weights: Weights, sources: int) -> None:
        """MixtureError if the job could keep more than MAX_HELD_POINTS points or
        MAX_HELD_CELLS weights once `weights` are in force over `sources` sources: the
        schedule in force and a re-plan's (both `weights`), and each pass plan's start and
        re-plans, each as wide as the job (what memory, a snapshot and a data checkpoint
        hold, and a replay makes again; a re-plan the change would replace is counted too:
        a bound, not the exact figure)."""
        points = 2 * len(weights.points)
        for plan in self.passes.values():
            points += len(plan.weights.points) + sum(len(r.weights.points) for r in plan.replans)
        if points > MAX_HELD_POINTS or points * sources > MAX_HELD_CELLS:
            raise MixtureError(
                f"the job would keep {points:,} points of weight schedules (in force and in "
                f"its passes' plans) for {sources:,} sources, {points * sources:,} weights, "
                f"over {MAX_HELD_POINTS:,} points or {MAX_HELD_CELLS:,} weights: a shorter "
                "schedule, or first commit the passes that hold the earlier ones"
            )

    def source_of_task(self, task: TaskId) -> int:
        """The source a global task ID belongs to."""
        return bisect_right(self.first_task, task) - 1

    def compute(self, plan: PassPlan, stop: int | None = None) -> tuple[array[int], list[Cursor]]:
        """The global tasks of units [0, stop) of `plan` (default: all), and the sources'
        cursors after them: planned as the pass was, one call from its start and one from
        each re-plan's unit on (a call cut short plans the same first units)."""
        stop = self.units if stop is None else stop
        cursors = copy_cursors(plan.start)
        points = [(0, plan.weights), *((r.at, r.weights) for r in plan.replans)]
        first = self.first_task
        out: array[int] = array("I")
        for i, (at, weights) in enumerate(points):
            end = min(points[i + 1][0] if i + 1 < len(points) else self.units, stop)
            if end > at:
                out.extend(
                    [
                        first[u.source] + u.task
                        for u in self.planner.plan(cursors, weights, end - at)
                    ]
                )
            if end >= stop:
                break
        return out, cursors

    def plan(self, pass_id: int) -> array[int]:
        """The global task of each unit of `pass_id` (a pass from the commit floor on)."""
        p = self.passes[pass_id]
        if p.units is None:
            p.units = self.compute(p)[0]
        return p.units

    def begin(self, pass_id: int, units: array[int] | None = None) -> None:
        """Plan a pass that begins: as a data checkpoint recorded it, or from the cursors
        under the weights in force. `units`: its plan, made already from the same start,
        weights and re-plans, with `cursors` those after it (a restore onto the pass that
        setting the dataset just planned: a million units cost seconds)."""
        p = self.passes.get(pass_id)
        if p is None:
            p = self.passes[pass_id] = PassPlan(tuple(copy_cursors(self.cursors)), self.weights)
        if units is None:
            p.units, self.cursors = self.compute(p)
        else:
            p.units = units
        self.high = 0
        self.reached = [0] * len(self.names)
        self.reached_records = [0] * len(self.names)
        self.records = self.records_of(p.units)

    def records_of(self, units: Sequence[int]) -> int:
        """The records of these global tasks."""
        return sum(map(self._task_records.__getitem__, units))

    @cached_property
    def _task_records(self) -> array[int]:
        """Records of every global task, the sources' side by side (made once)."""
        out: array[int] = array("Q")
        for records in self.planner.task_records:
            out.extend(records)
        return out

    def reach(self, pass_id: int, unit: int) -> None:
        """Unit `unit` of the current pass was handed out or committed."""
        if unit < self.high:
            return
        plan, first, records = self.plan(pass_id), self.first_task, self.planner.task_records
        for u in range(self.high, unit + 1):
            t = plan[u]
            s = bisect_right(first, t) - 1
            self.reached[s] += 1
            self.reached_records[s] += records[s][t - first[s]]
        self.high = unit + 1

    def planned_now(self, pass_id: int) -> int:
        """Records planned over the whole job up to the current pass's next unit never handed
        out: the weights in force are the schedule's there."""
        return sum(c.planned for c in self.passes[pass_id].start) + sum(self.reached_records)

    def plan_again(self, pass_id: int, at: int, weights: Weights) -> Replanned:
        """Units `at`.. of `pass_id` planned again under `weights`, not yet in force: what
        `replan` puts in force (a caller may first look at what the re-plan would change)."""
        p = self.passes[pass_id]
        kept = tuple(r for r in p.replans if r.at < at)
        _, cursors = self.compute(PassPlan(p.start, p.weights, kept), at)
        effect = sum(c.planned for c in cursors)
        tail = None
        if p.units is not None and at < self.units:
            first = self.first_task
            units = self.planner.plan(cursors, weights, self.units - at)  # moves the cursors
            tail = array("I", [first[u.source] + u.task for u in units])
        return Replanned(pass_id, at, weights, kept, effect, cursors, tail)

    def replan(self, pass_id: int, at: int, weights: Weights, current: bool) -> int:
        """Plan units `at`.. of `pass_id` again under `weights`, which are in force from now
        on; `current`: it is the pass being handed out. Returns the records planned before unit
        `at`: where the change takes effect, counted over the whole job."""
        return self.put_in_force(self.plan_again(pass_id, at, weights), current)

    def put_in_force(self, again: Replanned, current: bool) -> int:
        """`again` (`plan_again`) in force, its weights from now on (`replan`)."""
        p = self.passes[again.pass_id]
        p.replans = again.kept + (
            (Replan(again.at, again.weights),) if again.at < self.units else ()
        )
        if p.units is not None and again.tail is not None:
            p.units[again.at :] = again.tail
            if current:
                self.cursors = again.cursors
                self.records = self.records_of(p.units)
        self.weights = again.weights
        return again.effect

    def epoch(self, pass_id: int, source: int) -> int:
        """The epoch of `source` at the current pass's next unit to hand out."""
        start = self.passes[pass_id].start[source]
        n = self.first_task[source + 1] - self.first_task[source]
        return start.epoch + (start.next + self.reached[source]) // n

    def forget(self, floor: int, horizon: int) -> None:
        """Plans below the commit floor go; those no commit may name (at `horizon` or before)
        keep only what computes them again."""
        for p in [p for p in self.passes if p < floor]:
            del self.passes[p]
        for p, plan in self.passes.items():
            if p <= horizon:
                plan.units = None


# ---- as JSON values (the journal's, a snapshot's, a data checkpoint's) -----------------------


def _number(v: Any, what: str) -> float:
    if type(v) not in (int, float):
        raise MixtureError(f"{what} is not a number")
    return float(v)


def _integer(v: Any, what: str) -> int:
    if type(v) is not int:
        raise MixtureError(f"{what} is not an integer")
    return int(v)


def _items(v: Any, what: str, length: int | None = None) -> list[Any]:
    if type(v) is not list or (length is not None and len(v) != length):
        raise MixtureError(f"{what} is not a list" + (f" of {length}" if length else ""))
    return v


def weights_json(w: Weights) -> list[Any]:
    """[mode, [[at, weight, ...], ...]]"""
    return [w.mode, [[p.at, *p.weights] for p in w.points]]


def weights_from_json(v: Any) -> Weights:
    """The schedule `weights_json` wrote; MixtureError naming what is malformed (its values
    are checked by `Weights.check`)."""
    mode, points = _items(v, "a weight schedule", 2)
    if type(mode) is not str:
        raise MixtureError("a weight schedule's mode is not a string")
    out = []
    for p in _items(points, "a weight schedule's breakpoints"):
        p = _items(p, "a breakpoint")
        if not p:
            raise MixtureError("a breakpoint is empty")
        at = _integer(p[0], "a breakpoint's record")
        weights = p[1:]
        if not {*map(type, weights)} <= _NUMBERS:  # at C speed: a replay reads every weight
            for w in weights:
                _number(w, "a weight")
        out.append(Breakpoint(at, tuple(map(float, weights))))
    return Weights(tuple(out), mode)


_NUMBERS = frozenset({int, float})


def cursor_json(c: Cursor) -> list[Any]:
    return [c.epoch, c.next, c.planned, c.ahead]


def cursor_from_json(v: Any) -> Cursor:
    e, n, p, a = _items(v, "a source's cursor", 4)
    return Cursor(
        _integer(e, "a cursor's epoch"),
        _integer(n, "a cursor's next task"),
        _integer(p, "a cursor's records planned"),
        _number(a, "a cursor's lead"),
    )


def plan_json(plan: PassPlan) -> list[Any]:
    """How a pass is planned (its units aside): [cursors, weights, [[at, weights], ...]]."""
    return [
        [cursor_json(c) for c in plan.start],
        weights_json(plan.weights),
        [[r.at, weights_json(r.weights)] for r in plan.replans],
    ]


def plan_from_json(v: Any) -> PassPlan:
    start, weights, replans = _items(v, "a pass's plan", 3)
    return PassPlan(
        tuple(cursor_from_json(c) for c in _items(start, "a pass's cursors")),
        weights_from_json(weights),
        tuple(
            Replan(_integer(at, "a re-plan's unit"), weights_from_json(w))
            for at, w in (_items(r, "a re-plan", 2) for r in _items(replans, "a pass's re-plans"))
        ),
    )

"""The master's state: four queues, passes, failures, save-model approval, trainer sessions,
how far each held task is consumed, and how far each task is committed (docs/architecture.md).

Only `core.state.apply` changes it; the modules beside this one apply each event kind.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from chunkmaster.core import steps
from chunkmaster.core.budget import ErrorBudget, JobStop
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.ids import TaskId, UnitId
from chunkmaster.core.mixture import MixtureState
from chunkmaster.core.model import (
    Chunk,
    FailedPolicy,
    Failure,
    PassLedger,
    RecordCounts,
    Task,
    TaskMeta,
)
from chunkmaster.core.record_order import task_order_key
from chunkmaster.core.shuffle import pass_queue

FAILURE_HISTORY = 8  # failures remembered per task; the count is kept in full
LEDGER_PASSES = 16  # passes whose record counts are kept
COMMIT_PASSES = steps.PIECES_KEPT  # passes back a commit may still name (late commits)
NO_IDENTITY = 0  # a Finishers entry: no finisher with an identity is known in the pass
READ_FAILURE = "read failure"  # the ledger's reason for a trainer's TaskFailed


class InvalidEvent(Exception):
    """An event that cannot apply to this state: a bug in the shell, never a user error."""


@dataclass(slots=True)
class Pending:
    epoch: int
    deadline: float
    worker: str
    request: str = ""
    session: str = ""
    start: int = 0  # the record this dispatch started at
    owner: str = ""  # the identity holding it (mutual TLS): the session's, or the GetTask's


@dataclass(slots=True)
class Finishers:
    """Which identity (mutual TLS) finished each task and piece of one pass, for the commits
    still to come: 4 bytes a task, kept only once a finisher had an identity."""

    ids: dict[str, int]  # identity -> its number (1, 2, ...)
    tasks: array[int]  # task -> the number of its finisher's identity; 0: not finished
    pieces: dict[int, int] = field(default_factory=dict)  # the same, for pieces

    def finisher(self, unit: int) -> str | None:
        """The identity that finished `unit` in this pass (None: not finished in it)."""
        n = self.tasks[unit] if unit < len(self.tasks) else self.pieces.get(unit, NO_IDENTITY)
        if n == NO_IDENTITY:
            return None
        return next(name for name, k in self.ids.items() if k == n)

    def note(self, unit: int, identity: str) -> None:
        n = self.ids.get(identity)
        if n is None:
            n = self.ids[identity] = len(self.ids) + 1
        if unit < len(self.tasks):
            self.tasks[unit] = n
        else:
            self.pieces[unit] = n


@dataclass(slots=True)
class Session:
    name: str
    host: str
    pid: int
    report_every: int = 0
    consumed: int = 0  # records it reported consumed, all passes
    owner: str = ""  # the identity that opened it (mutual TLS): only it may resume it
    world_size: int = 0  # the job's trainers as this one declared them (0: not said)
    rank: int = 0
    #: Its tasks do not time out before this (wall-clock seconds): its last progress plus the
    #: task timeout (`Progress.deadline`). A trainer with a session times out when it is
    #: stuck, not when it is slow.
    deadline: float = 0.0


@dataclass(slots=True)
class SaveApproval:
    trainer_id: str
    until: float


@dataclass
class MasterState:
    dataset: Dataset | None = None
    failure_max: int = 3
    failed_policy: FailedPolicy = FailedPolicy.RETRY
    cur_pass: int = 0
    todo: deque[int] = field(default_factory=deque)
    pending: dict[int, Pending] = field(default_factory=dict)
    done: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    epochs: array[int] = field(default_factory=lambda: array("Q"))
    num_failures: dict[int, int] = field(default_factory=dict)  # only tasks with failures
    failure_log: dict[int, deque[Failure]] = field(default_factory=dict)
    failure_total: dict[int, int] = field(default_factory=dict)
    saver: SaveApproval | None = None
    requests: dict[str, int] = field(default_factory=dict)  # GetTask request ID -> pending task
    sessions: dict[str, Session] = field(default_factory=dict)
    progress: dict[int, int] = field(default_factory=dict)  # this pass: task -> records consumed
    commits: dict[int, dict[int, int]] = field(default_factory=dict)  # pass -> task -> records
    full_commits: dict[int, int] = field(default_factory=dict)  # pass -> tasks wholly committed
    commit_floor: int = 0  # the first pass not wholly committed
    pass_done: dict[int, int] = field(default_factory=dict)  # ended pass -> tasks done in it
    ledger: dict[int, PassLedger] = field(default_factory=dict)  # the last LEDGER_PASSES passes
    restored_from: str = ""  # the data checkpoint this state was started from, if any
    job_id: str = ""  # the job's identity (SetDataset; a job started from a checkpoint: its)
    restore_key: str = ""  # the restart that asked for the last restore (one per key)
    restore_ranks: frozenset[int] = frozenset()  # the ranks that asked with that key
    restore_moved: bool = False  # a task was handed out since the last restore
    error_budget: ErrorBudget = field(default_factory=ErrorBudget)  # quarantine.py
    stopped: JobStop | None = None  # the error budget was exceeded: no more tasks
    steps: steps.StepsState = field(default_factory=steps.StepsState)  # equal steps
    #: Dispatches taken from their holder (timeout, failure, lost or closed session), as
    #: (task or piece, epoch) -> pass, for the last COMMIT_PASSES passes: a commit naming one
    #: is refused, even once its pass is over or wholly committed by others.
    taken: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Of those, the dispatches their holder handed back (a trainer that stopped reading a
    #: pass): (task or piece, epoch) -> (session, position handed back at). The holder
    #: consumed the records before that position, so its commits of them are taken.
    returned: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)
    #: Passes not yet wholly committed (COMMIT_PASSES at most) -> who finished what in them.
    finishers: dict[int, Finishers] = field(default_factory=dict)
    #: A mixture's plans and per-source counts (None: one plain dataset).
    mix: MixtureState | None = None

    @property
    def ready(self) -> bool:
        return self.dataset is not None

    @property
    def num_tasks(self) -> int:
        return len(self.epochs)  # one epoch a task, set with the dataset; cheaper to ask

    def is_piece(self, task_id: int) -> bool:
        """Whether a queued or dispatched ID is a piece (else a unit)."""
        return task_id >= len(self.epochs)

    def unit_of(self, task_id: int) -> UnitId:
        """The unit a queued or dispatched ID is, or that a piece is a part of."""
        return self.steps.pieces[task_id].task if self.is_piece(task_id) else UnitId(task_id)

    def task(self, task_id: int) -> Task:
        """What a trainer is handed for the unit or piece `task_id` of this pass, with the
        job's shuffle window (and its seed) when it has one."""
        ds = self.dataset
        assert ds is not None
        p = self.pending.get(task_id)
        start = 0 if p is None else p.start
        piece = self.is_piece(task_id)
        if piece:  # its unit's chunks up to its end
            part = self.steps.pieces[task_id]
            unit, end, epoch = part.task, part.end, part.epoch
        else:
            unit, end, epoch = UnitId(task_id), 0, self.epochs[task_id]
        task = self.unit_task(unit)
        whole = ds.task_chunks(task, self.cur_pass)
        window = ds.shuffle_window
        # A piece is cut to the chunks it reaches, but not with a window: the task's windows
        # (and so each one's order) are cut from all its records.
        if piece and not window:
            chunks = []
            first = 0
            for c in whole:
                if first >= end:
                    break
                chunks.append(c)
                first += c.num_records
            whole = tuple(chunks)
        source, fmt = "", ds.format
        if self.mix is not None:  # the task's source, looked up once
            s = self.mix.source_of_task(task)
            source, fmt = self.mix.names[s], ds.sources[s].format
        return Task(
            TaskMeta(task_id, epoch),
            whole,
            self.cur_pass,
            start,
            end,
            fmt,
            self.num_failures.get(task_id, 0),
            source,
            task_order_key(ds.shuffle_seed or 0, self.cur_pass, unit) if window else 0,
            window,
        )

    def unit_task(self, unit: UnitId, pass_id: int | None = None) -> TaskId:
        """The dataset's task behind `unit` of a pass (default: this one): the unit itself,
        or in a mixture the task the pass's plan put there."""
        if self.mix is None:
            return TaskId(unit)
        return TaskId(self.mix.plan(self.cur_pass if pass_id is None else pass_id)[unit])

    def task_chunks(self, unit: UnitId, pass_id: int | None = None) -> tuple[Chunk, ...]:
        """The chunks `unit` covers in a pass (default: this one; in a mixture, a pass whose
        plan is no longer kept reads as this one)."""
        assert self.dataset is not None
        p = self.cur_pass if pass_id is None else pass_id
        if self.mix is not None and p not in self.mix.passes:
            p = self.cur_pass
        return self.dataset.task_chunks(self.unit_task(unit, p), p)

    def unit_source(self, task_id: int, pass_id: int | None = None) -> int:
        """A mixture's source of a unit (or piece) of a pass (default: this one)."""
        assert self.mix is not None
        return self.mix.source_of_task(self.unit_task(self.unit_of(task_id), pass_id))

    def task_records(self, task_id: int, pass_id: int | None = None) -> int:
        """Where a task (or a piece of one) ends, counted from the task's first record, in
        `pass_id` (default: this pass); with a shuffle seed a task covers other chunks every
        pass, and in a mixture a unit is another task every pass."""
        if task_id < len(self.epochs):  # a unit (`is_piece` inlined: every report asks this)
            assert self.dataset is not None
            p = self.cur_pass if pass_id is None else pass_id
            if self.mix is not None:
                return self.dataset.task_records[self.mix.plan(p)[task_id]]
            return self.dataset.task_records_for(p)[task_id]
        return self.steps.pieces[task_id].end

    def pass_queue(self, tasks: Iterable[int] | None = None) -> deque[int]:
        """`tasks` (default: all) in the order this pass hands them out; a mixture's pass
        hands out all its units in the plan's order."""
        assert self.dataset is not None
        if self.mix is not None:
            return deque(range(self.mix.units))
        return pass_queue(self.dataset.shuffle_seed, self.cur_pass, self.num_tasks, tasks)

    def pass_ledger(self, pass_id: int | None = None) -> PassLedger:
        p = self.cur_pass if pass_id is None else pass_id
        led = self.ledger.get(p)
        if led is None:
            led = self.ledger[p] = PassLedger()
        return led

    def ledgers(
        self, unit: int, pass_id: int | None = None, source: int | None = None
    ) -> tuple[RecordCounts, ...]:
        """The counts a unit's (or piece's) records of a pass (default: this one) go to: the
        pass's ledger, and in a mixture its source's in that pass too (`source`, when the
        caller knows it already)."""
        led = self.pass_ledger(pass_id)
        if self.mix is None:
            return (led,)
        s = self.unit_source(unit, pass_id) if source is None else source
        counts = led.sources.get(s)
        if counts is None:
            counts = led.sources[s] = RecordCounts()
        return led, counts

    def held_by(self, session: str) -> list[int]:
        return [t for t, p in self.pending.items() if p.session == session]

"""The master's state machine: four queues, passes, failures, save-model approval.

`apply(state, event)` is the only way the state changes. Every operation costs O(1) except a
pass rollover, which moves each task once per pass (O(1) amortised per task).
"""

from __future__ import annotations

import enum
from array import array
from collections import deque
from dataclasses import dataclass, field

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import AllTaskFailedError, PassAfterError, PassBeforeError
from chunkmaster.core.events import (
    ApproveSave,
    Configure,
    Dispatch,
    Event,
    Fail,
    Finish,
    Resume,
    SetDataset,
)
from chunkmaster.core.model import FailedPolicy, Failure, Task, TaskMeta

FAILURE_HISTORY = 8  # failures remembered per task; the count is kept in full


class InvalidEvent(Exception):
    """An event that cannot apply to this state: a bug in the shell, never a user error."""


@dataclass(slots=True)
class Pending:
    epoch: int
    deadline: float
    worker: str
    request: str = ""


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

    @property
    def ready(self) -> bool:
        return self.dataset is not None

    @property
    def num_tasks(self) -> int:
        return 0 if self.dataset is None else self.dataset.num_tasks

    def task(self, task_id: int) -> Task:
        assert self.dataset is not None
        return Task(
            TaskMeta(task_id, self.epochs[task_id]),
            self.dataset.task_chunks(task_id),
            self.cur_pass,
        )


class Availability(enum.Enum):
    NOT_READY = "not ready"  # no dataset yet: wait for one
    DISPATCH = "dispatch"  # a task can be handed out now
    WAIT = "wait"  # none in Todo, some pending: wait for one to come back or the pass to end


def check_get_task(state: MasterState, pass_id: int) -> Availability:
    """What a GetTask(pass_id) gets now; raises the pass and all-failed errors."""
    if state.dataset is None:
        return Availability.NOT_READY
    if pass_id < state.cur_pass:
        raise PassBeforeError()
    if pass_id > state.cur_pass:
        raise PassAfterError()
    if state.todo:
        return Availability.DISPATCH
    if state.pending:
        return Availability.WAIT
    raise AllTaskFailedError()


def finish_ignored(state: MasterState, ev: Finish) -> str | None:
    """Why a finish report changes nothing (None when it completes the task)."""
    p = state.pending.get(ev.task_id)
    if p is None:
        return "task is not pending"
    if ev.pass_id >= 0 and ev.pass_id != state.cur_pass:
        return f"report is for pass {ev.pass_id}, master is in pass {state.cur_pass}"
    if ev.epoch > p.epoch:
        return f"epoch {ev.epoch} was never dispatched (latest is {p.epoch})"
    return None


def fail_ignored(state: MasterState, ev: Fail) -> str | None:
    """Why a failure report or timeout changes nothing (None when it applies)."""
    p = state.pending.get(ev.task_id)
    if p is None:
        return "task is not pending"
    if p.epoch != ev.epoch:
        return f"report is for epoch {ev.epoch}, the pending dispatch is epoch {p.epoch}"
    return None


def save_allowed(state: MasterState, trainer_id: str, now: float) -> bool:
    """Approve if nobody holds an unexpired window, or the caller holds it."""
    s = state.saver
    return s is None or s.until <= now or s.trainer_id == trainer_id


def apply(state: MasterState, event: Event) -> Task | bool | None:
    """Apply one event. Returns the dispatched Task, or whether a report changed anything."""
    match event:
        case Dispatch():
            return _dispatch(state, event)
        case Finish():
            return _finish(state, event)
        case Fail():
            return _fail(state, event)
        case ApproveSave(trainer_id=tid, until=until):
            state.saver = SaveApproval(tid, until)
            return True
        case SetDataset(dataset=ds):
            if state.dataset is not None:
                return False
            state.dataset = ds
            state.epochs = array("Q", bytes(8 * ds.num_tasks))
            state.todo = deque(range(ds.num_tasks))
            return True
        case Configure(failure_max=fm, failed_policy=fp):
            state.failure_max = fm
            state.failed_policy = fp
            return True
        case Resume(not_before=nb):
            for p in state.pending.values():
                p.deadline = max(p.deadline, nb)
            return True
    raise InvalidEvent(f"unknown event {event!r}")


def _dispatch(state: MasterState, ev: Dispatch) -> Task:
    if not state.todo:
        raise InvalidEvent("dispatch with an empty todo queue")
    task_id = state.todo.popleft()
    state.epochs[task_id] += 1
    state.pending[task_id] = Pending(state.epochs[task_id], ev.deadline, ev.worker, ev.request)
    if ev.request:
        state.requests[ev.request] = task_id
    return state.task(task_id)


def _leave_pending(state: MasterState, task_id: int) -> None:
    p = state.pending.pop(task_id)
    if p.request:
        state.requests.pop(p.request, None)


def _finish(state: MasterState, ev: Finish) -> bool:
    if finish_ignored(state, ev) is not None:
        return False
    _leave_pending(state, ev.task_id)
    state.num_failures.pop(ev.task_id, None)
    state.done.append(ev.task_id)
    _maybe_roll_over(state)
    return True


def _fail(state: MasterState, ev: Fail) -> bool:
    if fail_ignored(state, ev) is not None:
        return False
    task_id = ev.task_id
    _leave_pending(state, task_id)
    count = state.num_failures.get(task_id, 0) + 1
    state.num_failures[task_id] = count
    log = state.failure_log.get(task_id)
    if log is None:
        log = state.failure_log[task_id] = deque(maxlen=FAILURE_HISTORY)
    log.append(Failure(state.cur_pass, ev.epoch, ev.reason))
    state.failure_total[task_id] = state.failure_total.get(task_id, 0) + 1
    if count > state.failure_max:
        state.failed.append(task_id)
    else:
        state.todo.append(task_id)
    _maybe_roll_over(state)
    return True


def _maybe_roll_over(state: MasterState) -> None:
    """A pass ends when Todo and Pending are both empty, however the last task left (D1)."""
    if state.todo or state.pending:
        return
    state.cur_pass += 1
    next_todo: deque[int] = deque(state.done)
    state.done = []
    if state.failed_policy is FailedPolicy.RETRY:
        for task_id in state.failed:
            state.num_failures.pop(task_id, None)
        next_todo.extend(state.failed)
        state.failed = []
    state.todo = next_todo

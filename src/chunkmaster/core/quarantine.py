"""Poison tasks and the error budget.

A task that fails more than `failure_max` times is quarantined: it leaves the pass (it sits in
`MasterState.failed`) with its failure log as its reasons; the files and chunks it covers come
from the dataset, so a quarantine stores nothing of its own. The records it did not deliver
are counted in the pass's ledger (`PassLedger.quarantined`), and the error budget decides what
that means: within it the pass goes on without them; over it the job stops (`JobStop`), and
every later request for a task gets `JobStoppedError`, naming the tasks, files and reasons.

The stop is part of the state: it follows from journaled events (the failures, the budget in
force, the dataset), so a restarted master rebuilds it by replaying the journal. A new budget
(`SetErrorBudget`, journaled when a master starts with a different one) decides again: a job
within the new budget goes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from chunkmaster.core.budget import ErrorBudget, JobStop
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import JobStoppedError
from chunkmaster.core.ids import UnitId
from chunkmaster.core.model import Chunk, FailedPolicy, Failure, PassLedger, RecordCounts

__all__ = [
    "ErrorBudget",
    "JobStop",
    "QuarantinedTask",
    "Records",
    "budget_limit",
    "check_running",
    "describe",
    "note_pass_started",
    "note_quarantined",
    "set_budget",
    "stop_job",
]

MESSAGE_TASKS = 5  # tasks named in a stop's message (status lists them all)


class Records(Protocol):
    """The seam: what the quarantine sees of the master's state (`core.master_state.MasterState`
    is one). It reads the pass, its failures and positions, and writes only the budget, the
    stop and the pass's ledger."""

    error_budget: ErrorBudget
    stopped: JobStop | None

    @property
    def dataset(self) -> Dataset | None: ...
    @property
    def cur_pass(self) -> int: ...
    @property
    def failed_policy(self) -> FailedPolicy: ...
    @property
    def failed(self) -> Sequence[int]: ...
    @property
    def progress(self) -> Mapping[int, int]: ...
    @property
    def failure_log(self) -> Mapping[int, Sequence[Failure]]: ...
    def task_records(self, task_id: int, pass_id: int | None = None) -> int: ...
    def task_chunks(self, unit: UnitId, pass_id: int | None = None) -> tuple[Chunk, ...]: ...
    def pass_ledger(self, pass_id: int | None = None) -> PassLedger: ...
    def ledgers(self, unit: int, pass_id: int | None = None) -> tuple[RecordCounts, ...]: ...


@dataclass(frozen=True, slots=True)
class QuarantinedTask:
    """What status shows of a quarantined task: where its data is and why it failed."""

    task_id: int
    chunks: tuple[Chunk, ...]
    reasons: tuple[Failure, ...]

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.path for c in self.chunks))

    @property
    def records(self) -> int:
        return sum(c.num_records for c in self.chunks)

    def describe(self) -> str:
        """One line: the task, its files and chunk offsets, records and last reason."""
        where = "; ".join(
            f"{path} chunks at offset(s) "
            + ", ".join(str(c.offset) for c in self.chunks if c.path == path)
            for path in self.files
        )
        why = self.reasons[-1].reason if self.reasons else "no reason recorded"
        return f"task {self.task_id} ({where}; {self.records} records): {why}"


def describe(state: Records, task_id: int) -> QuarantinedTask:
    assert state.dataset is not None
    log = state.failure_log.get(task_id, ())
    # With a shuffle seed a task covers other chunks every pass: name those it failed on.
    failed_in = log[-1].pass_id if log else state.cur_pass
    return QuarantinedTask(task_id, state.task_chunks(UnitId(task_id), failed_in), tuple(log))


def budget_limit(state: Records) -> int | None:
    ds = state.dataset
    if state.error_budget.percent is None:
        return state.error_budget.limit(None)
    return state.error_budget.limit(None if ds is None else ds.num_records)


def note_quarantined(state: Records, task_id: int) -> None:
    """A task went over failure_max in this pass: count the records it did not deliver (from
    its known position on) and hold the pass to the budget. Call before its position goes."""
    missing = state.task_records(task_id) - state.progress.get(task_id, 0)
    for led in state.ledgers(task_id):
        led.quarantined += missing
    _hold_to_budget(state)


def note_pass_started(state: Records) -> None:
    """A pass began: under the keep policy the tasks kept out are its quarantined records."""
    if state.failed_policy is FailedPolicy.KEEP and state.failed:
        for t in state.failed:
            for led in state.ledgers(t):
                led.quarantined += state.task_records(t)
        _hold_to_budget(state)


def set_budget(state: Records, budget: ErrorBudget) -> bool:
    """A new budget: a stopped job within it goes on; a running one over it stops."""
    state.error_budget = budget
    stop = state.stopped
    if stop is not None and stop.tasks:  # a stop without tasks is no budget's (stop_job)
        limit = budget_limit(state)
        if limit is None or stop.records <= limit:
            state.stopped = None
    _hold_to_budget(state)
    return True


def stop_job(state: Records, message: str) -> bool:
    """Stop the job for a reason no error budget changes (a dataset file changed after it
    was indexed): every later request for a task gets JobStoppedError with `message`. The
    first stop stays."""
    if state.stopped is not None:
        return False
    state.stopped = JobStop(state.cur_pass, 0, 0, (), message)
    return True


def check_running(state: Records) -> None:
    """Raise the stop's error if the job stopped."""
    if state.stopped is not None:
        raise JobStoppedError(state.stopped.message)


def _hold_to_budget(state: Records) -> None:
    if state.stopped is not None or state.dataset is None:
        return
    limit = budget_limit(state)
    lost = state.pass_ledger().quarantined
    if limit is None or lost <= limit:
        return
    tasks = tuple(state.failed)
    named = [describe(state, t).describe() for t in tasks[:MESSAGE_TASKS]]
    if len(tasks) > MESSAGE_TASKS:
        named.append(f"and {len(tasks) - MESSAGE_TASKS} more (see chunkmaster status)")
    message = (
        f"job stopped: pass {state.cur_pass} lost {lost} records to {len(tasks)} quarantined "
        f"task(s), over the error budget of {limit} records (--max-failed-records "
        f"{state.error_budget}): " + "; ".join(named)
    )
    state.stopped = JobStop(state.cur_pass, lost, limit, tasks, message)

"""The master's state machine: `apply(state, event)` is the only way the state changes.

Each event kind is applied by the module of its concern:

- `core.queues`: a task's way through Todo, Pending, Done and Failed, sessions and positions;
- `core.passes`: a pass's end and start;
- `core.commits`: committed positions and the job's data position;
- `core.mixture_events`: a mixture's weights, sources and plans;
- `core.restore`: a restore from a data checkpoint;
- `core.steps` and `core.quarantine`: equal steps, the error budget and a stopped job.

Three kinds of ID run through it (`core.ids`): a *task* of the dataset; a *unit*, a place in
a pass's queue (the task itself, or in a mixture the task the pass's plan put there); and a
*piece*, a record range of a unit under an ID beyond the units (equal steps). The queues hold
units and pieces.
"""

from __future__ import annotations

from array import array

from chunkmaster.core import quarantine, steps
from chunkmaster.core.commits import (
    commit,
    commit_refused,
    committed_position,
    committed_ranges,
    returned_at,
)
from chunkmaster.core.events import (
    AddSources,
    ApproveSave,
    Commit,
    Configure,
    Dispatch,
    EndSession,
    EqualSteps,
    Event,
    Fail,
    Finish,
    OpenSession,
    Progress,
    Restore,
    Resume,
    ReturnTasks,
    SetDataset,
    SetErrorBudget,
    SetWeights,
    StopJob,
)
from chunkmaster.core.master_state import (
    COMMIT_PASSES,
    FAILURE_HISTORY,
    LEDGER_PASSES,
    READ_FAILURE,
    InvalidEvent,
    MasterState,
    Pending,
    SaveApproval,
    Session,
)
from chunkmaster.core.mixture import MixtureError, MixtureState
from chunkmaster.core.mixture_events import add_sources, mixture_position, replan_point, set_weights
from chunkmaster.core.model import FailedPolicy, Task
from chunkmaster.core.passes import close_committed_passes, maybe_roll_over
from chunkmaster.core.queues import (
    Availability,
    check_get_task,
    dispatch,
    end_session,
    fail,
    fail_ignored,
    fail_quarantines,
    finish,
    finish_ignored,
    lost_reason,
    progress,
    reading_task,
    report_progress,
    return_tasks,
    save_allowed,
    task_deadline,
)
from chunkmaster.core.restore import restore, restore_repeated

__all__ = [
    "COMMIT_PASSES",
    "FAILURE_HISTORY",
    "LEDGER_PASSES",
    "READ_FAILURE",
    "Availability",
    "InvalidEvent",
    "MasterState",
    "Pending",
    "Session",
    "apply",
    "check_get_task",
    "commit_refused",
    "committed_position",
    "committed_ranges",
    "fail_ignored",
    "fail_quarantines",
    "finish_ignored",
    "lost_reason",
    "mixture_position",
    "reading_task",
    "replan_point",
    "restore_repeated",
    "returned_at",
    "save_allowed",
    "task_deadline",
]


def apply(state: MasterState, event: Event) -> Task | bool | int | None:
    """Apply one event. Returns the dispatched Task, whether a report changed anything, or
    how many of the positions it carried did."""
    match event:
        case Dispatch():
            return dispatch(state, event)
        case Finish():
            return finish(state, event)
        case Fail():
            return fail(state, event)
        case ApproveSave(trainer_id=tid, until=until):
            state.saver = SaveApproval(tid, until)
            return True
        case SetDataset():
            return _set_dataset(state, event)
        case Configure(failure_max=fm, failed_policy=fp):
            state.failure_max = fm
            state.failed_policy = fp
            if state.dataset is not None and fp is FailedPolicy.RETRY:
                maybe_roll_over(state)  # a pass whose every task was kept out retries them
            return True
        case EqualSteps(mode=mode):
            state.steps.mode = steps.StepsMode(mode)
            return True
        case Resume(not_before=nb):
            for p in state.pending.values():
                p.deadline = max(p.deadline, nb)
            return True
        case OpenSession():
            return _open_session(state, event)
        case EndSession():
            return end_session(state, event)
        case ReturnTasks():
            return return_tasks(state, event)
        case Progress(positions=positions, deadline=deadline):
            return report_progress(state, positions, deadline)
        case Commit(positions=positions):
            for pos in positions:  # a committed record was consumed: no later report needed
                progress(state, pos)
            applied = sum(commit(state, pos) for pos in positions)
            close_committed_passes(state)
            return applied
        case SetWeights(weights=weights):
            return set_weights(state, weights)
        case AddSources():
            return add_sources(state, event)
        case Restore():
            return restore(state, event)
        case SetErrorBudget(budget=budget):
            return quarantine.set_budget(state, budget)
        case StopJob(message=message):
            return quarantine.stop_job(state, message)
    raise InvalidEvent(f"unknown event {event!r}")


def _set_dataset(state: MasterState, ev: SetDataset) -> bool:
    """The job's dataset, once: its units' epochs and the first pass's queue."""
    if state.dataset is not None:
        return False
    state.job_id = ev.job_id
    ds = ev.dataset
    mix = None
    if ds.sources:  # refused before anything changes: nothing half set
        try:
            mix = MixtureState.of(ds)
        except MixtureError as exc:
            raise InvalidEvent(str(exc)) from None
    state.dataset = ds
    units = ds.num_tasks
    if mix is not None:
        state.mix = mix
        mix.begin(state.cur_pass)
        units = mix.units
    state.epochs = array("Q", bytes(8 * units))
    state.todo = state.pass_queue()
    return True


def _open_session(state: MasterState, ev: OpenSession) -> bool:
    state.sessions[ev.session] = Session(
        ev.name, ev.host, ev.pid, ev.report_every, 0, ev.owner, ev.world_size, ev.rank
    )
    return True

"""A master's settings against the state it recovered: what to journal before serving.

The state holds the limits it runs by (`Configure`, `SetErrorBudget`, `EqualSteps`), so a
replay gives the acknowledged state whatever flags the replaying master has. A master started
with other flags journals the change once, here; a shuffle seed or shuffle window cannot
change mid-job and is refused, and so is `--failed-policy keep` on a mixture. Pure: the shell
passes the time a Resume is due and journals what comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chunkmaster.core.budget import ErrorBudget
from chunkmaster.core.events import Configure, EqualSteps, Event, Resume, SetErrorBudget
from chunkmaster.core.master_state import MasterState
from chunkmaster.core.mixture import MixtureError
from chunkmaster.core.model import FailedPolicy
from chunkmaster.core.shuffle import ShuffleSeedError, ShuffleWindowError
from chunkmaster.core.steps import StepsMode

KEEP_REFUSED = (
    "--failed-policy keep does not apply to a mixture: its passes are other tasks every time "
    "(a task set aside comes back with its source's next epoch); start the master with "
    "--failed-policy retry"
)


@dataclass(frozen=True, slots=True)
class Limits:
    """The settings a job's state holds (the master's flags: `master.settings.Settings`)."""

    failure_max: int = 3
    failed_policy: FailedPolicy = FailedPolicy.RETRY
    error_budget: ErrorBudget = field(default_factory=ErrorBudget)
    #: None: the job's trainers decide (`--equal-steps auto`: the master journals the mode when
    #: the first of them opens a session), so a restart keeps the state's.
    equal_steps: StepsMode | None = StepsMode.OFF
    shuffle_seed: int | None = None
    shuffle_window: int = 0


def reconcile(state: MasterState, limits: Limits, resume_at: float | None = None) -> list[Event]:
    """The events that bring `state` to `limits`, in order; with `resume_at` (wall-clock
    seconds: now plus a task timeout) and tasks pending, a `Resume`: the time no master was
    serving does not count against the trainers holding them. Raises ShuffleSeedError when
    the job was started with another seed, ShuffleWindowError (one) with another shuffle
    window, MixtureError for `keep` on a mixture."""
    _check_seed(state, limits.shuffle_seed)
    _check_window(state, limits.shuffle_window)
    if state.mix is not None and limits.failed_policy is FailedPolicy.KEEP:
        raise MixtureError(KEEP_REFUSED)
    events: list[Event] = []
    if (state.failure_max, state.failed_policy) != (limits.failure_max, limits.failed_policy):
        events.append(Configure(limits.failure_max, limits.failed_policy))
    if state.error_budget != limits.error_budget:
        events.append(SetErrorBudget(limits.error_budget))
    if limits.equal_steps is not None and state.steps.mode is not limits.equal_steps:
        events.append(EqualSteps(limits.equal_steps.value))
    if resume_at is not None and state.pending:
        events.append(Resume(resume_at))
    return events


def _check_seed(state: MasterState, seed: int | None) -> None:
    ds = state.dataset
    if ds is None or ds.shuffle_seed == seed:
        return
    keep = "no --shuffle-seed" if ds.shuffle_seed is None else f"--shuffle-seed {ds.shuffle_seed}"
    raise ShuffleSeedError(
        f"the job's state was started with shuffle seed {_seed_text(ds.shuffle_seed)}, this "
        f"master has {_seed_text(seed)}: a seed cannot change in the middle of a job (every "
        f"pass's task order and tasks derive from it). Start with {keep}, or with an empty "
        "store for a new job"
    )


def _check_window(state: MasterState, window: int) -> None:
    ds = state.dataset
    if ds is None or ds.shuffle_window == window:
        return
    keep = (
        "no --shuffle-window" if not ds.shuffle_window else f"--shuffle-window {ds.shuffle_window}"
    )
    raise ShuffleWindowError(
        f"the job's state was started with shuffle window {_window_text(ds.shuffle_window)}, "
        f"this master has {_window_text(window)}: a shuffle window cannot change in the middle "
        "of a job (trainers' positions count each task's records in its windows' order). "
        f"Start with {keep}, or with an empty store for a new job"
    )


def _window_text(window: int) -> str:
    return "0 (off)" if not window else str(window)


def _seed_text(seed: int | None) -> str:
    return "none" if seed is None else str(seed)

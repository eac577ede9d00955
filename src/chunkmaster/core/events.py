"""The events that change the master's state. They are what the journal stores.

Each event holds every input its effect depends on (times, limits), so replaying the journal
reproduces the acknowledged state exactly, whatever the flags of the replaying master are.
"""

from __future__ import annotations

from dataclasses import dataclass

from chunkmaster.core.budget import ErrorBudget
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.mixture import PassPlan, Weights
from chunkmaster.core.model import FailedPolicy, Position


@dataclass(frozen=True, slots=True)
class Configure:
    """The limits in force from now on (journaled when a master starts with new flags)."""

    failure_max: int
    failed_policy: FailedPolicy


@dataclass(frozen=True, slots=True)
class SetErrorBudget:
    """The error budget in force from now on (journaled when a master starts with a new one)."""

    budget: ErrorBudget


@dataclass(frozen=True, slots=True)
class StopJob:
    """The job stops for a reason no budget changes: a dataset file changed after the master
    indexed it (a trainer found it at its read). `message` is what trainers get from now on."""

    message: str


@dataclass(frozen=True, slots=True)
class EqualSteps:
    """Equal steps per trainer in force from now on: "off", "drop" or "pad"
    (docs/equal-steps.md); journaled when a master starts with a new --equal-steps."""

    mode: str


@dataclass(frozen=True, slots=True)
class SetDataset:
    """The first dataset wins; later ones are not journaled. `job_id`: the job's identity
    from now on (random, made by the shell), which its data checkpoints carry."""

    dataset: Dataset
    job_id: str = ""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Hand the head of Todo to a trainer until `deadline` (wall-clock seconds).

    `request` is the trainer's ID for this GetTask; a retry of a request whose answer was
    lost gets the same task back instead of stranding it until its timeout.
    """

    deadline: float
    worker: str = ""
    request: str = ""
    session: str = ""  # the trainer session that holds the task ("" for a unary GetTask)
    owner: str = ""  # a unary GetTask's identity (mutual TLS); a session's is the session's


@dataclass(frozen=True, slots=True)
class Finish:
    """A trainer finished a task. `pass_id` -1 means "not said" (accepted)."""

    task_id: int
    epoch: int = 0
    pass_id: int = -1


@dataclass(frozen=True, slots=True)
class Fail:
    """A dispatch failed: the trainer said why, or its deadline passed (reason "timeout")."""

    task_id: int
    epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class ApproveSave:
    """`trainer_id` may save the model until `until` (wall-clock seconds)."""

    trainer_id: str
    until: float


@dataclass(frozen=True, slots=True)
class Resume:
    """A master took over (restart or failover): every pending task's deadline becomes at least
    `not_before` (wall-clock seconds), so time with no master leading does not count against
    the trainers that hold tasks."""

    not_before: float


@dataclass(frozen=True, slots=True)
class OpenSession:
    """A trainer opened a session. Leases are the shell's: they are not state, and a
    recovering master gives every session it finds here a fresh one."""

    session: str
    name: str
    host: str
    pid: int
    report_every: int = 0
    owner: str = ""  # the identity (mutual TLS certificate subject) that opened it
    world_size: int = 0  # the job's trainers, as the trainer declared them (0: not said)
    rank: int = 0  # its rank in 0 .. world_size - 1 (meaningless without a world size)


@dataclass(frozen=True, slots=True)
class EndSession:
    """A session ended: `reason` is TRAINER_LOST_REASON (its lease ran out) or RETURNED_REASON
    (the trainer said goodbye, with its final `positions`). Its tasks go back to the front of
    Todo at their known positions.

    With `charge` (a trainer lost, not one that said goodbye) the task it was reading, the
    first it holds in the order they were handed to it, counts one failure, as a TaskFailed
    does: a chunk that kills whoever reads it (out of memory, a crash in a decoder) is
    quarantined after `failure_max` such losses instead of killing trainers for ever. The
    other tasks it held count against nothing. (Journal entries written before this existed
    replay with no charge, as they were applied.)"""

    session: str
    reason: str
    positions: tuple[Position, ...] = ()
    charge: bool = False


@dataclass(frozen=True, slots=True)
class ReturnTasks:
    """A session hands tasks it holds back (it stopped reading their pass): each goes to the
    front of Todo at its position, as at the end of a session, counted against nothing."""

    session: str
    positions: tuple[Position, ...]


@dataclass(frozen=True, slots=True)
class Progress:
    """How far trainers consumed the tasks they hold (stale or foreign positions are ignored).
    A session whose position moved made progress: its tasks do not time out before
    `deadline` (wall-clock seconds: now plus the task timeout; 0 in entries written before
    deadlines moved with progress)."""

    positions: tuple[Position, ...]
    deadline: float = 0.0


@dataclass(frozen=True, slots=True)
class Commit:
    """Trainers' models reflect these positions: the data checkpoint moves to them."""

    positions: tuple[Position, ...]


@dataclass(frozen=True, slots=True)
class SetWeights:
    """A mixture's weight schedule from now on (one weight a source, in the dataset's order).
    The units of the current pass never handed out are planned again under it; after a
    restore that recorded later passes, the last of them from its last committed unit on
    (docs/mixtures.md)."""

    weights: Weights


@dataclass(frozen=True, slots=True)
class AddSources:
    """Sources added to a running mixture (`dataset`: a mixture of them alone, indexed), after
    its own, starting at epoch 0; then `weights`, naming every source, old and new, as
    SetWeights does: they take effect where a weight change would (docs/mixtures.md)."""

    dataset: Dataset
    weights: Weights


@dataclass(frozen=True, slots=True)
class MixturePosition:
    """What a mixture's data checkpoint holds beside its commits: the plan of each pass from
    the floor to the last with commits (the sources' cursors at its start, its weights and
    re-plans), and the weight schedule in force."""

    passes: tuple[tuple[int, PassPlan], ...]
    weights: Weights


@dataclass(frozen=True, slots=True)
class Restore:
    """Go to a data checkpoint's position: pass `floor` with `commits` ((pass, task, records
    committed), pass >= floor) already made, and `ranges` ((pass, task, start, end): records
    of a task split by equal steps committed beyond its prefix, ascending) too. On a running
    job every session ends and the queues start again from there (a training job restarted
    from its model checkpoint); task epochs keep growing, so no report about an earlier
    dispatch can apply to a later one."""

    floor: int
    commits: tuple[tuple[int, int, int], ...]
    source: str = ""  # the checkpoint's identity: restoring the same one again is a no-op
    key: str = ""  # the restart that asked for it: one restore per key (every rank may ask)
    mixture: MixturePosition | None = None  # a mixture's plans (None: not a mixture)
    rank: int = -1  # the rank that asked (-1: a trainer without a rank, or the operator)
    job_id: str = ""  # the checkpoint's job identity, which a job started from it takes
    ranges: tuple[tuple[int, int, int, int], ...] = ()


Event = (
    Configure
    | EqualSteps
    | SetDataset
    | Dispatch
    | Finish
    | Fail
    | ApproveSave
    | Resume
    | OpenSession
    | EndSession
    | ReturnTasks
    | Progress
    | Commit
    | Restore
    | SetErrorBudget
    | StopJob
    | SetWeights
    | AddSources
)

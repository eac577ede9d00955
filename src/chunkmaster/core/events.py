"""The events that change the master's state. They are what the journal stores.

Each event holds every input its effect depends on (times, limits), so replaying the journal
reproduces the acknowledged state exactly, whatever the flags of the replaying master are.
"""

from __future__ import annotations

from dataclasses import dataclass

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.model import FailedPolicy


@dataclass(frozen=True, slots=True)
class Configure:
    """The limits in force from now on (journaled when a master starts with new flags)."""

    failure_max: int
    failed_policy: FailedPolicy


@dataclass(frozen=True, slots=True)
class SetDataset:
    """The first dataset wins; later ones are not journaled."""

    dataset: Dataset


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Hand the head of Todo to a trainer until `deadline` (wall-clock seconds).

    `request` is the trainer's ID for this GetTask; a retry of a request whose answer was
    lost gets the same task back instead of stranding it until its timeout.
    """

    deadline: float
    worker: str = ""
    request: str = ""


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


Event = Configure | SetDataset | Dispatch | Finish | Fail | ApproveSave | Resume

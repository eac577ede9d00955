"""How a master runs its job: one table of settings and their defaults, checked once.

`Service` takes a `Settings`; `MasterConfig` (the command line) takes its defaults from
`DEFAULTS` and builds one (`MasterConfig.settings()`), so a default is written in one place
and a wrong value gets the same message from the flag and from the constructor.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chunkmaster.core.budget import ErrorBudget
from chunkmaster.core.model import FailedPolicy
from chunkmaster.core.reconcile import Limits
from chunkmaster.core.shuffle import MAX_SEED, MAX_WINDOW
from chunkmaster.core.steps import StepsMode
from chunkmaster.inflate import DEFAULT_MAX_INFLATED

MAX_CHUNK_SIZE = 1 << 30
"""The largest chunk size: a trainer holds a whole chunk in memory while it reads it."""


class SettingError(ValueError):
    """A setting's value is wrong; `name` is the setting (a `Settings` field)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name} {message}")
        self.name = name
        self.message = message


class StepsSetting(enum.StrEnum):
    """`--equal-steps`: a mode for every trainer, or `auto`, the job's trainers' choice."""

    AUTO = "auto"  # drop for trainers that declare a world size (torchrun), off for the others
    OFF = "off"
    DROP = "drop"
    PAD = "pad"

    @property
    def mode(self) -> StepsMode | None:
        """The mode the state holds (None: auto, journaled as the trainers come)."""
        return None if self is StepsSetting.AUTO else StepsMode(self.value)


@dataclass(frozen=True)
class Settings:
    """Everything the service runs by. Durations are seconds."""

    job: str = "default"
    #: Chunks a task (`--chunk-per-task`); None: the master chooses for each dataset it
    #: indexes (core/task_size.py), and journals its choice with the dataset.
    chunks_per_task: int | None = None
    #: The most bytes of a chunk the master cuts (line formats, TFRecord, WebDataset); None:
    #: each format's default.
    chunk_size: int | None = None
    #: A task's timeout (`--task-timeout-dur`): from its dispatch for a trainer without a
    #: session; from the holder's last progress for a trainer with one.
    timeout_dur: float = 20 * 60.0
    #: Failures before a task is quarantined (`--task-timeout-max`).
    failure_max: int = 3
    failed_policy: FailedPolicy = FailedPolicy.RETRY
    #: Records one pass may lose to quarantined tasks (`--max-failed-records`).
    error_budget: ErrorBudget = field(default_factory=ErrorBudget)
    #: `--equal-steps`: auto (equal steps, drop, for trainers that declare a world size, none
    #: for the others), or a mode for every trainer.
    equal_steps: StepsSetting = StepsSetting.AUTO
    shuffle_seed: int | None = None
    #: Records per window trainers permute each task's records in (`--shuffle-window`; 0:
    #: off). Needs a seed; fixed for the job, like it.
    shuffle_window: int = 0
    #: How long a silent trainer keeps its session (and the tasks it holds).
    trainer_ttl: float = 10.0
    #: How long a pass with equal steps waits for every rank of a declared world.
    rank_wait: float = 300.0
    #: How long one file's chunk index may take to read before set_dataset fails naming it.
    index_timeout: float = 120.0
    #: Bytes a compressed dataset file may inflate to when it is indexed (`--max-inflated-bytes`).
    max_inflated: int = DEFAULT_MAX_INFLATED
    #: The dataset files' format (`--format`); None: by their names.
    dataset_format: str | None = None
    #: Handed to the filesystem of URL datasets; may hold credentials (never logged).
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: Directories or URL prefixes datasets must lie in (docs/security.md).
    data_roots: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "failed_policy", _enum(FailedPolicy, self, "failed_policy"))
        object.__setattr__(self, "equal_steps", _enum(StepsSetting, self, "equal_steps"))
        object.__setattr__(self, "storage_options", dict(self.storage_options))
        object.__setattr__(self, "data_roots", tuple(self.data_roots))
        for name in ("timeout_dur", "trainer_ttl", "rank_wait", "index_timeout"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise SettingError(name, f"must be a positive duration, not {value}")
            object.__setattr__(self, name, float(value))
        _at_least(self, "failure_max", 0)
        _at_least(self, "max_inflated", 1)
        if self.chunk_size is not None and not 1 <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise SettingError("chunk_size", f"{self.chunk_size} is not in 1..{MAX_CHUNK_SIZE}")
        if self.shuffle_seed is not None and not 0 <= self.shuffle_seed <= MAX_SEED:
            raise SettingError("shuffle_seed", f"{self.shuffle_seed} is not in 0..2**64-1")
        _check_window(self)
        if not self.job or "/" in self.job:
            raise SettingError("job", f"{self.job!r} is not a job name: non-empty, without '/'")
        if self.dataset_format is not None:
            from chunkmaster.formats import FORMATS

            if self.dataset_format not in FORMATS:
                raise SettingError(
                    "dataset_format",
                    f"{self.dataset_format!r} is not a dataset format "
                    f"({', '.join(sorted(FORMATS))})",
                )

    @property
    def limits(self) -> Limits:
        """The settings the job's state holds (journaled when they change: core/reconcile.py)."""
        return Limits(
            self.failure_max,
            self.failed_policy,
            self.error_budget,
            self.equal_steps.mode,
            self.shuffle_seed,
            self.shuffle_window,
        )


def _enum(kind: Any, settings: Settings, name: str) -> Any:
    value = getattr(settings, name)
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(m.value for m in kind)
        raise SettingError(name, f"{value!r} is not one of {names}") from None


def _check_window(settings: Settings) -> None:
    """A window is a whole number of records up to MAX_WINDOW (a trainer holds one in memory),
    and needs a seed (the seed keys each window's permutation)."""
    window = settings.shuffle_window
    if type(window) is not int or not 0 <= window <= MAX_WINDOW:
        raise SettingError(
            "shuffle_window",
            f"{window!r} is not a number of records from 0 (off) to {MAX_WINDOW:,} (a trainer "
            "holds a whole window's records in memory)",
        )
    if window and settings.shuffle_seed is None:
        raise SettingError(
            "shuffle_window", "needs --shuffle-seed (the seed keys the permutation of each window)"
        )


def _at_least(settings: Settings, name: str, least: int) -> None:
    value = getattr(settings, name)
    if value < least:
        raise SettingError(name, f"must be at least {least}, not {value}")


DEFAULTS = Settings()

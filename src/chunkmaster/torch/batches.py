"""What workers send the main process: batches that say which records they hold.

Every item a worker yields names, for each task it touches, the position (records counted
from the task's first) reached at its last record: the main process moves a task's position
when it hands the batch to the training loop, so a commit covers exactly the batches taken, not
what workers read ahead or what waits in the DataLoader's queues and pinned memory.

Workers collate full batches themselves (as a DataLoader would). What is left when a worker's
part of a round ends is sent uncollated (`Loose`: with the default collate, tensors of one shape
go stacked into one, which crosses to the main process as one shared-memory tensor, not one a
sample) and merged by the main process into full batches (`Merger`): a rank that takes R
records in a pass gets ceil(R / batch_size) batches, however its records were spread over
workers and rounds, so ranks with equal records (equal steps) take equal numbers of steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from torch.utils.data import default_collate

from chunkmaster.torch.channel import TaskKey

Span = tuple[TaskKey, int, int]
"""(task, first, count): `count` consecutive samples are the task's records first.. on."""


def _marks(spans: list[Span]) -> tuple[tuple[TaskKey, int], ...]:
    """Each task's position after the last of these samples."""
    ends: dict[TaskKey, int] = {}
    for key, first, count in spans:
        ends[key] = first + count
    return tuple(ends.items())


@dataclass(slots=True)
class Batch:
    """A collated batch (or one sample, without batching) and where it leaves its tasks."""

    data: Any
    marks: tuple[tuple[TaskKey, int], ...]

    def pin_memory(self) -> Batch:
        """The DataLoader's pin-memory thread pins the data, not the marks."""
        self.data = pinned(self.data)
        return self


def pinned(data: Any) -> Any:
    """`data` in pinned memory (torch's own pin-memory walk of tensors, lists, dicts)."""
    from torch.utils.data._utils import pin_memory as pm

    pin: Callable[[Any], Any] = pm.pin_memory
    return pin(data)


@dataclass(slots=True)
class Loose:
    """Samples left over when a worker's part of a round ended: fewer than a batch. `packed`:
    the samples are tensors of one shape and dtype, stacked into one (`samples` is that tensor,
    its rows the samples), so that they cross to the main process as one shared-memory tensor
    rather than one each."""

    samples: Any
    spans: list[Span]
    packed: bool = False

    def rows(self) -> list[Any]:
        """The samples, one by one (a packed tensor's rows: views of it)."""
        return list(self.samples.unbind(0)) if self.packed else list(self.samples)


def _packable(samples: list[Any]) -> bool:
    """Whether `samples` are tensors that torch.stack takes as default_collate would (one
    shape, one dtype, dense, no grad): default_collate of their rows is then their stack."""
    import torch

    first = samples[0]
    if type(first) is not torch.Tensor or first.layout != torch.strided or first.requires_grad:
        return False
    shape, dtype, device = first.shape, first.dtype, first.device
    return all(
        type(s) is torch.Tensor
        and s.shape == shape
        and s.dtype == dtype
        and s.device == device
        and s.layout == torch.strided
        and not s.requires_grad
        for s in samples
    )


@dataclass(slots=True)
class ReadFailure:
    """A chunk of the task could not be read: its records before `records` were sent."""

    key: TaskKey
    records: int
    reason: str


class Batcher:
    """A worker's batches: `size` samples collated (None: each sample alone, uncollated)."""

    def __init__(self, size: int | None, collate: Callable[[list[Any]], Any]) -> None:
        self._size = size or 1
        self._collate: Callable[[list[Any]], Any] | None = collate if size else None
        self._samples: list[Any] = []
        self._spans: list[Span] = []

    def add(
        self,
        key: TaskKey,
        first: int,
        records: Iterator[Any],
        transform: Callable[[Any], Any] | None,
    ) -> Iterator[Batch]:
        """Take a run of the task's records (first.. on), yielding each batch it fills."""
        size = self._size
        at = first
        while True:
            got = list(islice(records, size - len(self._samples)))
            if not got:
                return
            if transform is not None:
                got = [transform(r) for r in got]
            self._samples.extend(got)
            spans = self._spans
            if spans and spans[-1][0] == key and spans[-1][1] + spans[-1][2] == at:
                k, f, n = spans[-1]
                spans[-1] = (k, f, n + len(got))
            else:
                spans.append((key, at, len(got)))
            at += len(got)
            if len(self._samples) == size:
                yield self._cut()

    def _cut(self) -> Batch:
        samples, spans = self._samples, self._spans
        self._samples, self._spans = [], []
        data = samples[0] if self._collate is None else self._collate(samples)
        return Batch(data, _marks(spans))

    def rest(self) -> Loose | None:
        """What is left (less than a batch), for the main process to merge."""
        if not self._samples:
            return None
        samples, spans = self._samples, self._spans
        self._samples, self._spans = [], []
        if self._collate is default_collate and len(samples) > 1 and _packable(samples):
            return Loose(default_collate(samples), spans, packed=True)
        return Loose(samples, spans)


class Merger:
    """The main process's batches made of workers' leftovers."""

    def __init__(self, size: int | None, collate: Callable[[list[Any]], Any]) -> None:
        self._size = size or 1
        self._collate: Callable[[list[Any]], Any] | None = collate if size else None
        self._samples: deque[Any] = deque()
        self._ends: deque[tuple[TaskKey, int]] = deque()  # each sample's task and position after

    def add(self, loose: Loose) -> None:
        self._samples.extend(loose.rows())
        for key, first, count in loose.spans:
            self._ends.extend((key, first + i + 1) for i in range(count))

    def holds(self, key: TaskKey) -> bool:
        return any(k == key for k, _ in self._ends)

    @property
    def full(self) -> bool:
        return len(self._samples) >= self._size

    def __len__(self) -> int:
        return len(self._samples)

    def pop(self) -> Batch | None:
        """A batch of the samples held, full if they make one, else all of them (None: none)."""
        n = min(self._size, len(self._samples))
        if not n:
            return None
        samples = [self._samples.popleft() for _ in range(n)]
        ends: dict[TaskKey, int] = {}
        for _ in range(n):
            key, end = self._ends.popleft()
            ends[key] = end
        data = samples[0] if self._collate is None else self._collate(samples)
        return Batch(data, tuple(ends.items()))

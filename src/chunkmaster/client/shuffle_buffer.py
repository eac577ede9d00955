"""The client's shuffle buffer: records of the tasks a trainer holds, handed out in a random order.

Like the shuffle buffers of tf.data and WebDataset: up to `size` records wait here, and each
record the trainer takes is drawn at random among them, its place refilled from the tasks. The
draw is seeded by (seed, pass, trainer name), so a trainer's mixing is repeatable; what it
mixes depends on which tasks it got, and when (see docs/shuffle.md).

A record in the buffer is not consumed: the trainer has not seen it. So a task's position (in
progress reports, a Goodbye and commits) is never beyond its oldest record still here, and a
task whose last record was read into the buffer is reported finished (and passed to
`on_task_done`) only once its last record here is handed out. Records are drawn a batch at a
time (one lock round per batch) and count as here until the whole batch was handed out:
positions lag by at most a batch, never lead. A trainer that dies with a full
buffer therefore gets those records delivered again, and a commit never covers a record the
model has not seen. Everything here is guarded by the client's lock.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count, repeat

from chunkmaster.client.reporter import ReportSink
from chunkmaster.client.stream import Reply
from chunkmaster.core.model import Task

Key = tuple[int, int]  # (task id, epoch): one dispatch of a task


def buffer_rng(seed: int, pass_id: int, trainer: str) -> random.Random:
    """The draw of one trainer in one pass."""
    h = hashlib.blake2b(f"{seed}\0{pass_id}\0{trainer}".encode(), digest_size=16)
    return random.Random(int.from_bytes(h.digest(), "little"))


@dataclass(slots=True)
class _Marks:
    """Which records of one dispatch are here: all from `low` on, except those in `out`."""

    low: int
    count: int = 0
    out: set[int] = field(default_factory=set)


class ShuffleBuffer:
    """At most `size` records, each with its task dispatch and index in the task."""

    def __init__(self, size: int, rng: random.Random) -> None:
        if size < 1:
            raise ValueError(f"a shuffle buffer holds at least 1 record, not {size}")
        self.size = size
        self._rng = rng
        self._items: list[tuple[bytes, Key, int]] = []  # record, its dispatch, its index
        self._marks: dict[Key, _Marks] = {}
        self._deferred: dict[Key, Task] = {}  # finished at the source, records still here

    def __len__(self) -> int:
        return len(self._items)

    @property
    def room(self) -> int:
        return self.size - len(self._items)

    def add(self, records: list[bytes], key: Key, first: int) -> None:
        """Records `first`.. of dispatch `key` (a dispatch's records come in index order)."""
        if not records:
            return
        marks = self._marks.get(key)
        if marks is None:
            marks = self._marks[key] = _Marks(first)
        marks.count += len(records)
        self._items += zip(records, repeat(key), count(first))

    def clear(self) -> None:
        """Drop every record and deferred finish (their tasks went to other trainers)."""
        self._items.clear()
        self._marks.clear()
        self._deferred.clear()

    def draw(self, most: int) -> list[tuple[bytes, Key, int]]:
        """Up to `most` records drawn at random, with their dispatches and indexes, to give
        to `handed` once the trainer has them all."""
        items = self._items
        rand = self._rng.random
        out = []
        for _ in range(min(most, len(items))):
            last = items.pop()
            j = int(rand() * (len(items) + 1))
            if j < len(items):
                items[j], last = last, items[j]
            out.append(last)
        return out

    def handed(self, drawn: list[tuple[bytes, Key, int]]) -> None:
        """The trainer has these drawn records: they are no longer here."""
        for _, key, index in drawn:
            marks = self._marks[key]
            marks.count -= 1
            if marks.count == 0:
                del self._marks[key]
            elif index == marks.low:
                low, out = index + 1, marks.out
                while low in out:
                    out.remove(low)
                    low += 1
                marks.low = low
            else:
                marks.out.add(index)

    def pop(self) -> tuple[bytes, Key]:
        """One record drawn and handed out at once."""
        drawn = self.draw(1)
        self.handed(drawn)
        return drawn[0][0], drawn[0][1]

    def oldest(self, task_id: int, epoch: int) -> int | None:
        """The index of the dispatch's oldest record here (None: none is here)."""
        marks = self._marks.get((task_id, epoch))
        return None if marks is None else marks.low

    def defer(self, task: Task) -> None:
        """The task's last record was read: hold its finish until its records are out."""
        self._deferred[(task.meta.id, task.meta.epoch)] = task

    def releasable(self, reading: Key | None) -> list[Task]:
        """Deferred tasks with no record here, but for the one still being read."""
        out = [
            task
            for key, task in self._deferred.items()
            if key not in self._marks and key != reading
        ]
        for task in out:
            del self._deferred[(task.meta.id, task.meta.epoch)]
        return out

    @property
    def deferred(self) -> int:
        return len(self._deferred)


class DeferredFinishes:
    """The pass buffer's reports with a shuffle buffer: finishes wait for the buffer to hand
    out the task's records (`ShuffleBuffer.releasable`), failures go at once."""

    def __init__(self, inner: ReportSink, buffer: ShuffleBuffer) -> None:
        self.inner = inner
        self.buffer = buffer

    def finished(self, task: Task, *, last: bool = False) -> None:
        self.buffer.defer(task)  # reported when its last record leaves the buffer

    def failed(self, task: Task, reason: str) -> None:
        self.inner.failed(task, reason)

    def settle(self, wake: Callable[[], None]) -> Reply | None:
        """What was reported so far (finishes still deferred here are not)."""
        return self.inner.settle(wake)

"""One pass read through a shuffle buffer (shuffle_buffer.py): the buffer is filled from the
pass reader's runs and hands out its records in a random order.

When no task comes for FILL_WAIT seconds (the end of the pass, whose last tasks may be the ones
this buffer holds), it hands out what it holds without waiting until a task comes again. A task
is done with once its last record is handed out: this loop tells the pace, the reports and
`on_task_done`. A session found lost empties the buffer (those tasks went to other trainers).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from chunkmaster.client.errors import EndOfPass
from chunkmaster.client.pass_reader import PassHost, PassReader, PassReplaced
from chunkmaster.client.shuffle_buffer import DeferredFinishes, Key
from chunkmaster.core.model import Task

FILL_WAIT = 0.1  # seconds a shuffle buffer waits for a task before it hands out what it holds
SHUFFLE_BATCH = 64  # records a shuffle buffer draws per turn of the lock


@dataclass(slots=True)
class _Filling:
    """Where the filling of a shuffle buffer stands: the run it is reading from (the task's
    key, the index of its next record), and whether the pass ended or ran dry for now."""

    reading: Iterator[Any] | None = None
    key: Key | None = None
    index: int = 0
    ended: bool = False
    starving: bool = False


class ShuffledPass:
    """The records of `reader`'s pass drawn through the shuffle buffer whose finishes
    `deferred` holds back until they are released to the client's reports (see the module's
    text); positions are clipped at the oldest record still buffered."""

    def __init__(self, reader: PassReader, deferred: DeferredFinishes, host: PassHost) -> None:
        self._reader = reader
        self._buf = deferred.buffer
        self._reports = deferred.inner
        self._progress = reader.progress
        self._host = host
        self._fill = _Filling()

    def records(self) -> Generator[Any, None, None]:
        reader, buf, fill = self._reader, self._buf, self._fill
        with reader.cond:
            self._progress.clip = buf.oldest
        losses = reader.losses
        finished = False
        batch: list[tuple[Any, Key, int]] = []
        try:
            while True:
                released: list[Task] = []
                with reader.cond:
                    buf.handed(batch)  # the previous batch: the trainer has taken it all
                    batch = []
                    if losses != reader.losses:  # those tasks went to other trainers
                        losses = reader.losses
                        buf.clear()
                        fill.reading = fill.key = None
                    if (buf or fill.reading is not None) and not reader.lease_ok():
                        reader.check_current()
                        reader.cond.wait()
                        continue
                    self._refill()
                    batch = buf.draw(SHUFFLE_BATCH)
                    if buf.deferred:
                        released = self._released()
                self._host.tasks_done(released)
                if batch:
                    for record, _, _ in batch:
                        yield record
                elif fill.ended and not buf.deferred:
                    finished = True
                    return
        except PassReplaced as replaced:
            replaced.log()
        finally:
            with reader.cond:
                if self._progress.clip == buf.oldest:
                    self._progress.clip = None
            reader.leave(finished)

    def _released(self) -> list[Task]:
        """The deferred tasks whose last record was handed out: done with (lock held)."""
        fill = self._fill
        released = self._buf.releasable(None if fill.reading is None else fill.key)
        for task in released:
            self._reader.buffer.task_done()
            self._reports.finished(task)
        return released

    def _refill(self) -> None:
        """Fill the buffer from the pass's runs (lock held) until it is full, no task comes
        within FILL_WAIT while it holds records, or the pass ended. Raises PassReplaced."""
        buf, fill = self._buf, self._fill
        self._reader.check_current()
        while not fill.ended and buf.room:
            if fill.reading is not None:
                room = buf.room
                got = list(itertools.islice(fill.reading, room))
                assert fill.key is not None
                buf.add(got, fill.key, fill.index)
                fill.index += len(got)
                if len(got) == room:
                    continue
                fill.reading = fill.key = None
            if not buf and not buf.deferred:
                deadline: float | None = None  # nothing to hand out: wait
            elif buf and not fill.starving:
                deadline = time.monotonic() + FILL_WAIT
            else:
                deadline = 0.0  # hand out what it holds, without waiting
            try:
                run = self._reader.take([], deadline)  # the buffer says when a task is done
            except EndOfPass:
                fill.ended = True
                break
            if run is None:
                fill.starving = bool(buf)
                break
            fill.starving = False
            fill.reading, fill.index = run.records, run.first
            fill.key = (run.task.meta.id, run.task.meta.epoch)

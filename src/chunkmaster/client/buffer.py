"""One pass's buffer: the tasks the fetcher got, and the runs of records the trainer takes.

The fetcher adds tasks; the trainer's thread takes runs of records from them, reading each
chunk when it reaches it (`chunks.ChunkReader`), as a direct scan does: the data is never
handed between threads, only tasks are. A task's last record is a run of its own that carries
the task, so "finished" is reported when the trainer takes that record [D10]. Everything here
is guarded by the client's lock (`cond`), which the methods below take or expect held.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

from chunkmaster.client.chunks import ChunkReader
from chunkmaster.client.errors import EndOfPass, TaskReadError
from chunkmaster.client.link import Cancelled, CancelToken
from chunkmaster.client.reporter import Reporter
from chunkmaster.core.model import Task
from chunkmaster.recordio.errors import RecordIOError

log = logging.getLogger("chunkmaster.client")


class Run(NamedTuple):
    """Records handed to the trainer in one piece; `finishes` is the task whose last it holds."""

    records: Iterator[bytes]
    finishes: Task | None


class PassBuffer:
    """Tasks of one pass not yet read to their end, and the pass's outcome once known."""

    def __init__(
        self, pass_id: int, cond: threading.Condition, reporter: Reporter, parent: CancelToken
    ) -> None:
        self.pass_id = pass_id
        self.cancel = CancelToken(parent)
        self._cond = cond
        self._reporter = reporter
        self._reader = ChunkReader()
        self._tasks: deque[Task] = deque()
        self.held: dict[int, Task] = {}  # taken from the master, neither finished nor failed
        self.end: BaseException | None = None  # raised once the tasks are used up
        self._task: Task | None = None  # being read
        self._next_chunk = 0
        self._tail: Run | None = None  # the last record of the task just read

    # ---- the fetcher's side (takes the lock) ----------------------------------------------

    def wait_slot(self, limit: int) -> None:
        """Wait until fewer than `limit` tasks are held: the master's timeout runs for each."""
        with self._cond:
            while len(self.held) >= limit and not self.cancel.cancelled:
                self._cond.wait()
        self.cancel.check()

    def add_task(self, task: Task) -> None:
        with self._cond:
            if self.cancel.cancelled:
                raise Cancelled()  # abandoned meanwhile; the task comes back after its timeout
            self.held[task.meta.id] = task
            self._tasks.append(task)
            self._cond.notify_all()

    def finish(self, end: BaseException) -> None:
        """The pass is over (EndOfPass) or cannot go on (the error the trainer gets)."""
        with self._cond:
            if self.end is None and not self.cancel.cancelled:
                self.end = end
                self._cond.notify_all()

    # ---- the trainer's side (lock held) -----------------------------------------------------

    def next_run(self, done: list[Task]) -> Run | None:
        """The next run of records, reading the next chunk if need be; None if none is here yet.

        Tasks whose last record this hands out are appended to `done` (and reported finished).
        A chunk that cannot be read is reported failed and raised as TaskReadError.
        """
        while True:
            if self._tail is not None:
                run, self._tail = self._tail, None
                if run.finishes is not None:
                    self._taken(run.finishes, done)
                return run
            task = self._task
            if task is None:
                if not self._tasks:
                    return None
                task = self._task = self._tasks.popleft()
                self._next_chunk = 0
            chunks = task.chunks
            if self._next_chunk == len(chunks):  # an empty task
                self._task = None
                self._taken(task, done)
                continue
            chunk = chunks[self._next_chunk]
            self._next_chunk += 1
            try:
                loaded = self._reader.load(chunk.path, chunk.offset, chunk.num_records)
            except (RecordIOError, OSError) as exc:
                self._task = None
                self.held.pop(task.meta.id, None)
                self._cond.notify_all()  # a slot for the fetcher
                err = TaskReadError(task, chunk, exc)
                log.error("%s; reporting the task failed", err)
                self._reporter.failed(task, err.reason)
                raise err from None
            n = loaded.count
            if self._next_chunk < len(chunks):
                if n:
                    return Run(loaded.head(n), None)
                continue
            self._task = None
            if not n:
                self._taken(task, done)
                continue
            self._tail = Run(iter((loaded.last(),)), task)
            if n > 1:
                return Run(loaded.head(n - 1), None)

    def _taken(self, task: Task, done: list[Task]) -> None:
        """The trainer took the task's last record: report it finished."""
        self.held.pop(task.meta.id, None)
        self._cond.notify_all()  # a slot for the fetcher
        self._reporter.finished(task)
        done.append(task)

    def abandon(self, why: str) -> None:
        """Stop the pass's fetcher and drop what it fetched (lock held)."""
        self.cancel.cancel()
        if self.end is None:
            log.info(
                "pass %d abandoned (%s)%s",
                self.pass_id,
                why,
                (
                    f"; tasks {sorted(self.held)} not reported finished, the master hands them "
                    "out again after its timeout"
                )
                if self.held
                else "",
            )
            self.end = EndOfPass(self.pass_id)
        self._tasks.clear()
        self.held.clear()
        self._task = None
        self._tail = None
        self._cond.notify_all()

"""One pass's buffer: the tasks the fetcher got, and the runs of records the trainer takes.

The fetcher adds tasks; the trainer's thread takes runs of records from them, reading each
chunk when it reaches it through the loader of the task's format (chunkmaster.formats), as a
direct scan does: the data is never handed between threads, only tasks are. A task's last
record is a run of its own that carries the task, so "finished" is reported when the trainer
takes that record [D10]. Everything here is guarded by the client's lock (`cond`), which the
methods below take or expect held.

A task handed out again starts at `task.start`: the chunks before it are skipped without being
read, and the first records of the chunk it starts in are dropped. A piece of a task (`task.end`
set, equal steps) comes with the chunks up to its end, and stops at `task.end` in the last.
Runs are cut at most `run_limit` records long, and each run is noted in `Progress`
(progress.py), whose positions come from the runs' own iterators.

With `batches` (columnar formats: Parquet), a run is one Arrow record batch, the rest of a
chunk's rows in one piece; taking it takes all its rows, for progress and commits alike.

With `readahead` (client/readahead.py), a task's chunks in an object store are fetched as the
task arrives, and the loader gets their bytes.

With `fence` (a session's `lease_ok`), no run is handed out while it says no: the trainer's
lease may have run out, and its tasks be someone else's (`fenced` tells the caller to wait
rather than end the pass). A session found lost drops every task it held (`drop_held`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from chunkmaster.client.errors import EndOfPass, TaskReadError
from chunkmaster.client.link import Cancelled, CancelToken
from chunkmaster.client.pace import Pace
from chunkmaster.client.progress import Progress
from chunkmaster.client.readahead import ReadAhead
from chunkmaster.client.reading import READ_ERRORS, chunk_loader, start_point
from chunkmaster.client.reporter import Reports, Settling
from chunkmaster.core.model import Task
from chunkmaster.formats import ChunkLoader, Loaded, Storage
from chunkmaster.formats.changed import check_chunk_file
from chunkmaster.formats.storage import storage_for
from chunkmaster.inflate import DEFAULT_MAX_INFLATED

log = logging.getLogger("chunkmaster.client")


class Run(NamedTuple):
    """Records handed to the trainer in one piece; `finishes` is the task whose last it holds.
    They are records `first`.. of `task` (counted from its first record)."""

    records: Iterator[Any]
    finishes: Task | None
    task: Task
    first: int


class PassBuffer:
    """Tasks of one pass not yet read to their end, and the pass's outcome once known.

    `returns_tasks`: the tasks it holds when abandoned go back to the master by the session's
    Goodbye (else after the master's timeout). `report_now` is called (lock held) when enough
    records were consumed since the last progress report. `columns`: the columns to read
    (columnar formats only); `batches`: runs are whole record batches. `storage`: where a
    chunk's file is read from, by its path. `max_inflated`: what one chunk may decompress to
    (a chunk that would inflate to more fails as unreadable, chunkmaster.inflate). `pace`
    learns the trainer's time over a task (client/pace.py): from one task done with to the
    next (`task_done`: the take of its last record, unless `paced_by_take` is false), less
    the time the trainer waited for the master holding no task (`wait`).
    """

    def __init__(
        self,
        pass_id: int,
        cond: threading.Condition,
        reporter: Reports,
        parent: CancelToken,
        progress: Progress,
        *,
        run_limit: int = 0,
        report_now: Callable[[], None] | None = None,
        returns_tasks: bool = False,
        columns: Sequence[str] | None = None,
        batches: bool = False,
        storage: Callable[[str], Storage] = storage_for,
        readahead: ReadAhead | None = None,
        max_inflated: int = DEFAULT_MAX_INFLATED,
        fence: Callable[[], bool] | None = None,
        generation: Callable[[], int] | None = None,
        pace: Pace | None = None,
        paced_by_take: bool = True,
    ) -> None:
        self.pass_id = pass_id
        self._fence = fence
        self._generation = generation  # the session's, which a task must have come in
        self.fenced = False  # the last next_run handed out nothing because of the fence
        self.cancel = CancelToken(parent)
        self._cond = cond
        self._reporter = reporter
        self._progress = progress
        self._run_limit = run_limit  # 0: a chunk's records in one run
        self._report_now = report_now
        self._returns_tasks = returns_tasks
        self._columns = None if columns is None else list(columns)
        self._batches = batches
        self._storage = storage
        self._ahead = readahead  # fetches the byte ranges of the tasks' chunks ahead
        self._max_inflated = max_inflated  # what one chunk may decompress to
        self._loaders: dict[str, ChunkLoader] = {}  # format -> this pass's loader of it
        self._tasks: deque[Task] = deque()
        self.held: dict[int, Task] = {}  # taken from the master, neither finished nor failed
        self.got_task = False  # a task of the pass came: the trainer took part in it
        #: The trainer read the pass before this one to its end: finding this one over before
        #: any task came means the others were faster, not that it asked for a finished pass.
        self.joined = False
        self.end: BaseException | None = None  # raised once the tasks are used up
        self._task: Task | None = None  # being read
        self._next_chunk = 0  # the next chunk of `_task` to load
        self._chunk_first = 0  # the loaded chunk's first record, counted in the task
        self._skip = 0  # records to drop at the start of the next chunk loaded
        self._loaded: Loaded | None = None
        self._at = 0  # the loaded chunk's next record
        self._after_suspect = False  # the last task taken had failures: settle before the next
        self._settling: Settling | None = None  # finishes being applied before a task begins
        self._room_wanted = -1  # the fetcher waits until at most this many are held (-1: not)
        self._pace = pace  # learns how long the trainer takes over a task
        #: Whether taking a task's last record is the trainer being done with it (not with a
        #: shuffle buffer, which calls task_done() itself: its records are handed out later).
        self._paced_by_take = paced_by_take
        self._done_at = 0.0  # when the trainer was last done with a task (time.monotonic())
        self.starved = 0.0  # seconds it waited since, holding no task

    # ---- the fetcher's side (takes the lock) ----------------------------------------------

    def wait_free(self, limit: int, want: int) -> int:
        """Wait until `want` of `limit` slots are free (a held task takes one: the master's
        timeout runs for each); how many are free. The trainer wakes this thread only once
        that many are free, not at every task it takes."""
        with self._cond:
            self._room_wanted = limit - want
            try:
                while len(self.held) > self._room_wanted and not self.cancel.cancelled:
                    self._cond.wait()
            finally:
                self._room_wanted = -1
            free = limit - len(self.held)
        self.cancel.check()
        return free

    def add_tasks(self, tasks: Sequence[Task], generation: int | None = None) -> None:
        """Hold `tasks` and read them in turn (one turn of the lock, one wake-up for them
        all); raises Cancelled if the pass was abandoned meanwhile (none is held then)."""
        with self._cond:
            if self.cancel.cancelled:
                raise Cancelled()
            for task in tasks:
                self._hold(task, generation)
            self._cond.notify_all()

    def add_task_locked(self, task: Task, generation: int | None = None) -> None:
        """Hold `task` and read it in turn (lock held); raises Cancelled if the pass was
        abandoned."""
        if self.cancel.cancelled:
            raise Cancelled()  # abandoned meanwhile
        self._hold(task, generation)
        self._cond.notify_all()

    def _hold(self, task: Task, generation: int | None) -> None:
        """Hold `task`; not if it came in a session (`generation`) that was found lost since:
        the master handed it to another trainer."""
        current = self._generation
        if generation is not None and current is not None and generation != current():
            log.info("task %d came in a session since lost: not read", task.meta.id)
            return
        self.held[task.meta.id] = task
        self.got_task = True
        self._progress.add(task)
        self._tasks.append(task)
        if self._ahead is not None:
            self._ahead.want(task)

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
        holding = self._task is not None or bool(self._tasks)
        self.fenced = holding and self._fence is not None and not self._fence()
        if self.fenced:
            return None
        while True:
            task = self._task
            loaded = self._loaded
            if task is not None and loaded is not None:
                n = loaded.count
                last_chunk = self._next_chunk == len(task.chunks)
                if last_chunk and task.end:  # a piece stops at its end
                    n = max(0, min(n, task.end - self._chunk_first))
                a = self._at
                if self._batches:  # the rest of the chunk, whole; the last one carries the task
                    self._loaded = None
                    if last_chunk:
                        self._task = None
                    run = (
                        self._run(task, loaded, a, n, task if last_chunk else None, done)
                        if a < n
                        else None
                    )
                    if not last_chunk:
                        self._chunk_first += task.chunks[self._next_chunk - 1].num_records
                    elif run is None:
                        self._taken(task, done)  # an empty last chunk
                    if run is not None:
                        return run
                    continue
                stop = n - 1 if last_chunk else n  # a task's last record is a run of its own
                if a < stop:
                    b = stop if not self._run_limit else min(stop, a + self._run_limit)
                    self._at = b
                    return self._run(task, loaded, a, b, None)
                self._loaded = None
                if not last_chunk:
                    self._chunk_first += task.chunks[self._next_chunk - 1].num_records
                    continue
                self._task = None
                if a < n:
                    self._at = n
                    return self._run(task, loaded, a, n, task, done)
                self._taken(task, done)  # an empty last chunk
                continue
            if task is None:
                if not self._tasks:
                    return None
                if (self._tasks[0].failures or self._after_suspect) and not self._settled():
                    return None  # the master is applying our finishes: the settle wakes us
                task = self._task = self._tasks.popleft()
                self._skip_to_start(task)
            chunks = task.chunks
            if self._next_chunk == len(chunks):  # nothing left to read: an empty task, or
                self._task = None  # a task handed out again at its end
                self._progress.stop_reading()
                self._taken(task, done)
                continue
            ahead = self._ahead
            if ahead is not None and self.end is None and not ahead.ready(task, self._next_chunk):
                return None  # its bytes are on the way: the client waits, the read-ahead wakes it
            loaded = self._loaded = self._load_next_chunk(task)
            self._at = min(self._skip, loaded.count)
            self._skip = 0

    def _load_next_chunk(self, task: Task) -> Loaded:
        """The task's next chunk, read (lock held). One that cannot be read drops the task,
        is reported failed and raised as TaskReadError."""
        chunk = task.chunks[self._next_chunk]
        self._next_chunk += 1
        ahead = self._ahead
        try:
            loader = self._loaders.get(task.format) or self._loader(task.format, chunk.path)
            data = None if ahead is None else ahead.take(task, self._next_chunk - 1)
            storage = self._storage(chunk.path)
            check_chunk_file(chunk, storage)
            return loader.load(chunk, storage, data)
        except READ_ERRORS as exc:
            if ahead is not None:
                ahead.drop(task)
            self._task = None
            self.held.pop(task.meta.id, None)
            self._progress.dropped(task)
            self._cond.notify_all()  # a slot for the fetcher
            err = TaskReadError(task, chunk, exc)
            log.error("%s; reporting the task failed", err)
            self._reporter.failed(task, err.reason)
            raise err from None

    def task_done(self) -> None:
        """The trainer is done with a task (lock held): the time since the one before, less
        what it waited for the master meanwhile, is its time over a task (`pace`)."""
        now = time.monotonic()
        if self._pace is not None and self._done_at:
            self._pace.task_took(now - self._done_at - self.starved)
        self._done_at = now
        self.starved = 0.0

    def wait(self, timeout: float | None) -> bool:
        """Wait on the client's condition (lock held) for a run, the pass's end or `timeout`;
        the time the trainer waits holding no task is not counted as its time over a task."""
        if self._task is not None or self._tasks:
            return self._cond.wait(timeout)
        t0 = time.monotonic()
        try:
            return self._cond.wait(timeout)
        finally:
            self.starved += time.monotonic() - t0

    def _room(self) -> None:
        """A held task is done with: wake the fetcher if it waits for that much room."""
        if self._room_wanted >= 0 and len(self.held) <= self._room_wanted:
            self._cond.notify_all()

    def _settled(self) -> bool:
        """Whether the master has applied this trainer's finishes (asking it, the first time).

        Around a task that failed before (it comes with `failures`), so that if this trainer
        dies reading it the master charges that task, not one finished a moment earlier whose
        finish had not reached it (docs/failures.md). Rare: only after failures."""
        settling = self._settling
        if settling is None:
            settling = self._settling = self._reporter.settle(self._wake)
            if settling is None:
                self._after_suspect = False
                return True
        if not settling.done:
            return False
        self._settling = None
        self._after_suspect = False
        return True

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _loader(self, name: str, path: str) -> ChunkLoader:
        """This pass's loader of format `name`, made on its first chunk (`path`)."""
        loader = chunk_loader(name, path, self._columns, self._batches, self._max_inflated)
        self._loaders[name] = loader
        return loader

    def _skip_to_start(self, task: Task) -> None:
        """Skip the chunks wholly before `task.start` (unread); drop the rest in the next."""
        self._next_chunk, self._chunk_first, self._skip = start_point(task)
        self._loaded = None

    def _run(
        self,
        task: Task,
        loaded: Loaded,
        a: int,
        b: int,
        finishes: Task | None,
        done: list[Task] | None = None,
    ) -> Run:
        if self._batches:
            records, ends = loaded.batch(a, b)  # type: ignore[attr-defined]  # columnar only
        else:
            records, ends = loaded.cut(a, b)
        due = self._progress.run_started(task, self._chunk_first + a, b - a, ends)
        if due and self._report_now is not None:
            self._report_now()
        if finishes is not None:
            assert done is not None
            self._taken(finishes, done)
        return Run(records, finishes, task, self._chunk_first + a)

    def _taken(self, task: Task, done: list[Task]) -> None:
        """The trainer took the task's last record: report it finished."""
        self.held.pop(task.meta.id, None)
        self._progress.finished(task)
        if task.failures:
            self._after_suspect = True
        if self._paced_by_take:
            self.task_done()
        self._room()
        self._reporter.finished(task, last=not self.held)
        done.append(task)

    def drop_held(self) -> list[Task]:
        """The session that holds these tasks ended on the master (lock held): they went to
        other trainers. Drop them unread; the pass goes on with the next session's tasks.
        The tasks dropped."""
        dropped = list(self.held.values())
        if self._ahead is not None:
            for task in dropped:
                self._ahead.drop(task)
        self._tasks.clear()
        self.held.clear()
        self._task = None
        self._loaded = None
        self._progress.stop_reading()
        self._cond.notify_all()  # slots for the fetcher
        return dropped

    def abandon(self, why: str) -> None:
        """Stop the pass's fetcher and drop what it fetched (lock held)."""
        self.cancel.cancel()
        if self.end is None:
            back = (
                "handed back at their positions"
                if self._returns_tasks
                else "the master hands them out again after its timeout"
            )
            log.info(
                "pass %d abandoned (%s)%s",
                self.pass_id,
                why,
                f"; tasks {sorted(self.held)} not reported finished, {back}" if self.held else "",
            )
            self.end = EndOfPass(self.pass_id)
        self._progress.stop_reading()
        if self._ahead is not None:
            self._ahead.cancel()
        self._tasks.clear()
        self.held.clear()
        self._task = None
        self._loaded = None
        self._cond.notify_all()

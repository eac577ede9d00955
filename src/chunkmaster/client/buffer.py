"""One pass's buffer: the tasks the fetcher got, and the runs of records the trainer takes.

The fetcher adds tasks; the trainer's thread takes runs of records from them, reading each
chunk when it reaches it through the loader of the task's format (chunkmaster.formats), as a
direct scan does: the data is never handed between threads, only tasks are. A task's last
record is a run of its own that carries the task, so "finished" is reported when the trainer
takes that record. Everything here is guarded by the client's lock (`cond`), which the
methods below take or expect held.

The chunks of a task are walked by reading.py's `TaskWalk` (from `task.start` to a piece's
`task.end`), and cut here into runs: at most `run_limit` records long, each noted in
`PositionTracker` (progress.py), whose positions come from the runs' own iterators.

With `batches` (columnar formats: Parquet), a run is one Arrow record batch, the rest of a
chunk's rows in one piece; taking it takes all its rows, for progress and commits alike.

With `readahead` (client/readahead.py), a task's chunks in an object store are fetched as the
task arrives, and the loader gets their bytes.

With a session (`BufferSetup.lease`), no run is handed out while its lease is in doubt: the
trainer's lease may have run out, and its tasks be someone else's (`fenced` tells the caller to
wait rather than end the pass). A session found lost drops every task it held (`drop_held`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from chunkmaster.client.errors import EndOfPass, TaskReadError
from chunkmaster.client.link import Cancelled, CancelToken
from chunkmaster.client.pace import Pace
from chunkmaster.client.progress import PositionTracker
from chunkmaster.client.readahead import ReadAhead
from chunkmaster.client.reading import Span, TaskReader, Walk
from chunkmaster.client.reporter import ReportSink
from chunkmaster.client.stream import Reply
from chunkmaster.core.model import Task

log = logging.getLogger("chunkmaster.client")


class Run(NamedTuple):
    """Records handed to the trainer in one piece; `finishes` is the task whose last it holds.
    They are records `first`.. of `task` (counted from its first record)."""

    records: Iterator[Any]
    finishes: Task | None
    task: Task
    first: int


class Lease(Protocol):
    """What a pass buffer asks of the trainer's session (session.py's TrainerSession)."""

    @property
    def generation(self) -> int:
        """Sessions found lost so far: a task must come in the current one."""

    def lease_ok(self) -> bool: ...

    def report_now(self) -> None: ...


@dataclass(frozen=True)
class BufferSetup:
    """What every pass buffer of one client shares. `cond`: the client's condition, guarding
    everything here. `run_limit`: runs are cut at most this many records long (0: a chunk's
    records in one run). `lease`: the session, if any: no run is handed out while its lease is
    in doubt, tasks of a lost session are refused, progress is reported when due, and the
    tasks held when the pass is abandoned go back by its Goodbye (else after the master's
    timeout). `readahead`: fetches the byte ranges of the tasks' chunks ahead. `pace` learns
    the trainer's time over a task (client/pace.py)."""

    cond: threading.Condition
    progress: PositionTracker
    parent: CancelToken
    pace: Pace
    run_limit: int = 0
    lease: Lease | None = None
    readahead: ReadAhead | None = None


class PassBuffer:
    """Tasks of one pass not yet read to their end, and the pass's outcome once known.

    `reporter` gets the finishes and failures. `reader` reads the tasks' chunks (its columns,
    whole record batches or not). The pace's time over a task runs from one task done with
    to the next (`task_done`: the take of its last record, unless `paced_by_take` is false),
    less the time the trainer waited for the master holding no task (`wait`).
    """

    def __init__(
        self,
        pass_id: int,
        setup: BufferSetup,
        reporter: ReportSink,
        reader: TaskReader,
        *,
        batches: bool = False,
        paced_by_take: bool = True,
    ) -> None:
        self.pass_id = pass_id
        self._lease = setup.lease
        self.fenced = False  # the last next_run handed out nothing because of the lease
        self.cancel = CancelToken(setup.parent)
        self._cond = setup.cond
        self._reporter = reporter
        self._progress = setup.progress
        self._run_limit = setup.run_limit
        self._batches = batches
        self._reader = reader
        self._ahead = setup.readahead
        self._tasks: deque[Task] = deque()
        self.held: dict[int, Task] = {}  # taken from the master, neither finished nor failed
        self.got_task = False  # a task of the pass came: the trainer took part in it
        #: The trainer read the pass before this one to its end: finding this one over before
        #: any task came means the others were faster, not that it asked for a finished pass.
        self.joined = False
        self.end: BaseException | None = None  # raised once the tasks are used up
        self._walk: Walk | None = None  # the task being read
        self._span: Span | None = None  # its chunk being read
        self._at = 0  # the span's next record
        self._after_suspect = False  # the last task taken had failures: settle before the next
        self._settling: Reply | None = None  # finishes being applied before a task begins
        self._room_wanted = -1  # the fetcher waits until at most this many are held (-1: not)
        self._pace = setup.pace
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
        lease = self._lease
        if generation is not None and lease is not None and generation != lease.generation:
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
        holding = self._walk is not None or bool(self._tasks)
        self.fenced = holding and self._lease is not None and not self._lease.lease_ok()
        if self.fenced:
            return None
        while True:
            if self._span is not None:
                run = self._cut(self._span, done)
                if run is not None:
                    return run
                continue
            walk = self._walk
            if walk is None:
                if not self._tasks:
                    return None
                if (self._tasks[0].failures or self._after_suspect) and not self._settled():
                    return None  # the master is applying our finishes: the settle wakes us
                walk = self._walk = self._reader.walk(self._tasks.popleft())
            if walk.done:  # nothing (left) to read: an empty task or last chunk, or a task
                self._walk = None  # handed out again at its end
                self._progress.stop_reading()
                self._taken(walk.task, done)
                continue
            ahead = self._ahead
            if ahead is not None and self.end is None and not ahead.ready(walk.task, walk.index):
                return None  # its bytes are on the way: the client waits, the read-ahead wakes it
            self._span = self._load(walk)
            self._at = self._span.start

    def _cut(self, span: Span, done: list[Task]) -> Run | None:
        """The next run of the chunk being read; None once it is used up. A task's last
        record is a run of its own, which carries the task; with `batches`, a run is the rest
        of the chunk, whole."""
        assert self._walk is not None
        task, a = self._walk.task, self._at
        if self._batches:
            self._span = None
            if a >= span.stop:
                return None
            if span.last:
                self._walk = None
            return self._run(task, span, a, span.stop, span.last, done)
        stop = span.stop - 1 if span.last else span.stop
        if a < stop:
            b = stop if not self._run_limit else min(stop, a + self._run_limit)
            self._at = b
            return self._run(task, span, a, b, False, done)
        self._span = None
        if not span.last or a >= span.stop:
            return None
        self._at = span.stop
        self._walk = None
        return self._run(task, span, a, span.stop, True, done)

    def _load(self, walk: Walk) -> Span:
        """The task's next chunk, read (lock held). One that cannot be read drops the task,
        is reported failed and raised as TaskReadError."""
        try:
            return next(walk)
        except TaskReadError as err:
            task = walk.task
            if self._ahead is not None:
                self._ahead.drop(task)
            self._walk = None
            self.held.pop(task.meta.id, None)
            self._progress.dropped(task)
            self._cond.notify_all()  # a slot for the fetcher
            log.error("%s; reporting the task failed", err)
            self._reporter.failed(task, err.reason)
            raise

    def task_done(self) -> None:
        """The trainer is done with a task (lock held): the time since the one before, less
        what it waited for the master meanwhile, is its time over a task (`pace`)."""
        now = time.monotonic()
        if self._done_at:
            self._pace.task_took(now - self._done_at - self.starved)
        self._done_at = now
        self.starved = 0.0

    def wait(self, timeout: float | None) -> bool:
        """Wait on the client's condition (lock held) for a run, the pass's end or `timeout`;
        the time the trainer waits holding no task is not counted as its time over a task."""
        if self._walk is not None or self._tasks:
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

    def _run(self, task: Task, span: Span, a: int, b: int, last: bool, done: list[Task]) -> Run:
        """Records a..b-1 of the chunk being read, noted in the progress; `last`: the task's
        last record is among them, which finishes it."""
        if self._batches:
            records, ends = span.loaded.batch(a, b)  # type: ignore[attr-defined]  # columnar
        else:
            records, ends = span.loaded.cut(a, b)
        due = self._progress.run_started(task, span.first + a, b - a, ends)
        if due and self._lease is not None:
            self._lease.report_now()
        if last:
            self._taken(task, done)
        return Run(records, task if last else None, task, span.first + a)

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
        self._drop_all()
        return dropped

    def abandon(self, why: str) -> None:
        """Stop the pass's fetcher and drop what it fetched (lock held)."""
        self.cancel.cancel()
        if self.end is None:
            back = (
                "handed back at their positions"
                if self._lease is not None
                else "the master hands them out again after its timeout"
            )
            log.info(
                "pass %d abandoned (%s)%s",
                self.pass_id,
                why,
                f"; tasks {sorted(self.held)} not reported finished, {back}" if self.held else "",
            )
            self.end = EndOfPass(self.pass_id)
        if self._ahead is not None:
            self._ahead.cancel()
        self._drop_all()

    def _drop_all(self) -> None:
        """Nothing is held or read any more (lock held)."""
        self._progress.stop_reading()
        self._tasks.clear()
        self.held.clear()
        self._walk = None
        self._span = None
        self._cond.notify_all()  # slots for the fetcher

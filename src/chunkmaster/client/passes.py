"""The client's reading side: one pass at a time, read by a `PassReader` (pass_reader.py:
next_record(), records(), batches(), the shuffle buffer of shuffled.py) or by readers outside
the client through a `PassFeed` (feed.py); and what the session tells about the tasks held.

Starting a pass abandons the one before: passes never mix. The abandoned tasks are not
reported finished: a session hands them back at their exact positions at once; without one
they come back after the master's timeout. Everything here is guarded by `cond`.

next_record()'s fast path is one step of the run it installed (`run_next`); the slow path
(`refill`) takes the next run under the lock.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from itertools import chain
from typing import Any, Final

from chunkmaster.client.buffer import BufferSetup
from chunkmaster.client.errors import ClientClosedError
from chunkmaster.client.feed import PassFeed
from chunkmaster.client.fetcher import TaskSource, UnaryTasks
from chunkmaster.client.files import OpenFiles
from chunkmaster.client.link import CancelToken, MasterLink
from chunkmaster.client.options import Reading, Session
from chunkmaster.client.pace import Pace
from chunkmaster.client.pass_reader import PassReader, PassReplaced, ReaderSetup
from chunkmaster.client.progress import PositionTracker
from chunkmaster.client.readahead import ReadAhead
from chunkmaster.client.reporter import Reporter, ReportSink
from chunkmaster.client.session import TrainerSession
from chunkmaster.client.shuffle_buffer import DeferredFinishes, ShuffleBuffer
from chunkmaster.client.shuffled import ShuffledPass
from chunkmaster.core.model import Position, Task
from chunkmaster.formats.base import Storage
from chunkmaster.formats.storage import storage_for
from chunkmaster.rpc import master_pb2 as pb

log = logging.getLogger("chunkmaster.client")

_EMPTY_ITER: Final[Iterator[Any]] = iter(())


class PassRecords(chain[Any]):
    """What records() returns: a chain of runs, closable like the generator it replaces."""

    _runs: Generator[Iterator[Any], None, None]

    def __new__(cls, runs: Generator[Iterator[Any], None, None]) -> PassRecords:
        self: PassRecords = cls.from_iterable(runs)  # type: ignore[assignment]
        self._runs = runs
        return self

    def close(self) -> None:
        """Stop reading the pass now (as leaving a for loop over it does)."""
        self._runs.close()


class Passes:
    """The passes of one client (see the module's text). `reading`: the client's reading
    options; `report_every`: records between progress reports, and the longest run;
    `on_task_done(task)` is called when the trainer takes a task's last record."""

    def __init__(
        self,
        reading: Reading,
        token: CancelToken,
        *,
        report_every: int,
        keep_finished: bool,
        on_task_done: Callable[[Task], None] | None,
    ) -> None:
        self.cond = threading.Condition(threading.Lock())
        held = None if reading.prefetch_tasks is None else 1 + reading.prefetch_tasks
        self.pace = Pace(2) if held is None else Pace(held, cap=held)  # tasks held (pace.py)
        self.progress = PositionTracker(report_every, keep_finished=keep_finished)
        self.files = OpenFiles()  # local files held open across chunks, closed at pass end
        #: Object stores with this trainer's own `storage_options` (never sent to the master).
        self.storage: Callable[[str], Storage] = functools.partial(
            storage_for, storage_options=dict(reading.storage_options or {}), local=self.files
        )
        self.readahead = (
            ReadAhead(
                self.storage,
                chunks=reading.read_ahead,
                budget=reading.read_ahead_bytes,
                on_ready=self.wake,
            )
            if reading.read_ahead
            else None
        )
        self._token = token
        self._report_every = report_every
        self._max_inflated = reading.max_inflated_bytes
        self._on_task_done = on_task_done
        self._setup: ReaderSetup | None = None
        self.session: TrainerSession | None = None
        self.reporter: Reporter | None = None
        self.reader: PassReader | None = None
        self._feed: PassFeed | None = None  # the pass read by outside readers
        self.run_iter: Iterator[Any] = _EMPTY_ITER  # the run next_record() reads
        self.run_next: Callable[[], Any] = _EMPTY_ITER.__next__
        self.fetchers: list[threading.Thread] = []
        self.closed = False
        #: The last pass this client read to its end. A trainer that starts late may find pass
        #: 0 over (the others were quicker to start): that is not asking for a finished pass.
        self._last_ended = -1

    def connect(
        self,
        link: MasterLink,
        sess: Session | None,
        *,
        worker: str,
        poll_wait: float,
        world: tuple[int, int],
        data_wait: Callable[[], pb.DataWait | None],
    ) -> None:
        """Where tasks come from and finishes go: the session's stream (it tells this what
        becomes of the tasks held), or (`sess` None) the unary calls and a Reporter thread.
        `world`: the trainer's (world size, rank); `data_wait`: what keep-alives report of
        the training loop's wait for data."""
        source: TaskSource
        reports: ReportSink
        if sess is not None:
            self.session = reports = source = TrainerSession(
                link,
                name=worker,
                report_every=self._report_every,
                report_interval=sess.report_interval,
                progress=self.report_positions,
                on_unclaimed=self.adopt,
                world_size=world[0],
                rank=world[1],
                data_wait=data_wait,
                on_lost=self.session_lost,
                on_alive=self.wake,
            )
        else:
            self.reporter = reports = Reporter(link, worker)
            source = UnaryTasks(link, worker)
        buffer = BufferSetup(
            self.cond,
            self.progress,
            self._token,
            self.pace,
            run_limit=self._report_every,
            lease=self.session,
            readahead=self.readahead,
        )
        self._setup = ReaderSetup(
            buffer,
            reports,
            source,
            worker,
            poll_wait,
            self.storage,
            self._max_inflated,
            host=self,
            startup=link.startup,
            on_unclaimed=None if self.session is None else self.adopt,
        )

    def wake(self) -> None:
        """Something the trainer's thread may wait for came (a chunk fetched ahead)."""
        with self.cond:
            self.cond.notify_all()

    # ---- what a pass reader asks (PassHost) -----------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise ClientClosedError("client is closed")

    def current_pass(self) -> int | None:
        return None if self.reader is None else self.reader.pass_id

    def pass_ended(self, reader: PassReader) -> None:
        """The trainer read `reader`'s pass to its end (lock held): its files are closed."""
        if not reader.cancelled:
            self._last_ended = max(self._last_ended, reader.pass_id)
        self.files.close()

    def abandon(self, reader: PassReader, why: str) -> None:
        """Cancel a pass's fetcher and drop its buffer; with a session, hand the pass's held
        tasks back at their exact positions now (closing, the Goodbye does). Lock held."""
        reader.buffer.abandon(why)
        self.files.close()
        self.run_iter = _EMPTY_ITER
        self.run_next = _EMPTY_ITER.__next__
        if self.session is not None and not self.closed:
            self.session.hand_back(self.progress.release(reader.pass_id))
        self.cond.notify_all()

    def tasks_done(self, done: list[Task]) -> None:
        """Tell `on_task_done` (the lock not held)."""
        if self._on_task_done is not None:
            for task in done:
                self._on_task_done(task)

    def take_installed(self) -> Iterator[Any] | None:
        """The run next_record() was reading, if any, now records()'s (lock held)."""
        run = self.run_iter
        if run is _EMPTY_ITER:
            return None
        self.run_iter = _EMPTY_ITER
        self.run_next = _EMPTY_ITER.__next__
        return run

    # ---- passes -------------------------------------------------------------------------

    def start(
        self,
        pass_id: int,
        columns: Sequence[str] | None = None,
        batches: bool = False,
        reports: ReportSink | None = None,
    ) -> PassReader:
        """Start reading `pass_id`; an unfinished earlier pass is abandoned."""
        assert self._setup is not None
        with self.cond:
            self.check_open()
            if self.reader is not None:
                self.abandon(self.reader, f"pass {pass_id} started")
            reader = self.reader = PassReader(
                pass_id,
                self._setup,
                columns=columns,
                batches=batches,
                reports=reports,
                paced_by_take=not isinstance(reports, DeferredFinishes),
                joined=self._last_ended == pass_id - 1,
            )
            self._keep_thread(reader.thread)
            self.cond.notify_all()
        reader.thread.start()  # the old fetcher stops by itself (close() waits for it)
        return reader

    def runs(
        self, pass_id: int, columns: Sequence[str] | None = None, batches: bool = False
    ) -> Generator[Iterator[Any], None, None]:
        """The runs of records of one pass: the pass starts at the first."""
        yield from self.start(pass_id, columns, batches).runs()

    def shuffled(
        self,
        pass_id: int,
        columns: Sequence[str] | None,
        buffer: Callable[[], ShuffleBuffer],
    ) -> Generator[Any, None, None]:
        """The records of one pass drawn through the shuffle buffer `buffer()` makes."""
        assert self._setup is not None
        deferred = DeferredFinishes(self._setup.reports, buffer())
        reader = self.start(pass_id, columns, reports=deferred)
        yield from ShuffledPass(reader, deferred, self).records()

    def open_feed(self, pass_id: int, stock: int, joined: bool) -> PassFeed:
        """A pass's tasks for readers outside the client, `stock` of them fetched ahead."""
        assert self._setup is not None
        session = self.session
        if session is None:
            raise RuntimeError("a feed needs a session: create the Client with session=True")
        if self._feed is not None:  # an iteration left suspended: its tasks go back first
            self._feed.abandon()
        with self.cond:
            self.check_open()
            if self.reader is not None:
                self.abandon(self.reader, f"a feed of pass {pass_id} started")
                self.reader = None
            feed = self._feed = PassFeed(pass_id, self._setup, session, stock=stock, joined=joined)
            self._keep_thread(feed.thread)
        feed.thread.start()
        return feed

    def _keep_thread(self, thread: threading.Thread) -> None:
        """A fetcher thread close() waits for (lock held)."""
        self.fetchers = [t for t in self.fetchers if t.is_alive()]
        self.fetchers.append(thread)

    def refill(self, timeout: float | None, done: list[Task]) -> Any:
        """next_record()'s slow path, lock held: the next run's first record, or EndOfPass."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            reader = self.reader
            if reader is None:
                self.check_open()
                raise RuntimeError("no pass started: call start_get_records(pass_id) first")
            try:
                return self.run_next()  # another thread may have installed a run meanwhile
            except StopIteration:
                pass
            installed = self.run_iter
            try:
                run = reader.take(done, deadline, functools.partial(self._moved_from, installed))
            except PassReplaced:
                continue  # read the pass that replaced it
            if run is None:
                if self.run_iter is not installed:
                    continue  # another thread installed a run: take from it
                raise TimeoutError(f"no record of pass {reader.pass_id} within {timeout}s")
            self.run_iter = run.records
            self.run_next = run.records.__next__

    def _moved_from(self, installed: Iterator[Any]) -> bool:
        """Whether another thread installed a run in place of `installed`."""
        return self.run_iter is not installed

    # ---- what the session tells -----------------------------------------------------------

    def report_positions(self) -> list[Position]:
        """What a keep-alive carries: the held tasks whose position moved (the session's
        thread calls this)."""
        with self.cond:
            return self.progress.report()

    def session_lost(self) -> None:
        """The master ended this trainer's session while it was away (frozen, cut off): every
        task it held went to other trainers. Stop reading them (the records already in the
        training loop's hands are delivered again, docs/sessions.md); where they were read
        to stays for the next commit(), which the master refuses."""
        with self.cond:
            dropped = [] if self.reader is None else self.reader.drop_held()
            if self._feed is not None:
                dropped += self._feed.lose_stock()
            held = self.progress.held_ids()
            self.progress.lose_held()
            self.run_iter = _EMPTY_ITER
            self.run_next = _EMPTY_ITER.__next__
            self.cond.notify_all()
        ids = sorted({t.meta.id for t in dropped} | set(held))
        if ids:
            log.warning(
                "tasks %s went to other trainers while this one was away: dropped unread; "
                "the next commit() is refused (the model holds records of them that are "
                "delivered again)",
                ids,
            )

    def adopt(self, task: Task) -> None:
        """A task that came for a request given up on: read it if its pass is being read,
        else hold it so that the session hands it back."""
        with self.cond:
            reader = self.reader
            if reader is not None and reader.pass_id == task.pass_id and not reader.cancelled:
                reader.buffer.add_task_locked(task)
                return
            if self.session is not None and not self.closed:
                meta = task.meta
                self.session.hand_back([Position(meta.id, meta.epoch, task.pass_id, task.start)])
            else:
                self.progress.add(task)  # the Goodbye hands it back
        log.info(
            "task %d (epoch %d) of pass %d came after its pass was left; handed back",
            task.meta.id,
            task.meta.epoch,
            task.pass_id,
        )

    def wait_lease(self) -> None:
        """Wait while the session's lease is in doubt; raises once the client is closed."""
        with self.cond:
            while self.session is not None and not self.session.lease_ok():
                self.check_open()
                self.cond.wait(1.0)

    def shut(self) -> bool:
        """Closing: no pass is read any more (the current one abandoned). False if it was
        closed already."""
        with self.cond:
            if self.closed:
                return False
            self.closed = True
            if self.reader is not None:
                self.abandon(self.reader, "client closed")
            self.cond.notify_all()
            return True

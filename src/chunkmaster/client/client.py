"""The trainer's client: records of the tasks the master hands out, one pass at a time.

`Client` is the public API. Per pass, a `TaskFetcher` thread (fetcher.py) asks the master for
tasks, ahead of need, into a `PassBuffer` (buffer.py); the trainer's thread takes runs of
records from it, reading and checking each chunk when it reaches it (the loader of the
dataset's format, chunkmaster.formats), as a direct `recordio.scan` does: only tasks cross
threads, never chunk data. The records of a run come from one C-level iterator, so one step of
it is atomic under the GIL and several trainer threads may share next_record(); only between
runs does the trainer take the lock.

With a session (the default), everything goes over one stream (session.py): task requests
carry the finishes, keep-alives carry the positions read off the runs' iterators
(progress.py), commit() makes them durable, close() hands the held tasks back. Without one,
a `Reporter` thread (reporter.py) sends TaskFinished/TaskFailed by unary calls.

Guarantees (the original's defects in brackets):
* A task is reported finished when the trainer *takes* its last record [D10]; a crashed
  trainer's task is re-dispatched after the master's timeout.
* A chunk that cannot be read is reported with TaskFailed and its reason, and raised to the
  trainer as TaskReadError after the records before it: nothing is skipped silently [D8].
* The pass ends (EndOfPass) only when the master has moved past it, not when no task happens to
  be free [D2]; "all tasks failed" is raised as AllTaskFailedError, and a job stopped by
  its error budget (too many records quarantined) as JobStoppedError, naming the tasks,
  files and reasons.
* A new pass, or close(), cancels the previous fetcher and drops its tasks: passes never
  mix [D19]. The abandoned tasks are not reported finished: a session hands them back at their
  exact positions at once; without one they come back after the master's timeout.
* Records are what the dataset's format makes them (docs/formats.md): bytes for RecordIO and
  TFRecord (any content, empty allowed [D9]), dicts for JSON Lines objects and Parquet rows,
  str for text lines. Parquet also gives whole Arrow record batches (`batches()`).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from chunkmaster.client.buffer import PassBuffer, Run
from chunkmaster.client.connection import (
    DATASET_TIMEOUT,
    CallCancelled,
    ChannelSecurity,
    MasterConnection,
    TransportError,
    join_all,
)
from chunkmaster.client.datawait import WaitMeter
from chunkmaster.client.errors import ClientClosedError, EndOfPass, TaskReadError
from chunkmaster.client.feed import PassFeed
from chunkmaster.client.fetcher import TaskFetcher, TaskSource, UnaryTasks
from chunkmaster.client.files import OpenFiles
from chunkmaster.client.link import Cancelled, CancelToken, Locator, MasterLink
from chunkmaster.client.mixture import (
    Schedule,
    Sources,
    WeightChange,
    schedule_to_pb,
    sources_to_pb,
)
from chunkmaster.client.options import Connection, Reading, Session, resolve
from chunkmaster.client.pace import Pace
from chunkmaster.client.progress import Progress
from chunkmaster.client.readahead import ReadAhead
from chunkmaster.client.reporter import Reporter, Reports
from chunkmaster.client.session import TrainerSession
from chunkmaster.client.shuffle_buffer import DeferredFinishes, Key, ShuffleBuffer, buffer_rng
from chunkmaster.core.errors import CheckpointRefusedError
from chunkmaster.core.model import Position, Task
from chunkmaster.formats.base import Storage
from chunkmaster.formats.storage import storage_for
from chunkmaster.rpc import master_pb2 as pb

if TYPE_CHECKING:
    from chunkmaster.etcd.discovery import MasterLocator

__all__ = [
    "Client",
    "ClientClosedError",
    "Connection",
    "EndOfPass",
    "Reading",
    "Session",
    "TaskReadError",
]

log = logging.getLogger("chunkmaster.client")

_GIL: Final = bool(getattr(sys, "_is_gil_enabled", lambda: True)())
"""With the GIL, one step of a C-level iterator is atomic, so the fast path needs no lock."""

FILL_WAIT = 0.1  # seconds a shuffle buffer waits for a task before it hands out what it holds
SHUFFLE_BATCH = 64  # records a shuffle buffer draws per turn of the lock
_worker_ids = itertools.count()
_T = TypeVar("_T")
_EMPTY_ITER: Final[Iterator[Any]] = iter(())
_MIN_DEADLINE = 0.001  # seconds: a retry at the deadline still gets a (failing) deadline
_open_clients: weakref.WeakSet[Client] = weakref.WeakSet()  # closed at interpreter exit


@atexit.register
def _close_at_exit() -> None:
    """Close the clients left open when the interpreter exits in order (the script ended,
    sys.exit(), Ctrl-C's KeyboardInterrupt out of the main thread): their sessions say Goodbye,
    so the master ends them as returned, not as "trainer lost" a lease later. Only this
    process's own: a forked child's copies are its parent's sessions."""
    for client in list(_open_clients):
        if client._pid == os.getpid():
            client.close()


class _Signal:
    """What the reading loop answers besides a run or the end of the pass."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_NOT_YET: Final = _Signal("_NOT_YET")  # no run before the deadline
_AGAIN: Final = _Signal("_AGAIN")  # another thread installed a run: take from it
_REPLACED: Final = _Signal("_REPLACED")  # a new pass replaced this one


@dataclass(slots=True)
class _Filling:
    """Where the filling of a shuffle buffer stands: the run it is reading from (the task's
    key, the index of its next record), and whether the pass ended or ran dry for now."""

    reading: Iterator[Any] | None = None
    key: Key | None = None
    index: int = 0
    ended: bool = False
    starving: bool = False


class PassBufferRecords(chain[Any]):
    """What records() returns: a chain of runs, closable like the generator it replaces."""

    _runs: Generator[Iterator[Any], None, None]

    def __new__(cls, runs: Generator[Iterator[Any], None, None]) -> PassBufferRecords:
        self: PassBufferRecords = cls.from_iterable(runs)  # type: ignore[assignment]
        self._runs = runs
        return self

    def close(self) -> None:
        """Stop reading the pass now (as leaving a for loop over it does)."""
        self._runs.close()


class Client:
    """Reads the records of the tasks a master hands out. Thread-safe; a context manager.

    Give either `addr` ("host:port") or `etcd_endpoints` (the master is looked up at
    `/master/addr` and followed when it moves). `name`: the trainer's name in the master's
    status (default host:pid:N, N telling apart the clients of one process). `token`: the
    master's shared token (default: the file CHUNKMASTER_TOKEN_FILE names, or the
    CHUNKMASTER_TOKEN variable; a shortcut for `Connection(token=...)`).
    `on_task_done(task)` is called in the trainer's thread when a task's last record is taken.

    The other options come in three groups (client/options.py): `connection=Connection(...)`
    (TLS, deadlines, retries, etcd), `session=Session(...)` (progress reports, the trainer's
    rank; `session=False` speaks the unary calls only: no commit(), tasks come back by the
    master's timeout only) and `reading=Reading(...)` (tasks held ahead, shuffle buffer,
    object stores, the decompression limit). The flat keyword arguments of before
    (`report_every=`, `prefetch_tasks=`, ...) still work, each with a DeprecationWarning
    naming its replacement.

    With a session, declare the rank (`Session(world_size=, rank=)`, or the WORLD_SIZE and
    RANK variables) on the one client of each rank that reads: a second client of the same
    rank (one for `status()`, say) should be `session=False`.
    """

    def __init__(
        self,
        addr: str | None = None,
        *,
        etcd_endpoints: Sequence[str] | str | None = None,
        token: str | None = None,
        name: str | None = None,
        session: bool | Session = True,
        connection: Connection | None = None,
        reading: Reading | None = None,
        on_task_done: Callable[[Task], None] | None = None,
        **deprecated: Any,
    ) -> None:
        options = resolve(
            addr=addr,
            etcd_endpoints=etcd_endpoints,
            token=token,
            name=name,
            session=session,
            connection=connection,
            reading=reading,
            on_task_done=on_task_done,
            legacy=deprecated,
        )
        conn, sess, read = options.connection, options.session_options, options.reading
        self.world_size, self.rank = declared_world(sess.world_size, sess.rank)
        self.max_inflated_bytes = read.max_inflated_bytes
        self.shuffle_buffer = read.shuffle_buffer
        self.shuffle_seed = read.shuffle_seed
        self.poll_wait = conn.poll_wait
        self.name = options.name or f"{socket.gethostname()}:{os.getpid()}:{next(_worker_ids)}"
        self._on_task_done = options.on_task_done
        self._locator: MasterLocator | None = None
        locator: Locator | None = None
        if etcd_endpoints is not None:
            self._locator = locator = _make_locator(
                etcd_endpoints, conn.etcd_timeout, conn.etcd_job, conn.etcd_options
            )
        security = ChannelSecurity.load(conn.token, conn.tls_ca, conn.tls_cert, conn.tls_key)
        self._link = MasterLink(
            addr,
            locator,
            rpc_timeout=conn.rpc_timeout,
            retry_timeout=conn.retry_timeout,
            security=security,
            startup_timeout=conn.startup_timeout,
        )
        held = None if read.prefetch_tasks is None else 1 + read.prefetch_tasks
        self._pace = Pace(2) if held is None else Pace(held, cap=held)  # tasks held (pace.py)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._open_storage(read)  # its read-ahead wakes the trainer's thread (self._cond)
        self._token = CancelToken()  # cancelled by close(): every pass and client-level call
        self._pass: PassBuffer | None = None
        self._it: Iterator[Any] = _EMPTY_ITER
        self._next: Callable[[], Any] = _EMPTY_ITER.__next__
        self._fetchers: list[threading.Thread] = []
        self._closed = False
        #: The last pass this client read to its end. A trainer that starts late may find pass
        #: 0 over (the others were quicker to start): that is not asking for a finished pass.
        self._last_ended = -1
        self._feed: PassFeed | None = None  # the pass read by outside readers (client/feed.py)
        self.report_every = sess.report_every if options.session else 0
        self._progress = Progress(self.report_every, keep_finished=options.session)
        self._lost_count = 0  # sessions found lost: a shuffle buffer drops their records
        self._session: TrainerSession | None = None
        self._reporter: Reporter | None = None
        self._reports: Reports
        self._source: TaskSource
        self._open_source(sess if options.session else None)
        self._pid = os.getpid()
        _open_clients.add(self)

    def _open_storage(self, read: Reading) -> None:
        """Where chunks are read from: local files held open across chunks (closed at pass
        end), object stores with this trainer's own `storage_options` (never sent to the
        master), and the read-ahead of the next chunks (none with `read_ahead=0`)."""
        self._files = OpenFiles()
        self._storage: Callable[[str], Storage] = functools.partial(
            storage_for, storage_options=dict(read.storage_options or {}), local=self._files
        )
        self._readahead = (
            ReadAhead(
                self._storage,
                chunks=read.read_ahead,
                budget=read.read_ahead_bytes,
                on_ready=self._wake,
            )
            if read.read_ahead
            else None
        )

    def _open_source(self, sess: Session | None) -> None:
        """Where tasks come from and finishes go: the session's stream, or (`sess` None) the
        unary calls and a Reporter thread."""
        if sess is not None:
            self._session = TrainerSession(
                self._link,
                name=self.name,
                report_every=self.report_every,
                report_interval=sess.report_interval,
                progress=self._report_positions,
                on_unclaimed=self._adopt,
                world_size=self.world_size,
                rank=self.rank,
                data_wait=self._data_wait,
                on_lost=self._session_lost,
                on_alive=self._wake,
            )
            self._reports = self._source = self._session
        else:
            self._reporter = Reporter(self._link, self.name)
            self._reports = self._reporter
            self._source = UnaryTasks(self._link, self.name)

    #: The training loop's wait for data, measured by a reader that knows its batches (the
    #: torch loader); each keep-alive reports it.
    wait_meter: WaitMeter | None = None

    def _data_wait(self) -> pb.DataWait | None:
        meter = self.wait_meter
        f = None if meter is None else meter.figures()
        if f is None:
            return None
        return pb.DataWait(
            p50_seconds=f.p50,
            p99_seconds=f.p99,
            share=f.share,
            batches=f.batches,
            window_seconds=f.window,
        )

    def _wake(self) -> None:
        """A chunk fetched ahead arrived: the trainer's thread may be waiting for it."""
        with self._cond:
            self._cond.notify_all()

    # ---- plain calls ---------------------------------------------------------------------

    @property
    def address(self) -> str | None:
        """The master address in use (for etcd discovery: the latest one seen)."""
        return self._link.address

    def set_dataset(
        self, globs: Sequence[str] | str | Sources, timeout: float = DATASET_TIMEOUT
    ) -> None:
        """Tell the master the dataset (the first trainer's call wins); errors are raised.

        One list of patterns, or a mixture: a mapping of source names to a `Source`
        (patterns, weight, format) or to patterns (docs/mixtures.md). Relative paths are this
        trainer's: they are sent absolute, resolved in its working directory. A master that
        serves another dataset refuses the call with DatasetMismatchError naming both. Waits
        until the master has indexed the files, retrying an unreachable master, for at most
        `timeout` seconds; then raises TimeoutError (the master goes on indexing).
        """
        if isinstance(globs, Mapping):
            self._set_sources(globs, timeout)
            return
        given = [globs] if isinstance(globs, str) else list(globs)
        paths = [
            os.path.abspath(p) if isinstance(p, str) and p and "://" not in p else p for p in given
        ]
        moved = [
            f"{g!r} as {p!r}"
            for g, p in zip(given, paths, strict=True)
            if isinstance(g, str) and g and "://" not in g and not os.path.isabs(g)
        ]
        if moved:
            log.info("set_dataset: relative patterns read in %s: %s", os.getcwd(), ", ".join(moved))
        deadline = time.monotonic() + timeout

        def call(conn: MasterConnection) -> None:
            conn.set_dataset(paths, max(deadline - time.monotonic(), _MIN_DEADLINE))

        try:
            self._call("set_dataset", call, deadline)
            self._link.startup.dataset = True
        except TransportError as exc:
            if time.monotonic() < deadline:
                raise  # retry_timeout or startup_timeout ran out first
            raise TimeoutError(
                f"set_dataset({paths}): the master did not answer within {timeout}s ({exc})"
            ) from None

    def _set_sources(self, sources: Sources, timeout: float) -> None:
        wire = sources_to_pb(sources)
        deadline = time.monotonic() + timeout

        def call(conn: MasterConnection) -> None:
            conn.set_dataset([], max(deadline - time.monotonic(), _MIN_DEADLINE), wire)

        try:
            self._call("set_dataset", call, deadline)
            self._link.startup.dataset = True
        except TransportError as exc:
            if time.monotonic() < deadline:
                raise
            raise TimeoutError(
                f"set_dataset({list(sources)}): the master did not answer within {timeout}s ({exc})"
            ) from None

    def set_weights(self, weights: Schedule, mode: str = "step") -> WeightChange:
        """A mixture's weights from now on, by source name (every source named; 0 retires
        one), or a schedule of (records planned over the whole job, weights) breakpoints held
        ("step") or interpolated ("linear") between them. The units of the pass never handed
        out are planned again: nothing handed out is lost or repeated (docs/mixtures.md).
        Returns where they took effect."""
        points = schedule_to_pb(weights)
        return WeightChange(*self._call("set_weights", lambda c: c.set_weights(points, mode)))

    def add_sources(
        self, sources: Sources, weights: Schedule | None = None, mode: str = "step"
    ) -> WeightChange:
        """Add sources to the running mixture, after its own (each starts at its epoch 0), and
        give the weights from then on: `weights` as `set_weights` takes them, naming every
        source, old and new; None: the weights in force, each added source at its `Source`
        weight on the same scale (patterns alone: 1). They take effect where new weights do;
        a pass keeps its units. Raises DatasetError naming a source the job has already, or
        one that matches no file or cannot be indexed: nothing is added (docs/mixtures.md)."""
        points = [] if weights is None else schedule_to_pb(weights)
        add = sources_to_pb(sources)
        return WeightChange(
            *self._call("add_sources", lambda c: c.set_weights(points, mode, add, DATASET_TIMEOUT))
        )

    def request_save_model(self, trainer_id: str, block_dur: float) -> bool:
        """True if this trainer should save the model now (nobody else may for block_dur s)."""
        return self._call(
            "request_save_model", lambda c: c.request_save_model(trainer_id, block_dur)
        )

    def status(self) -> dict[str, object]:
        """The master's status (pass, queues, failed tasks with their reasons)."""
        return self._call("status", lambda c: c.status())

    def restore(
        self, checkpoint: bytes, key: str, rank: int | None = None, *, other_job: bool = False
    ) -> bool:
        """Take the running job back to a data checkpoint, for a training job restarted from
        the model checkpoint saved beside it: every session ends (this one opens a new one),
        the passes go on from the checkpoint's position. `key` names the restart: every rank
        of one restart may ask with the same key, and only the first call restores (True);
        `rank` (the caller's, if it has one) tells a rank asking again, which is a new restart
        that reused the key, from the other ranks of the same one. A checkpoint of another job
        (another dataset, or a job started anew) is refused unless `other_job`.
        Raises CheckpointRefusedError naming the problem (another dataset, a damaged blob)."""
        applied, _ = self._call("restore", lambda c: c.restore(checkpoint, key, rank, other_job))
        return applied

    def data_checkpoint(self) -> bytes:
        """The job's data position at the last commits (save it beside the model checkpoint;
        `chunkmaster master --restore FILE` resumes from it). Waits for what the master holds
        to be durable."""
        return self._call("data_checkpoint", lambda c: c.data_checkpoint())

    # ---- sessions ----------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        """The master's ID of this trainer's session (None without one, "" until opened)."""
        return None if self._session is None else self._session.session_id

    def commit(self, timeout: float | None = None) -> None:
        """Make durable on the master what this trainer consumed since its last commit.

        Sends the task being read at its exact position (the records taken so far) and the
        tasks finished since at their end; returns once the master has made them durable.
        Raises the master's error: CheckpointRefusedError if one of those tasks was handed to
        another trainer meanwhile (its records past the last report will be delivered again;
        the refused positions are not sent again). A master whose store refuses writes for
        now (UnavailableError) gets the commit again, with backoff. TimeoutError after
        `timeout` seconds (the commit may still be applied; the next one sends the positions
        again).
        """
        session = self._session
        if session is None:
            raise RuntimeError("commit() needs a session: create the Client with session=True")
        with self._lock:
            self._check_open()
            positions = self._progress.to_commit()
        if not positions:
            return
        try:
            session.commit(positions, timeout)
        except Cancelled:
            raise ClientClosedError("client closed during commit") from None
        except CallCancelled:
            raise ClientClosedError("client closed during commit") from None
        except CheckpointRefusedError:
            with self._lock:
                self._progress.committed(positions)
            raise
        with self._lock:
            self._progress.committed(positions)

    def _report_positions(self) -> list[Position]:
        """What a keep-alive carries: the held tasks whose position moved (the session's
        thread calls this)."""
        with self._lock:
            return self._progress.report()

    def _session_lost(self) -> None:
        """The master ended this trainer's session while it was away (frozen, cut off): every
        task it held went to other trainers. Stop reading them (the records already in the
        training loop's hands are delivered again, docs/sessions.md); where they were read
        to stays for the next commit(), which the master refuses."""
        with self._lock:
            ps = self._pass
            dropped = [] if ps is None else ps.drop_held()
            if self._feed is not None:
                dropped += self._feed.lose_stock()
            lost = self._progress.lose_held()
            self._it = _EMPTY_ITER
            self._next = _EMPTY_ITER.__next__
            self._lost_count += 1
            self._cond.notify_all()
        ids = sorted({t.meta.id for t in dropped} | {p.task_id for p in lost})
        if ids:
            log.warning(
                "tasks %s went to other trainers while this one was away: dropped unread; "
                "the next commit() is refused (the model holds records of them that are "
                "delivered again)",
                ids,
            )

    def _lease_ok(self) -> bool:
        """Whether records of the held tasks may be handed out (lock held): with a session,
        only while its lease certainly holds (`TrainerSession.lease_ok`)."""
        return self._session is None or self._session.lease_ok()

    def wait_lease(self) -> None:
        """Wait while the session's lease is in doubt (readers outside the client hand out
        records only while it certainly holds); raises if the master stays unreachable."""
        with self._lock:
            while not self._lease_ok():
                self._check_open()
                self._cond.wait(1.0)

    def _adopt(self, task: Task) -> None:
        """A task that came for a request given up on: read it if its pass is being read,
        else hold it so that the session hands it back."""
        with self._lock:
            ps = self._pass
            if ps is not None and ps.pass_id == task.pass_id and not ps.cancel.cancelled:
                ps.add_task_locked(task)
                return
            if self._session is not None and not self._closed:
                meta = task.meta
                self._session.hand_back([Position(meta.id, meta.epoch, task.pass_id, task.start)])
            else:
                self._progress.add(task)  # the Goodbye hands it back
        log.info(
            "task %d (epoch %d) of pass %d came after its pass was left; handed back",
            task.meta.id,
            task.meta.epoch,
            task.pass_id,
        )

    def _call(
        self, what: str, fn: Callable[[MasterConnection], _T], deadline: float | None = None
    ) -> _T:
        self._check_open()
        try:
            return self._link.call(what, fn, self._token, deadline)
        except Cancelled:
            raise ClientClosedError("client closed during " + what) from None

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("client is closed")

    # ---- passes ------------------------------------------------------------------------

    def start_get_records(self, pass_id: int, columns: Sequence[str] | None = None) -> None:
        """Start fetching `pass_id`; an unfinished earlier pass is abandoned (records dropped).
        `columns`: read only these columns of a columnar (Parquet) dataset."""
        if self.shuffle_buffer:
            raise RuntimeError("a shuffle buffer mixes the records of records(pass_id) only")
        self._start(pass_id, columns)

    def _start(
        self,
        pass_id: int,
        columns: Sequence[str] | None = None,
        batches: bool = False,
        reports: Reports | None = None,
    ) -> PassBuffer:
        with self._lock:
            self._check_open()
            old = self._pass
            if old is not None:
                self._abandon(old, f"pass {pass_id} started")
            session = self._session
            ps = PassBuffer(
                pass_id,
                self._cond,
                self._reports if reports is None else reports,
                self._token,
                self._progress,
                run_limit=self.report_every,
                report_now=None if session is None else session.report_now,
                returns_tasks=session is not None,
                columns=columns,
                batches=batches,
                storage=self._storage,
                readahead=self._readahead,
                max_inflated=self.max_inflated_bytes,
                fence=None if session is None else session.lease_ok,
                generation=None if session is None else (lambda: session.generation),
                pace=self._pace,
                paced_by_take=not isinstance(reports, DeferredFinishes),
            )
            ps.joined = self._last_ended == pass_id - 1
            self._pass = ps
            fetcher = TaskFetcher(
                self._source,
                ps,
                worker=self.name,
                poll_wait=self.poll_wait,
                pace=self._pace,
                on_unclaimed=None if session is None else self._adopt,
                startup=self._link.startup,
            )
            self._fetchers = [t for t in self._fetchers if t.is_alive()]
            self._fetchers.append(fetcher.thread)
            self._cond.notify_all()
        fetcher.start()  # the old fetcher stops by itself (close() waits for it)
        return ps

    def feed(self, pass_id: int, stock: int, joined: bool) -> PassFeed:
        """A pass's tasks for readers outside this client (client/feed.py), `stock` of them
        fetched ahead; `joined`: the caller read the pass before to its end. Needs a session.
        An unfinished pass of this client's own (`records()`) is abandoned first."""
        session = self._session
        if session is None:
            raise RuntimeError("a feed needs a session: create the Client with session=True")
        if self._feed is not None:  # an iteration left suspended: its tasks go back first
            self._feed.abandon()
        with self._lock:
            self._check_open()
            old = self._pass
            if old is not None:
                self._abandon(old, f"a feed of pass {pass_id} started")
                self._pass = None
            feed = self._feed = PassFeed(
                pass_id,
                self._cond,
                session,
                session,
                self._progress,
                self._token,
                stock=stock,
                poll_wait=self.poll_wait,
                joined=joined,
                worker=self.name,
                startup=self._link.startup,
            )
            self._fetchers = [t for t in self._fetchers if t.is_alive()]
            self._fetchers.append(feed.thread)
        feed.start()
        return feed

    def _abandon(self, ps: PassBuffer, why: str) -> None:
        """Cancel a pass's fetcher and drop its buffer; with a session, hand the pass's held
        tasks back at their exact positions now (closing, the Goodbye does). Lock held."""
        ps.abandon(why)
        self._files.close()
        self._it = _EMPTY_ITER
        self._next = _EMPTY_ITER.__next__
        if self._session is not None and not self._closed:
            self._session.hand_back(self._progress.release(ps.pass_id))
        self._cond.notify_all()

    if _GIL:

        def next_record(self, timeout: float | None = None) -> Any:
            """The next record of the current pass; blocks. Raises EndOfPass at its end.

            Also raises TaskReadError (the pass goes on), AllTaskFailedError,
            JobStoppedError, and TimeoutError if `timeout` seconds pass without a record.
            """
            try:
                return self._next()  # the fast path: one step of the chunk's record iterator
            except StopIteration:
                pass
            done: list[Task] = []
            try:
                with self._lock:
                    return self._refill(timeout, done)
            finally:
                if done:
                    self._notify_done(done)

    else:  # pragma: no cover - free-threaded Python: the iterator step needs the lock

        def next_record(self, timeout: float | None = None) -> Any:
            """The next record of the current pass; blocks. Raises EndOfPass at its end."""
            done: list[Task] = []
            try:
                with self._lock:
                    try:
                        return self._next()
                    except StopIteration:
                        return self._refill(timeout, done)
            finally:
                if done:
                    self._notify_done(done)

    def _refill(self, timeout: float | None, done: list[Task]) -> Any:
        """Slow path of next_record, lock held: the next run's first record, or EndOfPass."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ps = self._pass
            if ps is None:
                self._check_open()
                raise RuntimeError("no pass started: call start_get_records(pass_id) first")
            try:
                return self._next()  # another thread may have installed a run meanwhile
            except StopIteration:
                pass
            run = self._next_run(ps, done, deadline, installed=self._it)
            if run is _NOT_YET:
                raise TimeoutError(f"no record of pass {ps.pass_id} within {timeout}s")
            if run is None:
                raise EndOfPass(ps.pass_id)
            if not isinstance(run, Run):  # _AGAIN: another thread installed a run;
                continue  # _REPLACED: a new pass replaced this one
            self._it = run.records
            self._next = run.records.__next__

    def _next_run(
        self,
        ps: PassBuffer,
        done: list[Task],
        deadline: float | None = None,
        installed: Iterator[Any] | None = None,
    ) -> Run | _Signal | None:
        """The next run of records of pass `ps`: the one reading loop of next_record(),
        records(), batches() and the shuffle buffer (lock held).

        Waits for a run until `deadline` (time.monotonic(); None: as long as the pass lasts),
        then answers _NOT_YET. None at the end of the pass; _REPLACED once `ps` is no longer
        the client's pass (a new pass replaced it). Raises the pass's error
        (AllTaskFailedError, JobStoppedError, ...), a chunk's TaskReadError,
        ClientClosedError. `installed`: the run next_record() had installed; answers _AGAIN
        once another thread replaced it.
        """
        while True:
            if self._pass is not ps:
                self._check_open()
                return _REPLACED
            if installed is not None and self._it is not installed:
                return _AGAIN
            run = ps.next_run(done)
            if run is not None:
                return run
            if ps.end is not None and not ps.fenced:
                self._check_open()
                if isinstance(ps.end, EndOfPass):
                    self._ended(ps)
                    return None
                raise ps.end
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return _NOT_YET
            ps.wait(remaining)

    def _ended(self, ps: PassBuffer) -> None:
        """The trainer read pass `ps` to its end (lock held): its files are closed."""
        if not ps.cancel.cancelled:
            self._last_ended = max(self._last_ended, ps.pass_id)
        self._files.close()

    def _notify_done(self, done: list[Task]) -> None:
        if self._on_task_done is not None:
            for task in done:
                self._on_task_done(task)

    def records(self, pass_id: int, columns: Sequence[str] | None = None) -> Iterator[Any]:
        """Run one whole pass: `for record in client.records(p): ...`.

        Leaving the loop early abandons the pass (its fetcher stops, its buffer is dropped).
        A C-level chain over the pass's runs of records: no Python frame per record.
        With a shuffle buffer, a generator that draws each record from it.
        `columns`: read only these columns of a columnar (Parquet) dataset's rows.
        """
        if self.shuffle_buffer:
            return self._shuffled(pass_id, columns)
        return PassBufferRecords(self._runs(pass_id, columns))

    def _buffer_seed(self) -> int:
        if self.shuffle_seed is None:
            seed = self.status().get("shuffle_seed")
            self.shuffle_seed = seed if isinstance(seed, int) else 0
        return self.shuffle_seed

    def _shuffled(
        self, pass_id: int, columns: Sequence[str] | None = None
    ) -> Generator[Any, None, None]:
        """One pass through a shuffle buffer (shuffle_buffer.py): fill it from the runs, and
        hand out a random record. When no task comes for FILL_WAIT seconds (the end of the
        pass, whose last tasks may be the ones this buffer holds), hand out what it holds
        without waiting until a task comes again."""
        buf = ShuffleBuffer(
            self.shuffle_buffer, buffer_rng(self._buffer_seed(), pass_id, self.name)
        )
        # A task is done with once its records are handed out: this loop tells the pace.
        ps = self._start(pass_id, columns, reports=DeferredFinishes(self._reports, buf))
        with self._lock:
            self._progress.clip = buf.oldest
        fill = _Filling()
        lost_seen = self._lost_count
        finished = False
        batch: list[tuple[Any, Key, int]] = []
        try:
            while True:
                released: list[Task] = []
                with self._lock:
                    buf.handed(batch)  # the previous batch: the trainer has taken it all
                    batch = []
                    if self._pass is not ps:
                        self._check_open()
                        self._replaced(ps)
                        return
                    if lost_seen != self._lost_count:  # those tasks went to other trainers
                        lost_seen = self._lost_count
                        buf.clear()
                        fill.reading = fill.key = None
                    if (buf or fill.reading is not None) and not self._lease_ok():
                        self._cond.wait()
                        continue
                    if not self._fill(ps, buf, fill):
                        self._replaced(ps)
                        return
                    batch = buf.draw(SHUFFLE_BATCH)
                    if buf.deferred:
                        released = buf.releasable(None if fill.reading is None else fill.key)
                        for task in released:
                            ps.task_done()
                            self._reports.finished(task)
                if released:
                    self._notify_done(released)
                if batch:
                    for record, _, _ in batch:
                        yield record
                elif fill.ended and not buf.deferred:
                    finished = True
                    return
        finally:
            with self._lock:
                if self._progress.clip == buf.oldest:
                    self._progress.clip = None
                if not finished and self._pass is ps:
                    self._abandon(ps, "records() left early")

    def _fill(self, ps: PassBuffer, buf: ShuffleBuffer, fill: _Filling) -> bool:
        """Fill `buf` from the pass's runs (lock held) until it is full, no task comes within
        FILL_WAIT while it holds records, or the pass ended. False: a new pass replaced `ps`."""
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
            run = self._next_run(ps, [], deadline)  # the buffer says when a task is done
            if run is _REPLACED:
                return False
            if run is _NOT_YET:
                fill.starving = bool(buf)
                break
            if not isinstance(run, Run):
                fill.ended = True
                break
            fill.starving = False
            fill.reading, fill.index = run.records, run.first
            fill.key = (run.task.meta.id, run.task.meta.epoch)
        return True

    def batches(self, pass_id: int, columns: Sequence[str] | None = None) -> Iterator[Any]:
        """Run one whole pass of a columnar (Parquet) dataset as `pyarrow.RecordBatch`es: each
        the rows of one chunk (a row group) not yet consumed, `columns` only if given.

        Taking a batch consumes its rows: progress, commits and the task's finish count them
        as records() would. Other formats raise TypeError at their first chunk.
        """
        return PassBufferRecords(self._runs(pass_id, columns, batches=True))

    def _runs(
        self, pass_id: int, columns: Sequence[str] | None = None, batches: bool = False
    ) -> Generator[Iterator[Any], None, None]:
        """The runs of records of one pass, each taken when the previous one is used up.

        Dropping the iterator early (a `break` out of records()) closes this generator,
        whose `finally` abandons the pass.
        """
        ps = self._start(pass_id, columns, batches)
        finished = False
        try:
            while True:
                done: list[Task] = []
                try:
                    with self._lock:
                        if self._it is not _EMPTY_ITER:  # left by next_record calls, if any
                            run: Iterator[Any] | None = self._it
                            self._it = _EMPTY_ITER
                            self._next = _EMPTY_ITER.__next__
                        else:
                            got = self._next_run(ps, done)
                            if got is _REPLACED:
                                self._replaced(ps)
                            run = got.records if isinstance(got, Run) else None
                finally:
                    if done:
                        self._notify_done(done)
                if run is None:
                    finished = True
                    return
                yield run
        finally:
            if not finished:
                with self._lock:
                    if self._pass is ps:
                        self._abandon(ps, "records() left early")

    def _replaced(self, ps: PassBuffer) -> None:
        now = None if self._pass is None else self._pass.pass_id
        log.warning("pass %d was replaced by pass %s while iterating it", ps.pass_id, now)

    # ---- closing -----------------------------------------------------------------------

    def close(self, flush_timeout: float = 5.0) -> None:
        """Stop every thread and end every call: cancel the pass, send queued reports
        (bounded), close the channel, and wait for every thread the client started (and gRPC's
        for its calls) to be gone.

        With a session: says Goodbye, handing the held tasks back at their exact positions,
        and waits up to `flush_timeout` s for the master's ack. Returns within `flush_timeout`
        + 2 x `rpc_timeout` whatever the master does (gone, frozen): the fetchers have
        `rpc_timeout` to stop before the Goodbye, the rest `rpc_timeout` after it (with etcd,
        the address watcher has `etcd_timeout` + 5 s more); a thread still alive then is named
        in a warning. A client left open is closed at interpreter exit (an orderly one:
        the script's end, sys.exit(), a KeyboardInterrupt), so that its session says Goodbye."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            _open_clients.discard(self)
            ps = self._pass
            if ps is not None:
                self._abandon(ps, "client closed")
            self._cond.notify_all()
        rpc_timeout = self._link.rpc_timeout
        # 1. The fetchers stop (their calls cancelled), so that the held tasks are final.
        self._token.cancel()
        left = join_all(self._fetchers, time.monotonic() + rpc_timeout)
        # 2. The Goodbye, or the queued reports, for up to flush_timeout.
        if self._session is not None:
            with self._lock:
                positions = self._progress.held_positions()
            self._session.close(positions, flush_timeout)
        if self._reporter is not None:
            self._reporter.close(flush_timeout)
        # 3. Everything else ends: no more reads, the channel closed under any call left.
        if self._readahead is not None:
            self._readahead.close()
        with self._lock:
            self._files.close()
        self._link.close()
        if self._locator is not None:
            self._locator.close()
        # 4. Every thread gone, then gRPC's threads done with every call.
        deadline = time.monotonic() + rpc_timeout
        if self._session is not None:
            left += self._session.join(deadline)
        if self._reporter is not None:
            left += self._reporter.join(deadline)
        if self._readahead is not None:
            left += self._readahead.join(deadline)
        left += self._link.wait_closed(deadline)
        if left:
            log.warning(
                "client %s closed with threads or calls still going after %.0fs: %s",
                self.name,
                rpc_timeout,
                ", ".join(left),
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def declared_world(world_size: int | None, rank: int | None) -> tuple[int, int]:
    """(world size, rank) a trainer declares: as given, else from WORLD_SIZE and RANK when
    both are set; (0, 0) declares nothing. Raises ValueError naming a bad value."""
    if world_size is None:
        env_world, env_rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
        if env_world is None or env_rank is None:
            if rank is not None:
                raise ValueError("rank needs world_size (or the WORLD_SIZE variable)")
            return 0, 0
        try:
            world_size = int(env_world)
            rank = int(env_rank) if rank is None else rank
        except ValueError:
            raise ValueError(
                f"WORLD_SIZE={env_world!r} and RANK={env_rank!r} must be whole numbers"
            ) from None
    if world_size == 0:
        return 0, 0
    if rank is None:
        env_rank = os.environ.get("RANK")
        if env_rank is None or not env_rank.strip().isdigit():
            raise ValueError(f"world_size={world_size} needs rank (or the RANK variable)")
        rank = int(env_rank)
    if not 0 < world_size <= 1 << 20:
        raise ValueError(f"world size {world_size} must be 1 to {1 << 20}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} must be in 0..{world_size - 1} (world size {world_size})")
    return world_size, rank


def _make_locator(
    endpoints: Sequence[str] | str,
    timeout: float,
    job: str | None,
    options: Mapping[str, str] | None,
) -> MasterLocator:
    from chunkmaster.etcd.discovery import MasterLocator  # only trainers that use etcd need it
    from chunkmaster.etcd.options import EtcdOptions

    etcd = EtcdOptions.parse(endpoints, **dict(options or {}))
    return MasterLocator(etcd, job=job, timeout=timeout)

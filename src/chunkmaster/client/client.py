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

import functools
import itertools
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from itertools import chain
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from chunkmaster.client.buffer import PassBuffer
from chunkmaster.client.connection import (
    DATASET_TIMEOUT,
    DEFAULT_TIMEOUT,
    CallCancelled,
    ChannelSecurity,
    MasterConnection,
    TransportError,
)
from chunkmaster.client.datawait import WaitMeter
from chunkmaster.client.errors import ClientClosedError, EndOfPass, TaskReadError
from chunkmaster.client.feed import PassFeed
from chunkmaster.client.fetcher import TaskFetcher, TaskSource, UnaryTasks
from chunkmaster.client.link import Cancelled, CancelToken, Locator, MasterLink
from chunkmaster.client.mixture import (
    Schedule,
    Sources,
    WeightChange,
    schedule_to_pb,
    sources_to_pb,
)
from chunkmaster.client.progress import Progress
from chunkmaster.client.readahead import DEFAULT_BUDGET as DEFAULT_READ_AHEAD_BYTES
from chunkmaster.client.readahead import DEFAULT_CHUNKS as DEFAULT_READ_AHEAD
from chunkmaster.client.readahead import ReadAhead
from chunkmaster.client.reporter import Reporter, Reports
from chunkmaster.client.session import TrainerSession
from chunkmaster.client.shuffle_buffer import DeferredFinishes, Key, ShuffleBuffer, buffer_rng
from chunkmaster.core.errors import CheckpointRefusedError
from chunkmaster.core.model import Position, Task
from chunkmaster.formats.base import Storage
from chunkmaster.formats.storage import storage_for
from chunkmaster.inflate import DEFAULT_MAX_INFLATED, check_limit
from chunkmaster.rpc import master_pb2 as pb

if TYPE_CHECKING:
    from chunkmaster.etcd.discovery import MasterLocator

__all__ = ["Client", "ClientClosedError", "EndOfPass", "TaskReadError"]

log = logging.getLogger("chunkmaster.client")

_GIL: Final = bool(getattr(sys, "_is_gil_enabled", lambda: True)())
"""With the GIL, one step of a C-level iterator is atomic, so the fast path needs no lock."""

DEFAULT_BUFFER = 1024
FILL_WAIT = 0.1  # seconds a shuffle buffer waits for a task before it hands out what it holds
SHUFFLE_BATCH = 64  # records a shuffle buffer draws per turn of the lock
_worker_ids = itertools.count()
_T = TypeVar("_T")
_EMPTY_ITER: Final[Iterator[Any]] = iter(())
_MIN_DEADLINE = 0.001  # seconds: a retry at the deadline still gets a (failing) deadline


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
    `/master/addr` and followed when it moves; `etcd_options` passes TLS and auth to the etcd
    client: ca_cert, cert_cert, cert_key, user, password). `prefetch_tasks` tasks are requested
    ahead of the one being read: few, because each held task's timeout on the master is running.
    `buffer_size` is kept for compatibility: chunks are read in the trainer's thread when it
    reaches them, so no records are read ahead.

    `token` (default: the CHUNKMASTER_TOKEN environment variable) goes with every call;
    `tls_ca` (a PEM file path) turns TLS on and says which CA signs the master's certificate;
    `tls_cert` and `tls_key` are the trainer's certificate for a master that asks for one
    (mutual TLS).

    `storage_options` go to the fsspec filesystem of URL datasets (s3://, gs://: credentials,
    an endpoint); they stay in this process, never sent to the master; without them each
    library looks in its usual places (AWS_* variables, ~/.aws, ...). For chunks in an object
    store, up to `read_ahead` ranged reads (0: none) of the next chunks are in flight, holding
    at most `read_ahead_bytes` fetched and not yet read (docs/object-stores.md).

    `session` (default): one Session stream to the master (docs/sessions.md), named `name`
    (default `worker`: host:pid:N, N telling apart the clients of one process), reporting
    progress every `report_every` records and at least every `report_interval` seconds;
    commit() needs it. `session=False` speaks the unary calls only (tasks then come back by
    the master's timeout only).

    `world_size` and `rank`: this trainer is rank `rank` of `world_size` (DDP's ranks); by
    default from the WORLD_SIZE and RANK variables when both are set (torchrun sets them), else
    not said; `world_size=0` says nothing. With equal steps the master shares each pass among
    exactly those ranks, once all are there (docs/equal-steps.md). Declare it on the one
    client of each rank that reads: a second client of the same rank (one for `status()`, say)
    should be `session=False`.

    `shuffle_buffer` (records; 0, the default, is off): records() hands the records out in a
    random order drawn from a buffer of that many, across the tasks this trainer holds
    (docs/shuffle.md). The draw is seeded by (`shuffle_seed`, pass, `name`); without
    `shuffle_seed` the master's --shuffle-seed is used (0 if it has none). A buffered record
    is not consumed: positions, commits and finishes wait until it is handed out.

    `max_inflated_bytes` (default 1 GiB) bounds what one chunk may decompress to: a chunk
    that would inflate to more (a decompression bomb: a few MB that inflate to many GB) is
    refused while it is decoded, before it takes the memory, and reported failed like any
    chunk that cannot be read (`TaskReadError`; docs/failures.md). Raise it for datasets whose
    chunks are that large (a JSON Lines or TFRecord file compressed whole is one chunk).
    """

    def __init__(
        self,
        addr: str | None = None,
        *,
        etcd_endpoints: Sequence[str] | str | None = None,
        etcd_timeout: float = 5.0,
        etcd_job: str | None = None,
        etcd_options: Mapping[str, str] | None = None,
        buffer_size: int = DEFAULT_BUFFER,
        prefetch_tasks: int = 1,
        rpc_timeout: float = DEFAULT_TIMEOUT,
        poll_wait: float = 2.0,
        retry_timeout: float | None = None,
        worker: str | None = None,
        on_task_done: Callable[[Task], None] | None = None,
        session: bool = True,
        name: str | None = None,
        report_every: int = 1000,
        report_interval: float = 5.0,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        read_ahead: int = DEFAULT_READ_AHEAD,
        read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES,
        shuffle_buffer: int = 0,
        shuffle_seed: int | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        max_inflated_bytes: int = DEFAULT_MAX_INFLATED,
    ) -> None:
        if (addr is None) == (etcd_endpoints is None):
            raise ValueError("give exactly one of addr and etcd_endpoints")
        self.world_size, self.rank = declared_world(world_size, rank)
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be 0 (off) or more, not {shuffle_buffer}")
        if prefetch_tasks < 0:
            raise ValueError(f"prefetch_tasks must be 0 or more, not {prefetch_tasks}")
        self.max_inflated_bytes = check_limit(max_inflated_bytes)
        self.shuffle_buffer = shuffle_buffer
        self.shuffle_seed = shuffle_seed
        self.buffer_size = max(1, buffer_size)
        self.prefetch_tasks = prefetch_tasks
        self.poll_wait = poll_wait
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{next(_worker_ids)}"
        self.name = name or self.worker
        self._on_task_done = on_task_done
        self._locator: MasterLocator | None = None
        locator: Locator | None = None
        if etcd_endpoints is not None:
            self._locator = locator = _make_locator(
                etcd_endpoints, etcd_timeout, etcd_job, etcd_options
            )
        security = ChannelSecurity.load(token, tls_ca, tls_cert, tls_key)
        self._link = MasterLink(
            addr,
            locator,
            rpc_timeout=rpc_timeout,
            retry_timeout=retry_timeout,
            security=security,
        )
        options = dict(storage_options or {})  # this trainer's own: never sent to the master
        self._storage: Callable[[str], Storage] = functools.partial(
            storage_for, storage_options=options
        )
        if read_ahead < 0:
            raise ValueError(f"read_ahead must be 0 (off) or more chunks, not {read_ahead}")
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._readahead = (
            ReadAhead(
                self._storage,
                chunks=read_ahead,
                budget=read_ahead_bytes,
                on_ready=self._wake,
            )
            if read_ahead
            else None
        )
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
        if report_every < 0 or not report_interval > 0:
            raise ValueError(
                f"report_every ({report_every}) must be >= 0 and report_interval "
                f"({report_interval}) > 0"
            )
        self.report_every = report_every if session else 0
        self._progress = Progress(self.report_every, keep_finished=session)
        self._session: TrainerSession | None = None
        self._lost_count = 0  # sessions found lost: a shuffle buffer drops their records
        self._reporter: Reporter | None = None
        self._reports: Reports
        self._source: TaskSource
        if session:
            self._session = TrainerSession(
                self._link,
                name=self.name,
                report_every=self.report_every,
                report_interval=report_interval,
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
            self._reporter = Reporter(self._link, self.worker)
            self._reports = self._reporter
            self._source = UnaryTasks(self._link, self.worker)

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
        except TransportError as exc:
            if time.monotonic() < deadline:
                raise  # retry_timeout ran out first
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

    def request_save_model(self, trainer_id: str, block_dur: float) -> bool:
        """True if this trainer should save the model now (nobody else may for block_dur s)."""
        return self._call(
            "request_save_model", lambda c: c.request_save_model(trainer_id, block_dur)
        )

    def status(self) -> dict[str, object]:
        """The master's status (pass, queues, failed tasks with their reasons)."""
        return self._call("status", lambda c: c.status())

    def restore(self, checkpoint: bytes, key: str) -> bool:
        """Take the running job back to a data checkpoint, for a training job restarted from
        the model checkpoint saved beside it: every session ends (this one opens a new one),
        the passes go on from the checkpoint's position. `key` names the restart: every rank
        of one restart may ask with the same key, and only the first call restores (True).
        Raises CheckpointRefusedError naming the problem (another dataset, a damaged blob)."""
        applied, _ = self._call("restore", lambda c: c.restore(checkpoint, key))
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
            )
            ps.joined = self._last_ended == pass_id - 1
            self._pass = ps
            fetcher = TaskFetcher(
                self._source,
                ps,
                worker=self.worker,
                poll_wait=self.poll_wait,
                prefetch_tasks=self.prefetch_tasks,
                on_unclaimed=None if session is None else self._adopt,
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
                worker=self.worker,
            )
            self._fetchers = [t for t in self._fetchers if t.is_alive()]
            self._fetchers.append(feed.thread)
        feed.start()
        return feed

    def _abandon(self, ps: PassBuffer, why: str) -> None:
        """Cancel a pass's fetcher and drop its buffer; with a session, hand the pass's held
        tasks back at their exact positions now (closing, the Goodbye does). Lock held."""
        ps.abandon(why)
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
        """Slow path of next_record, lock held: next list, end of pass, error, or wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ps = self._pass
            if ps is None:
                self._check_open()
                raise RuntimeError("no pass started: call start_get_records(pass_id) first")
            try:
                return self._next()  # another thread may have installed a list meanwhile
            except StopIteration:
                pass
            run = ps.next_run(done)
            if run is not None:
                self._it = run.records
                self._next = run.records.__next__
                continue
            if ps.end is not None and not ps.fenced:
                self._check_open()
                if isinstance(ps.end, EndOfPass):
                    self._ended(ps)
                    raise EndOfPass(ps.pass_id)
                raise ps.end
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"no record of pass {ps.pass_id} within {timeout}s")
            self._cond.wait(remaining)

    def _ended(self, ps: PassBuffer) -> None:
        """The trainer read pass `ps` to its end (lock held)."""
        if not ps.cancel.cancelled:
            self._last_ended = max(self._last_ended, ps.pass_id)

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
        ps = self._start(pass_id, columns, reports=DeferredFinishes(self._reports, buf))
        with self._lock:
            self._progress.clip = buf.oldest
        reading: Iterator[Any] | None = None
        key: Key | None = None
        index = 0
        lost_seen = self._lost_count
        ended = finished = starving = False
        batch: list[tuple[Any, Key, int]] = []
        try:
            while True:
                released: list[Task] = []
                with self._lock:
                    buf.handed(batch)  # the previous batch: the trainer has taken it all
                    batch = []
                    if self._pass is not ps:
                        self._check_open()
                        log.warning("pass %d was replaced while iterating it", ps.pass_id)
                        return
                    if lost_seen != self._lost_count:  # those tasks went to other trainers
                        lost_seen = self._lost_count
                        buf.clear()
                        reading = key = None
                    if (buf or reading is not None) and not self._lease_ok():
                        self._cond.wait()
                        continue
                    while not ended and buf.room:
                        if reading is not None:
                            room = buf.room
                            got = list(itertools.islice(reading, room))
                            assert key is not None
                            buf.add(got, key, index)
                            index += len(got)
                            if len(got) == room:
                                continue
                            reading = key = None
                        run = ps.next_run([])  # the buffer says when a task is done
                        if run is not None:
                            starving = False
                            reading, index = run.records, run.first
                            key = (run.task.meta.id, run.task.meta.epoch)
                            continue
                        if ps.end is not None and not ps.fenced:
                            if not isinstance(ps.end, EndOfPass):
                                raise ps.end
                            self._ended(ps)
                            ended = True
                        elif not buf and not buf.deferred:
                            self._cond.wait()
                            continue
                        elif buf and not starving:
                            starving = not self._cond.wait(FILL_WAIT)
                            continue
                        break
                    batch = buf.draw(SHUFFLE_BATCH)
                    if buf.deferred:
                        released = buf.releasable(None if reading is None else key)
                        for task in released:
                            self._reports.finished(task)
                if released:
                    self._notify_done(released)
                if batch:
                    for record, _, _ in batch:
                        yield record
                elif ended and not buf.deferred:
                    finished = True
                    return
        finally:
            with self._lock:
                if self._progress.clip == buf.oldest:
                    self._progress.clip = None
                if not finished and self._pass is ps:
                    self._abandon(ps, "records() left early")

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
                        batch = self._take(ps, done)
                finally:
                    if done:
                        self._notify_done(done)
                if batch is None:
                    finished = True
                    return
                yield batch
        finally:
            if not finished:
                with self._lock:
                    if self._pass is ps:
                        self._abandon(ps, "records() left early")

    def _take(self, ps: PassBuffer, done: list[Task]) -> Iterator[Any] | None:
        """The next run of records for records(): None at the end of the pass. Lock held."""
        while True:
            if self._pass is not ps:
                self._check_open()
                now = None if self._pass is None else self._pass.pass_id
                log.warning("pass %d was replaced by pass %s while iterating it", ps.pass_id, now)
                return None
            if self._it is not _EMPTY_ITER:  # left over by next_record calls (maybe none)
                rest = self._it
                self._it = _EMPTY_ITER
                self._next = _EMPTY_ITER.__next__
                return rest
            run = ps.next_run(done)
            if run is not None:
                return run.records
            if ps.end is not None and not ps.fenced:
                if isinstance(ps.end, EndOfPass):
                    self._ended(ps)
                    return None
                raise ps.end
            self._cond.wait()

    # ---- closing -----------------------------------------------------------------------

    def close(self, flush_timeout: float = 5.0) -> None:
        """Stop every thread: cancel the pass, send queued reports (bounded), drop the channel.

        With a session: says Goodbye, handing the held tasks back at their exact positions,
        and waits up to `flush_timeout` s for the master's ack."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ps = self._pass
            if ps is not None:
                self._abandon(ps, "client closed")
            self._cond.notify_all()
        self._token.cancel()
        for t in self._fetchers:
            if t is not threading.current_thread():
                t.join(self.poll_wait + self._link.rpc_timeout)
                if t.is_alive():
                    log.warning("%s did not stop in time; closing the channel under it", t.name)
        if self._session is not None:
            with self._lock:
                positions = self._progress.held_positions()
            self._session.close(positions, flush_timeout)
        if self._reporter is not None:
            self._reporter.close(flush_timeout)
        if self._readahead is not None:
            self._readahead.close()
        self._link.close()
        if self._locator is not None:
            self._locator.close()

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

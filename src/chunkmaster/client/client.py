"""The trainer's client: records of the tasks the master hands out, one pass at a time.

Threads and hand-over. One fetcher thread per pass asks the master for tasks (long-polling),
reads each chunk whole and checks it (CRC, decompression, the framing of every record:
`recordio.scanner.load_chunk`), and appends the checked chunk data to the pass's deque. The
trainer's thread cuts the records out of it one at a time, as a direct `recordio.scan` does
(each record is created and consumed while cache-hot; the fetcher never materialises them).
The records of a chunk come from one C-level iterator (`map` over slices), so one step of it
is atomic under the GIL and several trainer threads may share it; only at a chunk boundary does
the trainer touch the deque (under the lock). The fetcher asks for the next task as soon as it
has read the current one: the trainer never waits on the network between tasks. A reporter
thread sends TaskFinished/TaskFailed, so a report never waits behind a long poll.

Guarantees (the original's defects in brackets):
* A task is reported finished when the trainer *takes* its last record, not when the record
  reaches the buffer [D10]; a crashed trainer's task is re-dispatched after the master's timeout.
* A chunk that cannot be read is reported with TaskFailed and its reason, and raised to the
  trainer as TaskReadError after the records before it: nothing is skipped silently [D8].
* The pass ends (EndOfPass) only when the master has moved past it, not when no task happens to
  be free [D2]; "all tasks failed" is raised as AllTaskFailedError.
* A new pass, or close(), cancels the previous fetcher and drops its records: passes never
  mix [D19]. The abandoned tasks are not reported; they come back after the master's timeout.
* Records are bytes, any content, empty allowed [D9].
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
import os
import queue
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from itertools import chain, islice, repeat
from types import TracebackType
from typing import TYPE_CHECKING, Final, TypeVar

from chunkmaster.client.connection import DEFAULT_TIMEOUT, MasterConnection
from chunkmaster.client.link import Cancelled, CancelToken, Locator, MasterLink
from chunkmaster.core.errors import (
    AllTaskFailedError,
    MasterError,
    NoMoreAvailableError,
    NotReadyError,
    PassAfterError,
    PassBeforeError,
)
from chunkmaster.core.model import Chunk, Task
from chunkmaster.recordio.errors import RecordIOError
from chunkmaster.recordio.scanner import load_chunk

if TYPE_CHECKING:
    from chunkmaster.etcd.discovery import MasterLocator

__all__ = ["Client", "ClientClosedError", "EndOfPass", "TaskReadError"]

log = logging.getLogger("chunkmaster.client")

_GIL: Final = bool(getattr(sys, "_is_gil_enabled", lambda: True)())
"""With the GIL, one step of a C-level iterator is atomic, so the fast path needs no lock."""

DEFAULT_BUFFER = 1024
PASS_POLL_MAX = 0.5  # seconds between GetTask calls while the master is still in an older pass
WAIT_LOG_EVERY = 30.0
_worker_ids = itertools.count()
_T = TypeVar("_T")


class EndOfPass(Exception):
    """The master has moved past this pass: every task of it is done."""

    def __init__(self, pass_id: int) -> None:
        super().__init__(f"end of pass {pass_id}")
        self.pass_id = pass_id


class ClientClosedError(RuntimeError):
    """The client was closed."""


class TaskReadError(Exception):
    """A chunk of a task could not be opened or read; the master was told (TaskFailed).

    The records of the task before the bad chunk were delivered; the rest of the task is not.
    The pass goes on: call next_record() again to continue it.
    """

    def __init__(self, task: Task, chunk: Chunk, cause: BaseException) -> None:
        self.task = task
        self.chunk = chunk
        self.cause = cause
        self.reason = describe_read_error(chunk, cause)
        super().__init__(
            f"task {task.meta.id} (epoch {task.meta.epoch}, pass {task.pass_id}): {self.reason}"
        )


def describe_read_error(chunk: Chunk, cause: BaseException) -> str:
    """The failure reason sent to the master: file, chunk offset and size, and the error."""
    what = cause.reason if isinstance(cause, RecordIOError) else str(cause)
    return (
        f"cannot read {chunk.path} chunk at offset {chunk.offset} "
        f"({chunk.num_records} records): {type(cause).__name__}: {what}"
    )


def cut_records(data: bytes, ends: list[int], n: int) -> Iterator[bytes]:
    """Records 0..n-1 of a checked chunk (`load_chunk`), each cut out when it is asked for.

    Only C-level iterators (no generator): one next() of it is atomic under the GIL, so
    several threads may share it, and a record is created just before it is consumed.
    """
    starts = map(operator.add, chain((0,), ends), repeat(4))
    return map(data.__getitem__, map(slice, starts, islice(ends, n) if n < len(ends) else ends))


def last_record(data: bytes, ends: list[int]) -> bytes:
    """The last record of a checked, non-empty chunk."""
    return data[ends[-2] + 4 if len(ends) > 1 else 4 : ends[-1]]


# A batch: (records, how many, task finished once these are taken, error to raise instead).
_Batch = tuple[Iterator[bytes], int, Task | None, BaseException | None]
_EMPTY_ITER: Final[Iterator[bytes]] = iter(())


class _PassRecords(chain[bytes]):
    """What records() returns: a chain of runs, closable like the generator it replaces."""

    _runs: Generator[Iterator[bytes], None, None]

    def __new__(cls, runs: Generator[Iterator[bytes], None, None]) -> _PassRecords:
        self: _PassRecords = cls.from_iterable(runs)  # type: ignore[assignment]
        self._runs = runs
        return self

    def close(self) -> None:
        """Stop reading the pass now (as leaving a for loop over it does)."""
        self._runs.close()


class _Pass:
    """One pass's fetcher and buffer. Everything but `cancel` is guarded by Client._lock."""

    def __init__(self, pass_id: int, parent: CancelToken) -> None:
        self.pass_id = pass_id
        self.cancel = CancelToken(parent)
        self.batches: deque[_Batch] = deque()
        self.queued = 0  # records in `batches`
        self.end: BaseException | None = None  # raised once `batches` is drained
        self.held: dict[int, Task] = {}  # taken from the master, neither finished nor failed
        self.thread: threading.Thread | None = None


class Client:
    """Reads the records of the tasks a master hands out. Thread-safe; a context manager.

    Give either `addr` ("host:port") or `etcd_endpoints` (the master is looked up at
    `/master/addr` and followed when it moves; `etcd_options` passes TLS and auth to the etcd
    client: ca_cert, cert_cert, cert_key, user, password). `buffer_size` bounds the records
    read ahead (at least one chunk is always read ahead). `prefetch_tasks` tasks are requested
    ahead of the one being read: few, because each held task's timeout on the master is running.
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
    ) -> None:
        if (addr is None) == (etcd_endpoints is None):
            raise ValueError("give exactly one of addr and etcd_endpoints")
        self.buffer_size = max(1, buffer_size)
        self.prefetch_tasks = max(0, prefetch_tasks)
        self.poll_wait = poll_wait
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{next(_worker_ids)}"
        self._on_task_done = on_task_done
        self._locator: MasterLocator | None = None
        locator: Locator | None = None
        if etcd_endpoints is not None:
            self._locator = locator = _make_locator(
                etcd_endpoints, etcd_timeout, etcd_job, etcd_options
            )
        self._link = MasterLink(addr, locator, rpc_timeout=rpc_timeout, retry_timeout=retry_timeout)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._token = CancelToken()  # cancelled by close(): every pass and client-level call
        self._pass: _Pass | None = None
        self._it: Iterator[bytes] = _EMPTY_ITER
        self._next: Callable[[], bytes] = _EMPTY_ITER.__next__
        self._fetchers: list[threading.Thread] = []
        self._closed = False
        self._reports: queue.SimpleQueue[tuple[str, Task, str] | None] = queue.SimpleQueue()
        self._report_token = CancelToken()  # separate: close() first lets reports drain
        self._reporter = threading.Thread(
            target=self._report_loop, name=f"chunkmaster-reporter-{self.worker}", daemon=True
        )
        self._reporter.start()

    # ---- plain calls ---------------------------------------------------------------------

    @property
    def address(self) -> str | None:
        """The master address in use (for etcd discovery: the latest one seen)."""
        return self._link.address

    def set_dataset(self, globs: Sequence[str] | str) -> None:
        """Tell the master the dataset (the first trainer's call wins); errors are raised."""
        paths = [globs] if isinstance(globs, str) else list(globs)
        self._call("set_dataset", lambda c: c.set_dataset(paths))

    def request_save_model(self, trainer_id: str, block_dur: float) -> bool:
        """True if this trainer should save the model now (nobody else may for block_dur s)."""
        return self._call(
            "request_save_model", lambda c: c.request_save_model(trainer_id, block_dur)
        )

    def status(self) -> dict[str, object]:
        """The master's status (pass, queues, failed tasks with their reasons)."""
        return self._call("status", lambda c: c.status())

    def _call(self, what: str, fn: Callable[[MasterConnection], _T]) -> _T:
        self._check_open()
        try:
            return self._link.call(what, fn, self._token)
        except Cancelled:
            raise ClientClosedError("client closed during " + what) from None

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("client is closed")

    # ---- passes ------------------------------------------------------------------------

    def start_get_records(self, pass_id: int) -> None:
        """Start fetching `pass_id`; an unfinished earlier pass is abandoned (records dropped)."""
        self._start(pass_id)

    def _start(self, pass_id: int) -> _Pass:
        with self._lock:
            self._check_open()
            old = self._pass
            if old is not None:
                self._abandon(old, f"pass {pass_id} started")
            ps = _Pass(pass_id, self._token)
            self._pass = ps
            self._it = _EMPTY_ITER
            self._next = _EMPTY_ITER.__next__
            ps.thread = threading.Thread(
                target=self._fetch_loop,
                args=(ps,),
                name=f"chunkmaster-fetch-{self.worker}-pass{pass_id}",
                daemon=True,
            )
            self._fetchers = [t for t in self._fetchers if t.is_alive()]
            self._fetchers.append(ps.thread)
            self._cond.notify_all()
        ps.thread.start()  # the old fetcher stops by itself (close() waits for it)
        return ps

    def _abandon(self, ps: _Pass, why: str) -> None:
        """Cancel a pass's fetcher and drop its buffer. Called with the lock held."""
        ps.cancel.cancel()
        if ps.end is None:
            dropped = ps.queued
            log.info(
                "pass %d abandoned (%s): %d buffered records dropped (and the rest of the "
                "chunk being read)%s",
                ps.pass_id,
                why,
                dropped,
                (
                    f"; tasks {sorted(ps.held)} not reported finished, the master hands them "
                    "out again after its timeout"
                )
                if ps.held
                else "",
            )
            ps.end = EndOfPass(ps.pass_id)
        ps.batches.clear()
        ps.queued = 0
        ps.held.clear()
        self._it = _EMPTY_ITER
        self._next = _EMPTY_ITER.__next__
        self._cond.notify_all()

    if _GIL:

        def next_record(self, timeout: float | None = None) -> bytes:
            """The next record of the current pass; blocks. Raises EndOfPass at its end.

            Also raises TaskReadError (the pass goes on), AllTaskFailedError, and
            TimeoutError if `timeout` seconds pass without a record.
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

        def next_record(self, timeout: float | None = None) -> bytes:
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

    def _refill(self, timeout: float | None, done: list[Task]) -> bytes:
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
            if ps.batches:
                records, count, task, error = ps.batches.popleft()
                if error is not None:
                    raise error
                ps.queued -= count
                self._cond.notify_all()  # room for the fetcher
                if task is not None:  # the task's last record (or an empty task)
                    self._task_taken(ps, task, done)
                    if count:
                        return next(records)
                    continue
                self._it = records
                self._next = records.__next__
                continue
            if ps.end is not None:
                self._check_open()
                if isinstance(ps.end, EndOfPass):
                    raise EndOfPass(ps.pass_id)
                raise ps.end
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"no record of pass {ps.pass_id} within {timeout}s")
            self._cond.wait(remaining)

    def _task_taken(self, ps: _Pass, task: Task, done: list[Task]) -> None:
        """The trainer took the task's last record: report it finished. Lock held."""
        ps.held.pop(task.meta.id, None)
        self._reports.put(("finish", task, ""))
        done.append(task)

    def _notify_done(self, done: list[Task]) -> None:
        if self._on_task_done is not None:
            for task in done:
                self._on_task_done(task)

    def records(self, pass_id: int) -> Iterator[bytes]:
        """Run one whole pass: `for record in client.records(p): ...`.

        Leaving the loop early abandons the pass (its fetcher stops, its buffer is dropped).
        A C-level chain over the pass's runs of records: no Python frame per record.
        """
        return _PassRecords(self._runs(pass_id))

    def _runs(self, pass_id: int) -> Generator[Iterator[bytes], None, None]:
        """The runs of records of one pass, each taken when the previous one is used up.

        Dropping the iterator early (a `break` out of records()) closes this generator,
        whose `finally` abandons the pass.
        """
        ps = self._start(pass_id)
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

    def _take(self, ps: _Pass, done: list[Task]) -> Iterator[bytes] | None:
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
            if ps.batches:
                records, count, task, error = ps.batches.popleft()
                if error is not None:
                    raise error
                ps.queued -= count
                self._cond.notify_all()
                if task is not None:
                    self._task_taken(ps, task, done)
                    if not count:
                        continue
                return records
            if ps.end is not None:
                if isinstance(ps.end, EndOfPass):
                    return None
                raise ps.end
            self._cond.wait()

    # ---- the fetcher -------------------------------------------------------------------

    def _fetch_loop(self, ps: _Pass) -> None:
        try:
            self._fetch(ps)
        except Cancelled:
            pass
        except BaseException as exc:  # a bug or a fatal answer: the trainer must see it
            if not ps.cancel.cancelled:
                log.exception("fetcher of pass %d failed", ps.pass_id)
            self._end_pass(ps, exc)

    def _fetch(self, ps: _Pass) -> None:
        waiting: type[Exception] | None = None
        since = last_log = time.monotonic()
        polls = 0
        while True:
            self._wait_slot(ps)
            # One ID per GetTask, the same for its retries: if an answer is lost (the master
            # failed over, a deadline passed), the retry gets that same task back.
            request_id = uuid.uuid4().hex
            try:
                task = self._link.call(
                    f"GetTask(pass {ps.pass_id})",
                    functools.partial(self._get_task, ps=ps, request_id=request_id),
                    ps.cancel,
                )
            except PassBeforeError:
                self._end_pass(ps, EndOfPass(ps.pass_id))
                return
            except AllTaskFailedError as exc:
                self._end_pass(ps, exc)
                return
            except (NoMoreAvailableError, NotReadyError, PassAfterError) as exc:
                now = time.monotonic()
                if waiting is not type(exc):
                    waiting, since, last_log, polls = type(exc), now, now, 0
                    _log_wait(ps.pass_id, exc, 0.0, logging.INFO)
                elif now - last_log >= WAIT_LOG_EVERY:
                    last_log = now
                    _log_wait(ps.pass_id, exc, now - since, logging.WARNING)
                if isinstance(exc, PassAfterError):  # answered at once: poll, gently
                    ps.cancel.sleep(min(PASS_POLL_MAX, 0.02 * 2**polls))
                    polls += 1
                continue
            waiting = None
            with self._lock:
                if ps.cancel.cancelled:
                    return  # abandoned meanwhile; the task comes back after its timeout
                ps.held[task.meta.id] = task
            self._read_task(ps, task)

    def _get_task(self, conn: MasterConnection, ps: _Pass, request_id: str) -> Task:
        # Abandoning the pass cancels the long poll; a task the master dispatched meanwhile
        # keeps its timer there (the dispatch is shielded) and comes back after its timeout.
        call = conn.get_task_async(
            ps.pass_id, wait=self.poll_wait, worker=self.worker, request_id=request_id
        )
        return ps.cancel.run(call)

    def _read_task(self, ps: _Pass, task: Task) -> None:
        chunks = task.chunks
        if not chunks:
            self._push(ps, [(_EMPTY_ITER, 0, task, None)])
            return
        last = len(chunks) - 1
        for i, chunk in enumerate(chunks):
            self._wait_room(ps)
            try:
                data, ends = load_chunk(chunk.path, chunk.offset, chunk.num_records)
            except (RecordIOError, OSError) as exc:
                err = TaskReadError(task, chunk, exc)
                log.error("%s; reporting the task failed", err)
                with self._lock:
                    ps.held.pop(task.meta.id, None)
                self._reports.put(("fail", task, err.reason))
                self._push(ps, [(_EMPTY_ITER, 0, None, err)])
                return
            n = len(ends)
            if i < last:
                self._push(ps, [(cut_records(data, ends, n), n, None, None)])
            elif n:  # the last record is taken alone, so "finished" means taken (D10)
                tail = iter((last_record(data, ends),))
                batches: list[_Batch] = [(tail, 1, task, None)]
                if n > 1:
                    batches.insert(0, (cut_records(data, ends, n - 1), n - 1, None, None))
                self._push(ps, batches)
            else:
                self._push(ps, [(_EMPTY_ITER, 0, task, None)])
            del data, ends

    def _wait_slot(self, ps: _Pass) -> None:
        """Hold at most 1 + prefetch_tasks tasks: the master's timeout runs for each of them."""
        with self._lock:
            while len(ps.held) > self.prefetch_tasks and not ps.cancel.cancelled:
                self._cond.wait()
        ps.cancel.check()

    def _wait_room(self, ps: _Pass) -> None:
        with self._lock:
            while ps.queued >= self.buffer_size and not ps.cancel.cancelled:
                self._cond.wait()
        ps.cancel.check()

    def _push(self, ps: _Pass, batches: list[_Batch]) -> None:
        with self._lock:
            if ps.cancel.cancelled:
                raise Cancelled()
            for b in batches:
                ps.batches.append(b)
                ps.queued += b[1]
            self._cond.notify_all()

    def _end_pass(self, ps: _Pass, end: BaseException) -> None:
        with self._lock:
            if ps.end is None and not ps.cancel.cancelled:
                ps.end = end
                self._cond.notify_all()

    # ---- reports -----------------------------------------------------------------------

    def _report_loop(self) -> None:
        while True:
            item = self._reports.get()
            if item is None:
                return
            kind, task, reason = item
            try:
                applied = self._send_report(kind, task, reason)
            except Cancelled:
                left = 1 + sum(1 for _ in iter(self._reports.get_nowait, None))
                log.warning(
                    "client closed with %d task report(s) unsent; those tasks come back "
                    "after the master's timeout",
                    left,
                )
                return
            except MasterError as exc:
                log.warning(
                    "%s of task %d (epoch %d): %s", kind, task.meta.id, task.meta.epoch, exc
                )
                continue
            if not applied:
                log.info(
                    "master ignored %s of task %d (epoch %d): it timed out and went to "
                    "another trainer, or its pass is over",
                    kind,
                    task.meta.id,
                    task.meta.epoch,
                )

    def _send_report(self, kind: str, task: Task, reason: str) -> bool:
        meta = task.meta
        if kind == "finish":
            return self._link.call(
                f"TaskFinished(task {meta.id})",
                lambda c: c.task_finished(meta.id, epoch=meta.epoch, pass_id=task.pass_id),
                self._report_token,
            )
        return self._link.call(
            f"TaskFailed(task {meta.id})",
            lambda c: c.task_failed(meta, reason),
            self._report_token,
        )

    # ---- closing -----------------------------------------------------------------------

    def close(self, flush_timeout: float = 5.0) -> None:
        """Stop every thread: cancel the pass, send queued reports (bounded), drop the channel."""
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
        self._reports.put(None)
        if self._reporter is not threading.current_thread():
            self._reporter.join(flush_timeout)
            if self._reporter.is_alive():
                self._report_token.cancel()
                self._reporter.join(self._link.rpc_timeout)
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


def _log_wait(pass_id: int, exc: Exception, waited: float, level: int) -> None:
    if isinstance(exc, NoMoreAvailableError):
        what = "no task free; waiting for the other trainers' tasks to finish or come back"
    elif isinstance(exc, PassAfterError):
        what = "the master is still in an earlier pass; waiting for it to finish"
    else:
        what = "the master has no dataset yet; waiting for a trainer's set_dataset"
    suffix = f" (for {waited:.0f}s)" if waited else ""
    log.log(level, "pass %d: %s%s", pass_id, what, suffix)


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

"""The trainer's client: records of the tasks the master hands out, one pass at a time.

`Client` is the public API: a facade over the link to the master (link.py), the trainer's
session (session.py; without one, unary calls and a reporter.py thread) and its passes
(passes.py), each read by a `PassReader` (pass_reader.py): a fetcher thread asks the master for
tasks ahead of need, the trainer's thread reads their chunks itself (only tasks cross threads,
never chunk data) in runs of records, each one C-level iterator, so that one step of it is
atomic under the GIL and several trainer threads may share next_record().

Guarantees:
* A task is reported finished when the trainer *takes* its last record; a crashed
  trainer's task is re-dispatched after the master's timeout.
* A chunk that cannot be read is reported with TaskFailed and its reason, and raised to the
  trainer as TaskReadError after the records before it: nothing is skipped silently.
* The pass ends (EndOfPass) only when the master has moved past it, not when no task happens to
  be free; "all tasks failed" is raised as AllTaskFailedError, and a job stopped by
  its error budget (too many records quarantined) as JobStoppedError, naming the tasks,
  files and reasons.
* A new pass, or close(), cancels the previous fetcher and drops its tasks: passes never
  mix.
* Records are what the dataset's format makes them (docs/formats.md): bytes for RecordIO and
  TFRecord (any content, empty allowed), dicts for JSON Lines objects and Parquet rows,
  str for text lines. Parquet also gives whole Arrow record batches (`batches()`).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

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
from chunkmaster.client.link import Cancelled, CancelToken, MasterLink
from chunkmaster.client.mixture import (
    Schedule,
    Sources,
    WeightChange,
    absolute,
    schedule_to_pb,
    sources_to_pb,
)
from chunkmaster.client.options import Connection, Reading, Session, resolve
from chunkmaster.client.passes import Passes, PassRecords
from chunkmaster.client.shuffle_buffer import ShuffleBuffer, buffer_rng
from chunkmaster.closing import Closing
from chunkmaster.core.errors import CheckpointRefusedError
from chunkmaster.core.model import Task
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

_worker_ids = itertools.count()
_T = TypeVar("_T")
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


class Client(Closing):
    """Reads the records of the tasks a master hands out. Thread-safe; a context manager.

    Give either `addr` ("host:port") or `etcd_endpoints` (the master is looked up at
    `/master/addr` and followed when it moves). `name`: the trainer's name in the master's
    status (default host:pid:N, N telling apart the clients of one process). `token`: the
    master's shared token (default: the file CHUNKMASTER_TOKEN_FILE names, or the
    CHUNKMASTER_TOKEN variable; a shortcut for `Connection(token=...)`).
    `on_task_done(task)` is called in the trainer's thread when a task's last record is taken.

    The other options come in three groups (client/options.py, docs/client.md):
    `connection=Connection(...)`, `session=Session(...)` (`session=False`: the unary calls only,
    no commit(), tasks come back by the master's timeout) and `reading=Reading(...)`.

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
        self._link, self._locator = _open_link(addr, etcd_endpoints, conn)
        self._token = CancelToken()  # cancelled by close(): every pass and client-level call
        self.report_every = sess.report_every if options.session else 0
        self._passes = Passes(
            read,
            self._token,
            report_every=self.report_every,
            keep_finished=options.session,
            on_task_done=options.on_task_done,
        )
        self._passes.connect(
            self._link,
            sess if options.session else None,
            worker=self.name,
            poll_wait=self.poll_wait,
            world=(self.world_size, self.rank),
            data_wait=lambda: data_wait_pb(self.wait_meter),
        )
        self._session = self._passes.session
        self._reporter = self._passes.reporter
        self._pid = os.getpid()
        _open_clients.add(self)

    #: The training loop's wait for data, measured by a reader that knows its batches (the
    #: torch loader); each keep-alive reports it.
    wait_meter: WaitMeter | None = None

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
        paths: list[str] = []
        sources: list[pb.Source] = []
        if isinstance(globs, Mapping):
            sources = sources_to_pb(globs)
            named: object = list(globs)
        else:
            given = [globs] if isinstance(globs, str) else list(globs)
            named = paths = absolute(given)
            moved = [f"{g!r} as {p!r}" for g, p in zip(given, paths, strict=True) if g != p]
            if moved:
                log.info(
                    "set_dataset: relative patterns read in %s: %s", os.getcwd(), ", ".join(moved)
                )
        deadline = time.monotonic() + timeout

        def call(conn: MasterConnection) -> None:
            conn.set_dataset(paths, max(deadline - time.monotonic(), _MIN_DEADLINE), sources)

        try:
            self._call("set_dataset", call, deadline)
            self._link.startup.dataset = True
        except TransportError as exc:
            if time.monotonic() < deadline:
                raise  # retry_timeout or startup_timeout ran out first
            raise TimeoutError(
                f"set_dataset({named}): the master did not answer within {timeout}s ({exc})"
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
        """Add sources to the running mixture (each starts at its epoch 0), with the weights
        from then on as `set_weights` takes them (None: the weights in force, each added source
        at its `Source` weight). Raises DatasetError naming a source the job has already, or
        one that cannot be indexed: nothing is added (docs/mixtures.md)."""
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
        """Make durable on the master what this trainer consumed since its last commit: the
        task being read at its exact position, the tasks finished since at their end.

        Raises the master's error: CheckpointRefusedError if one of those tasks went to another
        trainer meanwhile (the refused positions are not sent again). TimeoutError after
        `timeout` seconds (the commit may still land; the next one sends the positions again).
        A store refusing writes for now gets the commit again with backoff (docs/client.md).
        """
        session = self._session
        if session is None:
            raise RuntimeError("commit() needs a session: create the Client with session=True")
        progress = self._passes.progress
        with self._passes.cond:
            self._passes.check_open()
            positions = progress.to_commit()
        if not positions:
            return
        try:
            session.commit(positions, timeout)
        except Cancelled:
            raise ClientClosedError("client closed during commit") from None
        except CallCancelled:
            raise ClientClosedError("client closed during commit") from None
        except CheckpointRefusedError:
            with self._passes.cond:
                progress.committed(positions)
            raise
        with self._passes.cond:
            progress.committed(positions)

    def wait_lease(self) -> None:
        """Wait while the session's lease is in doubt (readers outside the client hand out
        records only while it certainly holds); raises if the master stays unreachable."""
        self._passes.wait_lease()

    def _call(
        self, what: str, fn: Callable[[MasterConnection], _T], deadline: float | None = None
    ) -> _T:
        self._passes.check_open()
        try:
            return self._link.call(what, fn, self._token, deadline)
        except Cancelled:
            raise ClientClosedError("client closed during " + what) from None

    # ---- passes ------------------------------------------------------------------------

    def start_get_records(self, pass_id: int, columns: Sequence[str] | None = None) -> None:
        """Start fetching `pass_id`; an unfinished earlier pass is abandoned (records dropped).
        `columns`: read only these columns of a columnar (Parquet) dataset."""
        if self.shuffle_buffer:
            raise RuntimeError("a shuffle buffer mixes the records of records(pass_id) only")
        self._passes.start(pass_id, columns)

    def feed(self, pass_id: int, stock: int, joined: bool) -> PassFeed:
        """A pass's tasks for readers outside this client (client/feed.py), `stock` of them
        fetched ahead; `joined`: the caller read the pass before to its end. Needs a session.
        An unfinished pass of this client's own (`records()`) is abandoned first."""
        return self._passes.open_feed(pass_id, stock, joined)

    if _GIL:

        def next_record(self, timeout: float | None = None) -> Any:
            """The next record of the current pass; blocks. Raises EndOfPass at its end.

            Also raises TaskReadError (the pass goes on), AllTaskFailedError,
            JobStoppedError, and TimeoutError if `timeout` seconds pass without a record.
            """
            passes = self._passes
            try:
                return passes.run_next()  # the fast path: one step of the chunk's records
            except StopIteration:
                pass
            done: list[Task] = []
            try:
                with passes.cond:
                    return passes.refill(timeout, done)
            finally:
                passes.tasks_done(done)

    else:  # pragma: no cover - free-threaded Python: the iterator step needs the lock

        def next_record(self, timeout: float | None = None) -> Any:
            """The next record of the current pass; blocks. Raises EndOfPass at its end."""
            passes = self._passes
            done: list[Task] = []
            try:
                with passes.cond:
                    try:
                        return passes.run_next()
                    except StopIteration:
                        return passes.refill(timeout, done)
            finally:
                passes.tasks_done(done)

    def records(self, pass_id: int, columns: Sequence[str] | None = None) -> Iterator[Any]:
        """Run one whole pass: `for record in client.records(p): ...`.

        Leaving the loop early abandons the pass (its fetcher stops, its buffer is dropped).
        A C-level chain over the pass's runs of records: no Python frame per record.
        With a shuffle buffer, a generator that draws each record from it.
        `columns`: read only these columns of a columnar (Parquet) dataset's rows.
        """
        if self.shuffle_buffer:
            return self._passes.shuffled(pass_id, columns, lambda: self._shuffle_buffer(pass_id))
        return PassRecords(self._passes.runs(pass_id, columns))

    def _shuffle_buffer(self, pass_id: int) -> ShuffleBuffer:
        """This trainer's shuffle buffer for `pass_id`, seeded by (seed, pass, name); the seed
        is the master's --shuffle-seed unless the Reading options gave one."""
        if self.shuffle_seed is None:
            seed = self.status().get("shuffle_seed")
            self.shuffle_seed = seed if isinstance(seed, int) else 0
        return ShuffleBuffer(self.shuffle_buffer, buffer_rng(self.shuffle_seed, pass_id, self.name))

    def batches(self, pass_id: int, columns: Sequence[str] | None = None) -> Iterator[Any]:
        """Run one whole pass of a columnar (Parquet) dataset as `pyarrow.RecordBatch`es: each
        the rows of one chunk (a row group) not yet consumed, `columns` only if given.

        Taking a batch consumes its rows: progress, commits and the task's finish count them
        as records() would. Other formats raise TypeError at their first chunk.
        """
        return PassRecords(self._passes.runs(pass_id, columns, batches=True))

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
        passes = self._passes
        if not passes.shut():
            return
        _open_clients.discard(self)
        rpc_timeout = self._link.rpc_timeout
        # 1. The fetchers stop (their calls cancelled), so that the held tasks are final.
        self._token.cancel()
        left = join_all(passes.fetchers, time.monotonic() + rpc_timeout)
        # 2. The Goodbye, or the queued reports, for up to flush_timeout.
        if self._session is not None:
            with passes.cond:
                positions = passes.progress.held_positions()
            self._session.close(positions, flush_timeout)
        if self._reporter is not None:
            self._reporter.close(flush_timeout)
        # 3. Everything else ends: no more reads, the channel closed under any call left.
        if passes.readahead is not None:
            passes.readahead.close()
        with passes.cond:
            passes.files.close()
        self._link.close()
        if self._locator is not None:
            self._locator.close()
        # 4. Every thread gone, then gRPC's threads done with every call.
        deadline = time.monotonic() + rpc_timeout
        if self._session is not None:
            left += self._session.join(deadline)
        if self._reporter is not None:
            left += self._reporter.join(deadline)
        if passes.readahead is not None:
            left += passes.readahead.join(deadline)
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
        return self._passes.closed


def data_wait_pb(meter: WaitMeter | None) -> pb.DataWait | None:
    """The training loop's wait for data as a keep-alive carries it (None: not measured)."""
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


def _open_link(
    addr: str | None, etcd_endpoints: Sequence[str] | str | None, conn: Connection
) -> tuple[MasterLink, MasterLocator | None]:
    """The link to the master at `addr`, or found through etcd (then its locator too)."""
    locator = None
    if etcd_endpoints is not None:
        from chunkmaster.etcd.discovery import MasterLocator  # only trainers that use etcd
        from chunkmaster.etcd.options import EtcdOptions

        etcd = EtcdOptions.parse(etcd_endpoints, **dict(conn.etcd_options or {}))
        locator = MasterLocator(etcd, job=conn.etcd_job, timeout=conn.etcd_timeout)
    security = ChannelSecurity.load(conn.token, conn.tls_ca, conn.tls_cert, conn.tls_key)
    link = MasterLink(
        addr,
        locator,
        rpc_timeout=conn.rpc_timeout,
        retry_timeout=conn.retry_timeout,
        security=security,
        startup_timeout=conn.startup_timeout,
    )
    return link, locator

"""`Loader`: a PyTorch DataLoader over a chunkmaster job, with commits and a state_dict.

One `Loader` per rank. Its main process holds the rank's one session with the master (the
trainer that equal steps count, whatever its number of workers); its DataLoader workers read
the tasks the main process hands them (channel.py, readers.py). Each iteration of the loader
is one pass: every record of the pass once over all ranks. `commit()` after an optimizer step
commits exactly the batches the training loop has taken; `state_dict()` commits and returns
the job's data checkpoint, to save beside the model checkpoint; `load_state_dict()` on a
restarted job takes the master back to it (docs/torch.md).
"""

from __future__ import annotations

import hashlib
import io
import logging
import multiprocessing
import os
import pickle
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import DataLoader, default_collate

from chunkmaster.client.client import Client, declared_world
from chunkmaster.client.datawait import WaitMeter
from chunkmaster.client.errors import EndOfPass
from chunkmaster.client.feed import PassFeed
from chunkmaster.client.mixture import Sources
from chunkmaster.client.options import GROUPED, Options
from chunkmaster.client.options import resolve as resolve_options
from chunkmaster.core.errors import PassOverError
from chunkmaster.core.model import Task
from chunkmaster.torch.batches import Batch, Loose, Merger, ReadFailure, pinned
from chunkmaster.torch.channel import LocalEnd, Round, TaskKey, WorkerTasks
from chunkmaster.torch.readers import Readers

log = logging.getLogger("chunkmaster.torch")

STATE_VERSION = 1
READ_ERRORS_KEPT = 100  # read failure reasons a loader remembers (the master has them all)


def _keep(item: Any) -> Any:
    """The DataLoader's collate_fn: workers send whole items (batches.py)."""
    return item


START_METHOD = "forkserver"  # DataLoader workers' start method when the loader is not given one

FORK_RISK = (
    "DataLoader workers forked from a process whose gRPC threads run (the loader's session "
    "with the master) may crash: gRPC does not support fork() with live threads"
)


class _MainChecker(pickle.Pickler):
    """A pickler that also refuses what a worker could not import: a function or class of a
    __main__ that is no file (an interactive session, python -c)."""

    def reducer_override(self, obj: Any) -> Any:
        if (
            isinstance(obj, type | types.FunctionType)
            and obj.__module__ == "__main__"
            and getattr(sys.modules.get("__main__"), "__file__", None) is None
        ):
            raise pickle.PicklingError(
                f"{obj.__qualname__} is defined in __main__, which is no file"
            )
        return NotImplemented


def _unpicklable(pieces: Mapping[str, Any]) -> str | None:
    """The first of `pieces` (name -> object) that cannot go to a worker of a fresh process,
    and why; None when all can."""
    for name, obj in pieces.items():
        try:
            _MainChecker(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        except Exception as e:  # whatever pickling raises: the reason is shown
            return f"{name} {obj!r} cannot be pickled ({type(e).__name__}: {e})"
    return None


def _worker_context(given: Any, pieces: Mapping[str, Any]) -> Any:
    """The workers' multiprocessing context. One given is honoured (with a warning for fork,
    see FORK_RISK). By default forkserver: its server process is started fresh before the
    loader connects and forks the workers, so no worker inherits gRPC; workers then get their
    transform, collate_fn and worker_init_fn pickled, and when one cannot be, fork (warned)."""
    if given is not None:
        context = multiprocessing.get_context(given) if isinstance(given, str) else given
        if context.get_start_method() == "fork":
            log.warning(
                "multiprocessing_context='fork': %s; a worker may die of a segmentation "
                "fault. Leave multiprocessing_context unset (forkserver) or use 'spawn' "
                "(docs/torch.md)",
                FORK_RISK,
            )
        return context
    if START_METHOD not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context()
    reason = _unpicklable(pieces)
    if reason is None:
        return multiprocessing.get_context(START_METHOD)
    log.warning(
        "DataLoader workers start by fork, not %s: %s. %s; a worker may die of a "
        "segmentation fault. Define it at the top level of a module (docs/torch.md)",
        START_METHOD,
        reason,
        FORK_RISK,
    )
    return multiprocessing.get_context("fork")


def _start_forkserver() -> None:
    """Start the forkserver (fork and exec: a fresh process) before the loader's first channel,
    with torch and this package imported once there rather than in every worker."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    preload = list(getattr(server, "_preload_modules", None) or ["__main__"])
    if __name__ not in preload and getattr(server, "_forkserver_pid", None) is None:
        forkserver.set_forkserver_preload([*preload, __name__])
    forkserver.ensure_running()


def _client_options(
    addr: str | None, etcd_endpoints: Sequence[str] | str | None, given: dict[str, Any]
) -> Options:
    """The rank's Client options from the Loader's keyword arguments: grouped as the Client
    takes them, or flat as before (a DeprecationWarning each, at the line that made the
    Loader). ValueError for what a Loader cannot do."""
    if "drop_last" in given:
        raise ValueError(
            "drop_last is not supported: every record of a pass is delivered once; for "
            "equal batches on every rank start the master with --equal-steps"
        )
    grouped = {k: given.pop(k) for k in GROUPED if k in given}
    options = resolve_options(
        addr=addr,
        etcd_endpoints=etcd_endpoints,
        legacy=given,  # the flat ones of before, with a warning each
        stacklevel=3,  # Loader.__init__'s caller
        **grouped,
    )
    if not options.session:
        raise ValueError("a Loader needs a session (commits, progress, equal steps)")
    if options.reading.shuffle_buffer or options.reading.shuffle_seed is not None:
        raise ValueError(
            "Reading(shuffle_buffer=, shuffle_seed=) is the Client's buffer, which a Loader "
            "does not use: a Loader reads records in the job's shuffled order when the master "
            "has --shuffle-seed and --shuffle-window (docs/shuffle.md)"
        )
    return options


class Loader:
    """Batches of a chunkmaster job's records, one pass per iteration (see the module's text;
    every argument in docs/torch.md).

    The master: `addr` or `etcd_endpoints`; the rank's `Client` options as keyword arguments,
    as the Client takes them. `dataset`: patterns, or a mixture of named sources
    (`Client.set_dataset`'s), to set on the master. Records become samples
    through `transform` (in the workers), batches through `collate_fn` (default_collate) of
    `batch_size` samples (None: one by one). The DataLoader's own options pass through; without
    a `multiprocessing_context` workers start by forkserver (never forked from this process,
    whose gRPC threads run), so what they run is pickled. `columns`: of a Parquet dataset.
    A chunk that cannot be read is reported to the master and the pass goes on; `read_errors`
    counts them, and each is logged.
    """

    def __init__(
        self,
        addr: str | None = None,
        *,
        etcd_endpoints: Sequence[str] | str | None = None,
        dataset: Sequence[str] | str | Sources | None = None,
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = 1,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        pin_memory: bool = False,
        in_order: bool = True,
        multiprocessing_context: Any = None,
        worker_init_fn: Callable[[int], None] | None = None,
        timeout: float = 0.0,
        columns: Sequence[str] | None = None,
        restore_key: str | None = None,
        **client_options: Any,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be 1 or more (or None), not {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be 0 or more, not {num_workers}")
        self._options = _client_options(addr, etcd_endpoints, client_options)
        self.dataset = [dataset] if isinstance(dataset, str) else dataset
        self.batch_size = batch_size
        self._collate = collate_fn if collate_fn is not None else default_collate
        self.num_workers = num_workers
        self._pin = pin_memory
        self.restore_key = restore_key
        self.pass_id: int | None = None  # the pass the next iteration reads (None: the master's)
        self.read_errors = 0
        self.read_error_reasons: list[str] = []
        self.meter = WaitMeter()
        self._completed = -1  # the last pass this loader read to its end
        self._took_part = -1  # the last pass this loader's training loop took a batch of
        self._client: Client | None = None
        self._restore: bytes | None = None
        self._other_job = False
        self._rounds = 0
        self._readers = Readers(
            transform=transform,
            batch_size=batch_size,
            collate=self._collate,
            columns=columns,
            reading=self._options.reading,
        )
        self._loader = self._data_loader(
            {"transform": transform, "collate_fn": collate_fn, "worker_init_fn": worker_init_fn},
            num_workers=num_workers,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
            in_order=in_order,
            multiprocessing_context=multiprocessing_context,
            worker_init_fn=worker_init_fn,
            timeout=timeout,
        )

    def _data_loader(self, pieces: dict[str, Any], **workers: Any) -> DataLoader[Any]:
        """The DataLoader over this loader's readers (`workers`: its own options). With
        workers: their channel (channel.py), started by forkserver unless a context is given;
        `pieces` (the transform, collate_fn and worker_init_fn) must then be picklable."""
        num_workers = workers["num_workers"]
        self._forkserver = False
        self._worker_tasks: WorkerTasks | None = None
        if num_workers:
            context = _worker_context(workers["multiprocessing_context"], pieces)
            workers["multiprocessing_context"] = context
            self._forkserver = context.get_start_method() == "forkserver"
            self._worker_tasks = WorkerTasks(context, num_workers)
            self._readers.ends = self._worker_tasks.ends()
        else:
            workers["multiprocessing_context"] = None
        return DataLoader(self._readers, batch_size=None, collate_fn=_keep, **workers)

    # ---- the job ----------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """This rank's client (its session), made on first use."""
        if self._client is None:
            if self._forkserver:
                _start_forkserver()
            blob, self._restore = self._restore, None
            if blob is not None:
                self._restore_job(blob)
            self._client = Client(**self._options.client_kwargs())
            self._client.wait_meter = self.meter
            if self.dataset is not None:
                self._client.set_dataset(self.dataset)
        return self._client

    def set_pass(self, pass_id: int) -> None:
        """Read `pass_id` in the next iteration (by default: the pass after the last one read
        to its end, or the master's current pass for the first)."""
        self.pass_id = pass_id

    def commit(self, timeout: float | None = None) -> None:
        """Make durable on the master exactly the batches the training loop has taken (call it
        after the optimizer step that used them). Raises as `Client.commit` does."""
        self.client.commit(timeout)

    def state_dict(self) -> dict[str, Any]:
        """Commit, then the job's data checkpoint (all ranks' commits so far): save it beside
        the model checkpoint. In DDP: every rank commits, a barrier, then one rank saves."""
        client = self.client
        client.commit()
        return {
            "chunkmaster": STATE_VERSION,
            "pass": self.pass_id,
            "checkpoint": client.data_checkpoint(),
        }

    def load_state_dict(self, state: Mapping[str, Any], *, other_job: bool = False) -> None:
        """Resume from `state_dict()`'s value: the master goes back to its data checkpoint
        before this loader reads (every rank of one restart may call it: the master restores
        once per restart; under torchrun the restart is told by its variables, else give
        every rank the same `restore_key`). A state of another job is refused naming both,
        unless `other_job`."""
        if not isinstance(state, Mapping) or state.get("chunkmaster") != STATE_VERSION:
            raise ValueError(
                "not a chunkmaster.torch.Loader state (a state_dict() value of this version)"
            )
        blob = state.get("checkpoint")
        if not isinstance(blob, bytes | bytearray):
            raise ValueError("the loader state holds no data checkpoint")
        self.pass_id = None  # the master's pass after the restore
        self._completed = self._took_part = -1
        self._other_job = other_job
        if self._client is None:
            self._restore = bytes(blob)
        else:
            self._restore_job(bytes(blob))

    def _restore_job(self, blob: bytes) -> None:
        key = self.restore_key or _restart_key(blob)
        opts = self._options  # a plain client: no session, nothing read
        world, rank = declared_world(opts.session_options.world_size, opts.session_options.rank)
        with Client(
            opts.addr, etcd_endpoints=opts.etcd_endpoints, connection=opts.connection, session=False
        ) as plain:
            applied = plain.restore(blob, key, rank if world else None, other_job=self._other_job)
        log.info(
            "the job %s its data checkpoint (restart %s)",
            "went back to" if applied else "was already back at",
            key,
        )

    # ---- passes ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        client = self.client
        pass_id = self.pass_id
        if pass_id is None:
            cur = client.status().get("cur_pass")
            pass_id = cur if isinstance(cur, int) else 0
            log.info("this loader's iteration reads pass %d (%s)", pass_id, _why_pass(pass_id))
        stock = 1
        # A loop left (a `break`) at the pass's last batch finds it over when it comes back:
        # that is its end, not a pass it missed.
        joined = self._completed == pass_id - 1 or self._took_part == pass_id
        feed = client.feed(pass_id, stock=stock, joined=joined)
        return self._run(feed)

    def _run(self, feed: PassFeed) -> Iterator[Any]:
        p = feed.pass_id
        self.pass_id = p
        run = _PassRun(self, feed)
        completed = False
        self.meter.restart()
        try:
            while True:
                started = time.monotonic()
                if not feed.wait_ready():
                    end = feed.end
                    if end is None:  # abandoned: not read to its end here
                        raise RuntimeError(
                            f"this iteration of pass {p} was left: a newer iteration of the "
                            "loader began, or the loader was closed"
                        )
                    if isinstance(end, EndOfPass):
                        break
                    if isinstance(end, PassOverError):
                        raise self._pass_over(p, end) from end
                    raise end
                run.waited = time.monotonic() - started
                yield from self._round(run)
            completed = True
            self._completed = p
            self.pass_id = p + 1
        finally:
            if not completed:
                feed.abandon()  # its tasks go back at the positions the loop took them to

    def _pass_over(self, pass_id: int, exc: PassOverError) -> PassOverError:
        """The client's PassOverError, told in the Loader's terms: what to call on it."""
        try:
            cur = self.client.status().get("cur_pass")
        except Exception:  # the master's pass is in the client's text anyway
            cur = None
        now = f"pass {cur}" if isinstance(cur, int) else "the master's current pass"
        arg = str(cur) if isinstance(cur, int) else "N"
        return PassOverError(
            f"{exc}. With the Loader: call loader.set_pass({arg}) to read {now} in the next "
            "iteration (a new Loader, or one after load_state_dict, starts at the master's "
            "current pass by itself)"
        )

    def _round(self, run: _PassRun) -> Iterator[Any]:
        """One round of the DataLoader's workers over the tasks the feed has ready."""
        feed = run.feed
        round_ = run.round = Round(self._rounds)
        self._rounds += 1
        if self._worker_tasks is not None:
            self._worker_tasks.begin(round_, feed.take, lambda task: feed.restock(task, task.start))
        else:
            self._readers.local = LocalEnd(round_, feed.take)
        try:
            batches = iter(self._loader)
            while True:
                started = time.monotonic()
                try:
                    item = next(batches)
                except StopIteration:
                    break
                run.waited += time.monotonic() - started
                if isinstance(item, Batch):
                    if run.take(item.marks):
                        yield item.data
                elif isinstance(item, Loose):
                    for batch in run.merge(item):
                        yield self._pinned(batch)
                elif isinstance(item, ReadFailure):
                    run.read_failure(item)
        finally:
            if self._worker_tasks is not None:
                self._worker_tasks.end(round_)
            else:
                self._readers.local = None
            run.tasks.update(round_.given)
        # The round is over: what is left of the workers' batches goes now (a pass's last
        # batch), and a task no worker read to its end goes back to the stock.
        while (batch := run.merger.pop()) is not None:
            if run.take(batch.marks):
                yield self._pinned(batch.data)
        run.restock()

    def _failed(self, feed: PassFeed, task: Task, records: int, reason: str) -> None:
        self.read_errors += 1
        if len(self.read_error_reasons) < READ_ERRORS_KEPT:
            self.read_error_reasons.append(reason)
        log.error(
            "task %d (epoch %d) of pass %d: %s; reported to the master, the pass goes on",
            task.meta.id,
            task.meta.epoch,
            task.pass_id,
            reason,
        )
        feed.failed(task, records, reason)

    def _pinned(self, data: Any) -> Any:
        if not self._pin:
            return data
        import torch

        return pinned(data) if torch.cuda.is_available() else data

    # ---- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the workers and the session (held tasks go back to the master at once)."""
        iterator = getattr(self._loader, "_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if self._worker_tasks is not None:
            self._worker_tasks.close()
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PassRun:
    """One pass's bookkeeping in the rank's main process: the tasks handed to workers, how far
    the main process received each, the loose samples merged into batches, and the read
    failures waiting behind merged samples; the wait for data since the last batch taken."""

    def __init__(self, loader: Loader, feed: PassFeed) -> None:
        self.loader = loader
        self.feed = feed
        self.merger = Merger(loader.batch_size, loader._collate)
        self.round = Round(-1)
        self.tasks: dict[TaskKey, Task] = {}
        self.received: dict[TaskKey, int] = {}  # position the main process received (>= taken)
        self.failing: dict[TaskKey, tuple[int, str]] = {}  # failures behind merged samples
        self.done: set[TaskKey] = set()
        self.waited = 0.0

    def task_of(self, key: TaskKey) -> Task:
        task = self.round.given.get(key) or self.tasks.get(key)
        if task is None:
            raise RuntimeError(f"a worker sent records of task {key}, never handed out")
        return task

    def take(self, marks: tuple[tuple[TaskKey, int], ...]) -> bool:
        """The training loop takes a batch: move its tasks on. False when it holds records
        of no task this trainer still holds (its session was lost, they are another
        trainer's now): not to train on. Records of a lost task that share a batch with a
        held one are the duplicates of a lost session (one batch at most)."""
        self.loader.client.wait_lease()
        mine = False
        for key, end in marks:
            task = self.task_of(key)
            self.received[key] = max(self.received.get(key, 0), end)
            if self.feed.taken(task, end):
                mine = True
            if end >= task.num_records:
                self.done.add(key)
        for key in [k for k in self.failing if not self.merger.holds(k)]:
            self.loader._failed(self.feed, self.task_of(key), *self.failing.pop(key))
            self.done.add(key)
        if mine:
            self.loader._took_part = self.feed.pass_id
            self.loader.meter.waited(self.waited)
            self.waited = 0.0
        return mine

    def merge(self, item: Loose) -> Iterator[Any]:
        """Loose samples into batches: the data of each full batch the loop may take."""
        self.merger.add(item)
        for key, first, count in item.spans:
            self.received[key] = max(self.received.get(key, 0), first + count)
        while self.merger.full:
            batch = self.merger.pop()
            assert batch is not None
            if self.take(batch.marks):
                yield batch.data

    def read_failure(self, item: ReadFailure) -> None:
        self.received[item.key] = item.records
        if self.merger.holds(item.key):
            self.failing[item.key] = (item.records, item.reason)
        else:
            self.loader._failed(self.feed, self.task_of(item.key), item.records, item.reason)
            self.done.add(item.key)

    def restock(self) -> None:
        """A task of the round no worker read to its end goes back to the feed's stock."""
        for key, task in self.round.given.items():
            if key not in self.done and self.feed.held(task):
                self.feed.restock(task, self.received.get(key, task.start))


def _why_pass(pass_id: int) -> str:
    """Why an iteration whose pass was not set reads `pass_id`, for its log line."""
    if pass_id == 0:
        return "the master's current pass"
    over = "pass 0 is" if pass_id == 1 else f"passes 0 to {pass_id - 1} are"
    return (
        f"the master's current pass; {over} over. loader.set_pass(p) before iterating "
        "chooses another"
    )


def _restart_key(blob: bytes) -> str:
    """The identity of this restart: under torchrun the same on every rank of one restart
    (its run ID and restart count); elsewhere a new one for each loader."""
    run, count = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("TORCHELASTIC_RESTART_COUNT")
    digest = hashlib.blake2b(blob, digest_size=8).hexdigest()
    if run and count is not None:
        return f"torchelastic:{run}:{count}:{digest}"
    return f"loader:{uuid.uuid4().hex}:{digest}"

"""The master's operations: what a gRPC call (or a test) invokes.

Each operation asks the core what would happen, journals the event through the ledger, and
answers once it is durable. Waiting (for a dataset, for a pending task to come back, for the
pass to end) happens here, bounded by the caller's own deadline (defect D2).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from chunkmaster.core import checkpoint
from chunkmaster.core.dataset import Dataset, size_text
from chunkmaster.core.errors import (
    CheckpointRefusedError,
    DatasetMismatchError,
    InvalidArgumentError,
    MasterError,
    NoDatasetError,
    NoMoreAvailableError,
    NotReadyError,
    PassAfterError,
    PermissionDeniedError,
    RanksMissingError,
    SessionExpiredError,
    TrainerIdEmptyError,
    UnavailableError,
)
from chunkmaster.core.events import (
    ApproveSave,
    Commit,
    Configure,
    Dispatch,
    EndSession,
    EqualSteps,
    Event,
    Fail,
    Finish,
    OpenSession,
    Progress,
    Restore,
    Resume,
    ReturnTasks,
    SetDataset,
    SetErrorBudget,
)
from chunkmaster.core.model import (
    TIMEOUT_REASON,
    TRAINER_LOST_REASON,
    FailedPolicy,
    Position,
    Task,
    TaskMeta,
)
from chunkmaster.core.quarantine import ErrorBudget, budget_limit, describe
from chunkmaster.core.shuffle import ShuffleSeedError, check_seed
from chunkmaster.core.state import (
    Availability,
    MasterState,
    check_get_task,
    commit_refused,
    committed_position,
    fail_ignored,
    finish_ignored,
    lost_reason,
    reading_task,
    restore_repeated,
    save_allowed,
)
from chunkmaster.core.steps import StepsMode, missing_ranks, world_size
from chunkmaster.inflate import DEFAULT_MAX_INFLATED, check_limit
from chunkmaster.logs import about, plural
from chunkmaster.master.datasets import (
    INDEX_TIMEOUT,
    absolute_path,
    chunk_size_for,
    chunk_size_hint,
    dataset_mismatch,
    in_daemon_thread,
    load_dataset,
    same_patterns,
)
from chunkmaster.master.leases import DataWait, LeaseKeeper
from chunkmaster.master.ledger import Ledger
from chunkmaster.master.owners import (
    commit_position_refused,
    resume_refused,
    session_report_refused,
    unary_report_refused,
)
from chunkmaster.master.roots import DataRoots
from chunkmaster.master.timeouts import TimeoutScheduler
from chunkmaster.store.base import Store

log = logging.getLogger("chunkmaster.service")
T = TypeVar("T")

STATUS_LIST_LIMIT = 100
TRAINER_TTL = 10.0  # seconds a silent trainer keeps its session
RANK_WAIT = 300.0  # seconds a pass with equal steps waits for every rank of a declared world
MAX_WORLD = 1 << 20  # the most ranks a trainer may declare
MAX_INT = 2**63 - 1


class Service:
    """The master. Durations are seconds; `start()` must be awaited before use."""

    def __init__(
        self,
        store: Store,
        chunks_per_task: int = 10,
        timeout_dur: float = 20 * 60.0,
        failure_max: int = 3,
        *,
        failed_policy: FailedPolicy | str = FailedPolicy.RETRY,
        error_budget: ErrorBudget | None = None,
        equal_steps: StepsMode | str = StepsMode.OFF,
        clock: Callable[[], float] = time.time,
        compact_min: int | None = None,
        trainer_ttl: float = TRAINER_TTL,
        job: str = "default",
        index_timeout: float = INDEX_TIMEOUT,
        max_inflated: int = DEFAULT_MAX_INFLATED,
        dataset_format: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        shuffle_seed: int | None = None,
        rank_wait: float = RANK_WAIT,
        chunk_size: int | None = None,
        data_roots: Sequence[str] = (),
    ) -> None:
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1 byte, not {chunk_size}")
        if timeout_dur <= 0:
            raise ValueError(f"timeout_dur must be positive, not {timeout_dur}")
        if failure_max < 0:
            raise ValueError(f"failure_max must be 0 or more, not {failure_max}")
        if not trainer_ttl > 0:
            raise ValueError(f"trainer_ttl must be positive, not {trainer_ttl}")
        if not rank_wait > 0:
            raise ValueError(f"rank_wait must be positive, not {rank_wait}")
        self.rank_wait = float(rank_wait)
        #: (pass, time.monotonic()) since when the pass waits for ranks missing from its world
        self._ranks_waiting: tuple[int, float] | None = None
        self.store = store
        self.job = job
        self.index_timeout = index_timeout
        self.max_inflated = check_limit(max_inflated)  # what indexing may decompress a file to
        self.dataset_format = dataset_format  # None: each dataset's by its files' names
        self.storage_options = dict(storage_options or {})  # may hold credentials: never logged
        self.data_roots = DataRoots(data_roots)  # where datasets may lie (docs/security.md)
        self.chunks_per_task = chunks_per_task
        self.chunk_size = chunk_size  # None: each format's default (formats' chunk_size)
        self.timeout_dur = float(timeout_dur)
        self.failure_max = failure_max
        self.failed_policy = FailedPolicy(failed_policy)
        self.error_budget = ErrorBudget() if error_budget is None else error_budget
        self.shuffle_seed = None if shuffle_seed is None else check_seed(shuffle_seed)
        self.equal_steps = StepsMode(equal_steps)
        self._clock = clock
        self.ledger = (
            Ledger(store) if compact_min is None else Ledger(store, compact_min=compact_min)
        )
        self.ledger.on_change.append(self._notify)
        self.ledger.on_reset.append(self._rearm_timeouts)
        self.ledger.on_writable.append(self._after_store_outage)
        self._timeouts = TimeoutScheduler(self._expire, clock)
        self.leases = LeaseKeeper(trainer_ttl, self._lease_expired)
        self.ledger.on_reset.append(lambda: self.leases.reset(self.ledger.state.sessions))
        self._changed = asyncio.Event()
        self._loading: asyncio.Task[None] | None = None
        self._loading_globs: list[str] = []
        self._few_tasks_warned = False
        self._started = False

    # ---- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from the store and arm the timers of tasks that were pending."""
        await self.ledger.recover()
        st = self.ledger.state
        if st.dataset is not None and st.dataset.shuffle_seed != self.shuffle_seed:
            raise ShuffleSeedError(
                f"the job's state was started with shuffle seed "
                f"{_seed_text(st.dataset.shuffle_seed)}, this master has "
                f"{_seed_text(self.shuffle_seed)}: a seed cannot change in the middle of a job "
                f"(every pass's task order and tasks derive from it). Start with "
                + (
                    "no --shuffle-seed"
                    if st.dataset.shuffle_seed is None
                    else f"--shuffle-seed {st.dataset.shuffle_seed}"
                )
                + ", or with an empty store for a new job"
            )
        log.info("%s", self._recovered())
        if (st.failure_max, st.failed_policy) != (self.failure_max, self.failed_policy):
            await self.ledger.commit(Configure(self.failure_max, self.failed_policy))
        if st.error_budget != self.error_budget:
            await self.ledger.commit(SetErrorBudget(self.error_budget))
        if st.stopped is not None:
            log.error("%s", st.stopped.message, extra=about(pass_id=st.stopped.pass_id))
        if st.steps.mode is not self.equal_steps:
            await self.ledger.commit(EqualSteps(self.equal_steps.value))
        if st.pending:
            # Task deadlines are about trainers: the time no master was serving (down, or
            # not yet leading) must not time out tasks that live trainers are reading.
            await self.ledger.commit(Resume(self._clock() + self.timeout_dur))
        self._rearm_timeouts()
        self._timeouts.start()
        # Every session recovered gets a fresh lease: its trainer may reconnect in time.
        self.leases.grant(st.sessions)
        self.leases.start()
        self._started = True
        self._check_task_share()

    def _recovered(self) -> str:
        """One line: what this master found in its store (a new job, or where the job is)."""
        st = self.ledger.state
        where = f"job {self.job!r} in the {self.store.describe()}"
        sessions = f"{len(st.sessions)} trainer session(s)"
        ds = st.dataset
        if ds is None:
            return (
                f"{where}: no dataset yet ({sessions}): a new job, its dataset set by the "
                "first trainer's set_dataset"
            )
        chunks = "" if ds.chunk_size is None else f" of up to {size_text(ds.chunk_size)}"
        seed = "" if ds.shuffle_seed is None else f", shuffle seed {ds.shuffle_seed}"
        stopped = "" if st.stopped is None else f"; stopped in pass {st.stopped.pass_id}"
        return (
            f"recovered {where}: dataset {list(ds.globs)} ({len(ds.files)} {ds.format} "
            f"files, {ds.num_chunks} chunks{chunks}, {ds.num_records} records, "
            f"{ds.num_tasks} tasks of up to {ds.chunks_per_task} chunks{seed}); pass "
            f"{st.cur_pass}: {len(st.todo)} todo, {len(st.pending)} pending, {len(st.done)} "
            f"done, {len(st.failed)} failed; {sessions}; equal steps {st.steps.mode.value}"
            f"{stopped}"
        )

    def few_tasks(self) -> str | None:
        """A warning when the pass has fewer tasks than trainers with sessions (some of them
        get nothing to read), naming what makes more tasks; None otherwise."""
        st = self.ledger.state
        ds = st.dataset
        trainers = len(st.sessions)
        if ds is None or trainers <= ds.num_tasks:
            return None
        more = [chunk_size_hint(ds.format, ds.chunk_size)]
        if ds.chunks_per_task > 1:
            more.insert(0, f"a smaller --chunk-per-task (now {ds.chunks_per_task})")
        return (
            f"pass {st.cur_pass} has {plural(ds.num_tasks, 'task')} for {trainers} trainers "
            f"(sessions): {trainers - ds.num_tasks} of them get nothing to read; for more tasks "
            "give the "
            f"master {' or '.join(more)}"
        )

    def _check_task_share(self) -> None:
        """Log few_tasks() once each time trainers come to outnumber the tasks."""
        warning = self.few_tasks()
        if warning is not None and not self._few_tasks_warned:
            log.warning("%s", warning, extra=about(pass_id=self.ledger.state.cur_pass))
        self._few_tasks_warned = warning is not None

    async def close(self) -> None:
        await self.leases.close()
        await self._timeouts.close()
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        await self.ledger.close()
        await self.store.shutdown()

    def _check_started(self) -> None:
        """Operations before start() would run without recovery or task timeouts."""
        if not self._started:
            raise RuntimeError("Service.start() must be awaited before the service takes calls")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _after_store_outage(self) -> None:
        """While the store refused writes no trainer could report a task finished: like the
        time no master was serving, that time must not time out tasks live trainers are
        reading. Every pending task gets a full timeout again."""
        if self.ledger.state.pending:
            # Applied before any timer can fire on the old deadlines (they run after a yield).
            _, durable = self.ledger.submit(Resume(self._clock() + self.timeout_dur))
            started(durable)
            self._rearm_timeouts()

    def _rearm_timeouts(self) -> None:
        self._timeouts.reset(
            [(p.deadline, t, p.epoch) for t, p in self.ledger.state.pending.items()]
        )

    async def _wait_change(self, until: float) -> bool:
        """Wait for any state change until the monotonic time `until`; False on timeout."""
        remaining = until - time.monotonic()
        if remaining <= 0:
            return False
        try:
            await asyncio.wait_for(self._changed.wait(), remaining)
        except TimeoutError:
            return False
        return True

    # ---- operations ------------------------------------------------------------------

    async def set_dataset(self, globs: Sequence[str]) -> None:
        """The first dataset wins; a later call with the same dataset (the same patterns
        however spelled, or patterns matching exactly its files) succeeds and changes nothing,
        one with another dataset is refused with DatasetMismatchError naming both. Patterns
        outside the data roots are refused first (PermissionDeniedError). A restored data
        checkpoint's dataset is the master's like any other."""
        self._check_started()
        globs = list(globs)
        if not globs:  # checked before "already set", as the original does
            raise NoDatasetError()
        await in_daemon_thread(self.data_roots.check_all, globs)  # realpath may touch the disk
        while self.ledger.state.dataset is None:
            loading = self._loading
            if loading is None or loading.done():
                self._loading_globs = globs
                loading = self._loading = asyncio.create_task(self._load(globs), name="set-dataset")
            try:
                await asyncio.shield(loading)
            except MasterError:
                if same_patterns(globs, self._loading_globs):
                    raise
                # Another trainer's dataset could not be set: this one may be.
        ds = self.ledger.state.dataset
        assert ds is not None
        if same_patterns(ds.globs, globs):
            return
        why = await in_daemon_thread(
            dataset_mismatch, ds, globs, self.storage_options, self.data_roots
        )
        if why is not None:
            log.warning("set_dataset refused: %s", why)
            raise DatasetMismatchError(why)
        log.info("set_dataset(%s): other patterns for the same files as the dataset's", globs)

    async def _load(self, globs: list[str]) -> None:
        dataset = await in_daemon_thread(
            load_dataset,
            globs,
            self.chunks_per_task,
            self.index_timeout,
            self.dataset_format,
            self.storage_options,
            self.chunk_size,
            self.max_inflated,
            self.data_roots,
        )
        if self.ledger.state.dataset is None:
            await self.ledger.commit(SetDataset(dataset.with_shuffle(self.shuffle_seed)))
            self._check_task_share()

    async def get_task(
        self,
        pass_id: int,
        *,
        wait: float = 0.0,
        worker: str = "",
        request_id: str = "",
        session: str = "",
        owner: str = "",
    ) -> Task:
        """The next task of `pass_id`, waiting up to `wait` seconds for one to be free.

        Raises PassBeforeError and AllTaskFailedError at once; PassAfterError,
        NoMoreAvailableError and NotReadyError only when `wait` has passed (a pass may roll
        over, a task come back, a dataset arrive meanwhile). A retry with the `request_id` of
        a call whose answer was lost gets the same task again. `owner`: the identity of a
        unary caller (mutual TLS), the only one that may report the task.
        """
        tasks = await self.get_tasks(
            pass_id,
            1,
            wait=wait,
            worker=worker,
            request_id=request_id,
            session=session,
            owner=owner,
        )
        return tasks[0]

    async def get_tasks(
        self,
        pass_id: int,
        count: int,
        *,
        wait: float = 0.0,
        worker: str = "",
        request_id: str = "",
        session: str = "",
        owner: str = "",
    ) -> list[Task]:
        """Up to `count` tasks of `pass_id`: the first as `get_task` gives it, the others only
        if free at once. One round trip and one durable write for them all, which is what
        lets a trainer that prefetches several tasks outrun one request per task. The i-th
        task's request ID is `request_id#i`, so a retry gets the same tasks back."""
        task, durable = await self._take(pass_id, wait, worker, request_id, session, owner)
        tasks, writes = [task], [durable]
        while len(tasks) < count:
            rid = f"{request_id}#{len(tasks)}" if request_id else ""
            st = self.ledger.state
            if rid and (held := _repeated(st, rid, session, owner)) is not None:
                tasks.append(st.task(held))
                continue
            if not self.ledger.available:
                break
            try:
                if check_get_task(st, pass_id, session) is not Availability.DISPATCH:
                    break
            except MasterError:  # the pass is over or cannot go on: the first ones stand
                break
            more, written = self._submit_dispatch(worker, rid, session, owner)
            writes.append(written)
            if more is None:
                break
            tasks.append(more)
        for written in writes:
            await written
        return tasks

    async def _take(
        self, pass_id: int, wait: float, worker: str, request_id: str, session: str, owner: str
    ) -> tuple[Task, Awaitable[None]]:
        """get_task's work, but the dispatch's durability is left to the caller to await."""
        self._check_started()
        _check(pass_id >= 0, f"pass_id {pass_id} is negative")
        _check(math.isfinite(wait), f"wait {wait} is not a finite number of seconds")
        until = time.monotonic() + max(0.0, wait)
        while True:
            if not self.ledger.available:
                raise UnavailableError(f"master cannot persist changes: {self.ledger.error}")
            st = self.ledger.state
            if request_id and (held := _repeated(st, request_id, session, owner)) is not None:
                return st.task(held), _DONE
            try:
                avail = check_get_task(st, pass_id, session)
            except PassAfterError:
                if not await self._wait_change(until):
                    raise
                continue
            if avail is Availability.DISPATCH:
                if session and session not in st.sessions:
                    raise SessionExpiredError()
                task, durable = self._submit_dispatch(worker, request_id, session, owner)
                if task is not None:
                    return task, durable
                await durable
                continue  # equal steps: nothing for this trainer in this pass; ask again
            if avail is Availability.WAIT:
                self._check_ranks()
            if not await self._wait_change(until):
                if avail is Availability.NOT_READY:
                    raise NotReadyError()
                raise NoMoreAvailableError()

    def _check_ranks(self) -> None:
        """Equal steps in a declared world share a pass among its ranks only once every rank
        has a session: after `rank_wait` seconds without some, refuse naming them."""
        st = self.ledger.state
        missing = missing_ranks(st) if st.steps.on and not st.steps.fixed else []
        if not missing:
            self._ranks_waiting = None
            return
        now = time.monotonic()
        if self._ranks_waiting is None or self._ranks_waiting[0] != st.cur_pass:
            self._ranks_waiting = (st.cur_pass, now)
            log.info(
                "pass %d waits for rank(s) %s to open a session before sharing its records "
                "(equal steps); at most %.0fs",
                st.cur_pass,
                _ranks_text(missing),
                self.rank_wait,
            )
            return
        waited = now - self._ranks_waiting[1]
        if waited >= self.rank_wait:
            world = max(s.world_size for s in st.sessions.values())
            raise RanksMissingError(
                f"pass {st.cur_pass} cannot start: rank(s) {_ranks_text(missing)} of world size "
                f"{world} have no trainer after {waited:.0f}s (--rank-wait {self.rank_wait:g}s); "
                "start them, or check each trainer's WORLD_SIZE and RANK"
            )

    def _submit_dispatch(
        self, worker: str, request_id: str, session: str = "", owner: str = ""
    ) -> tuple[Task | None, Awaitable[None]]:
        """Dispatch the head of Todo (None: equal steps leave nothing for this trainer).
        Applied and its timer armed before any yield: a caller that goes away while the
        dispatch is made durable must not leave the task pending without a timer (it would
        never come back); a failed write resets the timers anyway."""
        deadline = self._clock() + self.timeout_dur
        task, durable = self.ledger.submit(Dispatch(deadline, worker, request_id, session, owner))
        if task is None:
            return None, durable
        assert isinstance(task, Task)
        self._timeouts.arm(deadline, task.meta.id, task.meta.epoch)
        return task, durable

    async def task_finished(
        self, task_id: int, *, epoch: int = 0, pass_id: int = -1, identity: str | None = None
    ) -> bool:
        """Complete a pending task; a report about anything else is answered, harmlessly.
        A unary report (`identity`: the caller's certificate under mutual TLS, else None) on a
        task a session or another certificate holds is refused (PermissionDeniedError)."""
        self._check_started()
        _check(task_id >= 0, f"task_id {task_id} is negative")
        _check(epoch >= 0, f"epoch {epoch} is negative")
        _check(pass_id >= -1, f"pass_id {pass_id} is neither a pass nor -1 (any pass)")
        _deny(unary_report_refused(self.ledger.state, task_id, identity))
        ev = Finish(task_id, epoch, pass_id)
        why = finish_ignored(self.ledger.state, ev)
        if why is not None:
            log.info(
                "finish of task %d (epoch %d) ignored: %s",
                task_id,
                epoch,
                why,
                extra=about(task=task_id, epoch=epoch),
            )
            return False
        return bool(await self.ledger.commit(ev))

    async def task_failed(
        self, meta: TaskMeta, reason: str = "", *, identity: str | None = None
    ) -> bool:
        """A trainer could not process a task; its reason stays visible in status. Refused as
        `task_finished` is on a task another holds."""
        self._check_started()
        _deny(unary_report_refused(self.ledger.state, meta.id, identity))
        return bool(await self.submit_failure(meta, reason))

    async def _expire(self, task_id: int, epoch: int) -> None:
        if not self.ledger.available:
            return  # the state is being rebuilt; every timer is re-armed from it after
        ev = Fail(task_id, epoch, TIMEOUT_REASON)
        if fail_ignored(self.ledger.state, ev) is None:
            await self.ledger.commit(ev)
            self._log_failure(task_id, TIMEOUT_REASON)

    def _log_failure(self, task_id: int, reason: str) -> None:
        st = self.ledger.state
        n = st.failure_total.get(task_id, 0)
        extra = about(pass_id=st.cur_pass, task=task_id, reason=reason)
        if task_id in st.failed:
            log.warning(
                "task %d failed %d times, over the limit of %d; quarantined: %s",
                task_id,
                n,
                st.failure_max,
                describe(st, task_id).describe(),
                extra=extra,
            )
            if st.stopped is not None and task_id in st.stopped.tasks:
                log.error("%s", st.stopped.message, extra=extra)
        else:
            log.warning("task %d failed (%s); dispatching it again", task_id, reason, extra=extra)

    async def request_save_model(self, trainer_id: str, block_dur: float) -> bool:
        """Approve one trainer at a time to save the model, for `block_dur` seconds."""
        self._check_started()
        if not trainer_id:
            raise TrainerIdEmptyError()
        _check(
            math.isfinite(block_dur) and 0 <= block_dur <= MAX_SAVE_BLOCK,
            f"block_dur {block_dur} is not a number of seconds from 0 to {MAX_SAVE_BLOCK:.0f}",
        )
        now = self._clock()
        if not save_allowed(self.ledger.state, trainer_id, now):
            return False
        await self.ledger.commit(ApproveSave(trainer_id, now + block_dur))
        return True

    # ---- sessions ----------------------------------------------------------------------
    #
    # The stream (server.py) calls these in the order its messages arrive. Those that change
    # the state apply their events before returning (in that order) and hand back an
    # awaitable for durability, so a report is never overtaken by a later message.

    async def open_session(
        self,
        session_id: str,
        name: str,
        host: str,
        pid: int,
        report_every: int,
        world_size: int = 0,
        rank: int = 0,
        identity: str | None = None,
    ) -> str:
        """Resume `session_id` with a fresh lease, or open a new session (empty id) for a
        trainer that may say its `rank` among `world_size` trainers (0: not said). Under
        mutual TLS (`identity`) a session belongs to the certificate that opened it: the
        binding is journaled, so no other certificate resumes it, before or after a restart."""
        self._check_started()
        _check(0 <= pid <= MAX_INT, f"pid {pid} is out of range")
        _check(0 <= report_every <= MAX_INT, f"report_every {report_every} is out of range")
        _check(0 <= world_size <= MAX_WORLD, f"world size {world_size} is out of range")
        _check(
            world_size == 0 or 0 <= rank < world_size,
            f"rank {rank} is not in 0..{world_size - 1} (world size {world_size})",
        )
        if session_id:
            # Refused before the lease is renewed: another certificate keeps no session alive.
            _deny(resume_refused(self.ledger.state, session_id, identity))
            self.touch(session_id)
            return session_id
        sid = uuid.uuid4().hex
        # The lease from the moment the session is in the state: a trainer gone while the
        # write is in flight cancels this call, and its session must still end (a failed
        # write rebuilds the state, and the leases with it).
        _, durable = self.ledger.submit(
            OpenSession(
                sid,
                name,
                host,
                pid,
                report_every,
                identity or "",
                world_size,
                rank if world_size else 0,
            )
        )
        self.leases.renew(sid)
        await durable
        log.info(
            "trainer %s (%s, pid %d%s) opened session %s",
            name,
            host,
            pid,
            f", rank {rank} of {world_size}" if world_size else "",
            sid,
            extra=about(trainer=name, session=sid),
        )
        self._check_task_share()
        return sid

    def touch(self, session: str) -> None:
        """Renew a session's lease (every message does); raise if it has ended."""
        s = self.ledger.state.sessions.get(session)
        if s is None:
            raise SessionExpiredError()
        self.leases.renew(session, s.consumed)

    def report_data_wait(self, session: str, wait: DataWait) -> None:
        """Keep a trainer's latest figures of its training loop's wait for data (status and
        the metrics show them per trainer; nothing durable)."""
        lease = self.leases.get(session)
        values = (wait.p50, wait.p99, wait.share, wait.window)
        if lease is not None and all(math.isfinite(v) and v >= 0 for v in values):
            lease.data_wait = wait

    def report_progress(self, session: str, positions: Iterable[Position]) -> int:
        """Record how far the session's trainer got; nobody waits for it to be durable. How
        many positions moved; positions on tasks another trainer holds change nothing and
        raise PermissionDeniedError naming them, once the session's own are recorded."""
        ps = list(positions)
        own = self._own(session, ps)
        applied = 0
        if own and self.ledger.available:
            result, durable = self.ledger.submit(Progress(own))
            assert isinstance(result, int)
            applied = result
            started(durable)
        st = self.ledger.state
        _deny(*(session_report_refused(st, session, pos.task_id) for pos in ps))
        return applied

    def submit_finishes(self, session: str, positions: Iterable[Position]) -> Awaitable[int]:
        """Finish each task (as TaskFinished would), in order; awaitable: how many applied.
        All or none: a finish on a task another trainer holds refuses them all
        (PermissionDeniedError naming it), and nothing changes."""
        self._check_started()
        ps = list(positions)
        for pos in ps:
            _check_position(pos)
        st = self.ledger.state
        _deny(*(session_report_refused(st, session, pos.task_id) for pos in ps))
        applied = 0
        durable: Awaitable[None] | None = None
        for pos in ps:
            ev = Finish(pos.task_id, pos.epoch, pos.pass_id)
            why = finish_ignored(self.ledger.state, ev)
            if why is not None:
                log.info("finish of task %d (epoch %d) ignored: %s", pos.task_id, pos.epoch, why)
                continue
            _, durable = self.ledger.submit(ev)
            applied += 1
        return _after(durable, applied)

    def submit_failure(
        self, meta: TaskMeta, reason: str, session: str | None = None
    ) -> Awaitable[int]:
        """Fail a dispatch; over a `session`, only one of that session's own."""
        self._check_started()
        _check(meta.id >= 0, f"task id {meta.id} is negative")
        _check(meta.epoch >= 0, f"epoch {meta.epoch} is negative")
        if session is not None:
            _deny(session_report_refused(self.ledger.state, session, meta.id))
        ev = Fail(meta.id, meta.epoch, reason or "failed (no reason given)")
        why = fail_ignored(self.ledger.state, ev)
        if why is not None:
            log.info("failure of task %d (epoch %d) ignored: %s", meta.id, meta.epoch, why)
            return _after(None, 0)
        _, durable = self.ledger.submit(ev)
        self._log_failure(meta.id, ev.reason)
        return _after(durable, 1)

    def submit_commit(
        self, positions: Iterable[Position], session: str = "", identity: str | None = None
    ) -> Awaitable[int]:
        """Commit the positions of `session` (`identity`: its certificate under mutual TLS),
        all or none: a position naming a dispatch another trainer holds or (under mutual
        TLS) a task another certificate finished refuses the whole commit with
        PermissionDeniedError, one naming a dispatch no longer this trainer's with
        CheckpointRefusedError, each naming the task."""
        self._check_started()
        st = self.ledger.state
        ps = tuple(positions)
        for pos in ps:
            _check_position(pos)
        _deny(*(commit_position_refused(st, pos, session, identity) for pos in ps))
        problems = []
        for pos in ps:
            why = commit_refused(st, pos)
            if why is not None:
                problems.append(f"task {pos.task_id} of pass {pos.pass_id}: {why}")
        if problems:
            raise CheckpointRefusedError("commit refused: " + "; ".join(problems[:5]))
        if not ps:
            return _after(None, 0)
        applied, durable = self.ledger.submit(Commit(ps))
        assert isinstance(applied, int)
        return _after(durable, applied)

    def submit_return(self, session: str, positions: Iterable[Position]) -> Awaitable[int]:
        """Hand the session's tasks named back at their positions; awaitable: how many."""
        self._check_started()
        ps = self._own(session, positions)
        if not ps:
            return _after(None, 0)
        if not self.ledger.available:
            raise self.ledger.unavailable()
        back, durable = self.ledger.submit(ReturnTasks(session, ps))
        assert isinstance(back, int)
        return _after(durable, back)

    async def end_session(
        self, session: str, reason: str, positions: Iterable[Position] = (), *, charge: bool = False
    ) -> int:
        """End a session; its tasks go back to the front of Todo. How many it held. With
        `charge` (a lost trainer) the task it was reading counts a failure."""
        self._check_started()
        st = self.ledger.state
        if session not in st.sessions:
            return 0
        s = st.sessions[session]
        ps = self._own(session, positions)
        reading = reading_task(st, session) if charge else None
        held = await self.ledger.commit(EndSession(session, reason, ps, charge))
        assert isinstance(held, int)
        self.leases.drop(session)
        self._check_task_share()
        if reading is not None:
            self._log_failure(reading, lost_reason(s))
        log.log(
            logging.WARNING if reason == TRAINER_LOST_REASON else logging.INFO,
            "session %s of trainer %s (%s, pid %d) ended (%s); %s task(s) it held go back "
            "to the queue",
            session,
            s.name,
            s.host,
            s.pid,
            reason,
            held,
            extra=about(trainer=s.name, session=session, reason=reason),
        )
        return held

    async def _lease_expired(self, session: str) -> None:
        if not self.ledger.available:
            raise self.ledger.unavailable()  # the keeper retries shortly
        await self.end_session(session, TRAINER_LOST_REASON, charge=True)

    def _own(self, session: str, positions: Iterable[Position]) -> tuple[Position, ...]:
        """The positions about tasks this session holds now (others are stale: ignored)."""
        pending = self.ledger.state.pending
        own = []
        for pos in positions:
            _check_position(pos)
            p = pending.get(pos.task_id)
            if p is not None and p.session == session and p.epoch == pos.epoch:
                own.append(pos)
        return tuple(own)

    async def data_checkpoint(self) -> bytes:
        """The job's data position at the last commits, as a checked blob; only what is
        durable (it waits for the writes in flight)."""
        self._check_started()
        await self.ledger.sync()
        st = self.ledger.state
        ds = st.dataset
        if ds is None:
            raise CheckpointRefusedError("no dataset is set yet: there is no position to save")
        floor, commits = committed_position(st)
        by_pass: dict[int, tuple[set[int], dict[int, int]]] = {}
        for pass_id, task_id, records in commits:
            full, partial = by_pass.setdefault(pass_id, (set(), {}))
            if records == st.task_records(task_id, pass_id):
                full.add(task_id)
            else:
                partial[task_id] = records
        cp = checkpoint.DataCheckpoint(
            job=self.job,
            created=self._clock(),
            dataset=checkpoint.fingerprint(ds, ds.file_sizes),
            num_tasks=ds.num_tasks,
            floor=floor,
            passes=tuple(
                checkpoint.PassCommits(p, frozenset(full), partial)
                for p, (full, partial) in sorted(by_pass.items())
            ),
            shuffle_seed=ds.shuffle_seed,
        )
        return checkpoint.encode(cp)

    async def restore(
        self, blob: bytes, *, replace: bool = False, other_job: bool = False, key: str = ""
    ) -> bool:
        """Go to a data checkpoint's position. Raises CheckpointError (a bad blob, another
        job's unless `other_job`, changed files, a store that holds a job) or the dataset's
        errors, naming the problem.

        Without `key` (`chunkmaster master --restore`): on an empty store, or over the job it
        holds with `replace`, index the checkpoint's dataset again (held to the data roots, as
        any dataset), check it is unchanged, and start from its position; False if this state
        was started from it already. With `key` (the Restore RPC: a training job restarted
        from its model checkpoint): on the running job, whose dataset must be the
        checkpoint's; every session ends. False if this key restored the job already (each
        rank of one restart asks)."""
        self._check_started()
        cp = checkpoint.decode(blob)
        source = hashlib.blake2b(blob, digest_size=16).hexdigest()
        if key:
            return await self._restore_running(cp, source, key)
        st = self.ledger.state
        if st.restored_from == source:
            log.info("the state was started from this data checkpoint already; going on")
            return False
        if cp.job != self.job and not other_job:
            raise checkpoint.CheckpointError(
                f"the data checkpoint is of the job {cp.job!r} and this master runs the job "
                f"{self.job!r}; start it with --job {cp.job}, or with --restore-other-job to "
                "restore another job's position"
            )
        if st.dataset is not None and not replace:
            raise checkpoint.CheckpointError(
                f"the store already holds a job (pass {st.cur_pass}, dataset "
                f"{list(st.dataset.globs)}): a data checkpoint is restored onto an empty "
                "store only; start with --restore-replace to replace the state it holds"
            )
        cp = checkpoint.with_paths(cp, absolute_path)
        bound = chunk_size_for(cp.dataset.format, self.chunk_size)
        why = checkpoint.chunk_size_refusal(cp.dataset, bound)
        if why is not None:
            raise checkpoint.CheckpointError(why)
        globs = list(cp.dataset.globs)
        dataset = await in_daemon_thread(
            load_dataset,
            globs,
            cp.dataset.chunks_per_task,
            self.index_timeout,
            cp.dataset.format,
            self.storage_options,
            self.chunk_size,
            self.max_inflated,
            self.data_roots,
        )
        dataset = dataset.with_shuffle(self.shuffle_seed)
        checkpoint.check_restorable(cp, dataset, dataset.file_sizes)
        events: list[Event] = [
            SetDataset(dataset),
            Restore(cp.floor, _commits_of(cp, dataset), source),
        ]
        if st.dataset is None:
            for ev in events:
                await self.ledger.commit(ev)
        else:
            await self.ledger.replace(events)
            await self.ledger.commit(Configure(self.failure_max, self.failed_policy))
            await self.ledger.commit(SetErrorBudget(self.error_budget))
            if self.equal_steps is not StepsMode.OFF:
                await self.ledger.commit(EqualSteps(self.equal_steps.value))
        st = self.ledger.state
        log.info(
            "restored the data checkpoint of job %r: pass %d, %d task(s) to do, %d done",
            cp.job,
            st.cur_pass,
            len(st.todo),
            len(st.done),
        )
        return True

    async def _restore_running(self, cp: checkpoint.DataCheckpoint, source: str, key: str) -> bool:
        st = self.ledger.state
        if restore_repeated(st, key):
            log.info("restore %r was made already (another rank of the same restart)", key)
            return False
        ds = st.dataset
        if ds is None:
            raise checkpoint.CheckpointError(
                "the master has no dataset yet: start it with --restore FILE to begin a job "
                "from a data checkpoint"
            )
        if cp.job != self.job:
            raise checkpoint.CheckpointError(
                f"the data checkpoint is of the job {cp.job!r} and this master runs the job "
                f"{self.job!r}: a running job goes back only to a checkpoint of its own"
            )
        cp = checkpoint.with_paths(cp, absolute_path)
        checkpoint.check_restorable(cp, ds, ds.file_sizes)
        ended = len(st.sessions)
        if not self.ledger.available:
            raise self.ledger.unavailable()
        await self.ledger.commit(Restore(cp.floor, _commits_of(cp, ds), source, key))
        st = self.ledger.state
        self.leases.reset(st.sessions)
        self._rearm_timeouts()
        log.warning(
            "restored the running job to the data checkpoint of %s (restart %r): pass %d, %d "
            "task(s) to do, %d done; %d session(s) ended",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(cp.created)),
            key,
            st.cur_pass,
            len(st.todo),
            len(st.done),
            ended,
        )
        return True

    # ---- status ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        st = self.ledger.state
        now = self._clock()
        ds = st.dataset
        with_failures = sorted(st.failure_log)
        failed_set = set(st.failed)

        def where(t: int) -> str:
            if t in failed_set:
                return "failed"
            return "pending" if t in st.pending else "in pass"

        failed_tasks = [
            {
                "id": t,
                "queue": where(t),
                "failures": st.num_failures.get(t, 0),
                "total_failures": st.failure_total.get(t, 0),
                "reasons": [
                    {"pass": f.pass_id, "epoch": f.epoch, "reason": f.reason}
                    for f in st.failure_log[t]
                ],
            }
            for t in with_failures[:STATUS_LIST_LIMIT]
        ]
        pending = [
            {
                "id": t,
                "epoch": p.epoch,
                "worker": p.worker,
                "expires_in": round(p.deadline - now, 3),
            }
            for t, p in list(st.pending.items())[:STATUS_LIST_LIMIT]
        ]
        saver = None
        if st.saver is not None and st.saver.until > now:
            saver = {
                "trainer_id": st.saver.trainer_id,
                "expires_in": round(st.saver.until - now, 3),
            }
        ledger = self.ledger
        now_mono = time.monotonic()
        held: dict[str, int] = {}
        for p in st.pending.values():
            if p.session:
                held[p.session] = held.get(p.session, 0) + 1
        trainers = []
        for sid, sess in list(st.sessions.items())[:STATUS_LIST_LIMIT]:
            lease = self.leases.get(sid)
            trainers.append(
                {
                    "session": sid,
                    "name": sess.name,
                    "host": sess.host,
                    "pid": sess.pid,
                    "tasks_held": held.get(sid, 0),
                    "records_consumed": sess.consumed,
                    "records_per_second": None if lease is None else round(lease.rate(), 1),
                    "last_heard_s": None if lease is None else round(now_mono - lease.heard, 3),
                    "lease_expires_in": None
                    if lease is None
                    else round(lease.expires - now_mono, 3),
                    "rank": sess.rank if sess.world_size else None,
                    "world_size": sess.world_size or None,
                    "data_wait": None if lease is None else _data_wait_view(lease.data_wait),
                }
            )
        passes = sorted(st.ledger)[-2:]
        quarantined = []
        for t in st.failed[:STATUS_LIST_LIMIT]:
            q = describe(st, t)
            quarantined.append(
                {
                    "id": t,
                    "files": list(q.files),
                    "chunks": [
                        {"path": c.path, "offset": c.offset, "records": c.num_records}
                        for c in q.chunks
                    ],
                    "records": q.records,
                    "reasons": [
                        {"pass": f.pass_id, "epoch": f.epoch, "reason": f.reason} for f in q.reasons
                    ],
                }
            )
        stop = st.stopped
        few_tasks = self.few_tasks()
        rates = [lease.rate() for sid in st.sessions if (lease := self.leases.get(sid))]
        return {
            "healthy": ledger.available,
            "warnings": [] if few_tasks is None else [few_tasks],
            "ready": st.ready,
            "cur_pass": st.cur_pass,
            "todo": len(st.todo),
            "pending": len(st.pending),
            "done": len(st.done),
            "failed": len(st.failed),
            "num_tasks": st.num_tasks,
            "progress": _progress_view(st, rates),
            "dataset": None
            if ds is None
            else {
                "globs": list(ds.globs),
                "files": len(ds.files),
                "chunks": ds.num_chunks,
                "records": ds.num_records,
                "chunks_per_task": ds.chunks_per_task,
                "chunk_size": ds.chunk_size,
                "format": ds.format,
            },
            "failure_max": st.failure_max,
            "failed_policy": st.failed_policy.value,
            "shuffle_seed": None if ds is None else ds.shuffle_seed,
            "timeout_dur": self.timeout_dur,
            "failed_tasks": failed_tasks,
            "error_budget": {
                "max_failed_records": str(st.error_budget),
                "limit": budget_limit(st),
                "quarantined": cur.quarantined if (cur := st.ledger.get(st.cur_pass)) else 0,
            },
            "quarantined_tasks": quarantined,
            "job_stopped": None
            if stop is None
            else {
                "pass": stop.pass_id,
                "records": stop.records,
                "limit": stop.limit,
                "tasks": list(stop.tasks),
                "message": stop.message,
            },
            "tasks_with_failures": len(with_failures),
            "pending_tasks": pending,
            "save_model": saver,
            "trainer_ttl": self.leases.ttl,
            "sessions": len(st.sessions),
            "trainers": trainers,
            "commit_floor": st.commit_floor,
            "equal_steps": {
                "mode": st.steps.mode.value,
                "world_size": world_size(st) or None,
                "missing_ranks": missing_ranks(st)[:STATUS_LIST_LIMIT],
                "target": st.steps.target,
                "records": dict(list(st.steps.members.items())[:STATUS_LIST_LIMIT]),
            },
            "ledger": [
                {
                    "pass": p,
                    "dispatched": st.ledger[p].dispatched,
                    "consumed": st.ledger[p].consumed,
                    "committed": st.ledger[p].committed,
                    "redispatched": dict(st.ledger[p].redispatched),
                    "quarantined": st.ledger[p].quarantined,
                    "dropped": st.ledger[p].dropped,
                    "padded": st.ledger[p].padded,
                }
                for p in passes
            ],
            "store": {
                "kind": self.store.describe(),
                "healthy": ledger.available,
                "error": ledger.error,  # the cause while changes are refused
                "failing_for": None
                if ledger.failing_since is None
                else round(now_mono - ledger.failing_since, 3),
                "failed_attempts": ledger.failed_attempts,
                "next_retry_in": None
                if ledger.next_retry_at is None
                else round(max(0.0, ledger.next_retry_at - now_mono), 3),
                "seq": ledger.seq,
                "durable_seq": ledger.durable_seq,
            },
        }


#: The longest save-model window a trainer may ask for (a day): a longer one holds the lock
#: past any plausible save, across restarts.
MAX_SAVE_BLOCK = 24 * 3600.0


def _progress_view(st: MasterState, rates: Sequence[float]) -> dict[str, Any]:
    """The current pass in records: how many were consumed (reported by the trainers) of how
    many it delivers, the trainers' rate (the sum of the sessions' rates; None without a
    session) and the time that leaves at that rate."""
    led = st.ledger.get(st.cur_pass)
    total = None
    done = 0
    if st.dataset is not None:
        total = st.dataset.num_records
        if led is not None:
            total += led.padded - led.dropped - led.quarantined
            done = min(led.consumed, total)
    rate = round(sum(rates), 1) if rates else None
    left = None if total is None or not rate else round((total - done) / rate, 1)
    return {
        "pass": st.cur_pass,
        "records_done": done,
        "records_total": total,
        "records_per_second": rate,
        "seconds_left": left,
    }


def _data_wait_view(wait: DataWait | None) -> dict[str, Any] | None:
    if wait is None:
        return None
    return {
        "p50_ms": round(wait.p50 * 1000, 2),
        "p99_ms": round(wait.p99 * 1000, 2),
        "share": round(min(1.0, wait.share), 4),
        "batches": wait.batches,
        "window_s": round(wait.window, 1),
    }


def _ranks_text(ranks: Sequence[int], most: int = 16) -> str:
    shown = ", ".join(map(str, ranks[:most]))
    return shown + (f" and {len(ranks) - most} more" if len(ranks) > most else "")


def _seed_text(seed: int | None) -> str:
    return "none" if seed is None else str(seed)


def _commits_of(
    cp: checkpoint.DataCheckpoint, dataset: Dataset
) -> tuple[tuple[int, int, int], ...]:
    """(pass, task, records committed) of a checkpoint, in the order Restore applies them."""
    return tuple(
        (p.pass_id, t, r)
        for p in cp.passes
        for totals in (dataset.task_records_for(p.pass_id),)
        for t, r in sorted([(t, totals[t]) for t in p.full] + list(p.partial.items()))
    )


def _check_position(pos: Position) -> None:
    _check(0 <= pos.task_id <= MAX_INT, f"task id {pos.task_id} is out of range")
    _check(0 <= pos.epoch <= MAX_INT, f"epoch {pos.epoch} is out of range")
    _check(0 <= pos.pass_id <= MAX_INT, f"pass_id {pos.pass_id} is out of range")
    _check(0 <= pos.records <= MAX_INT, f"records {pos.records} is out of range")


async def _after(durable: Awaitable[None] | None, result: int) -> int:
    if durable is not None:
        await durable
    return result


class _Written:
    """Awaits nothing: a repeated request's dispatch was made durable when first asked."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_DONE = _Written()


def started(aw: Awaitable[T]) -> asyncio.Future[T]:
    """`aw` running now, whether or not anyone awaits it: a write's failure is the ledger's to
    report, and must not be logged again as an exception nobody retrieved."""
    fut = asyncio.ensure_future(aw)
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return fut


def _repeated(st: MasterState, request_id: str, session: str, owner: str) -> int | None:
    """The task a repeated request got, if any: only its own requester gets it again."""
    held = st.requests.get(request_id)
    if held is None:
        return None
    p = st.pending[held]
    if p.session != session or (p.owner != owner and not session):
        raise PermissionDeniedError(
            f"permission denied: request {request_id} was made by another trainer"
        )
    return held


def _deny(*refusals: str | None) -> None:
    """Refuse a report if any of these reasons is given: PERMISSION_DENIED, nothing changes."""
    problems = [why for why in refusals if why is not None]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise PermissionDeniedError("; ".join(problems[:3]) + more)


def _check(ok: bool, problem: str) -> None:
    """Refuse a request value before it reaches the state: INVALID_ARGUMENT, nothing changes."""
    if not ok:
        raise InvalidArgumentError(f"invalid argument: {problem}")

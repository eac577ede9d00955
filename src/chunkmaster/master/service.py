"""The master: its parts wired together, its life cycle, and its operations (what a gRPC call,
a session message or a test invokes), each handed to the part whose job it is:

    job_dataset.py  set_dataset: the job's one dataset (or mixture), and its weights
    dispatch.py     get_task(s): handing out tasks, and waiting for one
    reports.py      finishes, failures, progress, tasks handed back
    timeouts.py     task deadlines: Fail("timeout") when one passes
    sessions.py     sessions and their leases
    checkpoints.py  commits, data checkpoints, restores
    save_model.py   save-model approval
    status.py       the status view

Each operation asks the core what would happen, journals the events through the ledger, and
answers once they are durable. Start-up reconciles the flags with the recovered state
(core/reconcile.py) before anything is served.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from chunkmaster.core.dataset import effective_chunks_per_task
from chunkmaster.core.events import Finish, StopJob
from chunkmaster.core.model import Task, TaskMeta
from chunkmaster.core.reconcile import reconcile
from chunkmaster.core.sizes import size_text
from chunkmaster.formats.changed import changed_files, stop_message
from chunkmaster.logs import about
from chunkmaster.master.checkpoints import Checkpoints
from chunkmaster.master.dispatch import Dispatcher
from chunkmaster.master.job_dataset import ByName, JobDataset, Reweighted, SourceSpec
from chunkmaster.master.leases import LeaseKeeper
from chunkmaster.master.ledger import Ledger
from chunkmaster.master.reports import Reports
from chunkmaster.master.roots import DataRoots
from chunkmaster.master.save_model import SaveApprovals
from chunkmaster.master.sessions import Sessions
from chunkmaster.master.settings import Settings, StepsSetting
from chunkmaster.master.status import Status, StatusWarnings, build_status, few_tasks
from chunkmaster.master.timeouts import TaskTimeouts
from chunkmaster.store.base import Store

log = logging.getLogger("chunkmaster.service")


class Service:
    """The master. `settings` (or its fields as keywords: `Service(store, timeout_dur=60)`)
    say how it runs the job; `start()` must be awaited before use."""

    def __init__(
        self,
        store: Store,
        settings: Settings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        compact_min: int | None = None,
        **overrides: Any,
    ) -> None:
        s = dataclasses.replace(settings or Settings(), **overrides)
        self.settings = s
        self.store = store
        self._clock = clock
        self.ledger = (
            Ledger(store) if compact_min is None else Ledger(store, compact_min=compact_min)
        )
        self._warnings = StatusWarnings(self.ledger)
        self._timeouts = TaskTimeouts(self.ledger, s.timeout_dur, clock)
        #: sessions and their leases: open, touch, data waits, end
        self.sessions = Sessions(self.ledger, s.trainer_ttl, self._warnings, s.equal_steps)
        #: requests for tasks (GetTask, a session's NextTask asking for one), answered or not,
        #: since this service started: the job's demand, a metric (docs/observability.md)
        self.task_requests = 0
        self._dispatch = Dispatcher(
            self.ledger,
            self._timeouts,
            s.rank_wait,
            self.sessions.leases,
            one_kind=s.equal_steps is StepsSetting.AUTO,
        )
        #: finishes, failures, progress and tasks handed back
        self.reports = Reports(self.ledger, self._timeouts.from_now)
        self._dataset = JobDataset(self.ledger, s, DataRoots(s.data_roots), self._warnings)
        #: commits, data checkpoints and restores
        self.checkpoints = Checkpoints(
            self.ledger, s, clock, self._dataset, self.sessions, self._timeouts
        )
        self._save = SaveApprovals(self.ledger, clock)
        self._started = False

    @property
    def leases(self) -> LeaseKeeper:
        return self.sessions.leases

    @property
    def job(self) -> str:
        return self.settings.job

    @property
    def timeout_dur(self) -> float:
        return self.settings.timeout_dur

    # ---- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from the store, journal what the flags change (core/reconcile.py), and
        arm the timers of the tasks pending."""
        await self.ledger.recover()
        events = reconcile(self.ledger.state, self.settings.limits, self._timeouts.from_now())
        log.info("%s", self._recovered())
        if self.settings.equal_steps is StepsSetting.OFF:
            log.warning(
                "--equal-steps off: trainers that declare a world size (torchrun's WORLD_SIZE) "
                "get what they ask for, so DDP ranks get unequal numbers of batches and hang "
                "at the all-reduce of a pass's last step; --equal-steps auto (the default) "
                "gives them equal steps"
            )
        for ev in events:
            await self.ledger.commit(ev)
        st = self.ledger.state
        ds = st.dataset
        if ds is not None and st.stopped is None:
            found = changed_files(ds.files, ds.file_sizes, ds.file_mtimes)  # a stat each
            if found:
                when = "found when the master started on its store"
                await self.ledger.commit(StopJob(stop_message(found, when)))
        if st.stopped is not None:
            log.error("%s", st.stopped.message, extra=about(pass_id=st.stopped.pass_id))
        self._timeouts.start()
        # Every session recovered gets a fresh lease: its trainer may reconnect in time.
        self.leases.grant(st.sessions)
        self.leases.start()
        self._started = True
        self._warnings.check()

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
        if ds.shuffle_window:
            seed += f", shuffle window {ds.shuffle_window} records"
        stopped = "" if st.stopped is None else f"; stopped in pass {st.stopped.pass_id}"
        what = f"dataset {list(ds.globs)}"
        if ds.sources:
            what = f"mixture of {len(ds.sources)} sources {[s.name for s in ds.sources][:8]}"
            seed += f", {st.num_tasks} units a pass"
        return (
            f"recovered {where}: {what} ({len(ds.files)} {ds.format} "
            f"files, {ds.num_chunks} chunks{chunks}, {ds.num_records} records, "
            f"{ds.num_tasks} tasks of up to {ds.chunks_per_task} chunks{seed}); pass "
            f"{st.cur_pass}: {len(st.todo)} todo, {len(st.pending)} pending, {len(st.done)} "
            f"done, {len(st.failed)} failed; {sessions}; equal steps {st.steps.mode.value}"
            f"{stopped}{self._cut_note(ds.chunks_per_task)}"
        )

    def _cut_note(self, cpt: int) -> str:
        """A --chunk-per-task other than the journaled dataset's: it is for a new dataset only
        (a job's tasks are cut once, when its dataset is set)."""
        given = self.settings.chunks_per_task
        if given is None or effective_chunks_per_task(given) == cpt:
            return ""
        return (
            f"; --chunk-per-task {given} does not recut it (its tasks were cut when it was "
            "set); it applies to a new job's dataset"
        )

    async def close(self) -> None:
        await self.leases.close()
        await self._timeouts.close()
        self._dataset.close()
        await self.ledger.close()
        await self.store.shutdown()

    def _check_started(self) -> None:
        """Operations before start() would run without recovery or task timeouts."""
        if not self._started:
            raise RuntimeError("Service.start() must be awaited before the service takes calls")

    # ---- the job's dataset, tasks and reports ---------------------------------------------

    async def set_dataset(self, globs: Sequence[str], sources: Sequence[SourceSpec] = ()) -> None:
        """The first dataset wins (master/job_dataset.py): one list of patterns, or a mixture
        of named `sources`."""
        self._check_started()
        await self._dataset.set(globs, sources)

    async def set_weights(
        self,
        points: Sequence[tuple[int, ByName]],
        mode: str = "step",
        add: Sequence[SourceSpec] = (),
    ) -> Reweighted:
        """A mixture's weights from now on, with the sources `add` added first
        (master/job_dataset.py; docs/mixtures.md)."""
        self._check_started()
        if add:
            return await self._dataset.add_sources(add, points, mode)
        return await self._dataset.set_weights(points, mode)

    async def get_task(
        self,
        pass_id: int,
        *,
        wait: float = 0.0,
        time_left: float | None = None,
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
            time_left=time_left,
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
        time_left: float | None = None,
        worker: str = "",
        request_id: str = "",
        session: str = "",
        owner: str = "",
    ) -> list[Task]:
        """Up to `count` tasks of `pass_id`: the first as `get_task` gives it, the others only
        if free at once, in one durable write (master/dispatch.py)."""
        self._check_started()
        self.task_requests += 1
        return await self._dispatch.get_tasks(
            pass_id,
            count,
            wait=wait,
            time_left=time_left,
            worker=worker,
            request_id=request_id,
            session=session,
            owner=owner,
        )

    async def task_finished(
        self, task_id: int, *, epoch: int = 0, pass_id: int = -1, identity: str | None = None
    ) -> bool:
        """A unary TaskFinished (`identity`: the caller's certificate under mutual TLS);
        whether it completed the task. Refused on a task a session or another certificate
        holds (PermissionDeniedError)."""
        self._check_started()
        finish = Finish(task_id, epoch, pass_id)
        return bool(await self.reports.finish([finish], identity=identity))

    async def task_failed(
        self, meta: TaskMeta, reason: str = "", *, identity: str | None = None
    ) -> bool:
        """A unary TaskFailed; refused as `task_finished` is on a task another holds."""
        self._check_started()
        return bool(await self.reports.fail(meta, reason, identity=identity))

    async def request_save_model(self, trainer_id: str, block_dur: float) -> bool:
        """Approve one trainer at a time to save the model, for `block_dur` seconds."""
        self._check_started()
        return await self._save.request(trainer_id, block_dur)

    # ---- sessions (a session's other messages go to the part whose job they are:
    # `sessions`, `reports`, `checkpoints`; master/stream.py) ---------------------------

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
        """Resume `session_id` or open a new session (master/sessions.py)."""
        self._check_started()
        return await self.sessions.open(
            session_id, name, host, pid, report_every, world_size, rank, identity
        )

    # ---- data checkpoints and status ----------------------------------------------------

    async def data_checkpoint(self) -> bytes:
        self._check_started()
        return await self.checkpoints.data_checkpoint()

    async def restore(
        self,
        blob: bytes,
        *,
        replace: bool = False,
        other_job: bool = False,
        key: str = "",
        rank: int = -1,
    ) -> bool:
        """Go to a data checkpoint's position (master/checkpoints.py)."""
        self._check_started()
        return await self.checkpoints.restore(
            blob, replace=replace, other_job=other_job, key=key, rank=rank
        )

    def few_tasks(self) -> str | None:
        """A warning when the pass has fewer tasks than trainers with sessions; else None."""
        return few_tasks(self.ledger.state)

    def status_view(self) -> Status:
        return build_status(
            self.ledger, self.leases, self.timeout_dur, self._clock(), self.store.describe()
        )

    def status(self) -> dict[str, Any]:
        """The status as JSON values (`chunkmaster status --json`, `/status.json`)."""
        return self.status_view().to_json()

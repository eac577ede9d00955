"""Commits and data checkpoints (docs/sessions.md): trainers commit the positions their model
reflects; the job's data position at its last commits is a data checkpoint
(`core/checkpoint.py` encodes it); a checkpoint is restored on an empty store at start
(`chunkmaster master --restore`), over the job a store holds (`--restore-replace`), or onto
the running job (the Restore RPC, once per restart key: a training job restarted from its
model checkpoint).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable

from chunkmaster.core import checkpoint
from chunkmaster.core.commits import commit_refused, committed_position, committed_ranges
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import CheckpointRefusedError
from chunkmaster.core.events import (
    AddSources,
    Commit,
    Event,
    MixturePosition,
    Restore,
    SetDataset,
)
from chunkmaster.core.mixture_events import mixture_position
from chunkmaster.core.model import FailedPolicy, Position
from chunkmaster.core.reconcile import KEEP_REFUSED, reconcile
from chunkmaster.core.restore import restore_repeated
from chunkmaster.master.checks import check_position, deny
from chunkmaster.master.indexing import chunk_size_for
from chunkmaster.master.job_dataset import JobDataset, SourceSpec
from chunkmaster.master.ledger import Ledger, after
from chunkmaster.master.owners import commit_position_refused
from chunkmaster.master.patterns import absolute_path
from chunkmaster.master.sessions import Sessions
from chunkmaster.master.settings import Settings
from chunkmaster.master.timeouts import TaskTimeouts

log = logging.getLogger("chunkmaster.service")


class Checkpoints:
    def __init__(
        self,
        ledger: Ledger,
        settings: Settings,
        clock: Callable[[], float],
        dataset: JobDataset,
        sessions: Sessions,
        timeouts: TaskTimeouts,
    ) -> None:
        self._ledger = ledger
        self._settings = settings
        self._clock = clock
        self._dataset = dataset
        self._sessions = sessions
        self._timeouts = timeouts

    def commit(
        self, positions: Iterable[Position], session: str = "", identity: str | None = None
    ) -> Awaitable[int]:
        """Commit the positions of `session` (`identity`: its certificate under mutual TLS),
        all or none: a position naming a dispatch another trainer holds or (under mutual
        TLS) a task another certificate finished refuses the whole commit with
        PermissionDeniedError, one naming a dispatch no longer this trainer's with
        CheckpointRefusedError, each naming the task."""
        st = self._ledger.state
        ps = tuple(positions)
        for pos in ps:
            check_position(pos)
        deny(*(commit_position_refused(st, pos, session, identity) for pos in ps))
        problems = []
        for pos in ps:
            why = commit_refused(st, pos)
            if why is not None:
                problems.append(f"task {pos.task_id} of pass {pos.pass_id}: {why}")
        if problems:
            raise CheckpointRefusedError("commit refused: " + "; ".join(problems[:5]))
        if not ps:
            return after(None, 0)
        applied, durable = self._ledger.submit(Commit(ps))
        assert isinstance(applied, int)
        return after(durable, applied)

    async def data_checkpoint(self) -> bytes:
        """The job's data position at the last commits, as a checked blob; only what is
        durable (it waits for the writes in flight)."""
        await self._ledger.sync()
        st = self._ledger.state
        ds = st.dataset
        if ds is None:
            raise CheckpointRefusedError("no dataset is set yet: there is no position to save")
        floor, commits = committed_position(st)
        mix = mixture_position(st)
        by_pass: dict[int, tuple[set[int], dict[int, int], dict[int, list[tuple[int, int]]]]]
        by_pass = {}
        for pass_id, task_id, records in commits:
            full, partial, _ = by_pass.setdefault(pass_id, (set(), {}, {}))
            if records == st.task_records(task_id, pass_id):
                full.add(task_id)
            else:
                partial[task_id] = records
        for pass_id, task_id, start, end in committed_ranges(st):  # kept, or delivered again
            ranges = by_pass.setdefault(pass_id, (set(), {}, {}))[2]
            ranges.setdefault(task_id, []).append((start, end))
        cp = checkpoint.DataCheckpoint(
            job=self._settings.job,
            created=self._clock(),
            dataset=checkpoint.fingerprint(ds, ds.file_sizes),
            num_tasks=st.num_tasks,
            floor=floor,
            passes=tuple(
                checkpoint.PassCommits(
                    p, frozenset(full), partial, {t: tuple(r) for t, r in ranges.items()}
                )
                for p, (full, partial, ranges) in sorted(by_pass.items())
            ),
            shuffle_seed=ds.shuffle_seed,
            shuffle_window=ds.shuffle_window,
            mixture=None
            if mix is None
            else checkpoint.MixtureCheckpoint(
                checkpoint.mixture_parts(ds), mix.weights, mix.passes
            ),
            job_id=st.job_id,
        )
        return checkpoint.encode(cp)

    async def restore(
        self,
        blob: bytes,
        *,
        replace: bool = False,
        other_job: bool = False,
        key: str = "",
        rank: int = -1,
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
        rank of one restart asks: `rank`, -1 without one); refused when that cannot be told
        (core/restore.py `restore_repeated`)."""
        cp = checkpoint.decode(blob)
        source = hashlib.blake2b(blob, digest_size=16).hexdigest()
        if key:
            return await self._restore_running(cp, source, key, rank, other_job)
        return await self._restore_at_start(cp, source, replace, other_job)

    async def _restore_at_start(
        self, cp: checkpoint.DataCheckpoint, source: str, replace: bool, other_job: bool
    ) -> bool:
        st = self._ledger.state
        job = self._settings.job
        if st.restored_from == source:
            log.info("the state was started from this data checkpoint already; going on")
            return False
        if cp.job != job and not other_job:
            raise checkpoint.CheckpointError(
                f"the data checkpoint is of the job {cp.job!r} and this master runs the job "
                f"{job!r}; start it with --job {cp.job}, or with --restore-other-job to "
                "restore another job's position"
            )
        if st.dataset is not None and not replace:
            raise checkpoint.CheckpointError(
                f"the store already holds a job (pass {st.cur_pass}, dataset "
                f"{list(st.dataset.globs)}): a data checkpoint is restored onto an empty "
                "store only; start with --restore-replace to replace the state it holds"
            )
        if cp.mixture is not None and self._settings.failed_policy is FailedPolicy.KEEP:
            raise checkpoint.CheckpointError(KEEP_REFUSED)
        cp = checkpoint.with_paths(cp, absolute_path)
        first, added = await self._index(cp)
        dataset = first if added is None else first.grown(added)
        units = checkpoint.check_restorable(cp, dataset, dataset.file_sizes, first.num_tasks)
        events: list[Event] = [SetDataset(first, uuid.uuid4().hex)]
        if added is not None and cp.mixture is not None:  # as the job had them: set, added
            events.append(AddSources(added, cp.mixture.weights))
        events.append(_restore_event(cp, dataset, units, source))
        if st.dataset is None:
            for ev in events:
                await self._ledger.commit(ev)
        else:  # a fresh state from the checkpoint, with this master's limits
            await self._ledger.replace(events)
            for ev in reconcile(self._ledger.state, self._settings.limits):
                await self._ledger.commit(ev)
        st = self._ledger.state
        log.info(
            "restored the data checkpoint of job %r: pass %d, %d task(s) to do, %d done",
            cp.job,
            st.cur_pass,
            len(st.todo),
            len(st.done),
        )
        return True

    async def _index(self, cp: checkpoint.DataCheckpoint) -> tuple[Dataset, Dataset | None]:
        """The checkpoint's dataset (or each source of its mixture) indexed again, cut as it
        was; a chunk size that would cut other chunks is refused before any file is read. A
        mixture comes as the sources its job was set with and those added to it while it ran
        (None: none were)."""
        fingerprints = (
            [cp.dataset] if cp.mixture is None else cp.mixture.source_fingerprints(cp.dataset)
        )
        for fp in fingerprints:
            bound = chunk_size_for(fp.format, self._settings.chunk_size)
            why = checkpoint.chunk_size_refusal(fp, bound)
            if why is not None:
                raise checkpoint.CheckpointError(why)
        cpt = cp.dataset.chunks_per_task
        if cp.mixture is None:
            return await self._dataset.index(cp.dataset.globs, cpt, cp.dataset.format), None
        sources = [SourceSpec(s.name, s.globs, s.weight, s.format) for s in cp.mixture.sources]
        k = checkpoint.set_with(cp)
        assert k is not None  # checked when the checkpoint was read
        first = await self._dataset.index_mixture(sources[:k], cpt)
        added = await self._dataset.index_mixture(sources[k:], cpt) if k < len(sources) else None
        return first, added

    async def _restore_running(
        self, cp: checkpoint.DataCheckpoint, source: str, key: str, rank: int, other_job: bool
    ) -> bool:
        st = self._ledger.state
        if cp.job_id and st.job_id and cp.job_id != st.job_id and not other_job:
            raise checkpoint.CheckpointError(
                f"the data checkpoint is of another job (job {cp.job!r}, id {cp.job_id}, "
                f"dataset {list(cp.dataset.globs)}, saved "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(cp.created))}) than the "
                f"one this master runs (job {self._settings.job!r}, id {st.job_id}, dataset "
                f"{[] if st.dataset is None else list(st.dataset.globs)}): a running job goes "
                "back only to its own checkpoints. To take this job to the other's position "
                "anyway, restore with other_job=True (Loader.load_state_dict(state, "
                "other_job=True)); to continue the other job, start a master on it with "
                "chunkmaster master --restore FILE"
            )
        repeated = restore_repeated(st, key, source, rank)
        if isinstance(repeated, str):
            raise checkpoint.CheckpointError(repeated)
        if repeated:
            log.info("restore %r was made already (another trainer of the same restart)", key)
            if rank >= 0:  # the rank asked: a second ask of it is a new restart
                await self._ledger.commit(Restore(0, (), source, key, rank=rank))
            return False
        ds = st.dataset
        if ds is None:
            raise checkpoint.CheckpointError(
                "the master has no dataset yet: start it with --restore FILE to begin a job "
                "from a data checkpoint"
            )
        if cp.job != self._settings.job:
            raise checkpoint.CheckpointError(
                f"the data checkpoint is of the job {cp.job!r} and this master runs the job "
                f"{self._settings.job!r}: a running job goes back only to a checkpoint of its own"
            )
        cp = checkpoint.with_paths(cp, absolute_path)
        units = checkpoint.check_restorable(cp, ds, ds.file_sizes, st.num_tasks)
        ended = len(st.sessions)
        if not self._ledger.available:
            raise self._ledger.unavailable()
        await self._ledger.commit(_restore_event(cp, ds, units, source, key, rank))
        st = self._ledger.state
        self._sessions.reset()
        self._timeouts.rearm()
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


def _restore_event(
    cp: checkpoint.DataCheckpoint,
    dataset: Dataset,
    units: dict[int, list[int]],
    source: str,
    key: str = "",
    rank: int = -1,
) -> Restore:
    """The Restore of a checkpoint: at start (no `key`, the job takes the checkpoint's
    identity) or onto the running job (`key`, `rank`: the restart that asked)."""
    return Restore(
        cp.floor,
        _commits_of(cp, dataset, units),
        source,
        key,
        _plans_of(cp),
        rank,
        "" if key else cp.job_id,
        _ranges_of(cp),
    )


def _commits_of(
    cp: checkpoint.DataCheckpoint, dataset: Dataset, units: dict[int, list[int]]
) -> tuple[tuple[int, int, int], ...]:
    """(pass, task, records committed) of a checkpoint, in the order Restore applies them (a
    mixture's units have the records of the tasks its plans put there: `units`, from
    `check_restorable`)."""
    return tuple(
        (p.pass_id, t, r)
        for p in cp.passes
        for totals in (units.get(p.pass_id) or dataset.task_records_for(p.pass_id),)
        for t, r in sorted([(t, totals[t]) for t in p.full] + list(p.partial.items()))
    )


def _ranges_of(cp: checkpoint.DataCheckpoint) -> tuple[tuple[int, int, int, int], ...]:
    """(pass, task, start, end) of each range a checkpoint holds committed beyond a task's
    prefix, in order."""
    return tuple(
        (p.pass_id, t, start, end)
        for p in cp.passes
        for t in sorted(p.ranges)
        for start, end in p.ranges[t]
    )


def _plans_of(cp: checkpoint.DataCheckpoint) -> MixturePosition | None:
    """A mixture checkpoint's plans and weights, as Restore takes them."""
    if cp.mixture is None:
        return None
    return MixturePosition(cp.mixture.passes, cp.mixture.weights)

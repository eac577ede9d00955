"""The master's status as a typed view: what `chunkmaster status`, `/status.json`, the
dashboard and the metrics show, built from the state, the leases and the ledger's health.

`Status.to_json()` is the wire form (`status --json`): each dataclass's fields by name, but
`pass` for `pass_id`. Lists are cut at STATUS_LIST_LIMIT entries, so the view stays bounded
whatever the job's size.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.master_state import MasterState
from chunkmaster.core.model import Failure, PassLedger, RecordCounts
from chunkmaster.core.quarantine import budget_limit, describe
from chunkmaster.core.queues import task_deadline
from chunkmaster.core.steps import missing_ranks, unequal_world, world_size
from chunkmaster.logs import about, plural
from chunkmaster.master.indexing import chunk_size_hint
from chunkmaster.master.leases import DataWait, LeaseKeeper
from chunkmaster.master.ledger import Ledger

log = logging.getLogger("chunkmaster.service")

STATUS_LIST_LIMIT = 100


PASS = {"json": "pass"}  # a field's metadata: named `pass` on the wire
OMITTED_IF_NONE = {"omit_none": True}  # a field's metadata: left out of the JSON while None


def to_json(value: Any) -> Any:
    """A view as JSON values: dataclasses as objects of their fields (renamed by a field's
    `json` metadata), sequences as lists, mappings as objects."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.metadata.get("json", f.name): to_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (f.metadata.get("omit_none") and getattr(value, f.name) is None)
        }
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


@dataclass(frozen=True)
class FailureView:
    pass_id: int = field(metadata=PASS)
    epoch: int
    reason: str


@dataclass(frozen=True)
class FailedTask:
    id: int
    queue: str  # "failed", "pending" or "in pass"
    failures: int  # in this pass
    total_failures: int
    reasons: list[FailureView]


@dataclass(frozen=True)
class PendingTask:
    id: int
    epoch: int
    worker: str
    expires_in: float  # seconds until its deadline


@dataclass(frozen=True)
class SaveWindow:
    trainer_id: str
    expires_in: float


@dataclass(frozen=True)
class DataWaitView:
    p50_ms: float
    p99_ms: float
    share: float
    batches: int
    window_s: float


@dataclass(frozen=True)
class Trainer:
    session: str
    name: str
    host: str
    pid: int
    tasks_held: int
    records_consumed: int
    records_per_second: float | None
    last_heard_s: float | None
    lease_expires_in: float | None
    rank: int | None
    world_size: int | None
    data_wait: DataWaitView | None


@dataclass(frozen=True)
class ChunkView:
    path: str
    offset: int
    records: int


@dataclass(frozen=True)
class QuarantinedView:
    id: int
    files: list[str]
    chunks: list[ChunkView]
    records: int
    reasons: list[FailureView]


@dataclass(frozen=True)
class DatasetView:
    globs: list[str]
    files: int
    chunks: int
    records: int
    chunks_per_task: int
    chunk_size: int | None
    format: str


@dataclass(frozen=True)
class SourceView:
    """One source of a mixture: what it is, its weight in force (`target`, normalised) and
    its share of the records consumed so far (`share`, None before any), its records handed
    out, consumed and committed over the whole job, and the epoch of its next task."""

    name: str
    globs: list[str]
    format: str
    files: int
    tasks: int
    records: int
    target: float
    share: float | None
    handed_out: int
    consumed: int
    committed: int
    epoch: int


@dataclass(frozen=True)
class MixtureView:
    """A mixture: units a pass, the weight schedule (its mode and breakpoints by records
    planned, weights by source name), the records planned before the pass's next unit never
    handed out (where a weight change would take effect), and each source."""

    units: int
    mode: str
    schedule: list[dict[str, Any]]
    records_planned: int
    sources: list[SourceView]


@dataclass(frozen=True)
class BudgetView:
    max_failed_records: str
    limit: int | None
    quarantined: int  # records the current pass lost so far


@dataclass(frozen=True)
class StopView:
    pass_id: int = field(metadata=PASS)
    records: int
    limit: int
    tasks: list[int]
    message: str


@dataclass(frozen=True)
class StepsView:
    mode: str
    world_size: int | None
    missing_ranks: list[int]
    target: int
    records: dict[str, int]  # session -> records it got in the pass


@dataclass(frozen=True)
class SourceRecords:
    """One source's records in one pass (the pass's counts, of its tasks only)."""

    dispatched: int
    consumed: int
    committed: int
    redispatched: dict[str, int]
    quarantined: int
    dropped: int
    padded: int
    restored: int
    rolled_back: int


@dataclass(frozen=True)
class PassRecords:
    pass_id: int = field(metadata=PASS)
    dispatched: int
    consumed: int
    committed: int
    redispatched: dict[str, int]
    quarantined: int
    dropped: int
    padded: int
    #: What the last restore of a data checkpoint found committed in the pass (where the pass
    #: went on from; `consumed` counts beyond it), and the records restores that went back to
    #: the pass delivered again: those the trainers had reached beyond the checkpoint, in this
    #: pass and later ones (core/restore.py).
    restored: int
    rolled_back: int
    #: A mixture's counts of each source in the pass, by name (every source, in the
    #: mixture's order, as `mixture.sources`): they add up to the pass's. Absent from the
    #: JSON of a job that is not a mixture.
    sources: dict[str, SourceRecords] | None = field(default=None, metadata=OMITTED_IF_NONE)


@dataclass(frozen=True)
class StoreView:
    kind: str
    healthy: bool
    error: str | None  # the cause while changes are refused
    failing_for: float | None
    failed_attempts: int
    next_retry_in: float | None
    seq: int
    durable_seq: int


@dataclass(frozen=True)
class ProgressView:
    """The current pass in records: consumed (as the trainers reported) of what it delivers,
    the trainers' rate (the sum of the sessions' rates; None without a session) and the time
    that leaves at that rate."""

    pass_id: int = field(metadata=PASS)
    records_done: int
    records_total: int | None
    records_per_second: float | None
    seconds_left: float | None


@dataclass(frozen=True)
class Status:
    healthy: bool
    warnings: list[str]
    ready: bool
    cur_pass: int
    todo: int
    pending: int
    done: int
    failed: int
    num_tasks: int
    progress: ProgressView
    dataset: DatasetView | None
    failure_max: int
    failed_policy: str
    shuffle_seed: int | None
    #: Records per window trainers permute each task's records in (0: none, or no dataset).
    shuffle_window: int
    timeout_dur: float
    failed_tasks: list[FailedTask]
    error_budget: BudgetView
    quarantined_tasks: list[QuarantinedView]
    job_stopped: StopView | None
    tasks_with_failures: int
    pending_tasks: list[PendingTask]
    save_model: SaveWindow | None
    trainer_ttl: float
    sessions: int
    trainers: list[Trainer]
    commit_floor: int
    equal_steps: StepsView
    ledger: list[PassRecords]
    store: StoreView
    mixture: MixtureView | None

    def to_json(self) -> dict[str, Any]:
        out = to_json(self)
        assert isinstance(out, dict)
        return out


def build_status(
    ledger: Ledger, leases: LeaseKeeper, timeout_dur: float, now: float, describe_store: str
) -> Status:
    """The status at wall-clock time `now` (deadlines are wall-clock; leases monotonic)."""
    st = ledger.state
    return Status(
        healthy=ledger.available,
        warnings=status_warnings(st),
        ready=st.ready,
        cur_pass=st.cur_pass,
        todo=len(st.todo),
        pending=len(st.pending),
        done=len(st.done),
        failed=len(st.failed),
        num_tasks=st.num_tasks,
        progress=_progress(st, leases),
        dataset=None if st.dataset is None else _dataset(st.dataset),
        failure_max=st.failure_max,
        failed_policy=st.failed_policy.value,
        shuffle_seed=None if st.dataset is None else st.dataset.shuffle_seed,
        shuffle_window=0 if st.dataset is None else st.dataset.shuffle_window,
        timeout_dur=timeout_dur,
        failed_tasks=_failed_tasks(st),
        error_budget=_budget(st),
        quarantined_tasks=[_quarantined(st, t) for t in st.failed[:STATUS_LIST_LIMIT]],
        job_stopped=_stop(st),
        tasks_with_failures=len(st.failure_log),
        pending_tasks=_pending(st, now),
        save_model=_save_window(st, now),
        trainer_ttl=leases.ttl,
        sessions=len(st.sessions),
        trainers=_trainers(st, leases),
        commit_floor=st.commit_floor,
        equal_steps=_steps(st),
        ledger=_ledger(st),
        store=_store(ledger, describe_store),
        mixture=_mixture(st),
    )


def _progress(st: MasterState, leases: LeaseKeeper) -> ProgressView:
    rates = [lease.rate() for sid in st.sessions if (lease := leases.get(sid)) is not None]
    led = st.ledger.get(st.cur_pass)
    total = None
    done = 0
    if st.dataset is not None:
        total = st.dataset.num_records if st.mix is None else st.mix.records
        if led is not None:
            total += led.padded - led.dropped - led.quarantined
            done = min(led.consumed, total)
    rate = round(sum(rates), 1) if rates else None
    left = None if total is None or not rate else round((total - done) / rate, 1)
    return ProgressView(st.cur_pass, done, total, rate, left)


def _mixture(st: MasterState) -> MixtureView | None:
    mix, ds = st.mix, st.dataset
    if mix is None or ds is None:
        return None
    planned = mix.planned_now(st.cur_pass)
    target = mix.weights.at(planned)
    consumed = sum(mix.consumed)
    records = ds.task_records
    sources = []
    for i, src in enumerate(ds.sources[:STATUS_LIST_LIMIT]):
        tasks = ds.source_tasks(i)
        sources.append(
            SourceView(
                src.name,
                list(src.globs),
                src.format,
                src.num_files,
                len(tasks),
                sum(records[tasks.start : tasks.stop]),
                round(target[i], 6),
                round(mix.consumed[i] / consumed, 6) if consumed else None,
                mix.handed[i],
                mix.consumed[i],
                mix.committed[i],
                mix.epoch(st.cur_pass, i),
            )
        )
    schedule = [
        {"records": p.at, "weights": dict(zip(mix.names, p.weights, strict=True))}
        for p in mix.weights.points[:STATUS_LIST_LIMIT]
    ]
    return MixtureView(mix.units, mix.weights.mode, schedule, planned, sources)


def _reasons(failures: Sequence[Failure]) -> list[FailureView]:
    return [FailureView(f.pass_id, f.epoch, f.reason) for f in failures]


def _dataset(ds: Dataset) -> DatasetView:
    return DatasetView(
        list(ds.globs),
        len(ds.files),
        ds.num_chunks,
        ds.num_records,
        ds.chunks_per_task,
        ds.chunk_size,
        ds.format,
    )


def _failed_tasks(st: MasterState) -> list[FailedTask]:
    failed = set(st.failed)

    def queue(t: int) -> str:
        if t in failed:
            return "failed"
        return "pending" if t in st.pending else "in pass"

    return [
        FailedTask(
            t,
            queue(t),
            st.num_failures.get(t, 0),
            st.failure_total.get(t, 0),
            _reasons(st.failure_log[t]),
        )
        for t in sorted(st.failure_log)[:STATUS_LIST_LIMIT]
    ]


def _budget(st: MasterState) -> BudgetView:
    cur = st.ledger.get(st.cur_pass)
    return BudgetView(str(st.error_budget), budget_limit(st), cur.quarantined if cur else 0)


def _quarantined(st: MasterState, task_id: int) -> QuarantinedView:
    q = describe(st, task_id)
    return QuarantinedView(
        task_id,
        list(q.files),
        [ChunkView(c.path, c.offset, c.num_records) for c in q.chunks],
        q.records,
        _reasons(q.reasons),
    )


def _stop(st: MasterState) -> StopView | None:
    s = st.stopped
    if s is None:
        return None
    return StopView(s.pass_id, s.records, s.limit, list(s.tasks), s.message)


def _pending(st: MasterState, now: float) -> list[PendingTask]:
    return [
        PendingTask(t, p.epoch, p.worker, round(task_deadline(st, t) - now, 3))
        for t, p in list(st.pending.items())[:STATUS_LIST_LIMIT]
    ]


def _save_window(st: MasterState, now: float) -> SaveWindow | None:
    s = st.saver
    if s is None or s.until <= now:
        return None
    return SaveWindow(s.trainer_id, round(s.until - now, 3))


def _trainers(st: MasterState, leases: LeaseKeeper) -> list[Trainer]:
    now = time.monotonic()
    held: dict[str, int] = {}
    for p in st.pending.values():
        if p.session:
            held[p.session] = held.get(p.session, 0) + 1
    trainers = []
    for sid, s in list(st.sessions.items())[:STATUS_LIST_LIMIT]:
        lease = leases.get(sid)
        trainers.append(
            Trainer(
                sid,
                s.name,
                s.host,
                s.pid,
                held.get(sid, 0),
                s.consumed,
                None if lease is None else round(lease.rate(), 1),
                None if lease is None else round(now - lease.heard, 3),
                None if lease is None else round(lease.expires - now, 3),
                s.rank if s.world_size else None,
                s.world_size or None,
                None if lease is None else _data_wait(lease.data_wait),
            )
        )
    return trainers


def _data_wait(wait: DataWait | None) -> DataWaitView | None:
    if wait is None:
        return None
    return DataWaitView(
        round(wait.p50 * 1000, 2),
        round(wait.p99 * 1000, 2),
        round(min(1.0, wait.share), 4),
        wait.batches,
        round(wait.window, 1),
    )


def _steps(st: MasterState) -> StepsView:
    return StepsView(
        st.steps.mode.value,
        world_size(st) or None,
        missing_ranks(st)[:STATUS_LIST_LIMIT],
        st.steps.target,
        dict(list(st.steps.members.items())[:STATUS_LIST_LIMIT]),
    )


def _ledger(st: MasterState) -> list[PassRecords]:
    return [
        PassRecords(
            p,
            led.dispatched,
            led.consumed,
            led.committed,
            dict(led.redispatched),
            led.quarantined,
            led.dropped,
            led.padded,
            led.restored,
            led.rolled_back,
            None if st.mix is None else _source_records(st.mix.names, led),
        )
        for p in sorted(st.ledger)[-2:]
        for led in (st.ledger[p],)
    ]


def _source_records(names: Sequence[str], led: PassLedger) -> dict[str, SourceRecords]:
    out = {}
    for i, name in enumerate(names[:STATUS_LIST_LIMIT]):
        c = led.sources.get(i) or RecordCounts()
        out[name] = SourceRecords(
            c.dispatched,
            c.consumed,
            c.committed,
            dict(c.redispatched),
            c.quarantined,
            c.dropped,
            c.padded,
            c.restored,
            c.rolled_back,
        )
    return out


def _store(ledger: Ledger, kind: str) -> StoreView:
    now, out = time.monotonic(), ledger.outage
    return StoreView(
        kind,
        ledger.available,
        out.error,
        None if out.since is None else round(now - out.since, 3),
        out.attempts,
        None if out.next_retry_at is None else round(max(0.0, out.next_retry_at - now), 3),
        ledger.seq,
        ledger.durable_seq,
    )


def few_tasks(st: MasterState) -> str | None:
    """A warning when the pass has fewer tasks than trainers with sessions (some of them get
    nothing to read), naming what makes more tasks; None otherwise."""
    ds = st.dataset
    trainers = len(st.sessions)
    if ds is None or trainers <= st.num_tasks:
        return None
    more = [chunk_size_hint(ds.format, ds.chunk_size)]
    if ds.chunks_per_task > 1:
        more.insert(0, f"a smaller --chunk-per-task (now {ds.chunks_per_task})")
    return (
        f"pass {st.cur_pass} has {plural(st.num_tasks, 'task')} for {trainers} trainers "
        f"(sessions): {trainers - st.num_tasks} of them get nothing to read; for more tasks "
        "give the "
        f"master {' or '.join(more)}"
    )


def status_warnings(st: MasterState) -> list[str]:
    """What the status warns of: too few tasks for the trainers, ranks without equal steps."""
    return [w for find in _WARNINGS if (w := find(st)) is not None]


_WARNINGS = (few_tasks, unequal_world)


class StatusWarnings:
    """Logs each of the status's warnings once each time it comes to hold."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._warned = dict.fromkeys(_WARNINGS, False)

    def check(self) -> None:
        st = self._ledger.state
        for find in _WARNINGS:
            warning = find(st)
            if warning is not None and not self._warned[find]:
                log.warning("%s", warning, extra=about(pass_id=st.cur_pass))
            self._warned[find] = warning is not None

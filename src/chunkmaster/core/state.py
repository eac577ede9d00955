"""The master's state machine: four queues, passes, failures, save-model approval, trainer
sessions, how far each held task is consumed, and how far each task is committed.

`apply(state, event)` is the only way the state changes. Every operation costs O(1) per task
it names, except a pass rollover, which moves each task once per pass (O(1) amortised per
task), and the end of a session, which scans the pending tasks for those it held.

In a mixture (core/mixture.py, docs/mixtures.md) a pass is a number of *units*, each a task of
one source as the pass's plan says: the queues hold units, and a unit's chunks and records are
its task's in that pass (`task_chunks`, `task_records`), as a shuffled pass's tasks cover the
chunks of that pass. A pass is planned once, when it begins (O(log sources) a unit).

With equal steps (core/steps.py) a pass also holds *pieces*: record ranges of tasks, with IDs
beyond the dataset's tasks, queued, dispatched, finished and failed like tasks. Fixing a pass's
trainers (its first dispatch) scans Todo once; every other dispatch costs O(trainers) more.
"""

from __future__ import annotations

import enum
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from chunkmaster.core import quarantine, steps
from chunkmaster.core.budget import ErrorBudget, JobStop
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import AllTaskFailedError, PassAfterError, PassBeforeError
from chunkmaster.core.events import (
    AddSources,
    ApproveSave,
    Commit,
    Configure,
    Dispatch,
    EndSession,
    EqualSteps,
    Event,
    Fail,
    Finish,
    MixturePosition,
    OpenSession,
    Progress,
    Restore,
    Resume,
    ReturnTasks,
    SetDataset,
    SetErrorBudget,
    SetWeights,
    StopJob,
)
from chunkmaster.core.mixture import (
    MixtureError,
    MixtureState,
    PassPlan,
    Weights,
    copy_cursors,
    widen_plan,
)
from chunkmaster.core.model import (
    RETURNED_REASON,
    TIMEOUT_REASON,
    TRAINER_LOST_REASON,
    Chunk,
    FailedPolicy,
    Failure,
    PassLedger,
    Position,
    RecordCounts,
    Task,
    TaskMeta,
)
from chunkmaster.core.shuffle import pass_queue

FAILURE_HISTORY = 8  # failures remembered per task; the count is kept in full
LEDGER_PASSES = 16  # passes whose record counts are kept
COMMIT_PASSES = steps.PIECES_KEPT  # passes back a commit may still name (late commits)
NO_IDENTITY = 0  # a Finishers entry: not finished in the pass (or before identities were kept)
READ_FAILURE = "read failure"  # the ledger's reason for a trainer's TaskFailed


class InvalidEvent(Exception):
    """An event that cannot apply to this state: a bug in the shell, never a user error."""


@dataclass(slots=True)
class Pending:
    epoch: int
    deadline: float
    worker: str
    request: str = ""
    session: str = ""
    start: int = 0  # the record this dispatch started at
    owner: str = ""  # the identity holding it (mutual TLS): the session's, or the GetTask's


@dataclass(slots=True)
class Finishers:
    """Which identity (mutual TLS) finished each task and piece of one pass, for the commits
    still to come: 4 bytes a task, kept only once a finisher had an identity."""

    ids: dict[str, int]  # identity -> its number (1, 2, ...)
    tasks: array[int]  # task -> the number of its finisher's identity; 0: not finished
    pieces: dict[int, int] = field(default_factory=dict)  # the same, for pieces

    def finisher(self, unit: int) -> str | None:
        """The identity that finished `unit` in this pass (None: not finished in it)."""
        n = self.tasks[unit] if unit < len(self.tasks) else self.pieces.get(unit, NO_IDENTITY)
        if n == NO_IDENTITY:
            return None
        return next(name for name, k in self.ids.items() if k == n)

    def note(self, unit: int, identity: str) -> None:
        n = self.ids.get(identity)
        if n is None:
            n = self.ids[identity] = len(self.ids) + 1
        if unit < len(self.tasks):
            self.tasks[unit] = n
        else:
            self.pieces[unit] = n


@dataclass(slots=True)
class Session:
    name: str
    host: str
    pid: int
    report_every: int = 0
    consumed: int = 0  # records it reported consumed, all passes
    owner: str = ""  # the identity that opened it (mutual TLS): only it may resume it
    world_size: int = 0  # the job's trainers as this one declared them (0: not said)
    rank: int = 0
    #: Its tasks do not time out before this (wall-clock seconds): its last progress plus the
    #: task timeout (`Progress.deadline`). A trainer with a session times out when it is
    #: stuck, not when it is slow.
    deadline: float = 0.0


@dataclass(slots=True)
class SaveApproval:
    trainer_id: str
    until: float


@dataclass
class MasterState:
    dataset: Dataset | None = None
    failure_max: int = 3
    failed_policy: FailedPolicy = FailedPolicy.RETRY
    cur_pass: int = 0
    todo: deque[int] = field(default_factory=deque)
    pending: dict[int, Pending] = field(default_factory=dict)
    done: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    epochs: array[int] = field(default_factory=lambda: array("Q"))
    num_failures: dict[int, int] = field(default_factory=dict)  # only tasks with failures
    failure_log: dict[int, deque[Failure]] = field(default_factory=dict)
    failure_total: dict[int, int] = field(default_factory=dict)
    saver: SaveApproval | None = None
    requests: dict[str, int] = field(default_factory=dict)  # GetTask request ID -> pending task
    sessions: dict[str, Session] = field(default_factory=dict)
    progress: dict[int, int] = field(default_factory=dict)  # this pass: task -> records consumed
    commits: dict[int, dict[int, int]] = field(default_factory=dict)  # pass -> task -> records
    full_commits: dict[int, int] = field(default_factory=dict)  # pass -> tasks wholly committed
    commit_floor: int = 0  # the first pass not wholly committed
    pass_done: dict[int, int] = field(default_factory=dict)  # ended pass -> tasks done in it
    ledger: dict[int, PassLedger] = field(default_factory=dict)  # the last LEDGER_PASSES passes
    restored_from: str = ""  # the data checkpoint this state was started from, if any
    job_id: str = ""  # the job's identity (SetDataset; a job started from a checkpoint: its)
    restore_key: str = ""  # the restart that asked for the last restore (one per key)
    restore_ranks: frozenset[int] = frozenset()  # the ranks that asked with that key
    restore_moved: bool = False  # a task was handed out since the last restore
    error_budget: ErrorBudget = field(default_factory=ErrorBudget)  # quarantine.py
    stopped: JobStop | None = None  # the error budget was exceeded: no more tasks
    steps: steps.StepsState = field(default_factory=steps.StepsState)  # equal steps
    #: Dispatches taken from their holder (timeout, failure, lost or closed session), as
    #: (task or piece, epoch) -> pass, for the last COMMIT_PASSES passes: a commit naming one
    #: is refused, even once its pass is over or wholly committed by others.
    taken: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Of those, the dispatches their holder handed back (a trainer that stopped reading a
    #: pass): (task or piece, epoch) -> (session, position handed back at). The holder
    #: consumed the records before that position, so its commits of them are taken.
    returned: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)
    #: Passes not yet wholly committed (COMMIT_PASSES at most) -> who finished what in them.
    finishers: dict[int, Finishers] = field(default_factory=dict)
    #: A mixture's plans and per-source counts (None: one plain dataset).
    mix: MixtureState | None = None

    @property
    def ready(self) -> bool:
        return self.dataset is not None

    @property
    def num_tasks(self) -> int:
        return len(self.epochs)  # one epoch a task, set with the dataset; cheaper to ask

    def task(self, task_id: int) -> Task:
        ds = self.dataset
        assert ds is not None
        p = self.pending.get(task_id)
        start = 0 if p is None else p.start
        if task_id >= len(self.epochs):  # a piece: its task's chunks up to its end
            piece = self.steps.pieces[task_id]
            unit, end, epoch = piece.task, piece.end, piece.epoch
        else:
            unit, end, epoch = task_id, 0, self.epochs[task_id]
        task = self.unit_task(unit)
        whole = ds.task_chunks(task, self.cur_pass)
        if task_id >= len(self.epochs):
            chunks = []
            first = 0
            for c in whole:
                if first >= end:
                    break
                chunks.append(c)
                first += c.num_records
            whole = tuple(chunks)
        source, fmt = "", ds.format
        if self.mix is not None:  # the task's source, looked up once
            s = self.mix.source_of_task(task)
            source, fmt = self.mix.names[s], ds.sources[s].format
        return Task(
            TaskMeta(task_id, epoch),
            whole,
            self.cur_pass,
            start,
            end,
            fmt,
            self.num_failures.get(task_id, 0),
            source,
        )

    def unit_task(self, unit: int, pass_id: int | None = None) -> int:
        """The dataset's task behind `unit` of a pass (default: this one): the unit itself,
        or in a mixture the task the pass's plan put there."""
        if self.mix is None:
            return unit
        return self.mix.plan(self.cur_pass if pass_id is None else pass_id)[unit]

    def task_chunks(self, unit: int, pass_id: int | None = None) -> tuple[Chunk, ...]:
        """The chunks `unit` covers in a pass (default: this one; in a mixture, a pass whose
        plan is no longer kept reads as this one)."""
        assert self.dataset is not None
        p = self.cur_pass if pass_id is None else pass_id
        if self.mix is not None and p not in self.mix.passes:
            p = self.cur_pass
        return self.dataset.task_chunks(self.unit_task(unit, p), p)

    def unit_source(self, task_id: int, pass_id: int | None = None) -> int:
        """A mixture's source of a unit (or piece) of a pass (default: this one)."""
        assert self.mix is not None
        unit = task_id if task_id < len(self.epochs) else self.steps.pieces[task_id].task
        return self.mix.source_of_task(self.unit_task(unit, pass_id))

    def task_records(self, task_id: int, pass_id: int | None = None) -> int:
        """Where a task (or a piece of one) ends, counted from the task's first record, in
        `pass_id` (default: this pass); with a shuffle seed a task covers other chunks every
        pass, and in a mixture a unit is another task every pass."""
        if task_id < len(self.epochs):
            assert self.dataset is not None
            p = self.cur_pass if pass_id is None else pass_id
            if self.mix is not None:
                return self.dataset.task_records[self.mix.plan(p)[task_id]]
            return self.dataset.task_records_for(p)[task_id]
        return self.steps.pieces[task_id].end

    def pass_queue(self, tasks: Iterable[int] | None = None) -> deque[int]:
        """`tasks` (default: all) in the order this pass hands them out; a mixture's pass
        hands out all its units in the plan's order."""
        assert self.dataset is not None
        if self.mix is not None:
            return deque(range(self.mix.units))
        return pass_queue(self.dataset.shuffle_seed, self.cur_pass, self.num_tasks, tasks)

    def pass_ledger(self, pass_id: int | None = None) -> PassLedger:
        p = self.cur_pass if pass_id is None else pass_id
        led = self.ledger.get(p)
        if led is None:
            led = self.ledger[p] = PassLedger()
        return led

    def ledgers(
        self, unit: int, pass_id: int | None = None, source: int | None = None
    ) -> tuple[RecordCounts, ...]:
        """The counts a unit's (or piece's) records of a pass (default: this one) go to: the
        pass's ledger, and in a mixture its source's in that pass too (`source`, when the
        caller knows it already)."""
        led = self.pass_ledger(pass_id)
        if self.mix is None:
            return (led,)
        s = self.unit_source(unit, pass_id) if source is None else source
        counts = led.sources.get(s)
        if counts is None:
            counts = led.sources[s] = RecordCounts()
        return led, counts

    def held_by(self, session: str) -> list[int]:
        return [t for t, p in self.pending.items() if p.session == session]


class Availability(enum.Enum):
    NOT_READY = "not ready"  # no dataset yet: wait for one
    DISPATCH = "dispatch"  # a task can be handed out now
    WAIT = "wait"  # none in Todo, some pending: wait for one to come back or the pass to end


def check_get_task(state: MasterState, pass_id: int, session: str = "") -> Availability:
    """What a GetTask(pass_id) of `session` gets now; raises the pass and all-failed errors.
    With equal steps, a trainer that has its quota (or is not one of the pass's) waits."""
    if state.dataset is None:
        return Availability.NOT_READY
    quarantine.check_running(state)
    if pass_id < state.cur_pass:
        raise PassBeforeError(
            f"{PassBeforeError.message} (pass {pass_id} is over; the master is in pass "
            f"{state.cur_pass})"
        )
    if pass_id > state.cur_pass:
        raise PassAfterError()
    if state.todo:
        if state.steps.on and not steps.may_take(state, session):
            return Availability.WAIT
        return Availability.DISPATCH
    if state.pending:
        return Availability.WAIT
    raise AllTaskFailedError()


def finish_ignored(state: MasterState, ev: Finish) -> str | None:
    """Why a finish report changes nothing (None when it completes the task)."""
    p = state.pending.get(ev.task_id)
    if p is None:
        return "task is not pending"
    if ev.pass_id >= 0 and ev.pass_id != state.cur_pass:
        return f"report is for pass {ev.pass_id}, master is in pass {state.cur_pass}"
    if ev.epoch > p.epoch:
        return f"epoch {ev.epoch} was never dispatched (latest is {p.epoch})"
    return None


def fail_ignored(state: MasterState, ev: Fail) -> str | None:
    """Why a failure report or timeout changes nothing (None when it applies)."""
    p = state.pending.get(ev.task_id)
    if p is None:
        return "task is not pending"
    if p.epoch != ev.epoch:
        return f"report is for epoch {ev.epoch}, the pending dispatch is epoch {p.epoch}"
    return None


def fail_quarantines(state: MasterState, task_id: int) -> bool:
    """Whether one more failure of `task_id` puts it over failure_max (it is quarantined).
    Asked before the failure is applied: after it, the pass may have ended without the task,
    and its failure count and the failed queue may be gone with it."""
    return state.num_failures.get(task_id, 0) + 1 > state.failure_max


def save_allowed(state: MasterState, trainer_id: str, now: float) -> bool:
    """Approve if nobody holds an unexpired window, or the caller holds it."""
    s = state.saver
    return s is None or s.until <= now or s.trainer_id == trainer_id


def apply(state: MasterState, event: Event) -> Task | bool | int | None:
    """Apply one event. Returns the dispatched Task, whether a report changed anything, or
    how many of the positions it carried did."""
    match event:
        case Dispatch():
            return _dispatch(state, event)
        case Finish():
            return _finish(state, event)
        case Fail():
            return _fail(state, event)
        case ApproveSave(trainer_id=tid, until=until):
            state.saver = SaveApproval(tid, until)
            return True
        case SetDataset(dataset=ds, job_id=job_id):
            if state.dataset is not None:
                return False
            state.job_id = job_id
            mix = None
            if ds.sources:  # refused before anything changes: nothing half set
                try:
                    mix = MixtureState.of(ds)
                except MixtureError as exc:
                    raise InvalidEvent(str(exc)) from None
            state.dataset = ds
            units = ds.num_tasks
            if mix is not None:
                state.mix = mix
                mix.begin(state.cur_pass)
                units = mix.units
            state.epochs = array("Q", bytes(8 * units))
            state.todo = state.pass_queue()
            return True
        case Configure(failure_max=fm, failed_policy=fp):
            state.failure_max = fm
            state.failed_policy = fp
            if state.dataset is not None and fp is FailedPolicy.RETRY:
                _maybe_roll_over(state)  # a pass whose every task was kept out retries them
            return True
        case EqualSteps(mode=mode):
            state.steps.mode = steps.StepsMode(mode)
            return True
        case Resume(not_before=nb):
            for p in state.pending.values():
                p.deadline = max(p.deadline, nb)
            return True
        case OpenSession(
            session=sid,
            name=name,
            host=host,
            pid=pid,
            report_every=every,
            owner=owner,
            world_size=w,
            rank=r,
        ):
            state.sessions[sid] = Session(name, host, pid, every, 0, owner, w, r)
            return True
        case EndSession():
            return _end_session(state, event)
        case ReturnTasks():
            return _return_tasks(state, event)
        case Progress(positions=positions, deadline=deadline):
            return _report_progress(state, positions, deadline)
        case Commit(positions=positions):
            for pos in positions:  # a committed record was consumed: no later report needed
                _progress(state, pos)
            applied = sum(_commit(state, pos) for pos in positions)
            _close_committed_passes(state)
            return applied
        case SetWeights(weights=weights):
            return _set_weights(state, weights)
        case AddSources():
            return _add_sources(state, event)
        case Restore():
            return _restore(state, event)
        case SetErrorBudget(budget=budget):
            return quarantine.set_budget(state, budget)
        case StopJob(message=message):
            return quarantine.stop_job(state, message)
    raise InvalidEvent(f"unknown event {event!r}")


def _dispatch(state: MasterState, ev: Dispatch) -> Task | None:
    """The task handed out; None only with equal steps, when fixing the pass's trainers
    left nothing for this one (a quota of 0)."""
    if not state.todo:
        raise InvalidEvent("dispatch with an empty todo queue")
    if state.steps.on:
        if not steps.may_take(state, ev.session):
            raise InvalidEvent(f"dispatch to {ev.session!r}, which has its equal-steps quota")
        unit = steps.take(state, ev.session)
        if unit is None:
            _maybe_roll_over(state)
            return None
        task_id = unit
    else:
        task_id = state.todo.popleft()
    if task_id < len(state.epochs):
        state.epochs[task_id] = epoch = state.epochs[task_id] + 1
        start = state.progress.get(task_id, 0)
    else:
        piece = state.steps.pieces[task_id]
        piece.epoch = epoch = piece.epoch + 1
        start = state.progress.get(task_id, piece.start)
    owner = ev.owner
    if ev.session:
        holder = state.sessions.get(ev.session)
        owner = "" if holder is None else holder.owner
    state.pending[task_id] = Pending(
        epoch, ev.deadline, ev.worker, ev.request, ev.session, start, owner
    )
    state.restore_moved = True
    if ev.request:
        state.requests[ev.request] = task_id
    handed = state.task_records(task_id) - start
    source = None
    if state.mix is not None:
        unit = task_id if task_id < len(state.epochs) else state.steps.pieces[task_id].task
        state.mix.reach(state.cur_pass, unit)
        source = state.unit_source(task_id)
        state.mix.handed[source] += handed
    for led in state.ledgers(task_id, source=source):
        led.dispatched += handed
    return state.task(task_id)


def _leave_pending(state: MasterState, task_id: int, *, taken: bool = True) -> None:
    """The dispatch ends: finished (`taken` False), or taken from its holder, whose commits
    naming it are refused from now on."""
    p = state.pending.pop(task_id)
    if p.request:
        state.requests.pop(p.request, None)
    if taken:
        state.taken[(task_id, p.epoch)] = state.cur_pass


def _finish(state: MasterState, ev: Finish) -> bool:
    if finish_ignored(state, ev) is not None:
        return False
    _consumed(state, ev.task_id, state.task_records(ev.task_id))
    _note_finisher(state, ev.task_id, state.pending[ev.task_id].owner)
    _leave_pending(state, ev.task_id, taken=False)
    state.progress.pop(ev.task_id, None)
    state.num_failures.pop(ev.task_id, None)
    if ev.task_id >= len(state.epochs):
        steps.piece_finished(state, ev.task_id)
    else:
        state.done.append(ev.task_id)
    _maybe_roll_over(state)
    return True


def _fail(state: MasterState, ev: Fail) -> bool:
    if fail_ignored(state, ev) is not None:
        return False
    task_id = ev.task_id
    holder = state.pending[task_id].session
    _leave_pending(state, task_id)
    if _count_failure(state, task_id, ev.epoch, ev.reason):
        _quarantine(state, task_id, holder)
    else:
        state.todo.append(task_id)
        if state.steps.on:
            steps.handed_back(state, task_id, holder)
        _redispatched(
            state, task_id, TIMEOUT_REASON if ev.reason == TIMEOUT_REASON else READ_FAILURE
        )
    _maybe_roll_over(state)
    return True


def _count_failure(state: MasterState, task_id: int, epoch: int, reason: str) -> bool:
    """Log one failure of a task's dispatch `epoch`; whether it is now over failure_max."""
    count = state.num_failures.get(task_id, 0) + 1
    state.num_failures[task_id] = count
    log = state.failure_log.get(task_id)
    if log is None:
        log = state.failure_log[task_id] = deque(maxlen=FAILURE_HISTORY)
    log.append(Failure(state.cur_pass, epoch, reason))
    state.failure_total[task_id] = state.failure_total.get(task_id, 0) + 1
    return count > state.failure_max


def _quarantine(state: MasterState, task_id: int, holder: str) -> None:
    """Set aside a task (no longer pending) that went over failure_max, out of the pass."""
    piecewise = state.steps.on or task_id >= state.num_tasks
    aside = steps.set_aside(state, task_id, holder) if piecewise else task_id
    if aside is not None:
        state.failed.append(aside)
        quarantine.note_quarantined(state, aside)
    state.progress.pop(task_id, None)


def reading_task(state: MasterState, session: str) -> int | None:
    """The task `session` is reading: the first of those it holds, in the order they were
    handed to it (a trainer reads its tasks in that order; the others wait in its buffer,
    unread). Pending keeps dispatch order, in snapshots too."""
    for task_id, p in state.pending.items():
        if p.session == session:
            return task_id
    return None


def lost_reason(session: Session) -> str:
    """The failure a lost trainer's reading task is charged with."""
    return (
        f"{TRAINER_LOST_REASON} while reading it: {session.name} on {session.host} (pid "
        f"{session.pid}) went silent past its lease (killed? out of memory?)"
    )


def _note_finisher(state: MasterState, unit: int, owner: str) -> None:
    """Remember who finished `unit` in this pass, once identities are in use."""
    fin = state.finishers.get(state.cur_pass)
    if fin is None:
        if not owner:
            return
        fin = Finishers({}, array("I", bytes(4 * state.num_tasks)))
        state.finishers[state.cur_pass] = fin
    fin.note(unit, owner)


def _redispatched(state: MasterState, task_id: int, why: str) -> None:
    """Count the records of a task that will be handed out again, from its known position."""
    n = steps.remaining(state, task_id)
    if n > 0:
        for led in state.ledgers(task_id):
            led.redispatched[why] = led.redispatched.get(why, 0) + n


def _consumed(state: MasterState, task_id: int, records: int) -> int:
    """Move a pending task's known position forward to `records`; the records gained."""
    p = state.pending[task_id]
    old = state.progress.get(task_id, p.start)
    if records <= old:
        return 0
    state.progress[task_id] = records
    gained = records - old
    source = None
    if state.mix is not None:
        source = state.unit_source(task_id)
        state.mix.consumed[source] += gained
    for led in state.ledgers(task_id, source=source):
        led.consumed += gained
    session = state.sessions.get(p.session) if p.session else None
    if session is not None:
        session.consumed += gained
    return gained


def _holds(state: MasterState, pos: Position) -> bool:
    """Whether `pos` is about a dispatch pending now (not a stale or foreign one)."""
    p = state.pending.get(pos.task_id)
    return p is not None and p.epoch == pos.epoch and pos.pass_id == state.cur_pass


def task_deadline(state: MasterState, task_id: int) -> float:
    """When the pending `task_id` times out (wall-clock seconds): its dispatch's deadline, or
    for a task of a session, its holder's last progress plus the timeout if that is later."""
    p = state.pending[task_id]
    s = state.sessions.get(p.session) if p.session else None
    return p.deadline if s is None else max(p.deadline, s.deadline)


def _report_progress(state: MasterState, positions: Iterable[Position], deadline: float) -> int:
    """Move the positions; the holder of each one that moved made progress: its tasks are
    safe until `deadline` (O(1) a position: the session holds the deadline, not each task)."""
    moved = 0
    for pos in positions:
        if _progress(state, pos):
            moved += 1
            holder = state.pending[pos.task_id].session
            s = state.sessions.get(holder) if holder else None
            if s is not None and deadline > s.deadline:
                s.deadline = deadline
    return moved


def _progress(state: MasterState, pos: Position) -> int:
    if not _holds(state, pos):
        return 0
    return (
        1 if _consumed(state, pos.task_id, min(pos.records, state.task_records(pos.task_id))) else 0
    )


def _end_session(state: MasterState, ev: EndSession) -> int:
    """Hand the session's tasks back, first in line, at their known positions; with
    `ev.charge`, the one it was reading counts a failure (and may be quarantined)."""
    if ev.session not in state.sessions:
        return 0
    for pos in ev.positions:
        p = state.pending.get(pos.task_id)
        if p is not None and p.session == ev.session:
            _progress(state, pos)
    held = state.held_by(ev.session)
    reading = reading_task(state, ev.session) if ev.charge else None
    over = reading is not None and _count_failure(
        state, reading, state.pending[reading].epoch, lost_reason(state.sessions[ev.session])
    )
    for task_id in reversed(held):
        _leave_pending(state, task_id)
        if over and task_id == reading:
            _quarantine(state, task_id, ev.session)
            continue
        state.todo.appendleft(task_id)
        if state.steps.on:
            steps.handed_back(state, task_id, ev.session, ending=True)
        if ev.reason != RETURNED_REASON:
            _redispatched(state, task_id, ev.reason)
    del state.sessions[ev.session]
    if state.steps.on:
        steps.session_ended(state, ev.session)
    if state.steps.on or over:
        _maybe_roll_over(state)  # what is left may have been dropped or quarantined
    return len(held)


def _return_tasks(state: MasterState, ev: ReturnTasks) -> int:
    """Hand back the session's tasks named, first in line at their positions."""
    back = []
    for pos in ev.positions:
        p = state.pending.get(pos.task_id)
        if p is None or p.session != ev.session or p.epoch != pos.epoch:
            continue  # not this session's dispatch (any more): nothing to hand back
        _progress(state, pos)
        back.append(pos.task_id)
        state.returned[(pos.task_id, pos.epoch)] = (ev.session, pos.records)
    for task_id in reversed(back):
        _leave_pending(state, task_id)
        state.todo.appendleft(task_id)
        if state.steps.on:
            steps.handed_back(state, task_id, ev.session)
    if state.steps.on:
        _maybe_roll_over(state)  # one read to its end, back when every trainer has its quota
    return len(back)


def commit_refused(state: MasterState, pos: Position) -> str | None:
    """Why a committed position cannot be taken (None when it can). A position must name a
    dispatch its trainer holds now or finished: one taken from it (its lease ran out, it timed
    out or failed) is refused, whatever happened to the task since."""
    if state.dataset is None:
        return "no dataset is set"
    if pos.pass_id > state.cur_pass:
        return f"pass {pos.pass_id} has not started (the master is in pass {state.cur_pass})"
    lost = state.taken.get((pos.task_id, pos.epoch))
    handed_back = returned_at(state, pos)
    if lost is not None and handed_back is None:
        return (
            f"task {pos.task_id} (epoch {pos.epoch}) was taken from this trainer in pass {lost} "
            f"(its lease ran out, or it timed out or failed) and handed to another trainer; "
            f"records this trainer consumed past its last report are delivered again"
        )
    if state.commit_floor <= pos.pass_id <= state.cur_pass - COMMIT_PASSES:
        return (
            f"pass {pos.pass_id} ended more than {COMMIT_PASSES} passes ago: who held its tasks "
            f"is no longer known (commit at least once every {COMMIT_PASSES} passes)"
        )
    if pos.task_id >= state.num_tasks:
        why = steps.piece_commit_refused(state, pos.task_id, pos.epoch, pos.records)
        if why is not None:
            return why
    elif pos.task_id < 0:
        return f"task {pos.task_id} does not exist (the dataset has {state.num_tasks} tasks)"
    else:
        # A mixture forgets the plans of passes before the commit floor: a commit there is an
        # old one's echo, taken as nothing (`_commit`), whose records nothing bounds.
        if state.mix is None or pos.pass_id in state.mix.passes:
            total = state.task_records(pos.task_id, pos.pass_id)
            if not 0 <= pos.records <= total:
                return f"task {pos.task_id} has {total} records, not {pos.records}"
        if pos.epoch > state.epochs[pos.task_id]:
            return f"epoch {pos.epoch} of task {pos.task_id} was never dispatched"
    p = state.pending.get(pos.task_id)
    if handed_back is not None:
        if pos.records > handed_back:
            return (
                f"task {pos.task_id} (epoch {pos.epoch}) was handed back at record "
                f"{handed_back}: records past it are not this trainer's to commit"
            )
    elif pos.pass_id == state.cur_pass and p is not None and p.epoch != pos.epoch:
        return (
            f"task {pos.task_id} was handed to another trainer (epoch {p.epoch}); records "
            f"this trainer consumed past its last report are delivered again"
        )
    return None


def returned_at(state: MasterState, pos: Position) -> int | None:
    """Where the dispatch `pos` names was handed back by its holder (None: it was not)."""
    back = state.returned.get((pos.task_id, pos.epoch))
    return None if back is None else back[1]


def _commit(state: MasterState, pos: Position) -> int:
    if pos.pass_id < state.commit_floor or commit_refused(state, pos) is not None:
        return 0
    if state.mix is None:
        return _commit_records(state, pos)
    led = state.ledger.get(pos.pass_id)
    before = 0 if led is None else led.committed
    applied = _commit_records(state, pos)
    gained = state.pass_ledger(pos.pass_id).committed - before if applied else 0
    if gained:
        state.mix.committed[state.unit_source(pos.task_id, pos.pass_id)] += gained
    return applied


def _commit_records(state: MasterState, pos: Position) -> int:
    if pos.task_id >= state.num_tasks:
        return steps.commit_piece(state, pos.task_id, pos.pass_id, pos.records)
    old = state.commits.get(pos.pass_id, {}).get(pos.task_id, 0)
    if pos.records <= old:
        return 0
    for led in state.ledgers(pos.task_id, pos.pass_id):
        led.committed += pos.records - old
    steps.cover(state, pos.pass_id, pos.task_id, 0, pos.records)
    return 1


def _close_committed_passes(state: MasterState) -> None:
    """Move the floor past ended passes whose done tasks are all wholly committed."""
    while state.commit_floor < state.cur_pass:
        f = state.commit_floor
        if state.full_commits.get(f, 0) < state.pass_done.get(f, 0):
            return
        state.commits.pop(f, None)
        state.full_commits.pop(f, None)
        state.pass_done.pop(f, None)
        state.finishers.pop(f, None)
        state.commit_floor = f + 1
        if state.mix is not None:
            state.mix.forget(state.commit_floor, state.cur_pass - COMMIT_PASSES)


def restore_repeated(state: MasterState, key: str, source: str, rank: int = -1) -> bool | str:
    """Whether a restore of the checkpoint `source` asked by `rank` (-1: none) of the restart
    `key` repeats the last one (True: another trainer of that restart asks too, nothing to
    do), is a restore of its own (False), or is refused (why).

    A key names one restore of one checkpoint: another checkpoint is another restore. Each rank
    of a restart asks once, so a rank asking again with the same key is a new restart that
    reused the key (torchrun's run ID and restart count are the same from one launch of a
    command to the next): it restores. A trainer without a rank cannot be told apart: once a
    task was handed out since the restore, its repeat is refused, naming the key, rather than
    skipped (the job has moved past the checkpoint the caller's model is at)."""
    if not key or key != state.restore_key or source != state.restored_from:
        return False
    if rank >= 0:
        return rank not in state.restore_ranks
    if not state.restore_moved:
        return True
    return (
        f"the restart key {key!r} took the job back to this data checkpoint already, and tasks "
        "were handed out since: either this trainer is of that restart and came after the "
        "others began reading (every trainer of a restart loads the state before any reads), "
        "or it is another restart that reused the key; give each restart a key of its own "
        "(Loader(restore_key=...)), or declare ranks (Session(world_size=, rank=))"
    )


def _restore(state: MasterState, ev: Restore) -> bool:
    """Start over from a data checkpoint's position. Every session ends (the shell ends their
    streams and leases), every queue is made again from the position; epochs, failure history
    and the dataset stay. False when this restart's key restored the job already."""
    if state.dataset is None:
        raise InvalidEvent("a data checkpoint restores onto a state with its dataset")
    repeated = restore_repeated(state, ev.key, ev.source, ev.rank)
    if repeated is True and ev.rank >= 0:
        state.restore_ranks |= {ev.rank}
    if repeated is not False:  # a repeat, or refused (the shell said why before journaling)
        return False
    if (state.mix is None) != (ev.mixture is None):  # refused before anything changes
        raise InvalidEvent("a mixture's data checkpoint restores onto a mixture, and only it")
    if state.mix is not None and ev.mixture is not None:
        n = len(state.mix.names)
        if any(len(plan.start) > n for _, plan in ev.mixture.passes):
            raise InvalidEvent(f"a data checkpoint of more sources than the mixture's {n}")
    keep_failed = state.failed if state.failed_policy is FailedPolicy.KEEP else []
    kept = set(keep_failed)
    for task_id, p in state.pending.items():  # their holders' commits must be refused
        state.taken[(task_id, p.epoch)] = state.cur_pass
    state.returned = {}  # what was handed back before the restore is not committed now
    state.sessions.clear()
    state.pending.clear()
    state.finishers = {}
    state.requests.clear()
    state.progress = {}
    state.done = []
    state.failed = list(keep_failed)
    state.num_failures = {t: n for t, n in state.num_failures.items() if t in kept}
    state.commits = {}
    state.full_commits = {}
    state.pass_done = {}
    state.saver = None
    state.stopped = None
    state.ledger = {p: led for p, led in state.ledger.items() if p < ev.floor}
    steps.restart(state)
    state.cur_pass = state.commit_floor = ev.floor
    state.restored_from = ev.source
    state.restore_key = ev.key
    if ev.job_id and not ev.key:  # a job started from the checkpoint continues its job
        state.job_id = ev.job_id
    state.restore_ranks = frozenset([ev.rank] if ev.rank >= 0 else [])
    state.restore_moved = False
    if state.mix is not None and ev.mixture is not None:
        _restore_plans(state.mix, ev.floor, ev.mixture.passes, ev.mixture.weights)
    for pass_id, task_id, records in ev.commits:
        state.commits.setdefault(pass_id, {})[task_id] = records
        if records == state.task_records(task_id, pass_id):
            state.full_commits[pass_id] = state.full_commits.get(pass_id, 0) + 1
        for led in state.ledgers(task_id, pass_id):
            led.committed += records
    state.todo = state.pass_queue(
        None if not kept else (t for t in range(state.num_tasks) if t not in kept)
    )
    _start_pass(state)
    _maybe_roll_over(state)
    return True


def _restore_plans(
    mix: MixtureState, floor: int, passes: tuple[tuple[int, PassPlan], ...], weights: Weights
) -> None:
    """A mixture's plans as its data checkpoint recorded them, from the floor pass on. The
    floor pass is planned again, unless it is the last pass this state planned, from the same
    start, weights and re-plans: the plan is the same, and so are the cursors after it."""
    old = mix.passes.get(floor)
    same = old is not None and old.units is not None and floor == max(mix.passes)
    n = len(mix.names)  # sources added since the checkpoint have weight 0 in its plans
    mix.passes = {
        p: widen_plan(PassPlan(tuple(copy_cursors(plan.start)), plan.weights, plan.replans), n)
        for p, plan in passes
    }
    new = mix.passes.get(floor)
    if new is None:
        raise InvalidEvent(f"a mixture's restore lacks the plan of its floor pass {floor}")
    mix.weights = weights.widened(n - len(weights.points[0].weights))
    if same and old is not None:
        same = (old.start, old.weights, old.replans) == (new.start, new.weights, new.replans)
    mix.begin(floor, old.units if same and old is not None else None)


def _start_pass(state: MasterState) -> None:
    """Apply the commits a data checkpoint holds for the pass just begun: wholly committed
    tasks are done, partly committed ones start where their commit ends."""
    commits = state.commits.get(state.cur_pass)
    if not commits:
        return
    todo: deque[int] = deque()
    for task_id in state.todo:
        c = commits.get(task_id, 0)
        if c == state.task_records(task_id):
            state.done.append(task_id)
            continue
        if c:
            state.progress[task_id] = c
        todo.append(task_id)
    state.todo = todo
    if state.mix is not None:  # a weight change plans again only after the commits
        state.mix.reach(state.cur_pass, max(commits))


def _maybe_roll_over(state: MasterState) -> None:
    """A pass ends when Todo and Pending are both empty, however the last task left (D1)."""
    while not state.todo and not state.pending:
        state.pass_done[state.cur_pass] = len(state.done)
        state.cur_pass += 1
        state.progress = {}
        next_todo: deque[int] = deque(state.done)
        state.done = []
        # A mixture's units are other tasks every pass: a task set aside comes back with
        # its source's next epoch, whatever the policy (the shell refuses `keep`).
        if state.failed_policy is FailedPolicy.RETRY or state.mix is not None:
            for task_id in state.failed:
                state.num_failures.pop(task_id, None)
            next_todo.extend(state.failed)
            state.failed = []
        if state.mix is not None:
            state.mix.begin(state.cur_pass)
        state.todo = state.pass_queue(next_todo)
        quarantine.note_pass_started(state)
        for old in [p for p in state.ledger if p <= state.cur_pass - LEDGER_PASSES]:
            del state.ledger[old]
        _forget_old_holders(state)
        steps.new_pass(state)
        _start_pass(state)
        _close_committed_passes(state)
        if not state.todo and not state.done:
            return  # every task failed and is kept out: nothing to roll over to


def _forget_old_holders(state: MasterState) -> None:
    """Passes a commit may no longer name need no record of who held their tasks."""
    horizon = state.cur_pass - COMMIT_PASSES
    for old in [p for p in state.finishers if p <= horizon]:
        del state.finishers[old]
    if state.mix is not None:
        state.mix.forget(state.commit_floor, horizon)
    if state.taken and min(state.taken.values()) <= horizon:
        state.taken = {k: p for k, p in state.taken.items() if p > horizon}
        state.returned = {k: r for k, r in state.returned.items() if k in state.taken}


def replan_point(state: MasterState) -> int:
    """The first unit of the current pass from which on no unit was handed out, committed,
    split or dropped: a weight change plans those again, and nothing else."""
    assert state.mix is not None
    cur = state.cur_pass
    at = max(
        state.mix.high,
        1 + max(state.commits.get(cur, {}), default=-1),
        1 + max(state.done, default=-1),  # equal steps drop units without handing them out
    )
    for piece in state.steps.pieces.values():
        if piece.pass_id == cur:
            at = max(at, piece.task + 1)
    return at


def _set_weights(state: MasterState, weights: Weights) -> int:
    """New weights: the units of the current pass nobody had are planned again under them (or,
    after a restore that recorded later passes, the last of those from after its last commit).
    With equal steps, a re-plan that would leave a trainer of the pass over its new quota (drop:
    fewer records to share than it got) is not made: the weights take effect at the next pass.
    Returns the records planned before the first unit planned again: where they take effect,
    counted over the whole job."""
    mix = state.mix
    if mix is None:
        raise InvalidEvent("weights for a job that is not a mixture")
    try:
        weights.check(mix.names, bounds=False)
    except MixtureError as exc:
        raise InvalidEvent(str(exc)) from None
    last = max(mix.passes)
    if last != state.cur_pass:
        at = 1 + max(state.commits.get(last, {}), default=-1)
        return mix.replan(last, at, weights, False)
    at = replan_point(state)
    again = mix.plan_again(last, at, weights)
    if not state.steps.on or again.tail is None:
        return mix.put_in_force(again, True)
    delta = mix.records_of(again.tail) - _records_from(state, at)
    if not steps.replan_keeps_quotas(state, delta):
        return mix.replan(last, mix.units, weights, True)
    effect = mix.put_in_force(again, True)
    steps.replanned(state, delta)
    _maybe_roll_over(state)  # the quotas shared again may drop what is left in Todo
    return effect


def _add_sources(state: MasterState, ev: AddSources) -> int:
    """Sources added after the mixture's own, then `ev.weights` (naming them all) as a weight
    change: the units from the first nobody had are planned again with the new sources in;
    the pass keeps its units. Returns where the weights take effect (`_set_weights`)."""
    mix, ds = state.mix, state.dataset
    if mix is None or ds is None:
        raise InvalidEvent("sources added to a job that is not a mixture")
    names = [s.name for s in ev.dataset.sources]
    if set(names) & set(mix.names) or len(set(names)) != len(names):
        raise InvalidEvent(f"sources {names} added to a mixture of {list(mix.names)}")
    if len(ev.weights.points[0].weights) != len(mix.names) + len(names):
        raise InvalidEvent(f"{len(ev.weights.points[0].weights)} weights for the sources added")
    try:
        grown = ds.grown(ev.dataset)
        ev.weights.check([*mix.names, *names], bounds=False)
    except (ValueError, MixtureError) as exc:
        raise InvalidEvent(str(exc)) from None
    records = grown.task_records
    first = len(mix.names)
    mix.add(
        names,
        [
            records[r.start : r.stop]
            for r in map(grown.source_tasks, range(first, len(grown.sources)))
        ],
    )
    state.dataset = grown
    return _set_weights(state, ev.weights)


def _records_from(state: MasterState, at: int) -> int:
    """Records of the current pass's units from `at` on."""
    records = state.dataset.task_records if state.dataset is not None else ()
    assert state.mix is not None
    plan = state.mix.plan(state.cur_pass)
    return sum(records[plan[u]] for u in range(at, len(plan)))


def mixture_position(state: MasterState) -> MixturePosition | None:
    """What a mixture's data checkpoint holds beside `committed_position`: the plans of the
    passes from the floor to the last with commits, and the weights in force (None: the job
    is not a mixture)."""
    if state.mix is None:
        return None
    floor, commits = committed_position(state)
    last = max([floor, *(p for p, _, _ in commits)])
    plans = state.mix.passes
    return MixturePosition(
        tuple(
            (p, PassPlan(plans[p].start, plans[p].weights, plans[p].replans))
            for p in range(floor, last + 1)
        ),
        state.mix.weights,
    )


def committed_position(state: MasterState) -> tuple[int, tuple[tuple[int, int, int], ...]]:
    """The job's data position at its last commits: the first pass not wholly committed, and
    (pass, task, records committed) for it and every later pass with commits. What a data
    checkpoint holds, and what `Restore` starts from."""
    commits = tuple(
        (p, t, r)
        for p in sorted(state.commits)
        if p >= state.commit_floor
        for t, r in sorted(state.commits[p].items())
    )
    return state.commit_floor, commits

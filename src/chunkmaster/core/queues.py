"""A task's way through the queues: handed out (Todo to Pending), finished (Done), failed or
timed out (back to Todo, or set aside in Failed), handed back by a trainer or its ended
session, and the positions trainers report on the way. O(1) per task an event names, except
the end of a session, which scans Pending for what it held.
"""

from __future__ import annotations

import enum
from array import array
from collections import deque
from collections.abc import Iterable

from chunkmaster.core import quarantine, steps
from chunkmaster.core.errors import AllTaskFailedError, PassAfterError, PassBeforeError
from chunkmaster.core.events import Dispatch, EndSession, Fail, Finish, ReturnTasks
from chunkmaster.core.master_state import (
    FAILURE_HISTORY,
    READ_FAILURE,
    Finishers,
    InvalidEvent,
    MasterState,
    Pending,
    Session,
)
from chunkmaster.core.model import (
    RETURNED_REASON,
    TIMEOUT_REASON,
    TRAINER_LOST_REASON,
    Failure,
    Position,
    Task,
)
from chunkmaster.core.passes import maybe_roll_over


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


def dispatch(state: MasterState, ev: Dispatch) -> Task | None:
    """The task handed out; None only with equal steps, when fixing the pass's trainers
    left nothing for this one (a quota of 0)."""
    if not state.todo:
        raise InvalidEvent("dispatch with an empty todo queue")
    if state.steps.on:
        if not steps.may_take(state, ev.session):
            raise InvalidEvent(f"dispatch to {ev.session!r}, which has its equal-steps quota")
        unit = steps.take(state, ev.session)
        if unit is None:
            maybe_roll_over(state)
            return None
        task_id = unit
    else:
        task_id = state.todo.popleft()
    if not state.is_piece(task_id):
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
        unit = state.unit_of(task_id)
        state.mix.reach(state.cur_pass, unit)
        source = state.unit_source(task_id)
        state.mix.handed[source] += handed
    for led in state.ledgers(task_id, source=source):
        led.dispatched += handed
    return state.task(task_id)


def leave_pending(state: MasterState, task_id: int, *, taken: bool = True) -> None:
    """The dispatch ends: finished (`taken` False), or taken from its holder, whose commits
    naming it are refused from now on."""
    p = state.pending.pop(task_id)
    if p.request:
        state.requests.pop(p.request, None)
    if taken:
        state.taken[(task_id, p.epoch)] = state.cur_pass


def finish(state: MasterState, ev: Finish) -> bool:
    if finish_ignored(state, ev) is not None:
        return False
    consumed(state, ev.task_id, state.task_records(ev.task_id))
    note_finisher(state, ev.task_id, state.pending[ev.task_id].owner)
    leave_pending(state, ev.task_id, taken=False)
    state.progress.pop(ev.task_id, None)
    state.num_failures.pop(ev.task_id, None)
    if state.is_piece(ev.task_id):
        steps.piece_finished(state, ev.task_id)
    else:
        state.done.append(ev.task_id)
    maybe_roll_over(state)
    return True


def fail(state: MasterState, ev: Fail) -> bool:
    if fail_ignored(state, ev) is not None:
        return False
    task_id = ev.task_id
    holder = state.pending[task_id].session
    leave_pending(state, task_id)
    if count_failure(state, task_id, ev.epoch, ev.reason):
        quarantine_task(state, task_id, holder)
    else:
        state.todo.append(task_id)
        if state.steps.on:
            steps.handed_back(state, task_id, holder)
        redispatched(
            state, task_id, TIMEOUT_REASON if ev.reason == TIMEOUT_REASON else READ_FAILURE
        )
    maybe_roll_over(state)
    return True


def count_failure(state: MasterState, task_id: int, epoch: int, reason: str) -> bool:
    """Log one failure of a task's dispatch `epoch`; whether it is now over failure_max."""
    count = state.num_failures.get(task_id, 0) + 1
    state.num_failures[task_id] = count
    log = state.failure_log.get(task_id)
    if log is None:
        log = state.failure_log[task_id] = deque(maxlen=FAILURE_HISTORY)
    log.append(Failure(state.cur_pass, epoch, reason))
    state.failure_total[task_id] = state.failure_total.get(task_id, 0) + 1
    return count > state.failure_max


def quarantine_task(state: MasterState, task_id: int, holder: str) -> None:
    """Set aside a task (no longer pending) that went over failure_max, out of the pass."""
    piecewise = state.steps.on or state.is_piece(task_id)
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


def note_finisher(state: MasterState, unit: int, owner: str) -> None:
    """Remember who finished `unit` in this pass, once identities are in use."""
    fin = state.finishers.get(state.cur_pass)
    if fin is None:
        if not owner:
            return
        fin = Finishers({}, array("I", bytes(4 * state.num_tasks)))
        state.finishers[state.cur_pass] = fin
    fin.note(unit, owner)


def redispatched(state: MasterState, task_id: int, why: str) -> None:
    """Count the records of a task that will be handed out again, from its known position."""
    n = steps.remaining(state, task_id)
    if n > 0:
        for led in state.ledgers(task_id):
            led.redispatched[why] = led.redispatched.get(why, 0) + n


def consumed(state: MasterState, task_id: int, records: int) -> int:
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


def holds(state: MasterState, pos: Position) -> bool:
    """Whether `pos` is about a dispatch pending now (not a stale or foreign one)."""
    p = state.pending.get(pos.task_id)
    return p is not None and p.epoch == pos.epoch and pos.pass_id == state.cur_pass


def task_deadline(state: MasterState, task_id: int) -> float:
    """When the pending `task_id` times out (wall-clock seconds): its dispatch's deadline, or
    for a task of a session, its holder's last progress plus the timeout if that is later."""
    p = state.pending[task_id]
    s = state.sessions.get(p.session) if p.session else None
    return p.deadline if s is None else max(p.deadline, s.deadline)


def report_progress(state: MasterState, positions: Iterable[Position], deadline: float) -> int:
    """Move the positions; the holder of each one that moved made progress: its tasks are
    safe until `deadline` (O(1) a position: the session holds the deadline, not each task)."""
    moved = 0
    for pos in positions:
        if progress(state, pos):
            moved += 1
            holder = state.pending[pos.task_id].session
            s = state.sessions.get(holder) if holder else None
            if s is not None and deadline > s.deadline:
                s.deadline = deadline
    return moved


def progress(state: MasterState, pos: Position) -> int:
    if not holds(state, pos):
        return 0
    return (
        1 if consumed(state, pos.task_id, min(pos.records, state.task_records(pos.task_id))) else 0
    )


def end_session(state: MasterState, ev: EndSession) -> int:
    """Hand the session's tasks back, first in line, at their known positions; with
    `ev.charge`, the one it was reading counts a failure (and may be quarantined)."""
    if ev.session not in state.sessions:
        return 0
    for pos in ev.positions:
        p = state.pending.get(pos.task_id)
        if p is not None and p.session == ev.session:
            progress(state, pos)
    held = state.held_by(ev.session)
    reading = reading_task(state, ev.session) if ev.charge else None
    over = reading is not None and count_failure(
        state, reading, state.pending[reading].epoch, lost_reason(state.sessions[ev.session])
    )
    for task_id in reversed(held):
        leave_pending(state, task_id)
        if over and task_id == reading:
            quarantine_task(state, task_id, ev.session)
            continue
        state.todo.appendleft(task_id)
        if state.steps.on:
            steps.handed_back(state, task_id, ev.session, ending=True)
        if ev.reason != RETURNED_REASON:
            redispatched(state, task_id, ev.reason)
    del state.sessions[ev.session]
    if state.steps.on:
        steps.session_ended(state, ev.session)
    if state.steps.on or over:
        maybe_roll_over(state)  # what is left may have been dropped or quarantined
    return len(held)


def return_tasks(state: MasterState, ev: ReturnTasks) -> int:
    """Hand back the session's tasks named, first in line at their positions."""
    back = []
    for pos in ev.positions:
        p = state.pending.get(pos.task_id)
        if p is None or p.session != ev.session or p.epoch != pos.epoch:
            continue  # not this session's dispatch (any more): nothing to hand back
        progress(state, pos)
        back.append(pos.task_id)
        state.returned[(pos.task_id, pos.epoch)] = (ev.session, pos.records)
    for task_id in reversed(back):
        leave_pending(state, task_id)
        state.todo.appendleft(task_id)
        if state.steps.on:
            steps.handed_back(state, task_id, ev.session)
    if state.steps.on:
        maybe_roll_over(state)  # one read to its end, back when every trainer has its quota
    return len(back)

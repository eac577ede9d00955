"""Equal steps: every trainer of a pass gets the same number of records (docs/equal-steps.md).

The pass's trainers are the live sessions when its first task is handed out; each gets a
quota, the records still to hand out plus those its trainers hold, divided among them (floor
with `drop`, ceil with `pad`). A trainer whose quota is smaller than the next task gets a
*piece* of it: the records [start, end) of the task, under an ID of its own beyond the
dataset's tasks, while the rest of the task stays in Todo as another piece. Pieces are made
only when a trainer's last dispatch of the pass does not fit a whole task, so a pass has a
few per trainer.

When every trainer has its quota the records left in Todo are dropped for the pass (`drop`),
or short trainers get pieces that repeat the dataset's first records (`pad`). A trainer lost
mid-pass gives its quota back: the quota of the others is computed again from what is left.

Committed positions are kept per task as a prefix: a piece committed before the pieces ahead
of it waits in `ahead` and joins the prefix when they are committed. Dropped records count as
committed for the data position (they are not delivered again in that pass). A data checkpoint
keeps what waits; a restore puts it back (`restored_ranges`) and queues only the gaps before
it, as pieces (`queue_gaps`), so none of it is delivered again.

Everything here is applied by core/state.py inside `apply`: no clocks, no I/O. It sees the
state through one seam, `Pass`: the pass's queues and positions, its holders and sessions,
its ledger and commits; it owns only `StepsState`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from chunkmaster.core.ids import UnitId
from chunkmaster.core.model import PassLedger, RecordCounts

PIECES_KEPT = 16  # passes whose pieces are remembered (for late commits), as the ledger's


class StepsMode(enum.StrEnum):
    OFF = "off"
    DROP = "drop"  # quota floor(R / N): the remainder is not handed out in the pass
    PAD = "pad"  # quota ceil(R / N): short trainers get repeated records


@dataclass(slots=True)
class Piece:
    """Records [start, end) of `task` (counted from its first record), handed out in
    `pass_id` under an ID of its own. A `pad` piece repeats records of the pass."""

    pass_id: int
    task: UnitId
    start: int
    end: int
    pad: bool = False
    epoch: int = 0
    committed: int = 0  # how far its commits reached (or its first dispatch's start)


@dataclass
class StepsState:
    mode: StepsMode = StepsMode.OFF
    members: dict[str, int] = field(default_factory=dict)  # session -> records it got
    target: int = 0  # each member's quota for the pass
    unassigned: int = 0  # records in Todo (pads included)
    queued_pads: int = 0  # records of pad pieces in Todo
    pieces: dict[int, Piece] = field(default_factory=dict)  # by ID (num_tasks + n)
    next_piece: int = 0
    outstanding: dict[int, int] = field(default_factory=dict)  # split task -> live pieces
    lost: set[int] = field(default_factory=set)  # split tasks set aside as failed this pass
    ahead: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    pad_task: int = 0  # where the next pad piece starts
    pad_at: int = 0

    @property
    def on(self) -> bool:
        return self.mode is not StepsMode.OFF

    @property
    def fixed(self) -> bool:
        """The pass's trainers are known (they are fixed at its first dispatch)."""
        return bool(self.members)


class Holder(Protocol):
    """A pending dispatch, as equal steps see it: who holds it."""

    @property
    def session(self) -> str: ...


class Member(Protocol):
    """A trainer session, as equal steps see it: its declared place in the world."""

    @property
    def world_size(self) -> int: ...
    @property
    def rank(self) -> int: ...


class Pass(Protocol):
    """The seam: what equal steps see of the master's state (`core.master_state.MasterState` is
    one). They move units in and out of Todo and Done, positions and commits, and read who
    holds what; everything else of the state is not theirs."""

    @property
    def steps(self) -> StepsState: ...
    @property
    def cur_pass(self) -> int: ...
    @property
    def commit_floor(self) -> int: ...
    @property
    def num_tasks(self) -> int: ...
    @property
    def todo(self) -> deque[int]: ...
    @property
    def done(self) -> list[int]: ...
    @property
    def progress(self) -> dict[int, int]: ...
    @property
    def commits(self) -> dict[int, dict[int, int]]: ...
    @property
    def full_commits(self) -> dict[int, int]: ...
    @property
    def pending(self) -> Mapping[int, Holder]: ...
    @property
    def sessions(self) -> Mapping[str, Member]: ...
    def task_records(self, task_id: int, pass_id: int | None = None) -> int: ...
    def pass_ledger(self, pass_id: int | None = None) -> PassLedger: ...
    def ledgers(self, unit: int, pass_id: int | None = None) -> tuple[RecordCounts, ...]: ...


def quota(total: int, trainers: int, mode: StepsMode) -> int:
    """Each trainer's records when `total` are shared among `trainers`."""
    if trainers <= 0:
        return 0
    if mode is StepsMode.PAD:
        return -(-total // trainers)
    return total // trainers


def split(remaining: int, want: int) -> int:
    """How many records of a unit with `remaining` records a trainer that still wants `want`
    gets: all of them, or a piece of `want` (0: none)."""
    return max(0, min(remaining, want))


# ---- units: a task, or a piece of one ------------------------------------------------------


def unit_end(state: Pass, unit: int) -> int:
    """Where a unit ends, counted from its task's first record."""
    return state.task_records(unit)


def unit_start(state: Pass, unit: int) -> int:
    """Where the next dispatch of a unit starts (its known position)."""
    piece = state.steps.pieces.get(unit) if unit >= state.num_tasks else None
    return state.progress.get(unit, 0 if piece is None else piece.start)


def remaining(state: Pass, unit: int) -> int:
    return unit_end(state, unit) - unit_start(state, unit)


def _new_piece(state: Pass, task: UnitId, start: int, end: int, pad: bool = False) -> int:
    st = state.steps
    unit = state.num_tasks + st.next_piece
    st.next_piece += 1
    st.pieces[unit] = Piece(state.cur_pass, task, start, end, pad)
    if not pad:
        st.outstanding[task] = st.outstanding.get(task, 0) + 1
    return unit


def _covers_from(state: Pass, unit: int) -> int:
    """The first record a commit of this unit covers: a task's first, or a piece's start."""
    return state.steps.pieces[unit].start if unit >= state.num_tasks else 0


def _retire(state: Pass, unit: int) -> tuple[UnitId, bool]:
    """A unit or piece about to be split in two pieces: its unit, and whether it is a pad. A
    retired piece stays known (its earlier holder may still commit what it read of it)."""
    st = state.steps
    state.progress.pop(unit, None)
    if unit < state.num_tasks:
        return UnitId(unit), False
    piece = st.pieces[unit]
    if piece.pad:
        del st.pieces[unit]
    else:
        st.outstanding[piece.task] -= 1
    return piece.task, piece.pad


# ---- the pass's trainers and their quota -----------------------------------------------------


def _held(state: Pass, session: str) -> int:
    return sum(remaining(state, t) for t, p in state.pending.items() if p.session == session)


def world(state: Pass) -> tuple[int, dict[int, str]]:
    """The job's declared world: its size (0: no trainer declared one) and, for each rank
    present, the session that holds it. The oldest live declaration sets the size and the
    oldest live session of a rank holds it, so a trainer outside the live world (another world
    size, a second session of a rank) never takes it over: it is refused (`contested`). A
    world whose sessions all ended is not live: a job restarted with another number of ranks
    (4, then 3) is the new ranks' once the old sessions are gone."""
    size = 0
    ranks: dict[int, str] = {}
    for sid, s in state.sessions.items():  # in the order they opened
        if not s.world_size:
            continue
        size = size or s.world_size
        if s.world_size == size and 0 <= s.rank < size:
            ranks.setdefault(s.rank, sid)
    return size, ranks


def unlike(state: Pass, session: str) -> list[str]:
    """The live sessions of the other kind than `session` (ranked: a declared world size;
    unranked: none), when the oldest live session is of that other kind: under
    `--equal-steps auto` the first of a job's trainers sets its kind (equal steps for ranks,
    dynamic dispatch otherwise), and a trainer of the other kind would get what the job's
    trainers do not expect."""
    s = state.sessions.get(session)
    if s is None:
        return []
    ranked = bool(s.world_size)
    oldest = next(iter(state.sessions.values()))
    if bool(oldest.world_size) == ranked:
        return []
    return [sid for sid, o in state.sessions.items() if bool(o.world_size) != ranked]


def unequal_world(state: Pass) -> str | None:
    """A warning when equal steps are off and live trainers declare a world (torchrun's): ranks
    then get unequal numbers of batches, and DDP waits forever at a pass's last all-reduce."""
    size = world_size(state)
    if state.steps.on or not size:
        return None
    return (
        f"equal steps are off (--equal-steps off) and trainers declare a world of {size} "
        "(WORLD_SIZE): ranks get unequal numbers of batches, and DDP hangs at the all-reduce "
        "of a pass's last step; --equal-steps auto (the default) gives ranks equal steps"
    )


def contested(state: Pass, session: str) -> list[str]:
    """The live sessions whose declarations `session`'s contradicts: the live world's ranks
    when it declares another world size, the holder of its rank when that is another session;
    empty when it is in the world or declares none."""
    s = state.sessions.get(session)
    if s is None or not s.world_size:
        return []
    size, ranks = world(state)
    if s.world_size != size:
        return [ranks[r] for r in sorted(ranks)]
    holder = ranks.get(s.rank, session)
    return [] if holder == session else [holder]


def world_size(state: Pass) -> int:
    """The job's declared number of trainers (0: none declared)."""
    return world(state)[0]


def missing_ranks(state: Pass) -> list[int]:
    """The ranks of the declared world with no live session (none without a world size)."""
    size, ranks = world(state)
    return [r for r in range(size) if r not in ranks]


def _trainers(state: Pass) -> list[str]:
    """A pass's trainers: one session per rank of the declared world, else every session."""
    size, ranks = world(state)
    return [ranks[r] for r in sorted(ranks)] if size else list(state.sessions)


def _fix(state: Pass) -> None:
    """The pass's trainers, each credited with what it holds."""
    st = state.steps
    st.members = {sid: _held(state, sid) for sid in _trainers(state)}
    st.unassigned = sum(remaining(state, u) for u in state.todo)
    st.queued_pads = sum(
        remaining(state, u) for u in state.todo if u in st.pieces and st.pieces[u].pad
    )
    _rebalance(state)


def _rebalance(state: Pass) -> None:
    """Share what is left to hand out, and what the members got, among the members."""
    st = state.steps
    if not st.members:
        st.target = 0
        return
    if st.queued_pads:  # pads are owed against the old quota: make them again if still owed
        keep = [u for u in state.todo if not (u in st.pieces and st.pieces[u].pad)]
        for u in state.todo:
            if u in st.pieces and st.pieces[u].pad:
                del st.pieces[u]
        state.todo.clear()
        state.todo.extend(keep)
        st.unassigned -= st.queued_pads
        st.queued_pads = 0
    total = st.unassigned + sum(st.members.values())
    st.target = quota(total, len(st.members), st.mode)
    if st.mode is StepsMode.PAD:  # nobody gives records back: pad the others up to the most
        st.target = max(st.target, *st.members.values())
    _settle(state)


def _settle(state: Pass) -> None:
    """Pad short members, or drop what is left once every member has its quota."""
    st = state.steps
    if not st.members:
        return
    short = sum(max(0, st.target - got) for got in st.members.values())
    if short == 0:
        if state.todo:
            _drop_todo(state)
        return
    if st.mode is StepsMode.PAD and st.unassigned < short:
        _queue_pads(state, short - st.unassigned)


def _queue_pads(state: Pass, records: int) -> None:
    """Pieces repeating records of the dataset, task 0 on, continuing where the last pad of
    the pass stopped."""
    st = state.steps
    tries = 0
    while records > 0 and tries <= state.num_tasks:
        total = state.task_records(st.pad_task)
        if st.pad_at >= total:
            st.pad_task = (st.pad_task + 1) % state.num_tasks
            st.pad_at = 0
            tries += 1
            continue
        end = min(total, st.pad_at + records)
        unit = _new_piece(state, UnitId(st.pad_task), st.pad_at, end, pad=True)
        state.todo.append(unit)
        n = end - st.pad_at
        st.unassigned += n
        st.queued_pads += n
        records -= n
        st.pad_at = end
        tries = 0


def _drop_todo(state: Pass) -> None:
    """Every member has its quota: what is left in Todo is not handed out in this pass."""
    st = state.steps
    state.pass_ledger()  # the pass has its entry once it drops, even nothing
    for unit in state.todo:
        piece = st.pieces.get(unit) if unit >= state.num_tasks else None
        if piece is not None and piece.pad:
            del st.pieces[unit]
            continue
        n = remaining(state, unit)
        for led in state.ledgers(unit):
            led.dropped += n
        state.progress.pop(unit, None)
        if piece is None:
            cover(state, state.cur_pass, unit, 0, unit_end(state, unit))
            state.done.append(unit)
        else:
            cover(state, state.cur_pass, piece.task, piece.start, piece.end)
            _piece_closed(state, piece)
    state.todo.clear()
    st.unassigned = 0
    st.queued_pads = 0


def may_take(state: Pass, session: str) -> bool:
    """Whether `session` may get a task of this pass now (Todo is not empty). Before the
    pass's trainers are fixed: once every rank of a declared world is here, and only for
    those ranks' sessions."""
    st = state.steps
    if not st.fixed:
        size, ranks = world(state)
        if not size:
            return session in state.sessions
        return len(ranks) == size and session in ranks.values()
    got = st.members.get(session)
    return got is not None and got < st.target


def take(state: Pass, session: str) -> int | None:
    """The unit to hand to `session` (which `may_take`): the head of Todo, or a piece of it
    as long as the session's quota still wants. None when fixing the pass's trainers showed
    that it has nothing for this session (a quota of 0: the records are dropped)."""
    st = state.steps
    if not st.fixed:
        _fix(state)
        if not state.todo or st.members[session] >= st.target:
            return None
    want = st.target - st.members[session]
    head = state.todo[0]
    rem = remaining(state, head)
    n = split(rem, want)
    if n == rem:
        unit = state.todo.popleft()
    else:
        start, end = unit_start(state, head), unit_end(state, head)
        covers = _covers_from(state, head)
        task, pad = _retire(state, head)
        # The first piece covers what the unit covered before its known position: a commit
        # of it covers the records a lost holder reported consumed, as a task's would.
        unit = _new_piece(state, task, covers, start + n, pad)
        if start > covers:
            state.progress[unit] = start
            st.pieces[unit].committed = start
        state.todo[0] = _new_piece(state, task, start + n, end, pad)
    st.members[session] += n
    st.unassigned -= n
    if unit in st.pieces and st.pieces[unit].pad:
        st.queued_pads -= n
        for led in state.ledgers(unit):
            led.padded += n
    _settle(state)
    return unit


def handed_back(state: Pass, unit: int, session: str, *, ending: bool = False) -> None:
    """A unit `session` held goes back to Todo (a failure, a timeout, the session's end,
    `ending`: `session_ended` settles the quotas after)."""
    st = state.steps
    n = remaining(state, unit)
    st.unassigned += n
    if unit in st.pieces and st.pieces[unit].pad:
        st.queued_pads += n
    if session in st.members:
        st.members[session] -= n
    if not ending:
        _settle(state)  # e.g. a unit with nothing left, back when every member has its quota


def session_ended(state: Pass, session: str) -> None:
    """A member left (its units are back in Todo): the others share its quota."""
    st = state.steps
    if st.members.pop(session, None) is None:
        return
    if st.members:
        _rebalance(state)
    else:
        st.target = 0  # nobody left: the next dispatch fixes the trainers again


def set_aside(state: Pass, unit: int, session: str) -> int | None:
    """A unit failed too often: the task to set aside (None if it is set aside already, or
    a pad). Its records are no longer the pass's: the quota is computed again."""
    st = state.steps
    n = unit_end(state, unit) - unit_start(state, unit)
    if session in st.members:
        st.members[session] -= n
    piece = st.pieces.get(unit) if unit >= state.num_tasks else None
    task: int | None = unit
    if piece is not None:
        task = None
        if not piece.pad:
            if piece.task not in st.lost:
                st.lost.add(piece.task)
                task = piece.task
            _piece_closed(state, piece)
    if st.fixed:
        _rebalance(state)
    return task


def piece_finished(state: Pass, unit: int) -> None:
    piece = state.steps.pieces[unit]
    if not piece.pad:
        _piece_closed(state, piece)


def _piece_closed(state: Pass, piece: Piece) -> None:
    """A piece finished or dropped: its task is done once none of its pieces is left."""
    st = state.steps
    left = st.outstanding[piece.task] - 1
    if left:
        st.outstanding[piece.task] = left
        return
    del st.outstanding[piece.task]
    if piece.task in st.lost:
        st.lost.discard(piece.task)  # it is in Failed already
    else:
        state.done.append(piece.task)


def replan_keeps_quotas(state: Pass, delta: int) -> bool:
    """Whether Todo holding `delta` records more (or fewer) after a mixture's re-plan leaves
    every trainer of the pass within its quota: with `drop`, fewer records lower the quota,
    and a trainer cannot give back what it got (`pad` pads the others up instead)."""
    st = state.steps
    if not st.fixed or st.mode is not StepsMode.DROP or delta >= 0:
        return True
    total = st.unassigned - st.queued_pads + delta + sum(st.members.values())
    return max(st.members.values()) <= quota(total, len(st.members), st.mode)


def replanned(state: Pass, delta: int) -> None:
    """A mixture's units not handed out yet were planned again (new weights): Todo holds
    `delta` records more (or fewer), which the pass's trainers share again."""
    st = state.steps
    if st.fixed:
        st.unassigned += delta
        _rebalance(state)


def _forget_members(st: StepsState) -> None:
    """The pass's trainers, their quotas, split tasks and pad position, as a pass starts."""
    st.members = {}
    st.target = st.unassigned = st.queued_pads = 0
    st.outstanding = {}
    st.lost = set()
    st.pad_task = st.pad_at = 0


def restart(state: Pass) -> None:
    """A restore: the pass starts again, fixed at its first dispatch; pieces are forgotten
    (their IDs are never used again) and so are commits waiting for the pieces before them
    (the restore puts back those its checkpoint holds: `restored_ranges`)."""
    st = state.steps
    _forget_members(st)
    st.pieces = {}
    st.ahead = {}


def restored_ranges(state: Pass, pass_id: int, task: int, ranges: list[tuple[int, int]]) -> int:
    """A data checkpoint's committed `ranges` of `task` beyond its prefix in `pass_id` wait in
    `ahead` again, as they did when it was taken; the records they hold."""
    if not ranges:
        return 0
    waiting = state.steps.ahead.setdefault((pass_id, task), {})
    for start, end in ranges:
        waiting[start] = max(waiting.get(start, start), end)
    return sum(end - start for start, end in ranges)


def split_tasks(state: Pass) -> dict[int, list[tuple[int, int]]]:
    """The tasks of this pass with committed ranges beyond their prefix (a restore's): each
    one's ranges, in order."""
    cur = state.cur_pass
    return {t: sorted(r.items()) for (p, t), r in state.steps.ahead.items() if p == cur and r}


def queue_gaps(state: Pass, task: int, ranges: list[tuple[int, int]]) -> list[int]:
    """The pieces that deliver what `task` still needs in this pass: the gaps from its prefix
    to its committed `ranges`, between them and after the last to its end. Committing them
    joins the ranges to the prefix, and the task is done once they are finished, as when
    equal steps split it (pieces work with equal steps off as well)."""
    at = state.commits.get(state.cur_pass, {}).get(task, 0)
    units = []
    for start, end in ranges:
        if start > at:
            units.append(_new_piece(state, UnitId(task), at, start))
        at = max(at, end)
    total = state.task_records(task)
    if at < total:
        units.append(_new_piece(state, UnitId(task), at, total))
    return units


def new_pass(state: Pass) -> None:
    """A pass begins: its trainers are fixed at its first dispatch."""
    st = state.steps
    _forget_members(st)
    keep_from = max(state.commit_floor, state.cur_pass - PIECES_KEPT + 1)
    st.pieces = {u: p for u, p in st.pieces.items() if p.pass_id >= keep_from}
    # Committed ranges are kept from the floor on, as the prefixes are: a data checkpoint holds
    # both, however far behind the floor is (a piece never committed holds it there).
    st.ahead = {k: v for k, v in st.ahead.items() if k[0] >= state.commit_floor}


# ---- commits ------------------------------------------------------------------------------


def piece_commit_refused(state: Pass, unit: int, epoch: int, records: int) -> str | None:
    piece = state.steps.pieces.get(unit)
    if piece is None:
        return f"task {unit} is neither a task of the dataset nor a piece still known"
    if not 0 <= records <= piece.end:
        return f"piece {unit} of task {piece.task} ends at record {piece.end}, not {records}"
    if epoch > piece.epoch:
        return f"epoch {epoch} of piece {unit} was never dispatched"
    return None


def commit_piece(state: Pass, unit: int, pass_id: int, records: int) -> int:
    """A piece committed to `records`: its task's prefix grows when it is contiguous."""
    piece = state.steps.pieces[unit]
    if piece.pad or piece.pass_id != pass_id:
        return 0
    old = max(piece.start, piece.committed)
    if records <= old:
        return 0
    piece.committed = records
    for led in state.ledgers(unit, pass_id):
        led.committed += records - old
    cover(state, pass_id, piece.task, piece.start, records)
    return 1


def cover(state: Pass, pass_id: int, task: int, start: int, end: int) -> None:
    """Records [start, end) of `task` need no delivery in `pass_id` any more (committed or
    dropped): the committed prefix grows, or the range waits in `ahead` for it."""
    if end <= start:
        return
    commits = state.commits.setdefault(pass_id, {})
    have = commits.get(task, 0)
    key = (pass_id, task)
    if start > have:
        waiting = state.steps.ahead.setdefault(key, {})
        waiting[start] = max(waiting.get(start, start), end)
        return
    new = max(have, end)
    ahead = state.steps.ahead.get(key)
    while ahead:
        joined = [s for s in ahead if s <= new]
        if not joined:
            break
        for s in joined:
            new = max(new, ahead.pop(s))
    if ahead is not None and not ahead:
        del state.steps.ahead[key]
    if new <= have:
        return
    commits[task] = new
    if new == state.task_records(task, pass_id):
        state.full_commits[pass_id] = state.full_commits.get(pass_id, 0) + 1

"""Committed positions: which a trainer may commit (`commit_refused`), how they count, and the
job's data position at its last commits (what a data checkpoint holds).
"""

from __future__ import annotations

from chunkmaster.core import steps
from chunkmaster.core.master_state import COMMIT_PASSES, MasterState
from chunkmaster.core.model import Position


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
    if state.is_piece(pos.task_id):
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


def commit(state: MasterState, pos: Position) -> int:
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
    if state.is_piece(pos.task_id):
        return steps.commit_piece(state, pos.task_id, pos.pass_id, pos.records)
    old = state.commits.get(pos.pass_id, {}).get(pos.task_id, 0)
    if pos.records <= old:
        return 0
    for led in state.ledgers(pos.task_id, pos.pass_id):
        led.committed += pos.records - old
    steps.cover(state, pos.pass_id, pos.task_id, 0, pos.records)
    return 1


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


def committed_ranges(state: MasterState) -> tuple[tuple[int, int, int, int], ...]:
    """(pass, task, start, end) for each range of records committed beyond its task's prefix
    (a task split by equal steps, a later piece committed first), from the commit floor on,
    ascending and merged: a data checkpoint holds them beside the prefixes, or a restore would
    deliver them again."""
    out: list[tuple[int, int, int, int]] = []
    for (p, t), waiting in sorted(state.steps.ahead.items()):
        if p < state.commit_floor:
            continue
        merged: list[list[int]] = []
        for start, end in sorted(waiting.items()):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            elif end > start:
                merged.append([start, end])
        out.extend((p, t, start, end) for start, end in merged)
    return tuple(out)

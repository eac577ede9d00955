"""A pass's end and start: Todo and Pending both empty end it, the next one begins with the
tasks done and (with `retry`) those set aside, and the commits a data checkpoint holds for it.
A rollover moves each task once per pass (O(1) amortised per task).
"""

from __future__ import annotations

from collections import deque

from chunkmaster.core import quarantine, steps
from chunkmaster.core.master_state import COMMIT_PASSES, LEDGER_PASSES, MasterState
from chunkmaster.core.model import FailedPolicy


def start_pass(state: MasterState) -> None:
    """Apply the commits a data checkpoint holds for the pass just begun: wholly committed
    tasks are done, partly committed ones start where their commit ends, and those with
    committed ranges beyond their prefix (split by equal steps) are queued as the pieces
    between them."""
    commits = state.commits.get(state.cur_pass, {})
    split = steps.split_tasks(state)  # committed beyond their prefix: their gaps are queued
    if not commits and not split:
        return
    todo: deque[int] = deque()
    for task_id in state.todo:
        c = commits.get(task_id, 0)
        if c == state.task_records(task_id):
            state.done.append(task_id)
            continue
        if task_id in split:
            todo.extend(steps.queue_gaps(state, task_id, split[task_id]))
            continue
        if c:
            state.progress[task_id] = c
        todo.append(task_id)
    state.todo = todo
    if state.mix is not None:  # a weight change plans again only after the commits
        state.mix.reach(state.cur_pass, max([*commits, *split]))


def maybe_roll_over(state: MasterState) -> None:
    """A pass ends when Todo and Pending are both empty, however the last task left."""
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
        start_pass(state)
        close_committed_passes(state)
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


def close_committed_passes(state: MasterState) -> None:
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

"""A restore from a data checkpoint: every session ends, every queue is made again from the
checkpoint's position; a restart's trainers asking for the same restore restore it once. The
record ledger keeps what it cost: each pass's records reached beyond the checkpoint, which the
pass delivers again (`RecordCounts.rolled_back`).
"""

from __future__ import annotations

from chunkmaster.core import steps
from chunkmaster.core.events import Restore
from chunkmaster.core.master_state import InvalidEvent, MasterState
from chunkmaster.core.mixture_events import restore_plans
from chunkmaster.core.model import FailedPolicy, PassLedger, RecordCounts
from chunkmaster.core.passes import maybe_roll_over, start_pass


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


def restore(state: MasterState, ev: Restore) -> bool:
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
    kept = _forget_the_running_pass(state)
    rolled = {p: led for p, led in state.ledger.items() if p >= ev.floor}
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
        restore_plans(state.mix, ev.floor, ev.mixture.passes, ev.mixture.weights)
    _restore_commits(state, ev.commits)
    _restore_ranges(state, ev.ranges)
    _count_rollback(state, ev.floor, rolled)
    state.todo = state.pass_queue(
        None if not kept else (t for t in range(state.num_tasks) if t not in kept)
    )
    start_pass(state)
    maybe_roll_over(state)
    return True


def _forget_the_running_pass(state: MasterState) -> set[int]:
    """End every session, hand-out, finish, commit and stop of the running job; the tasks
    quarantined stay so under FailedPolicy.KEEP (returned: their IDs)."""
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
    return kept


def _restore_commits(state: MasterState, commits: tuple[tuple[int, int, int], ...]) -> None:
    """Each task's committed prefix in the checkpoint, counted as committed in its ledgers."""
    for pass_id, task_id, records in commits:
        state.commits.setdefault(pass_id, {})[task_id] = records
        if records == state.task_records(task_id, pass_id):
            state.full_commits[pass_id] = state.full_commits.get(pass_id, 0) + 1
        for led in state.ledgers(task_id, pass_id):
            led.committed += records


def _restore_ranges(state: MasterState, ranges: tuple[tuple[int, int, int, int], ...]) -> None:
    """Records committed beyond a task's prefix wait for the gaps before them again (the pass
    that has them queues the gaps as pieces: `start_pass`), and count as committed."""
    by_task: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for pass_id, task_id, start, end in ranges:
        by_task.setdefault((pass_id, task_id), []).append((start, end))
    for (pass_id, task_id), spans in by_task.items():
        state.commits.setdefault(pass_id, {})
        records = steps.restored_ranges(state, pass_id, task_id, spans)
        for led in state.ledgers(task_id, pass_id):
            led.committed += records


def _count_rollback(state: MasterState, floor: int, before: dict[int, PassLedger]) -> None:
    """What the restore cost (`before`: the ledgers of the passes from the floor on before it;
    the restored commits are counted now): the records the trainers had reached in those
    passes beyond the checkpoint's commits are delivered again. They count in the pass the job
    goes back to, the floor's, with what earlier restores rolled back in those passes
    (`rolled_back`; a later pass has no ledger until it starts again), and the checkpoint's
    commits are where each pass starts again (`restored`)."""
    total = sum(
        _reached_beyond(was, state.ledger.get(p)) + was.rolled_back for p, was in before.items()
    )
    if total:
        led = state.pass_ledger(floor)
        led.rolled_back = total
        for p, was in before.items():
            now = state.ledger.get(p)
            for s, counts in was.sources.items():
                more = _reached_beyond(counts, None if now is None else now.sources.get(s))
                if more + counts.rolled_back:
                    mine = led.sources.setdefault(s, RecordCounts())
                    mine.rolled_back += more + counts.rolled_back
    for p, led in state.ledger.items():
        if p >= floor:
            led.restored = led.committed
            for counts in led.sources.values():
                counts.restored = counts.committed


def _reached_beyond(was: RecordCounts, now: RecordCounts | None) -> int:
    """The records of a pass (or of a source in it) the trainers had reached, as `was`
    counted them (consumed beyond where the pass started: the previous restore's commits),
    that `now`, the checkpoint's commits, does not hold."""
    reached = max(was.consumed + was.restored, was.committed)
    return max(0, reached - (0 if now is None else now.committed))

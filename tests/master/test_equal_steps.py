"""Equal steps in the pure core: quotas, pieces, drop and pad, trainers lost, commits.

A fake dataset of one-record chunks; trainers are sessions driven by events. Each test
plays a pass the way trainers would: ask while allowed, finish what they hold.
"""

from __future__ import annotations

import random
from collections import Counter

import hypothesis.strategies as st
import pytest
from helpers.datasets import chunk_dataset
from hypothesis import given, settings

from chunkmaster.core.events import (
    Commit,
    Dispatch,
    EndSession,
    EqualSteps,
    Fail,
    Finish,
    OpenSession,
    Progress,
    Restore,
    ReturnTasks,
    SetDataset,
)
from chunkmaster.core.model import TRAINER_LOST_REASON, Position, Task
from chunkmaster.core.state import (
    Availability,
    MasterState,
    apply,
    check_get_task,
    committed_position,
    committed_ranges,
)
from chunkmaster.core.steps import StepsMode, contested, quota, split, world


def started(mode: str, chunks: list[int], cpt: int, trainers: int) -> MasterState:
    s = MasterState()
    apply(s, EqualSteps(mode))
    apply(s, SetDataset(chunk_dataset(chunks, cpt)))
    for i in range(trainers):
        apply(s, OpenSession(f"s{i}", f"t{i}", "h", i))
    return s


def records_of(task: Task) -> range:
    return range(task.start, task.num_records)


def play_pass(
    s: MasterState,
    rng: random.Random,
    kill: str | None = None,
    kill_after: int = 0,
    fail_rate: float = 0.0,
) -> dict[str, int]:
    """Trainers ask and finish in a random order until the pass ends; records per trainer."""
    pass_id = s.cur_pass
    got: Counter[str] = Counter()
    held: dict[str, list[Task]] = {sid: [] for sid in s.sessions}
    steps_taken = 0
    while s.cur_pass == pass_id:
        every_task_once(s)
        live = [sid for sid in held if sid in s.sessions]
        asking = [sid for sid in live if check_get_task(s, pass_id, sid) is Availability.DISPATCH]
        holding = [sid for sid in live if held[sid]]
        assert asking or holding, "a pass stalled"
        steps_taken += 1
        if kill is not None and steps_taken == kill_after and kill in s.sessions:
            # it consumed half of what it holds, reported
            pos = tuple(
                Position(t.meta.id, t.meta.epoch, pass_id, t.start + (t.num_records - t.start) // 2)
                for t in held[kill]
            )
            apply(s, Progress(pos))
            got[kill] += sum((t.num_records - t.start) // 2 for t in held[kill])
            apply(s, EndSession(kill, TRAINER_LOST_REASON))
            held[kill] = []
            continue
        if asking and (not holding or rng.random() < 0.5):
            sid = rng.choice(asking)
            task = apply(s, Dispatch(100.0, sid, "", sid))
            if task is None:  # a quota of 0: nothing for anyone, the records are dropped
                assert s.steps.target == 0
                continue
            assert isinstance(task, Task)
            held[sid].append(task)
        else:
            sid = rng.choice(holding)
            task = held[sid].pop(rng.randrange(len(held[sid])))
            if rng.random() < fail_rate:  # a read failure after a reported half
                half = task.start + (task.num_records - task.start) // 2
                apply(s, Progress((Position(task.meta.id, task.meta.epoch, pass_id, half),)))
                got[sid] += half - task.start
                assert apply(s, Fail(task.meta.id, task.meta.epoch, "bad chunk"))
                continue
            got[sid] += len(records_of(task))
            assert apply(s, Finish(task.meta.id, task.meta.epoch, pass_id))
    return {sid: got[sid] for sid in held}


def every_task_once(s: MasterState) -> None:
    """Each task is in exactly one queue, or split into pieces that are; the quota books agree."""
    n = s.num_tasks
    whole = [u for u in [*s.todo, *s.pending, *s.done, *s.failed] if u < n]
    pieces = [s.steps.pieces[u] for u in [*s.todo, *s.pending] if u >= n]
    split_tasks = {p.task for p in pieces if not p.pad}
    assert len(whole) == len(set(whole))
    assert not (set(whole) & split_tasks) or split_tasks & set(s.failed)
    assert set(whole) | set(s.steps.outstanding) == set(range(n))
    for task, live in s.steps.outstanding.items():
        assert live == sum(1 for p in pieces if p.task == task and not p.pad)
    if s.steps.fixed:
        assert s.steps.unassigned == sum(
            s.task_records(u) - s.progress.get(u, s.steps.pieces[u].start if u >= n else 0)
            for u in s.todo
        )


def test_quota_and_split() -> None:
    assert quota(10, 3, StepsMode.DROP) == 3
    assert quota(10, 3, StepsMode.PAD) == 4
    assert quota(9, 3, StepsMode.PAD) == 3
    assert quota(5, 0, StepsMode.DROP) == 0
    assert split(10, 3) == 3
    assert split(2, 3) == 2
    assert split(5, 0) == 0


@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_three_trainers_get_equal_records_every_pass(mode: str) -> None:
    chunks = [3, 5, 2, 7, 1, 4, 6, 2, 3]  # 33 records... plus one: 34, not divisible by 3
    chunks.append(1)
    s = started(mode, chunks, 2, 3)
    rng = random.Random(7)
    for p in range(3):
        got = play_pass(s, rng)
        assert len(set(got.values())) == 1, got
        per = next(iter(got.values()))
        assert per == (34 // 3 if mode == "drop" else -(-34 // 3))
        led = s.ledger[p]
        if mode == "drop":
            assert led.dropped == 34 % 3 and led.padded == 0
        else:
            assert led.padded == 3 * per - 34 and led.dropped == 0
        # few pieces: at most two a trainer a pass
        assert sum(1 for x in s.steps.pieces.values() if x.pass_id == p) <= 2 * 3 + 2
    assert s.cur_pass == 3 and not s.steps.outstanding


@settings(max_examples=80, deadline=None)
@given(
    chunks=st.lists(st.integers(0, 9), min_size=1, max_size=14),
    cpt=st.integers(1, 4),
    trainers=st.integers(1, 4),
    mode=st.sampled_from(["drop", "pad"]),
    seed=st.integers(0, 1000),
    kill_after=st.integers(0, 30),
)
def test_equal_counts_with_a_trainer_lost(
    chunks: list[int], cpt: int, trainers: int, mode: str, seed: int, kill_after: int
) -> None:
    """Whatever the dataset and whoever dies when, the survivors end each pass equal."""
    s = started(mode, chunks, cpt, trainers)
    s.failure_max = 1000
    rng = random.Random(seed)
    total = sum(chunks)
    kill = "s0" if trainers > 1 else None
    got = play_pass(s, rng, kill=kill, kill_after=kill_after, fail_rate=0.15)
    survivors = {sid: n for sid, n in got.items() if sid in s.sessions}
    assert len(set(survivors.values())) == 1, got
    # every pass ends; the next pass has every task again, whole
    assert sorted(list(s.todo) + s.done) == list(range(s.num_tasks))
    got2 = play_pass(s, rng)
    per = quota(total, len(s.sessions), StepsMode(mode))
    assert set(got2.values()) == {per}, got2


def test_a_piece_is_a_record_range_of_its_task() -> None:
    s = started("drop", [10], 1, 3)  # one task of 10 records, 3 trainers: 3 each
    a = apply(s, Dispatch(1.0, "s0", "", "s0"))
    assert isinstance(a, Task)
    assert a.meta.id >= s.num_tasks and (a.start, a.num_records) == (0, 3)
    b = apply(s, Dispatch(1.0, "s1", "", "s1"))
    c = apply(s, Dispatch(1.0, "s2", "", "s2"))
    assert isinstance(b, Task) and isinstance(c, Task)
    assert [(t.start, t.num_records) for t in (b, c)] == [(3, 6), (6, 9)]
    # every trainer has its quota: the last record is dropped, the others wait
    assert not s.todo and s.ledger[0].dropped == 1
    assert check_get_task(s, 0, "s0") is Availability.WAIT
    for t in (c, a, b):
        apply(s, Finish(t.meta.id, t.meta.epoch, 0))
    assert s.cur_pass == 1 and list(s.todo) == [0]


def test_commits_of_pieces_build_the_task_prefix_in_any_order() -> None:
    s = started("drop", [10], 1, 3)
    a, b, c = (apply(s, Dispatch(1.0, sid, "", sid)) for sid in ("s0", "s1", "s2"))
    assert isinstance(a, Task) and isinstance(b, Task) and isinstance(c, Task)
    # the later pieces commit first: the prefix waits for the first
    apply(s, Commit((Position(c.meta.id, c.meta.epoch, 0, 9),)))
    apply(s, Commit((Position(b.meta.id, b.meta.epoch, 0, 5),)))
    assert s.commits[0].get(0, 0) == 0
    apply(s, Commit((Position(a.meta.id, a.meta.epoch, 0, 3),)))
    assert s.commits[0][0] == 5
    apply(s, Commit((Position(b.meta.id, b.meta.epoch, 0, 6),)))
    assert s.commits[0][0] == 10  # the dropped record counts as needing no delivery
    assert s.ledger[0].committed == 9
    for t in (a, b, c):
        apply(s, Finish(t.meta.id, t.meta.epoch, 0))
    assert s.cur_pass == 1 and s.commit_floor == 1
    assert committed_position(s) == (1, ())


def test_a_joiner_waits_for_the_next_pass_and_a_failed_piece_comes_back() -> None:
    s = started("drop", [4, 4, 4], 1, 2)  # 12 records, 2 trainers: 6 each
    t0 = apply(s, Dispatch(1.0, "s0", "", "s0"))
    apply(s, OpenSession("late", "late", "h", 9))
    assert check_get_task(s, 0, "late") is Availability.WAIT
    t1 = apply(s, Dispatch(1.0, "s1", "", "s1"))
    p0 = apply(s, Dispatch(1.0, "s0", "", "s0"))  # 2 of the last task: a piece
    assert isinstance(t0, Task) and isinstance(t1, Task) and isinstance(p0, Task)
    assert p0.meta.id >= s.num_tasks and p0.num_records - p0.start == 2
    assert check_get_task(s, 0, "s0") is Availability.WAIT
    apply(s, Fail(p0.meta.id, p0.meta.epoch, "bad chunk"))  # back to Todo: s0 may take it
    assert check_get_task(s, 0, "s0") is Availability.DISPATCH
    again = apply(s, Dispatch(1.0, "s0", "", "s0"))  # the other piece, first in Todo
    assert isinstance(again, Task) and (again.start, again.num_records) == (2, 4)
    p1 = apply(s, Dispatch(1.0, "s1", "", "s1"))  # the failed piece, again
    assert isinstance(p1, Task) and p1.meta.id == p0.meta.id and p1.meta.epoch == 2
    for t in (t0, t1, again, p1):
        apply(s, Finish(t.meta.id, t.meta.epoch, 0))
    assert s.cur_pass == 1
    assert sorted(s.todo) == [0, 1, 2]
    assert check_get_task(s, 1, "late") is Availability.DISPATCH
    apply(s, Dispatch(1.0, "late", "", "late"))
    assert set(s.steps.members) == {"s0", "s1", "late"} and s.steps.target == 4


def test_unary_get_task_waits_under_equal_steps() -> None:
    s = started("pad", [4], 1, 1)
    assert check_get_task(s, 0, "") is Availability.WAIT
    assert check_get_task(s, 0, "s0") is Availability.DISPATCH


def test_a_task_read_to_its_end_and_handed_back_last_ends_the_pass() -> None:
    """Found by tests/master/test_state_events.py: every trainer has its quota, and the last
    task out comes back by ReturnTasks (the trainer stopped reading the pass) at its end. What
    is left is dropped; the pass must end there, not stall with Todo and Pending empty (where
    every GetTask would be answered "all tasks failed")."""
    s = started("drop", [2, 2], 1, 1)
    first = apply(s, Dispatch(100.0, "t0", "", "s0"))
    last = apply(s, Dispatch(100.0, "t0", "", "s0"))
    assert isinstance(first, Task) and isinstance(last, Task)
    assert apply(s, Finish(last.meta.id, last.meta.epoch, 0))
    assert apply(s, ReturnTasks("s0", (Position(first.meta.id, first.meta.epoch, 0, 2),))) == 1
    assert s.cur_pass == 1
    assert check_get_task(s, 1, "s0") is Availability.DISPATCH


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("stop_after", [2, 4])
@pytest.mark.parametrize("onto", ["fresh", "running", "off"])
def test_a_restore_in_the_middle_of_an_equal_steps_pass_delivers_the_rest_once(
    seed: int, stop_after: int, onto: str
) -> None:
    """Trainers commit what they finish; a data checkpoint is taken mid-pass, and a state
    restored from it (a fresh one, the running one, a fresh one without equal steps) delivers
    each record the checkpoint does not hold exactly once (the dropped remainder aside), with
    equal counts again. Pieces of a split task committed before those ahead of them are
    beyond its prefix: the checkpoint holds them too (`committed_ranges`), else they would be
    delivered again."""
    chunks = [3, 5, 2, 7, 1, 4, 6, 2, 3, 1]  # 34 records
    s = started("drop", chunks, 2, 3)
    rng = random.Random(seed)
    held: dict[str, list[Task]] = {sid: [] for sid in s.sessions}
    finishes = 0
    while finishes < stop_after and s.cur_pass == 0:
        sid = rng.choice(sorted(held))
        if check_get_task(s, 0, sid) is Availability.DISPATCH and rng.random() < 0.8:
            task = apply(s, Dispatch(1.0, sid, "", sid))
            assert isinstance(task, Task)
            held[sid].append(task)
        elif held[sid]:
            t = held[sid].pop(0)
            apply(s, Finish(t.meta.id, t.meta.epoch, 0))
            apply(s, Commit((Position(t.meta.id, t.meta.epoch, 0, t.num_records),)))
            finishes += 1
    floor, commits = committed_position(s)
    ranges = committed_ranges(s)
    assert floor == 0
    prefix = {(t, r) for p, t, n in commits if p == 0 for r in range(n)}
    prefix |= {(t, r) for p, t, a, b in ranges if p == 0 for r in range(a, b)}

    fresh = s if onto == "running" else MasterState()
    if onto != "running":
        apply(fresh, EqualSteps("off" if onto == "off" else "drop"))
        apply(fresh, SetDataset(s.dataset))  # type: ignore[arg-type]
    assert apply(fresh, Restore(floor, commits, "cp", onto, ranges=ranges))
    assert committed_ranges(fresh) == ranges
    # a restored position counts as committed, dropped records in it too (as prefixes did)
    assert fresh.ledger[0].committed == len(prefix)
    for i in range(3):
        apply(fresh, OpenSession(f"n{i}", f"n{i}", "h", i))
    delivered: Counter[tuple[int, int]] = Counter()
    got: Counter[str] = Counter()
    while fresh.cur_pass == 0:
        for sid in sorted(fresh.sessions):
            if check_get_task(fresh, 0, sid) is not Availability.DISPATCH:
                continue
            task = apply(fresh, Dispatch(1.0, sid, "", sid))
            if task is None:
                continue
            assert isinstance(task, Task)
            piece = fresh.steps.pieces.get(task.meta.id)
            tid = task.meta.id if piece is None else piece.task
            delivered.update((tid, r) for r in range(task.start, task.num_records))
            got[sid] += task.num_records - task.start
            apply(fresh, Finish(task.meta.id, task.meta.epoch, 0))
            if fresh.cur_pass:
                break
    assert all(n == 1 for n in delivered.values())
    assert not (set(delivered) & prefix)
    if onto != "off":
        assert len(set(got.values())) == 1, got
    assert len(prefix) + len(delivered) + fresh.ledger[0].dropped == sum(chunks)


def test_the_live_world_is_the_oldest_declaration_and_a_contradiction_is_contested() -> None:
    """The oldest live session sets the world size and holds its rank: a stray world size or
    a second session of a rank never takes the world over (the shell refuses them); once the
    old sessions end, a world of another size is the job's."""
    s = started("drop", [4, 4, 4, 4], 1, 0)
    apply(s, OpenSession("a0", "t", "h", 1, 0, "", 2, 0))
    apply(s, OpenSession("a1", "t", "h", 2, 0, "", 2, 1))
    apply(s, OpenSession("stray", "t", "h", 3, 0, "", 4, 0))
    apply(s, OpenSession("again", "t", "h", 4, 0, "", 2, 0))
    assert world(s) == (2, {0: "a0", 1: "a1"})
    assert contested(s, "stray") == ["a0", "a1"]
    assert contested(s, "again") == ["a0"]
    assert contested(s, "a0") == contested(s, "a1") == []
    assert check_get_task(s, 0, "stray") is check_get_task(s, 0, "again") is Availability.WAIT
    assert check_get_task(s, 0, "a0") is Availability.DISPATCH
    for sid in ("a0", "a1"):
        apply(s, EndSession(sid, "returned"))
    assert world(s) == (4, {0: "stray"})  # the old world ended: the next oldest declaration
    assert contested(s, "again") == ["stray"]


def drain(s: MasterState, commit: bool = True) -> None:
    """Every session reads the current pass to its end, committing each task it finishes (or
    not: `commit`)."""
    p = s.cur_pass
    while s.cur_pass == p:
        for sid in sorted(s.sessions):
            if s.cur_pass != p or check_get_task(s, p, sid) is not Availability.DISPATCH:
                continue
            t = apply(s, Dispatch(1.0, sid, "", sid))
            if t is None:
                continue
            if commit:
                apply(s, Commit((Position(t.meta.id, t.meta.epoch, p, t.num_records),)))
            apply(s, Finish(t.meta.id, t.meta.epoch, p))


def test_ranges_committed_far_behind_are_kept_while_the_floor_is_there() -> None:
    """Hostile review (issue 29): one task of 10 records split among 3 trainers; the last two
    pieces are committed, the first never is (its trainer lost without a restart), so the floor
    stays at pass 0 while 17 more passes go by. Every checkpoint keeps pass 0's prefix (none)
    and its committed ranges: they were pruned with the pieces 16 passes later, and a restore
    delivered the 7 committed records again."""
    s = started("drop", [1] * 10, 10, 3)
    a, b, c = (apply(s, Dispatch(1.0, sid, "", sid)) for sid in ("s0", "s1", "s2"))
    for t in (b, c):
        apply(s, Commit((Position(t.meta.id, t.meta.epoch, 0, t.num_records),)))
    for t in (a, b, c):
        apply(s, Finish(t.meta.id, t.meta.epoch, 0))
    ranges = committed_ranges(s)
    assert [(p, t) for p, t, _, _ in ranges] == [(0, 0)]
    for _ in range(17):
        drain(s)
    assert s.cur_pass == 18 and s.commit_floor == 0
    assert committed_ranges(s)[: len(ranges)] == ranges


def test_a_mixture_checkpoint_holds_the_plan_of_a_pass_with_only_ranges() -> None:
    """Hostile review (issue 29): in a mixture with equal steps (drop), pass 0 read and not
    committed yet (the floor stays there), pass 1 begun: the records its split tasks drop are
    ranges beyond their prefixes, and pass 1 has no prefix commit. The checkpoint's mixture
    position must hold pass 1's plan, or encoding it fails ("pass 1 has commits and no
    plan"): `Loader.state_dict()` raised."""
    from helpers.datasets import chunk_dataset as chunks_of

    from chunkmaster.core.dataset import Dataset
    from chunkmaster.core.state import mixture_position

    mixed = Dataset.mix([("a", chunks_of([1] * 10, 5), 0.5), ("b", chunks_of([1] * 5, 5), 0.5)])
    s = MasterState()
    apply(s, EqualSteps("drop"))
    apply(s, SetDataset(mixed))
    for i in range(2):
        apply(s, OpenSession(f"s{i}", f"t{i}", "h", i, world_size=2, rank=i))
    drain(s, commit=False)
    for _ in range(2):
        for sid in ("s0", "s1"):
            if check_get_task(s, 1, sid) is Availability.DISPATCH:
                apply(s, Dispatch(1.0, sid, "", sid))
    ranges = committed_ranges(s)
    assert s.commit_floor == 0 and 1 in {p for p, _, _, _ in ranges} and not s.commits.get(1)
    mix = mixture_position(s)
    assert mix is not None and 1 in dict(mix.passes)

"""The core's commits and restores, driven by random trainer schedules (pure: no I/O).

Trainers with sessions take tasks, consume records one by one, report progress, finish and
commit in random orders across pass boundaries; then everything "crashes": a fresh state
restores from the committed position. The records delivered from there must be exactly the
dataset minus the records the trainers committed, each once, and the pass after is whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis.strategies as st
from helpers.datasets import chunk_dataset
from hypothesis import given, settings

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import (
    Commit,
    Dispatch,
    EndSession,
    Finish,
    OpenSession,
    Progress,
    Restore,
    ReturnTasks,
    SetDataset,
)
from chunkmaster.core.model import RETURNED_REASON, TRAINER_LOST_REASON, Position, Task
from chunkmaster.core.state import (
    Availability,
    MasterState,
    apply,
    check_get_task,
    commit_refused,
    committed_position,
)

Record = tuple[int, int, int]  # (pass, task, record index in the task)


@dataclass
class Held:
    task: Task
    pos: int  # records of the task consumed (from its first record)


@dataclass
class Trainer:
    sid: str
    held: list[Held] = field(default_factory=list)
    uncommitted: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    consumed_uncommitted: list[Record] = field(default_factory=list)

    def positions(self) -> list[Position]:
        return [
            Position(h.task.meta.id, h.task.meta.epoch, h.task.pass_id, h.pos) for h in self.held
        ]


class Job:
    def __init__(self, ds: Dataset, trainers: int) -> None:
        self.ds = ds
        self.state = MasterState()
        apply(self.state, SetDataset(ds))
        self.trainers = [Trainer(f"s{i}") for i in range(trainers)]
        for t in self.trainers:
            apply(self.state, OpenSession(t.sid, t.sid, "h", 1))
        self.committed: set[Record] = set()
        self.delivered: list[Record] = []

    def total(self, task_id: int) -> int:
        return self.ds.task_records[task_id]

    def get(self, tr: Trainer) -> None:
        st_ = self.state
        try:
            avail = check_get_task(st_, st_.cur_pass)
        except Exception:
            return
        if avail is not Availability.DISPATCH:
            return
        task = apply(st_, Dispatch(0.0, tr.sid, "", tr.sid))
        assert isinstance(task, Task)
        tr.held.append(Held(task, task.start))

    def consume(self, tr: Trainer, n: int) -> None:
        if not tr.held:
            return
        h = tr.held[0]
        for _ in range(n):
            if h.pos == self.total(h.task.meta.id):
                return
            rec = (h.task.pass_id, h.task.meta.id, h.pos)
            self.delivered.append(rec)
            tr.consumed_uncommitted.append(rec)
            h.pos += 1
            key = (h.task.pass_id, h.task.meta.id)
            tr.uncommitted[key] = (h.task.meta.epoch, h.pos)

    def progress(self, tr: Trainer) -> None:
        apply(self.state, Progress(tuple(tr.positions())))

    def finish(self, tr: Trainer) -> None:
        if tr.held and tr.held[0].pos == self.total(tr.held[0].task.meta.id):
            h = tr.held.pop(0)
            apply(self.state, Finish(h.task.meta.id, h.task.meta.epoch, h.task.pass_id))

    def hand_back(self, tr: Trainer) -> None:
        """The trainer stops reading (a `break`): its tasks go back at their positions; what
        it consumed of them stays owed to its next commit."""
        if tr.held:
            apply(self.state, ReturnTasks(tr.sid, tuple(tr.positions())))
            tr.held.clear()

    def lost_mid_task(self, tr: Trainer) -> list[Position]:
        """The trainer reads two records of a task, reports them, and is lost (its session
        ended): the positions it would still commit."""
        self.get(tr)
        self.consume(tr, 2)
        self.progress(tr)
        stale = tr.positions()
        apply(self.state, EndSession(tr.sid, TRAINER_LOST_REASON))
        return stale

    def commit(self, tr: Trainer) -> None:
        ps = tuple(Position(t, e, p, r) for (p, t), (e, r) in sorted(tr.uncommitted.items()))
        for pos in ps:  # nothing stale: no trainer is ever lost here
            assert commit_refused(self.state, pos) is None, pos
        apply(self.state, Commit(ps))
        self.committed.update(tr.consumed_uncommitted)
        tr.uncommitted.clear()
        tr.consumed_uncommitted.clear()


@settings(max_examples=300, deadline=None)
@given(
    chunk_records=st.lists(st.integers(0, 4), min_size=1, max_size=8),
    cpt=st.integers(1, 3),
    trainers=st.integers(1, 3),
    steps=st.lists(
        st.tuples(st.sampled_from("gcpfkb"), st.integers(0, 2), st.integers(1, 3)), max_size=120
    ),
)
def test_restore_delivers_exactly_what_was_not_committed(
    chunk_records: list[int], cpt: int, trainers: int, steps: list[tuple[str, int, int]]
) -> None:
    ds = chunk_dataset(chunk_records, cpt)
    job = Job(ds, trainers)
    for op, who, n in steps:
        tr = job.trainers[who % trainers]
        if op == "g":
            job.get(tr)
        elif op == "c":
            job.consume(tr, n)
        elif op == "p":
            job.progress(tr)
        elif op == "f":
            job.finish(tr)
        elif op == "b":
            job.hand_back(tr)
        else:
            job.commit(tr)

    # Everything crashes; a fresh master restores the committed position.
    floor, commits = committed_position(job.state)
    assert floor <= job.state.cur_pass
    fresh = Job(ds, 1)
    apply(fresh.state, Restore(floor, commits))
    assert fresh.state.cur_pass >= floor
    runner = fresh.trainers[0]
    end_pass = job.state.cur_pass + 2
    while fresh.state.cur_pass < end_pass and fresh.state.todo:
        fresh.get(runner)
        fresh.consume(runner, 10**6)
        fresh.finish(runner)
    for p in range(floor, end_pass):
        wanted = {(p, t, i) for t in range(ds.num_tasks) for i in range(ds.task_records[t])} - {
            r for r in job.committed if r[0] == p
        }
        got = [r for r in fresh.delivered if r[0] == p]
        assert len(got) == len(set(got)), f"pass {p}: a record delivered twice"
        assert set(got) == wanted, f"pass {p}: delivered != dataset - committed"


def small_job(trainers: int = 2) -> Job:
    return Job(chunk_dataset([5, 5, 5], 1), trainers)


def test_a_lost_trainers_tasks_go_back_first_at_their_reported_position() -> None:
    job = small_job()
    a, b = job.trainers
    job.get(a)
    job.get(a)
    job.consume(a, 3)
    job.progress(a)
    job.consume(a, 1)  # consumed but never reported: delivered again
    first = a.held[0].task.meta.id
    assert apply(job.state, EndSession(a.sid, TRAINER_LOST_REASON)) == 2
    assert a.sid not in job.state.sessions
    assert job.state.num_failures == {}  # not the tasks' fault
    job.get(b)
    assert (b.held[0].task.meta.id, b.held[0].task.start) == (first, 3)
    led = job.state.ledger[0]
    assert led.redispatched == {TRAINER_LOST_REASON: (5 - 3) + 5}
    assert led.consumed == 3


def test_goodbye_hands_tasks_back_at_the_exact_position_and_counts_no_redispatch() -> None:
    job = small_job()
    a, b = job.trainers
    job.get(a)
    job.consume(a, 4)
    apply(job.state, EndSession(a.sid, RETURNED_REASON, tuple(a.positions())))
    job.get(b)
    assert b.held[0].task.start == 4
    assert job.state.ledger[0].redispatched == {}


def test_a_commit_for_a_task_now_held_by_another_trainer_is_refused() -> None:
    job = small_job()
    a, b = job.trainers
    stale = job.lost_mid_task(a)
    job.get(b)
    assert apply(job.state, Commit(tuple(stale))) == 0
    assert job.state.commits.get(0, {}) == {}


def test_a_commit_for_a_task_taken_from_its_trainer_is_refused_once_its_pass_is_over() -> None:
    """Issue 19: the task was finished by its new holder (not pending any more), its pass is
    over and even wholly committed by the others: the lost trainer's commit is refused all
    the same, naming the task."""
    from chunkmaster.core.state import commit_refused

    job = small_job()
    a, b = job.trainers
    stale = job.lost_mid_task(a)
    a.held.clear()
    for _ in range(3):
        job.get(b)
        job.consume(b, 5)
        job.finish(b)
    assert job.state.cur_pass == 1 and 0 not in job.state.pending
    for pos in stale:
        assert "was taken from this trainer" in str(commit_refused(job.state, pos))
    job.commit(b)
    assert committed_position(job.state) == (1, ())  # pass 0 wholly committed
    for pos in stale:
        why = commit_refused(job.state, pos)
        assert why is not None and f"task {pos.task_id} (epoch {pos.epoch}) was taken" in why
    assert apply(job.state, Commit(tuple(stale))) == 0


def test_a_task_handed_back_is_committed_by_its_holder_up_to_where_it_handed_it_back() -> None:
    """Issue 27, 2: a trainer that leaves its loop (a `break`) hands its tasks back at the
    records it took; its next commit covers them, also once the task went on with another
    trainer. Past that position, or from another trainer, the commit is refused."""
    from chunkmaster.master.owners import commit_position_refused

    job = small_job()
    a, b = job.trainers
    job.get(a)
    job.consume(a, 3)
    task = a.held[0].task
    job.hand_back(a)
    job.get(b)
    assert b.held[0].task.start == 3
    job.consume(b, 1)
    job.commit(b)  # b commits [0, 4): its dispatch started at 3
    at = Position(task.meta.id, task.meta.epoch, 0, 3)
    assert commit_refused(job.state, at) is None
    assert commit_position_refused(job.state, at, a.sid, None) is None
    assert "another trainer" in str(commit_position_refused(job.state, at, b.sid, None))
    beyond = Position(task.meta.id, task.meta.epoch, 0, 4)
    assert "handed back at record 3" in str(commit_refused(job.state, beyond))
    job.commit(a)
    assert job.state.commits[0] == {task.meta.id: 4}


def test_the_floor_moves_once_every_task_of_a_pass_is_committed() -> None:
    job = small_job(1)
    (a,) = job.trainers
    for _ in range(3):
        job.get(a)
        job.consume(a, 5)
        job.finish(a)
    assert job.state.cur_pass == 1
    assert committed_position(job.state) == (0, ())
    job.commit(a)
    assert committed_position(job.state) == (1, ())
    assert job.state.commits == {}

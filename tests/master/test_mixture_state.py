"""A mixture job in the core state machine (core/state.py with core/mixture.py): each pass is
planned units, consumed records follow the weights, each source epoch is delivered exactly once,
through weight changes, failures, lost trainers and a restore from a data checkpoint."""

from __future__ import annotations

from collections import defaultdict

import hypothesis.strategies as st
import pytest
from helpers.mixtures import check_ledger_sums, check_source_epochs, windows
from helpers.state_dump import dump
from hypothesis import given, settings

from chunkmaster.core.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import (
    AddSources,
    Commit,
    Configure,
    Dispatch,
    EndSession,
    EqualSteps,
    Event,
    Fail,
    Finish,
    OpenSession,
    Progress,
    Restore,
    SetDataset,
    SetWeights,
)
from chunkmaster.core.mixture import Breakpoint, Weights
from chunkmaster.core.model import FailedPolicy, Position
from chunkmaster.core.state import (
    Availability,
    InvalidEvent,
    MasterState,
    apply,
    check_get_task,
    committed_position,
    mixture_position,
)


def source(name: str, sizes: list[int]) -> Dataset:
    return Dataset.build([f"/{name}/*"], [f"/{name}/f"], [(list(range(len(sizes))), sizes)], 1)


def mixture(parts: list[tuple[str, list[int], float]], seed: int | None = None) -> Dataset:
    return Dataset.mix([(n, source(n, sizes), w) for n, sizes, w in parts]).with_shuffle(seed)


def three(seed: int | None = 5) -> Dataset:
    """Sources of very different sizes: a large web source of small tasks, a middling code
    source, a small books source of large tasks that repeats its epochs."""
    return mixture(
        [
            ("web", [10 + t % 41 for t in range(2000)], 0.7),
            ("code", [20 + t % 21 for t in range(150)], 0.2),
            ("books", [100] * 7, 0.1),
        ],
        seed,
    )


class Run:
    """A state driven by events, remembering each pass's last plan and what was finished."""

    def __init__(self, ds: Dataset, state: MasterState | None = None) -> None:
        self.ds = ds
        self.state = state or MasterState()
        self.plans: dict[int, list[int]] = {}
        self.finished: dict[tuple[int, int], int] = defaultdict(int)  # (pass, unit) -> count
        self.consumed: list[tuple[int, int]] = []  # (source, records) in the order consumed
        #: (pass, source) -> records handed out / finished (consumed), as the ledger counts them
        self.handed: dict[tuple[int, int], int] = defaultdict(int)
        self.done: dict[tuple[int, int], int] = defaultdict(int)
        if self.state.dataset is None:
            self.do(SetDataset(ds))

    def do(self, ev: Event) -> object:
        """Apply `ev`; note the current pass's plan when it may have changed."""
        st = self.state
        out = apply(st, ev)
        if st.mix is not None and (
            st.cur_pass not in self.plans or isinstance(ev, SetWeights | Restore | AddSources)
        ):
            self.plans[st.cur_pass] = list(st.mix.plan(st.cur_pass))
        return out

    def take(self, session: str = "") -> int | None:
        st = self.state
        if check_get_task(st, st.cur_pass, session) is not Availability.DISPATCH:
            return None
        task = self.do(Dispatch(100.0, "w", "", session))
        assert task is not None and not isinstance(task, bool | int)
        assert st.dataset is not None and st.mix is not None
        assert task.source == st.mix.names[st.dataset.source_of(st.unit_task(task.meta.id))]
        unit = int(task.meta.id)
        self.handed[(st.cur_pass, st.unit_source(unit))] += task.num_records - task.start
        return unit

    def finish(self, unit: int) -> None:
        st = self.state
        p, pass_id = st.pending[unit], st.cur_pass
        source = st.unit_source(unit)
        left = st.task_records(unit) - st.progress.get(unit, p.start)
        assert self.do(Finish(unit, p.epoch, pass_id)) is True
        self.finished[(pass_id, unit)] += 1
        self.consumed.append((source, left))
        self.done[(pass_id, source)] += left

    def step(self, kind: str, x: int) -> None:
        """One of the ops both property tests draw that do not depend on the sources: take
        (D), finish (F) or fail (X) a unit, lose (E) or open (O) the session "s"."""
        st = self.state
        if kind == "D":
            self.take("s" if x % 2 else "")
        elif kind == "F" and st.pending:
            self.finish(sorted(st.pending)[x % len(st.pending)])
        elif kind == "X" and st.pending:
            unit = sorted(st.pending)[x % len(st.pending)]
            self.do(Fail(unit, st.pending[unit].epoch, "bad"))
        elif kind == "E":
            self.do(EndSession("s", "trainer lost", (), x % 2 == 0))
        elif kind == "O" and "s" not in st.sessions:
            self.do(OpenSession("s", "t", "h", 1))

    def check_ledger(self) -> None:
        """Each pass's ledger, source by source, holds what was handed out and finished in
        it, and the sources' counts add up to the pass's."""
        check_ledger_sums(self.state.ledger)
        for p, led in self.state.ledger.items():
            for s, c in led.sources.items():
                assert (c.dispatched, c.consumed) == (self.handed[(p, s)], self.done[(p, s)])
            assert {s for s, c in led.sources.items() if c.dispatched} == {
                s for q, s in self.handed if q == p
            }


def test_consumed_records_follow_the_weights_across_passes() -> None:
    """0.7/0.2/0.1 over sources of 2,000, 150 and 7 tasks of 10 to 100 records: every window of
    10,000 consumed records after the first is within one percentage point of the weights,
    across pass boundaries; the small sources repeat their epochs while the large one streams."""
    run = Run(three())
    while run.state.cur_pass < 4:
        unit = run.take()
        assert unit is not None
        run.finish(unit)
    shares = windows(run.consumed, 3)
    assert len(shares) > 1000
    for got in shares:
        for g, want in zip(got, (0.7, 0.2, 0.1), strict=True):
            assert abs(g - want) <= 0.01
    epochs = check_source_epochs(run.ds, run.plans)
    assert epochs[2] > epochs[1] > epochs[0]  # books repeats most, web streams on


def test_a_pass_is_as_many_units_as_the_sources_have_tasks_in_the_plans_order() -> None:
    ds = three(seed=None)
    run = Run(ds)
    st = run.state
    assert st.num_tasks == ds.num_tasks == 2157
    order = [run.take() for _ in range(10)]
    assert order == list(range(10))  # the plan's order is the hand-out order
    assert run.plans[0] != sorted(run.plans[0])  # the plan blends the sources
    seeded = Run(three(seed=9))
    assert seeded.plans[0] != run.plans[0]  # a seed draws each source epoch's order


def test_a_single_list_of_patterns_is_no_mixture() -> None:
    plain = Dataset.build(["/d/*"], ["/d/f"], [(list(range(6)), [3] * 6)], 2)
    st = MasterState()
    apply(st, SetDataset(plain))
    assert st.mix is None and list(st.todo) == [0, 1, 2]
    task = apply(st, Dispatch(1.0))
    assert task.source == "" and task.format == "recordio"  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from("DDDFFFXWEO"), st.integers(0, 99)), max_size=400),
)
def test_weight_changes_failures_and_lost_trainers_lose_and_repeat_nothing(
    ops: list[tuple[str, int]],
) -> None:
    """Whatever happens (weight changes mid-pass, failures, trainers lost holding tasks), each
    unit of a pass is finished once, and each source's tasks across the plans are whole epochs:
    a re-plan hands no task out twice in an epoch and skips none."""
    ds = mixture(
        [("a", [1 + t % 5 for t in range(13)], 1), ("b", [7] * 4, 1), ("c", [2] * 9, 2)], 3
    )
    run = Run(ds)
    st_ = run.state
    st_.failure_max = 100
    apply(st_, OpenSession("s", "t", "h", 1))
    for kind, x in ops:
        if kind == "W":
            w = (x % 4, 1 + x % 3, x % 5)
            run.do(SetWeights(Weights.fixed(w if sum(w) else (1, 1, 1))))
        else:
            run.step(kind, x)
    assert max(run.finished.values(), default=1) == 1
    for p in range(st_.cur_pass):
        assert {u for q, u in run.finished if q == p} == set(range(ds.num_tasks))
    check_source_epochs(ds, run.plans)
    run.check_ledger()


def test_a_weight_change_takes_effect_after_the_last_unit_handed_out() -> None:
    ds = mixture([("a", [10] * 100, 1), ("b", [10] * 100, 1)])
    run = Run(ds)
    for _ in range(30):
        unit = run.take()
        assert unit is not None
        run.finish(unit)
    held = run.take()
    assert held == 30
    before = list(run.plans[0])
    at = run.do(SetWeights(Weights.fixed([9, 1])))
    after = run.plans[0]
    assert at == 31 * 10  # records planned before the first unit planned again
    assert after[:31] == before[:31]  # nothing handed out is touched
    tail = [ds.source_of(t) for t in after[31:]]
    assert abs(tail[:100].count(0) / 100 - 0.9) <= 0.02
    check_source_epochs(ds, run.plans)


def test_a_schedule_changes_the_weights_by_records_planned() -> None:
    ds = mixture([("a", [10] * 200, 1), ("b", [10] * 200, 1)])
    schedule = Weights((Breakpoint(0, (1.0, 0.0)), Breakpoint(1000, (0.0, 1.0))))
    run = Run(ds)
    run.do(SetWeights(schedule))
    sources = [ds.source_of(t) for t in run.plans[0]]
    assert sources == [0] * 100 + [1] * 300  # b then starts its second epoch; a has none


def run_committing(run: Run, units: int, holes: set[int]) -> None:
    """Hand out and finish `units` units, committing each one whole except `holes` (units of
    the current pass left uncommitted)."""
    st = run.state
    for _ in range(units):
        unit = run.take("s")
        assert unit is not None
        p, pass_id = st.pending[unit], st.cur_pass
        pos = Position(unit, p.epoch, pass_id, st.task_records(unit))
        run.finish(unit)
        if unit not in holes:
            run.do(Commit((pos,)))


@pytest.mark.parametrize("reweigh", [False, True])
def test_a_restore_continues_each_source_exactly_where_it_was_committed(reweigh: bool) -> None:
    """A fresh state restored from a mixture's data checkpoint plans its passes as they were;
    with new weights after the restore, only what follows the last commit is planned again.
    Committed before plus delivered after is every unit once, and whole source epochs."""
    ds = three()
    live = Run(ds)
    apply(live.state, OpenSession("s", "t", "h", 1))
    n = ds.num_tasks
    live.do(SetWeights(Weights.fixed([1, 1, 1])))
    run_committing(live, n + 400, holes={5, n // 2})
    # pass 0 has two holes: the floor stays there, pass 1 has commits up to unit 399
    floor, commits = committed_position(live.state)
    position = mixture_position(live.state)
    assert floor == 0 and position is not None and [p for p, _ in position.passes] == [0, 1]

    fresh = Run(ds)
    fresh.do(Restore(floor, commits, "ckpt", "", position))
    assert fresh.plans[0] == live.plans[0]
    assert sorted(fresh.state.todo) == [5, n // 2]
    if reweigh:
        at = fresh.do(SetWeights(Weights.fixed([0.7, 0.2, 0.1])))
        assert isinstance(at, int) and at > 0
    apply(fresh.state, OpenSession("s", "t", "h", 1))
    while fresh.state.cur_pass < 3:
        unit = fresh.take("s")
        assert unit is not None
        fresh.finish(unit)
    committed = {(p, t) for p, t, _ in commits}
    for p in (0, 1, 2):
        delivered = {u for q, u in fresh.finished if q == p}
        assert delivered.isdisjoint({u for q, u in committed if q == p})
        assert delivered | {u for q, u in committed if q == p} == set(range(n))
    assert fresh.plans[1][:400] == live.plans[1][:400]
    if not reweigh:
        assert fresh.plans[1] == live.plans[1]
    check_source_epochs(ds, fresh.plans)
    check_ledger_sums(fresh.state.ledger)
    for p in (0, 1):  # the restored commits count for the sources they are of
        want: dict[int, int] = defaultdict(int)
        for q, t, r in commits:
            if q == p:
                want[ds.source_of(fresh.plans[p][t])] += r
        got = {s: c.committed for s, c in fresh.state.ledger[p].sources.items() if c.committed}
        assert got == want


def test_a_restore_onto_the_pass_just_planned_keeps_its_plan_and_changes_nothing_else() -> None:
    """Restoring onto a fresh job, whose pass 0 setting the dataset just planned from the same
    start and weights, keeps that plan instead of planning a million units again: the state
    is byte for byte the one a restore that plans the pass again gives."""
    from chunkmaster.core.codec import encode_snapshot

    ds = three()
    live = Run(ds)
    apply(live.state, OpenSession("s", "t", "h", 1))
    run_committing(live, 300, holes={7})
    floor, commits = committed_position(live.state)
    position = mixture_position(live.state)
    assert floor == 0 and position is not None
    kept, planned = Run(ds), Run(ds)
    assert kept.state.mix is not None and planned.state.mix is not None
    units = kept.state.mix.passes[0].units
    planned.state.mix.passes[0].units = None  # as if it were not planned: plan it again
    for run in (kept, planned):
        run.do(Restore(floor, commits, "ckpt", "", position))
    assert kept.state.mix.passes[0].units is units  # the same plan, not planned again
    assert encode_snapshot(kept.state) == encode_snapshot(planned.state)
    assert kept.plans[0] == live.plans[0]


def test_keep_is_refused_on_a_mixture_at_start() -> None:
    from chunkmaster.core.mixture import MixtureError
    from chunkmaster.core.model import FailedPolicy
    from chunkmaster.core.reconcile import Limits, reconcile

    st = MasterState()
    apply(st, SetDataset(three()))
    with pytest.raises(MixtureError, match="--failed-policy keep does not apply to a mixture"):
        reconcile(st, Limits(failed_policy=FailedPolicy.KEEP, shuffle_seed=5))
    assert reconcile(st, Limits(shuffle_seed=5)) == []


def test_a_pass_of_a_mixture_counts_its_planned_records() -> None:
    ds = three()
    run = Run(ds)
    mix = run.state.mix
    assert mix is not None
    assert mix.records == sum(ds.task_records[t] for t in run.plans[0])
    run.do(SetWeights(Weights.fixed([1, 1, 1])))
    assert mix.records == sum(ds.task_records[t] for t in run.plans[0])


# ---- sources added to a running job ----------------------------------------------------------


def replayed(journal: list[Event]) -> MasterState:
    """A fresh state given the same events through the journal's bytes (a standby, a restart)."""
    state = MasterState()
    for ev in journal:
        apply(state, decode_event(encode_event(ev)))
    return state


class Journaled(Run):
    """A Run that keeps its events, to replay them."""

    def __init__(self, ds: Dataset) -> None:
        self.journal: list[Event] = []
        super().__init__(ds)

    def do(self, ev: Event) -> object:
        self.journal.append(ev)
        return super().do(ev)


def test_a_source_added_mid_pass_takes_effect_after_the_last_unit_handed_out() -> None:
    """A source added mid-pass (with new weights naming it) changes no unit handed out; the
    units from the first nobody had are planned again with it in, at its weight; the pass
    keeps its N units, and so do the next; the new source starts at its epoch 0 and every
    source's tasks across the plans are whole epochs. A standby replaying the journal, and a
    snapshot, give the same state and plan the same units."""
    ds = mixture([("a", [10] * 100, 1), ("b", [10] * 100, 1)], seed=4)
    run = Journaled(ds)
    for _ in range(30):
        unit = run.take()
        assert unit is not None
        run.finish(unit)
    assert run.take() == 30  # held: the change comes after it
    before = list(run.plans[0])
    added = mixture([("c", [10] * 60, 1)])
    at = run.do(AddSources(added, Weights.fixed([1, 1, 2])))
    st_ = run.state
    grown = st_.dataset
    assert grown is not None and st_.mix is not None
    assert at == 31 * 10  # records planned before the first unit planned again
    after = run.plans[0]
    assert after[:31] == before[:31] and len(after) == st_.num_tasks == 200
    assert [s.name for s in grown.sources] == ["a", "b", "c"] and grown.num_tasks == 260
    c = [t for t in after[31:] if grown.source_of(t) == 2]
    assert abs(len(c) / len(after[31:]) - 0.5) <= 0.02
    assert st_.mix.epoch(0, 2) == 0
    run.finish(30)
    while st_.cur_pass < 3:
        unit = run.take()
        assert unit is not None
        run.finish(unit)
    for p in range(3):
        assert {u for q, u in run.finished if q == p} == set(range(200))
    assert max(run.finished.values()) == 1
    epochs = check_source_epochs(grown, run.plans)
    assert epochs[2] >= 2  # c went through whole epochs of its own, from its first
    late = [grown.source_of(t) for t in run.plans[2]]
    assert abs(late.count(2) / len(late) - 0.5) <= 0.02
    run.check_ledger()
    assert st_.ledger[0].sources[2].consumed > 0  # the added source delivered in its pass
    standby = replayed(run.journal)
    assert dump(standby) == dump(st_)
    assert dump(decode_snapshot(encode_snapshot(st_))) == dump(st_)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from("DDDFFFXWEOA"), st.integers(0, 99)), max_size=400),
)
def test_sources_added_with_failures_and_lost_trainers_lose_and_repeat_nothing(
    ops: list[tuple[str, int]],
) -> None:
    """Sources added at any point (and weight changes, failures, trainers lost holding tasks):
    each unit of a pass is finished once, every pass keeps its units, each source's tasks
    across the plans are whole epochs, and a replay of the journal is the same state."""
    ds = mixture([("a", [1 + t % 5 for t in range(13)], 1), ("b", [7] * 4, 1)], 3)
    run = Journaled(ds)
    st_ = run.state
    run.do(Configure(100, FailedPolicy.RETRY))
    run.do(OpenSession("s", "t", "h", 1))
    for kind, x in ops:
        n = len(st_.dataset.sources) if st_.dataset is not None else 0
        if kind == "W":
            w = [(x + i) % 4 for i in range(n)]
            run.do(SetWeights(Weights.fixed(w if sum(w) else [1] * n)))
        elif kind == "A":
            if n < 5:
                name = "abcde"[n]
                added = mixture([(name, [1 + (t * x) % 9 for t in range(1 + x % 11)], 1)])
                w = [1 + (x + i) % 3 for i in range(n + 1)]
                run.do(AddSources(added, Weights.fixed(w)))
        else:
            run.step(kind, x)
    assert max(run.finished.values(), default=1) == 1
    for p in range(st_.cur_pass):
        assert {u for q, u in run.finished if q == p} == set(range(ds.num_tasks))
    assert st_.dataset is not None
    check_source_epochs(st_.dataset, run.plans)
    run.check_ledger()
    assert dump(replayed(run.journal)) == dump(st_)
    assert dump(decode_snapshot(encode_snapshot(st_))) == dump(st_)


def test_a_restore_of_fewer_sources_continues_them_and_starts_the_added_one_at_epoch_0() -> None:
    """A data checkpoint of web, code and books restored onto the job that had "extra" added
    since (the Restore RPC on the running job, or `master --restore` and then the add): the
    floor pass is planned as the checkpoint recorded it (extra at weight 0), and new weights
    naming extra plan the units after the last commit again with it in. Committed before plus
    delivered after is every unit once; every source's tasks are whole epochs, extra's from
    its first; a snapshot and a replay agree."""
    ds = three()
    live = Journaled(ds)
    live.do(OpenSession("s", "t", "h", 1))
    n = ds.num_tasks
    run_committing(live, n + 400, holes={5, n // 2})
    floor, commits = committed_position(live.state)
    position = mixture_position(live.state)
    assert floor == 0 and position is not None and [p for p, _ in position.passes] == [0, 1]

    live.do(AddSources(mixture([("extra", [30] * 40, 1.0)]), Weights.fixed([1, 1, 1, 1])))
    live.do(Restore(floor, commits, "ckpt", "k", position))
    st_ = live.state
    four = st_.dataset
    assert four is not None and st_.mix is not None and st_.num_tasks == n
    assert st_.mix.plan(0).tolist() == list(mixture_plan(ds, position, 0))
    assert st_.mix.weights.at(0)[3] == 0  # the checkpoint's weights, extra at 0
    live.plans = {0: list(st_.mix.plan(0))}
    live.finished.clear()
    live.do(SetWeights(Weights.fixed([0.4, 0.2, 0.1, 0.3])))
    live.do(OpenSession("s", "t", "h", 1))
    while st_.cur_pass < 3:
        unit = live.take("s")
        assert unit is not None
        live.finish(unit)
    committed = {(p, t) for p, t, _ in commits}
    for p in (0, 1, 2):
        delivered = {u for q, u in live.finished if q == p}
        mine = {u for q, u in committed if q == p}
        assert delivered.isdisjoint(mine) and delivered | mine == set(range(n))
    epochs = check_source_epochs(four, live.plans)
    assert epochs[3] >= 1
    records = four.task_records
    extra = sum(records[t] for t in live.plans[2] if four.source_of(t) == 3)
    assert abs(extra / sum(records[t] for t in live.plans[2]) - 0.3) <= 0.01  # by records
    check_ledger_sums(st_.ledger)
    assert st_.ledger[2].sources[3].consumed == extra
    assert dump(decode_snapshot(encode_snapshot(st_))) == dump(st_)
    assert dump(replayed(live.journal)) == dump(st_)


def mixture_plan(ds: Dataset, position: object, pass_id: int) -> list[int]:
    """Pass `pass_id` as a data checkpoint's position recorded it, on `ds`."""
    from chunkmaster.core.events import MixturePosition
    from chunkmaster.core.mixture import MixtureState

    assert isinstance(position, MixturePosition)
    return list(MixtureState.of(ds).compute(dict(position.passes)[pass_id])[0])


def check_equal_steps(st_: MasterState, unequal: bool) -> None:
    """The two promises test_state_events.py checks after every event: the pass can end (Todo
    and Pending never both empty while Done or Failed hold units: RETRY), and no trainer of
    the pass has more than its quota (all have it exactly once Todo is empty, unless a
    quarantine took records out of the pass: `unequal`)."""
    if not st_.todo and not st_.pending:
        assert not st_.done and not st_.failed, "the pass can never end"
    steps = st_.steps
    if steps.fixed:
        assert all(got <= steps.target for got in steps.members.values()), steps
        if not st_.todo and not unequal:
            assert all(got == steps.target for got in steps.members.values()), steps


@pytest.mark.parametrize("read", [None, 0, 2], ids=["no failure", "failed unread", "failed read"])
def test_a_weight_change_with_equal_steps_keeps_the_quotas_and_the_pass_ends(
    read: int | None,
) -> None:
    """Found by tests/master/test_state_events.py: equal steps (drop) on a mixture of a
    retired source and another, two trainers, the first takes a unit (2 records) and it fails
    at once (failure_max 0: quarantined, unread or read to its end) or not at all, then the
    weights retire the other source. The re-plan makes the pass's last unit a 1-record one:
    the pass must still end (it stalled, its unit dropped with nothing to roll the pass over),
    no trainer may be left over its quota (the first had 2 of a quota now of 1), the pass ends
    with every trainer equal, and a replay and a snapshot give the same state."""
    ds = mixture([("a", [1], 0.0), ("b", [2], 0.5)])
    run = Journaled(ds)
    st_ = run.state
    run.do(Configure(0, FailedPolicy.RETRY))
    run.do(EqualSteps("drop"))
    for sid in ("s0", "s1"):
        run.do(OpenSession(sid, "t", "h", 1))
    unit = run.take("s0")
    assert unit == 0 and st_.steps.members == {"s0": 2, "s1": 0}
    if read is not None:
        epoch = st_.pending[unit].epoch
        if read:
            run.do(Progress((Position(unit, epoch, 0, read),), 0.0))
        run.do(Fail(unit, epoch, "bad"))
        assert st_.failed == [unit]
    unequal = bool(st_.ledger[0].quarantined)
    check_equal_steps(st_, unequal)
    plan = list(run.plans[0])
    effect = run.do(SetWeights(Weights.fixed([0.5, 0.0])))
    check_equal_steps(st_, unequal)
    if read == 0:  # 1 record for 2 trainers: a quota of 0, the unit dropped, the pass over
        assert effect == 2 and st_.cur_pass == 1 and st_.ledger[0].dropped == 1
        assert run.plans[1] == [0, 0]  # the next pass under the new weights
    else:  # a quota of 1 would leave s0 over it: the weights take effect at the next pass
        assert effect == 4 and st_.cur_pass == 0 and run.plans[0] == plan == [1, 1]
        assert st_.steps.target == 2 and st_.mix is not None and st_.mix.weights.at(0)[0] == 1
    assert dump(replayed(run.journal)) == dump(st_)
    assert dump(decode_snapshot(encode_snapshot(st_))) == dump(st_)
    while st_.cur_pass == 0:  # the trainers read on: the pass ends, each with its quota
        took = [u for u in (run.take(sid) for sid in ("s0", "s1")) if u is not None]
        for u in [*st_.pending]:
            run.finish(u)
        check_equal_steps(st_, unequal)
        assert took or st_.cur_pass == 1, "nothing to hand out, and the pass goes on"
    assert dump(replayed(run.journal)) == dump(st_)
    assert dump(decode_snapshot(encode_snapshot(st_))) == dump(st_)


def test_weights_the_planner_cannot_use_are_refused_by_the_core_changing_nothing() -> None:
    """The shell checks first; the core too, before it changes anything: a SetDataset whose
    weights overflow (1e308 three times) left the dataset set and no task. The core holds
    weights to what the planner can use only (a journal an older build wrote replays); the
    shell's bounds are stricter (test_mixture_bounds.py)."""
    state = MasterState()
    overflow = mixture([(n, [5] * 4, 1e308) for n in ("a", "b", "c")])
    with pytest.raises(InvalidEvent, match="add up to more than a float holds"):
        apply(state, SetDataset(overflow))
    assert state.dataset is None and state.mix is None and not state.todo
    apply(state, SetDataset(mixture([(n, [5] * 4, 1) for n in ("a", "b", "c")])))
    before = dump(state)
    for bad in ([1e308] * 3, [1, -1, 1], [0, 0, 0], [1, 1]):
        with pytest.raises(InvalidEvent):
            apply(state, SetWeights(Weights.fixed(bad)))
        assert dump(state) == before
    assert len(state.todo) == 12
    # weights an older build took (a share under set_weights' 1e-12) still apply on replay
    apply(state, SetWeights(Weights.fixed([1, 1e-13, 1])))
    assert state.mix is not None and state.mix.weights.points[0].weights[1] == 1e-13

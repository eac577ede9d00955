"""A mixture's events on the master's state (core/mixture.py plans, docs/mixtures.md): weights
changed and sources added mid-pass plan the units nobody had again; a data checkpoint holds
and restores the plans. A pass is planned once, when it begins (O(log sources) a unit).
"""

from __future__ import annotations

from chunkmaster.core import steps
from chunkmaster.core.commits import committed_position, committed_ranges
from chunkmaster.core.events import AddSources, MixturePosition
from chunkmaster.core.master_state import InvalidEvent, MasterState
from chunkmaster.core.mixture import (
    MixtureError,
    MixtureState,
    PassPlan,
    Weights,
    copy_cursors,
    widen_plan,
)
from chunkmaster.core.passes import maybe_roll_over


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


def set_weights(state: MasterState, weights: Weights) -> int:
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
    if last != state.cur_pass:  # units with ranges committed beyond their prefix count too
        ahead = (t for p, t in state.steps.ahead if p == last)
        at = 1 + max([*state.commits.get(last, {}), *ahead], default=-1)
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
    maybe_roll_over(state)  # the quotas shared again may drop what is left in Todo
    return effect


def add_sources(state: MasterState, ev: AddSources) -> int:
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
    return set_weights(state, ev.weights)


def _records_from(state: MasterState, at: int) -> int:
    """Records of the current pass's units from `at` on."""
    records = state.dataset.task_records if state.dataset is not None else ()
    assert state.mix is not None
    plan = state.mix.plan(state.cur_pass)
    return sum(records[plan[u]] for u in range(at, len(plan)))


def mixture_position(state: MasterState) -> MixturePosition | None:
    """What a mixture's data checkpoint holds beside `committed_position`: the plans of the
    passes from the floor to the last with commits (prefixes or ranges beyond them), and the
    weights in force (None: the job is not a mixture)."""
    if state.mix is None:
        return None
    floor, commits = committed_position(state)
    ranges = committed_ranges(state)  # a pass may have ranges and no prefix commit yet
    last = max([floor, *(p for p, _, _ in commits), *(p for p, _, _, _ in ranges)])
    plans = state.mix.passes
    return MixturePosition(
        tuple(
            (p, PassPlan(plans[p].start, plans[p].weights, plans[p].replans))
            for p in range(floor, last + 1)
        ),
        state.mix.weights,
    )


def restore_plans(
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

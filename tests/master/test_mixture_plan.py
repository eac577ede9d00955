"""The mixture planner (core/mixture.py): shares by records, source epochs, weight changes."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkmaster.core.mixture import (
    Breakpoint,
    Cursor,
    MixtureError,
    Planner,
    Weights,
    name_problem,
)

WINDOW = 10_000


def window_shares(planner: Planner, units: list, sources: int) -> list[list[float]]:
    """Each source's share of the records in every window of WINDOW records (sliding by a
    unit), after the first WINDOW records."""
    sizes = [planner.task_records[u.source][u.task] for u in units]
    out = []
    lo = 0
    acc = [0] * sources
    total = 0
    for hi, (u, r) in enumerate(zip(units, sizes, strict=True)):
        acc[u.source] += r
        total += r
        while total - sizes[lo] >= WINDOW:
            acc[units[lo].source] -= sizes[lo]
            total -= sizes[lo]
            lo += 1
        if total >= WINDOW and sum(sizes[:hi]) >= 2 * WINDOW:
            out.append([a / total for a in acc])
    return out


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.integers(1, 20), min_size=2, max_size=6),
    tasks=st.lists(st.integers(1, 300), min_size=6, max_size=6),
    sizes=st.integers(1, 40),
    seed=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)
def test_every_window_of_ten_thousand_records_follows_the_weights(
    weights: list[int], tasks: list[int], sizes: int, seed: int | None
) -> None:
    """Over any 10,000 planned records after the first, each source's share is within one
    percentage point of its weight, for sources of very different sizes (a small one repeats
    its epochs) and tasks of different sizes (up to 40 records)."""
    n = len(weights)
    task_records = [[1 + (t * 7 + s) % sizes for t in range(tasks[s])] for s in range(n)]
    planner = Planner(task_records, [f"s{s}" for s in range(n)], seed)
    cursors = [Cursor() for _ in range(n)]
    units = planner.plan(cursors, Weights.fixed(weights).check(planner.names), 3000)
    target = [w / sum(weights) for w in weights]
    for shares in window_shares(planner, units, n):
        for got, want in zip(shares, target, strict=True):
            assert abs(got - want) <= 0.01


def test_each_source_epoch_holds_every_task_of_the_source_once() -> None:
    task_records = [[3] * 5, [4] * 50, [2] * 7]
    planner = Planner(task_records, ["small", "big", "tiny"], seed=7)
    cursors = [Cursor() for _ in range(3)]
    units = planner.plan(cursors, Weights.fixed([0.5, 0.3, 0.2]).check(planner.names), 400)
    for s in range(3):
        epochs: dict[int, list[int]] = {}
        for u in units:
            if u.source == s:
                epochs.setdefault(u.epoch, []).append(u.task)
        complete = [e for e in epochs if len(epochs[e]) == len(task_records[s])]
        assert complete, f"source {s} finished no epoch"
        for e in complete:
            assert sorted(epochs[e]) == list(range(len(task_records[s])))
        # reshuffled per epoch under the seed
        if len(complete) > 1:
            assert epochs[complete[0]] != epochs[complete[1]]
    assert cursors[0].epoch > cursors[1].epoch  # the small source repeats, the big one streams


def test_the_plan_depends_on_its_inputs_only() -> None:
    """A master plans a pass in one call at its start (and the rest of it in one call after a
    weight change), from journaled cursors: the same inputs give the same units, on a replay,
    a standby or after a restore."""
    task_records = [[1 + t % 9 for t in range(40)], [1 + t % 4 for t in range(13)]]
    weights = Weights((Breakpoint(0, (1.0, 1.0)), Breakpoint(500, (3.0, 1.0))), "linear")

    def plan() -> list:
        cursors = [Cursor(), Cursor()]
        planner = Planner(task_records, ["a", "b"], 3)
        return planner.plan(cursors, weights, 100) + planner.plan(cursors, weights, 500)

    assert plan() == plan()
    other = Planner(task_records, ["a", "b"], 4).plan([Cursor(), Cursor()], weights, 600)
    assert other != plan()  # another seed, another order


def test_a_weight_change_takes_effect_where_it_is_scheduled_and_nothing_is_lost() -> None:
    task_records = [[10] * 30, [10] * 30]
    weights = Weights((Breakpoint(0, (1.0, 1.0)), Breakpoint(5000, (9.0, 1.0))))
    planner = Planner(task_records, ["a", "b"])
    cursors = [Cursor(), Cursor()]
    units = planner.plan(cursors, weights, 2000)
    before = Counter(u.source for u in units[:500])
    after = Counter(u.source for u in units[500:])
    assert before == {0: 250, 1: 250}
    assert abs(after[0] / (len(units) - 500) - 0.9) < 0.01
    per_epoch = Counter((u.source, u.epoch, u.task) for u in units)
    assert max(per_epoch.values()) == 1  # within a source epoch, no task twice


def test_a_zero_weight_retires_a_source_and_bad_weights_are_refused() -> None:
    planner = Planner([[5] * 4, [5] * 4], ["a", "b"])
    units = planner.plan([Cursor(), Cursor()], Weights.fixed([1, 0]).check(["a", "b"]), 20)
    assert {u.source for u in units} == {0}
    for bad, why in [
        (Weights.fixed([0, 0]), "all zero"),
        (Weights.fixed([1, -1]), "source 'b' has weight -1.0 at record 0: a weight is 0 or"),
        (Weights.fixed([1]), "for 2 source"),
        (Weights((Breakpoint(5, (1, 1)),)), "starts at record 0"),
        (Weights.fixed([1, 1]).__class__((Breakpoint(0, (1, 1)),), "cubic"), "neither"),
    ]:
        with pytest.raises(MixtureError, match=why):
            bad.check(["a", "b"])


@pytest.mark.parametrize(
    ("weights", "why"),
    [
        # each finite, yet their sum overflows to inf: normalised, every weight was 0
        ([1e308, 1e308, 1e308], "source 'a' has weight 1e+308 at record 0: a weight is 0 or a"),
        ([math.inf, 1, 1], "source 'a' has weight inf"),
        ([1, math.nan, 1], "source 'b' has weight nan"),
        ([5e-324, 5e-324, 0], "source 'a' has weight 5e-324"),  # subnormal: a sum of 1e-323
        # above 0, yet a share of the sum that rounds to 0: never planned
        ([1e300, 1e-300, 1], "source 'b' has weight 1e-300 at record 0, 0 of their sum"),
        ([1, 1e-13, 0], "source 'b' has weight 1e-13 at record 0, 1e-13 of their sum"),
    ],
)
def test_weights_the_planner_cannot_use_are_refused_naming_the_source(
    weights: list[float], why: str
) -> None:
    with pytest.raises(MixtureError, match=re.escape(why)):
        Weights.fixed(weights).check(["a", "b", "c"])
    schedule = Weights((Breakpoint(0, (1.0, 1.0, 1.0)), Breakpoint(10, tuple(weights))))
    with pytest.raises(MixtureError, match="at record 10"):
        schedule.check(["a", "b", "c"])


def test_weights_at_their_bounds_plan_every_source() -> None:
    planner = Planner([[5] * 4] * 3, ["a", "b", "c"])
    for weights in ([1e300, 1e300, 1e300], [1e-300, 1e-300, 1e-300], [1, 2e-12, 0]):
        units = planner.plan(
            [Cursor() for _ in range(3)], Weights.fixed(weights).check(planner.names), 12
        )
        assert {u.source for u in units} >= {s for s, w in enumerate(weights) if w >= 1e-3}
    for name in ["😀" * 255, "é" * 255, "web text"]:
        assert name_problem(name) is None
    assert "256 characters long" in (name_problem("😀" * 256) or "")
    assert "1 to 255 characters" in (name_problem("") or "")
    for name, code, at in [
        ("x\x1b[31m", "U+001B", 2),
        ("ab\n", "U+000A", 3),
        ("\u2028", "U+2028", 1),
        ("a\u202eb", "U+202E", 2),
        ("a\u200bb", "U+200B", 2),
    ]:
        assert f"holds {code} " in (name_problem(name) or "")
        assert f"at character {at}:" in (name_problem(name) or "")

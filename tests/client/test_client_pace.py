"""A Client sizes its task requests by itself (client/pace.py): enough tasks in hand to cover a
round trip to the master at the pace it reads them, within a cap; few when tasks are slow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

from chunkmaster.client import Client
from chunkmaster.client.pace import MAX_HELD, Pace


def _held_by(status: dict[str, Any], session: str | None) -> int:
    return next(t["tasks_held"] for t in status["trainers"] if t["session"] == session)


def test_a_trainer_of_many_small_tasks_holds_enough_to_cover_a_round_trip(tmp_path: Path) -> None:
    """Before: the default Client held 2 tasks (1 + prefetch_tasks) whatever their pace, so
    a trainer of one-record tasks waited a round trip every other task (0.17x the raw batch
    client's rate, bench/session_bench.py --only client). The master's status shows how many
    it holds."""
    tasks = 3000
    path = numbered_records(tmp_path / "small.rio", tasks)
    with InProcessMaster(chunks_per_task=1, timeout_dur=600.0) as m, Client(m.addr) as c:
        c.set_dataset([path])
        most = 0
        seen = 0
        for _ in c.records(0):
            seen += 1
            if seen % 200 == 0:
                most = max(most, _held_by(c.status(), c.session_id))
    assert seen == tasks
    assert most > 4, f"held at most {most} tasks"


def _settle(pace: Pace) -> int:
    """The slots once the doubling from one request to the next has caught up."""
    return [pace.slots() for _ in range(10)][-1]


def test_the_pace_grows_the_request_with_the_task_rate_and_shrinks_it_when_tasks_are_slow() -> None:
    pace = Pace(2)
    assert pace.slots() == 2  # nothing known yet: the minimum
    for _ in range(2000):  # 100 us a task, 3 ms round trips: 30 tasks go by in a round trip
        pace.task_took(0.0001)
        pace.answered(0.003, asked=8, got=8)
    assert [pace.slots() for _ in range(3)] == [4, 8, 16]  # twice the request before, at most
    fast = _settle(pace)
    assert 2 * 30 <= fast <= MAX_HELD  # the half left when it asks covers a round trip
    pace.task_took(0.05)
    pace.task_took(0.05)  # the trainer slows down: 50 ms a task
    assert pace.slots() == 2  # a round trip is a fraction of one task: the minimum, at once


def test_a_burst_of_tasks_done_together_does_not_pass_for_a_fast_trainer() -> None:
    """A shuffle buffer hands out the last records of many tasks at once: 30 tasks done in a
    moment, then 120 ms until the next 30. Its pace is 4 ms a task, not microseconds."""
    pace = Pace(2)
    for _ in range(3):
        for _ in range(29):
            pace.task_took(0.000_01)
        pace.task_took(0.12)
        pace.answered(0.006, asked=1, got=1)
    assert pace.task_seconds is not None and 0.003 < pace.task_seconds < 0.005
    assert _settle(pace) <= 10


def test_the_pace_never_holds_more_than_its_cap_nor_long_round_trips_of_work() -> None:
    pace = Pace(2)
    for _ in range(200):  # a slow master (200 ms) and tasks of 1 ms: 600 would be needed
        pace.task_took(0.001)
        pace.answered(0.2, asked=4, got=4)
    assert _settle(pace) == MAX_HELD
    for _ in range(30):  # tasks of 100 ms: what it holds beyond the minimum lasts < 1 s
        pace.task_took(0.1)
        pace.answered(5.0, asked=1, got=1)  # a stalled master counts as MAX_ROUND_TRIP
    assert (pace.slots() - 2) * 0.1 < 1.0


def test_the_pace_keeps_the_minimum_given_and_ignores_long_polls() -> None:
    pace = Pace(16)  # prefetch_tasks=15: at least 16 held
    for _ in range(30):
        pace.task_took(0.5)
        pace.answered(0.003, asked=8, got=8)
    assert _settle(pace) == 16
    slow_master = Pace(2)
    for _ in range(2000):
        slow_master.task_took(0.0001)
        slow_master.answered(0.001, asked=8, got=8)
    before = _settle(slow_master)
    slow_master.answered(2.0, asked=8, got=1)  # a long poll that waited for a task
    assert slow_master.slots() == before
    with pytest.raises(ValueError, match="at least one task"):
        Pace(0)


def test_an_explicit_prefetch_fixes_what_is_held() -> None:
    fixed = Pace(3, cap=3)  # Reading(prefetch_tasks=2)
    for _ in range(2000):
        fixed.task_took(0.0001)
        fixed.answered(0.01, asked=1, got=1)
    assert _settle(fixed) == 3

"""Tasks read together and mixed (client/interleave.py): each task's records in its own order,
each once, its position one integer at every moment; tasks drawn in proportion to what they
have left. Pure: runs are lists, no files."""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chunkmaster.client.errors import TaskReadError
from chunkmaster.client.interleave import Drawn, Failed, Interleave
from chunkmaster.core.model import Chunk, Task, TaskMeta


def _task(key: int, runs: list[int], start: int = 0) -> Task:
    chunks = tuple(Chunk(f"f{key}", i, n) for i, n in enumerate(runs))
    return Task(TaskMeta(key, 0), chunks, start=start)


def _runs(key: int, sizes: list[int], start: int, fail_at: int | None = None) -> Any:
    """(first, records, count) runs of records (key, position), from `start`."""
    first = 0
    for i, n in enumerate(sizes):
        if fail_at == i:
            raise TaskReadError(_task(key, sizes), Chunk(f"f{key}", i, n), OSError("gone"))
        lo = max(first, start)
        if lo < first + n:
            yield lo, iter([(key, p) for p in range(lo, first + n)]), first + n - lo
        first += n


def _drain(mix: Interleave) -> Iterator[Drawn | Failed]:
    while (drawn := mix.draw()) is not None:
        yield drawn


@settings(max_examples=200, deadline=None)
@given(
    tasks=st.lists(
        st.tuples(st.lists(st.integers(0, 30), max_size=5), st.integers(0, 60)),
        min_size=1,
        max_size=6,
    ),
    seed=st.integers(0, 100),
)
def test_each_task_is_read_in_its_order_once_its_positions_exact(
    tasks: list[tuple[list[int], int]], seed: int
) -> None:
    mix = Interleave(random.Random(seed), run=3)
    for key, (sizes, start) in enumerate(tasks):
        mix.add(key, _task(key, sizes, start), _runs(key, sizes, start))
    seen: dict[int, list[int]] = {k: [] for k in range(len(tasks))}
    for drawn in _drain(mix):
        assert isinstance(drawn, Drawn)
        assert 1 <= len(drawn.records) <= 3
        positions = [p for k, p in drawn.records if k == drawn.key]
        assert len(positions) == len(drawn.records)  # one task's records only
        assert positions[0] == drawn.first
        seen[drawn.key].extend(positions)
    for key, (sizes, start) in enumerate(tasks):
        assert seen[key] == list(range(min(start, sum(sizes)), sum(sizes)))
    assert mix.left == 0 and not len(mix)


def test_tasks_are_mixed_in_proportion_to_what_they_have_left() -> None:
    mix = Interleave(random.Random(1), run=1)
    mix.add(0, _task(0, [3000]), _runs(0, [3000], 0))
    mix.add(1, _task(1, [1000]), _runs(1, [1000], 0))
    keys = [d.key for d in _drain(mix) if isinstance(d, Drawn)]
    assert 650 < keys[:1000].count(0) < 850  # 3 to 1 while both have records
    switches = sum(a != b for a, b in pairwise(keys))
    assert switches > 500  # mixed record by record, not task after task


def test_a_task_that_cannot_be_read_on_fails_at_its_position_and_the_others_go_on() -> None:
    mix = Interleave(random.Random(3), run=2)
    mix.add(0, _task(0, [4, 4]), _runs(0, [4, 4], 0, fail_at=1))
    mix.add(1, _task(1, [5]), _runs(1, [5], 0))
    out = list(_drain(mix))
    failed = [d for d in out if isinstance(d, Failed)]
    assert len(failed) == 1 and failed[0].key == 0 and failed[0].at == 4
    got = [p for d in out if isinstance(d, Drawn) for _, p in d.records if d.key == 1]
    assert got == [0, 1, 2, 3, 4]

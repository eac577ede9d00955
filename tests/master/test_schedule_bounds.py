"""What a weight schedule may cost the master, over real gRPC (docs/limits.md, "Mixtures";
docs/mixtures.md, "Bounds"): a schedule of more points than MAX_SCHEDULE_POINTS, or more
weights (points x sources) than MAX_SCHEDULE_CELLS, whether sent or made by adding sources to
a long schedule in force, and a change that would leave the job keeping more than
MAX_HELD_POINTS points of schedules, are refused in one line naming the figures and the
limit, with nothing changed: the schedule in status is as it was and trainers read on. A
schedule at the limits works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

from chunkmaster import Client, Source
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import InvalidArgumentError
from chunkmaster.core.mixture import (
    MAX_HELD_POINTS,
    MAX_SCHEDULE_CELLS,
    MAX_SCHEDULE_POINTS,
)

RECORDS = 3  # a source's one-record tasks


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return [numbered_records(tmp_path / f"s{i}.rio", RECORDS, b"s%d-%%d" % i) for i in range(26)]


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster(chunks_per_task=1) as m:
        yield m


def schedule(names: list[str], points: int) -> list[tuple[int, dict[str, float]]]:
    """`points` breakpoints, one every 10 records, each source's weight from 1 to 7."""
    return [(k * 10, {n: 1.0 + (k + j) % 7 for j, n in enumerate(names)}) for k in range(points)]


def mixture_view(m: InProcessMaster) -> dict[str, Any]:
    st = m.status()
    mix = st["mixture"]
    return {
        "pass": st["cur_pass"],
        "mode": mix["mode"],
        "schedule": mix["schedule"],
        "sources": [(s["name"], s["target"], s["tasks"]) for s in mix["sources"]],
    }


def read_pass(addr: str, pass_id: int) -> list[bytes]:
    with Client(addr) as client:
        return sorted(client.records(pass_id))


def test_points_and_weights_over_the_bounds_are_refused_and_a_schedule_at_them_works(
    master: InProcessMaster, files: list[str]
) -> None:
    """25 sources: 1,001 points refused; 1,000 points (25,000 weights, both limits) set;
    then a 26th source added with that schedule in force (26,000 weights) refused, before
    any file is read: nothing added, the schedule as it was."""
    names = [f"s{i}" for i in range(25)]
    assert MAX_SCHEDULE_POINTS * len(names) == MAX_SCHEDULE_CELLS
    with Client(master.addr) as client:
        client.set_dataset({n: Source(files[i]) for i, n in enumerate(names)})
        before = mixture_view(master)
        with pytest.raises(InvalidArgumentError) as info:
            client.set_weights(schedule(names, MAX_SCHEDULE_POINTS + 1), "linear")
        assert str(info.value).count("\n") == 0
        assert "a weight schedule of 1,001 points, over the 1,000 a schedule may hold" in str(
            info.value
        )
        assert mixture_view(master) == before
        change = client.set_weights(schedule(names, MAX_SCHEDULE_POINTS), "linear")
        assert change.pass_id == 0
        at_limit = mixture_view(master)
        assert at_limit["mode"] == "linear" and at_limit != before
        with pytest.raises(InvalidArgumentError) as info:
            client.add_sources({"s25": Source(files[25])})
        assert str(info.value).count("\n") == 0
        assert (
            "a weight schedule of 1,000 points for 26 sources is 26,000 weights, over the "
            "25,000 a schedule may hold (points x sources)" in str(info.value)
        )
        assert mixture_view(master) == at_limit
    got = read_pass(master.addr, 0)
    assert len(got) == 25 * RECORDS and {r.split(b"-")[0] for r in got} <= {
        n.encode() for n in names
    }


def test_schedules_kept_over_the_bound_are_refused(
    master: InProcessMaster, files: list[str]
) -> None:
    """Each change at another unit of the pass keeps the schedule before it in the pass's
    plan (its re-plans): three full schedules in one pass would keep 4,001 points."""
    names = ["s0", "s1", "s2"]
    with Client(master.addr) as client, MasterConnection(master.addr) as conn:
        client.set_dataset({n: Source(files[i]) for i, n in enumerate(names)})
        client.set_weights(schedule(names, MAX_SCHEDULE_POINTS))  # at unit 0
        task = conn.get_task(0)
        client.set_weights(schedule(names, MAX_SCHEDULE_POINTS))  # at unit 1: keeps the first
        before = mixture_view(master)
        conn.get_task(0)
        with pytest.raises(InvalidArgumentError) as info:
            client.set_weights(schedule(names, MAX_SCHEDULE_POINTS))
        assert str(info.value).count("\n") == 0
        why = f"the job would keep {MAX_HELD_POINTS + 1:,} points of weight schedules"
        assert why in str(info.value), info.value
        assert mixture_view(master) == before
        assert conn.task_finished(task.meta.id, epoch=task.meta.epoch, pass_id=0)
        client.set_weights(schedule(names, 2))  # a short one is taken

"""A data checkpoint of a task split by equal steps and committed out of order (issue 29).

With equal steps a task is handed out in pieces, and a piece committed before the pieces ahead
of it waits beyond the task's committed prefix. A data checkpoint taken then must keep that
range: restored (onto the running job, or a fresh master), the pass delivers every record it
does not hold exactly once, and none of the range again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.service import started_service

from chunkmaster.core.checkpoint import decode
from chunkmaster.core.errors import NoMoreAvailableError, PassAfterError
from chunkmaster.core.events import Finish
from chunkmaster.core.model import Position, Task
from chunkmaster.core.steps import StepsMode
from chunkmaster.master.service import Service

RECORDS = 15  # one record a chunk, 5 chunks a task: 3 tasks of 5
TRAINERS = ("s0", "s1")


def record_of(svc: Service, task: Task, at: int) -> int:
    """The dataset's record (its number) at position `at` of the task or piece `task`."""
    st = svc.ledger.state
    unit = st.unit_of(task.meta.id)
    return 5 * unit + at


async def open_trainers(svc: Service) -> list[str]:
    """Two trainers, ranks 0 and 1: their sessions."""
    return [
        await svc.open_session("", name, "h", i, 0, world_size=2, rank=i)
        for i, name in enumerate(TRAINERS)
    ]


async def split_and_commit_out_of_order(svc: Service) -> tuple[set[int], bytes]:
    """Two trainers, 7 records each: s0 gets task 0 and records [0, 2) of task 2, s1 task 1
    and [2, 4) of task 2 (record 4 is dropped). Everything but s0's piece is committed; the
    data checkpoint is taken then. Returns the records it holds as needing no delivery in the
    pass (committed or dropped), and it."""
    sessions = await open_trainers(svc)
    held: dict[str, list[Task]] = {sid: [] for sid in sessions}
    for _ in range(2):
        for sid in sessions:
            held[sid].append(await svc.get_task(0, session=sid))
    a = held[sessions[0]][1]
    b = held[sessions[1]][1]
    assert (a.start, a.num_records, b.start, b.num_records) == (0, 2, 2, 4)
    committed = set()
    for sid, tasks in held.items():
        done = [t for t in tasks if t is not a]
        await svc.checkpoints.commit(
            [Position(t.meta.id, t.meta.epoch, 0, t.num_records) for t in done], sid
        )
        await svc.reports.finish([Finish(t.meta.id, t.meta.epoch, 0) for t in done], session=sid)
        committed |= {record_of(svc, t, r) for t in done for r in range(t.start, t.num_records)}
    assert committed == set(range(10)) | {12, 13}
    assert svc.ledger.state.ledger[0].dropped == 1  # record 14: not delivered in the pass
    return committed | {14}, await svc.data_checkpoint()


async def drain(svc: Service) -> Counter[int]:
    """Two new trainers read pass 0 to its end: each record they are handed, counted."""
    sessions = await open_trainers(svc)
    delivered: Counter[int] = Counter()
    while svc.ledger.state.cur_pass == 0:
        for sid in sessions:
            if svc.ledger.state.cur_pass:
                break
            try:
                t = await svc.get_task(0, session=sid)
            except (NoMoreAvailableError, PassAfterError):
                continue
            delivered.update(record_of(svc, t, r) for r in range(t.start, t.num_records))
            await svc.reports.finish([Finish(t.meta.id, t.meta.epoch, 0)], session=sid)
    return delivered


def check_rest_once(committed: set[int], delivered: Counter[int], dropped: int) -> None:
    assert not set(delivered) & committed, f"committed records delivered again: {delivered}"
    assert all(n == 1 for n in delivered.values()), delivered
    assert len(committed) + len(delivered) + dropped == RECORDS, (committed, delivered)


@pytest.mark.parametrize("onto", ["running", "fresh", "fresh-off"])
def test_a_split_task_committed_out_of_order_is_not_delivered_again(
    tmp_path: Path, onto: str
) -> None:
    """Onto the running job, a fresh master, and a fresh master without equal steps (the
    gaps are pieces there too: pieces work whatever the mode)."""
    data = numbered_records(tmp_path / "d.rio", RECORDS)

    async def main() -> None:
        kw = {"chunks_per_task": 5, "equal_steps": StepsMode.DROP, "timeout_dur": 60.0}
        async with started_service(data=[data], **kw) as svc:
            committed, blob = await split_and_commit_out_of_order(svc)
            cp = decode(blob)
            assert cp.passes[0].partial.get(2, 0) == 0  # the prefix of task 2: nothing
            if onto == "running":
                assert await svc.checkpoints.restore(blob, key="k1")
                target = svc
            else:
                off = {"equal_steps": StepsMode.OFF} if onto == "fresh-off" else {}
                fresh = started_service(**{**kw, **off})
                target = await fresh.__aenter__()
                assert await target.checkpoints.restore(blob)
            try:
                delivered = await drain(target)
                check_rest_once(committed, delivered, target.ledger.state.ledger[0].dropped)
                st = target.ledger.state
                assert st.commit_floor == 0 and st.commits[0].get(2, 0) == 0
            finally:
                if target is not svc:
                    await fresh.__aexit__(None, None, None)

    asyncio.run(main())

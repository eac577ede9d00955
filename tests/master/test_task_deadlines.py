"""The cost of deadlines that move with progress: a progress report moves a session's
deadline in the state (O(1)), never the timer heap; the timer of a task whose deadline moved
is pushed again only when it comes up (master/timeouts.py)."""

from __future__ import annotations

from pathlib import Path

from helpers.aio import run, until
from helpers.clock import Clock
from helpers.datasets import numbered_records
from helpers.service import started_service

from chunkmaster.core.model import Position
from chunkmaster.core.state import task_deadline


def test_progress_moves_the_deadline_without_a_timer_per_report(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", 2000)
    clock = Clock()

    async def main() -> None:
        settings = {"chunks_per_task": 2000, "timeout_dur": 60.0, "clock": clock}
        async with started_service(data=[data], **settings) as svc:
            sid = await svc.open_session("", "t", "h", 1, 0)
            task = await svc.get_task(0, session=sid)
            timers = len(svc._timeouts)  # the dispatch's one
            for n in range(1, 1001):
                clock.now += 1.0
                moved = svc.reports.progress(sid, [Position(task.meta.id, 1, 0, n)])
                assert moved == 1
            assert len(svc._timeouts) == timers == 1
            assert task_deadline(svc.ledger.state, task.meta.id) == clock.now + 60.0
            [pending] = svc.status_view().pending_tasks
            assert pending.expires_in == 60.0

    run(main())


def test_moving_the_clock_past_a_deadline_times_the_task_out(tmp_path: Path) -> None:
    """The timers wait on the master's clock: a test moves it past a task's deadline (an hour
    away) and the task times out at once; a minute short of it, nothing fires."""
    data = numbered_records(tmp_path / "d.rio", 10)
    clock = Clock()

    async def main() -> None:
        async with started_service(
            data=[data], timeout_dur=3600.0, clock=clock, chunks_per_task=10
        ) as svc:  # one task of the 10 chunks
            await svc.get_task(0)
            await until(lambda: clock.idle_timers() == 1, "the timer to wait on the clock")
            clock.now += 3540.0
            await until(lambda: clock.idle_timers() == 1, "the timer to look again")
            assert svc.status_view().pending == 1
            clock.now += 61.0
            await until(lambda: svc.status_view().pending == 0, "the task to time out")
            view = svc.status_view()
            assert view.todo == 1 and view.tasks_with_failures == 1

    run(main(), timeout=10.0)

"""The status a master sends (`status --json`) reads back as the typed view it was made from
(helpers.status_view): a test of a remote master looks at the same fields as one of a
Service in process."""

from __future__ import annotations

from pathlib import Path

from helpers.aio import run
from helpers.clock import Clock
from helpers.datasets import numbered_records
from helpers.service import started_service
from helpers.status_view import status_view

from chunkmaster.core.model import Position


def test_the_status_as_json_reads_back_as_the_typed_view(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", 30)

    async def main() -> None:
        async with started_service(data=[data], chunks_per_task=5, clock=Clock()) as svc:
            sid = await svc.open_session("", "t", "h", 1, 0)
            task = await svc.get_task(0, session=sid)
            svc.reports.progress(sid, [Position(task.meta.id, task.meta.epoch, 0, 2)])
            other = await svc.get_task(0)
            await svc.task_failed(other.meta, "disk on fire")
            view = svc.status_view()
            assert view.trainers and view.ledger and view.tasks_with_failures == 1
            assert status_view(view.to_json()) == view

    run(main())

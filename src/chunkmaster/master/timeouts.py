"""One scheduler for every task deadline (not a thread or timer per task).

Deadlines are wall-clock times stored in the state, so after a restart a pending task keeps
the time it already used. Entries are (deadline, task, epoch); a stale entry (the task was
finished, or dispatched again under a newer epoch) is dropped when it comes up.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("chunkmaster.timeouts")


class TimeoutScheduler:
    def __init__(
        self,
        on_expire: Callable[[int, int], Awaitable[None]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._on_expire = on_expire
        self._clock = clock
        self._heap: list[tuple[float, int, int]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="task-timeouts")

    def arm(self, deadline: float, task_id: int, epoch: int) -> None:
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (deadline, task_id, epoch))
        if earliest is None or deadline < earliest:
            self._wake.set()

    def reset(self, entries: list[tuple[float, int, int]]) -> None:
        """Replace every deadline (after the state was rebuilt from the store)."""
        self._heap = list(entries)
        heapq.heapify(self._heap)
        self._wake.set()

    def __len__(self) -> int:
        return len(self._heap)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            if not self._heap:
                await self._wake.wait()
                continue
            delay = self._heap[0][0] - self._clock()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=min(delay, 3600.0))
                continue
            _, task_id, epoch = heapq.heappop(self._heap)
            try:
                await self._on_expire(task_id, epoch)
            except Exception:  # one bad expiry must not stop every later one
                log.exception("handling the timeout of task %d epoch %d failed", task_id, epoch)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

"""Task timeouts: one scheduler for every task deadline (not a thread or timer per task).

Deadlines are wall-clock times stored in the state, so after a restart a pending task keeps
the time it already used. A task held by a trainer without a session times out a fixed
timeout after its dispatch (the original's meaning); one held by a session, only once the
session has made no progress for the timeout (`core.queues.task_deadline`: a trainer that is
slow but reading keeps its tasks; one that is stuck loses them). Entries are (deadline, task,
epoch); a stale entry (the task was finished, or dispatched again under a newer epoch) is
dropped when it comes up, and one whose task's deadline moved is pushed again at the new one.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable, Callable

from chunkmaster.core.events import Fail, Resume
from chunkmaster.core.model import TIMEOUT_REASON
from chunkmaster.core.queues import fail_ignored, fail_quarantines, task_deadline
from chunkmaster.master.ledger import Ledger, LedgerSubscriber, started
from chunkmaster.master.reports import log_failure
from chunkmaster.master.timer_wait import cancel_and_wait, wait_woken

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
                await wait_woken(self._clock, self._wake, min(delay, 3600.0))
                continue
            _, task_id, epoch = heapq.heappop(self._heap)
            try:
                await self._on_expire(task_id, epoch)
            except Exception:  # one bad expiry must not stop every later one
                log.exception("handling the timeout of task %d epoch %d failed", task_id, epoch)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None


class TaskTimeouts(LedgerSubscriber):
    """The pending tasks' deadlines on one scheduler: a deadline passed is a `Fail("timeout")`.

    Re-armed from the state whenever the ledger rebuilds it. After a store outage every pending
    task gets a full timeout again (`Resume`): while the store refused writes no trainer could
    report a task finished, and like the time no master was serving, that time must not time
    out tasks live trainers are reading.
    """

    def __init__(
        self,
        ledger: Ledger,
        timeout_dur: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ledger = ledger
        self.timeout_dur = timeout_dur
        self._clock = clock
        self._scheduler = TimeoutScheduler(self._expire, clock)
        ledger.subscribe(self)

    def from_now(self) -> float:
        """A deadline one timeout from now (wall-clock seconds, journaled)."""
        return self._clock() + self.timeout_dur

    def arm(self, deadline: float, task_id: int, epoch: int) -> None:
        self._scheduler.arm(deadline, task_id, epoch)

    def rearm(self) -> None:
        """Every pending task's deadline, from the state (after it was rebuilt)."""
        st = self._ledger.state
        self._scheduler.reset([(task_deadline(st, t), t, p.epoch) for t, p in st.pending.items()])

    def state_rebuilt(self) -> None:
        self.rearm()

    def start(self) -> None:
        self.rearm()
        self._scheduler.start()

    async def close(self) -> None:
        await self._scheduler.close()

    def __len__(self) -> int:
        return len(self._scheduler)

    async def _expire(self, task_id: int, epoch: int) -> None:
        """A timer came up: the dispatch times out, unless it is over, or its holder made
        progress since the timer was armed. Then it is armed again at the new deadline: one
        heap entry per timeout a live trainer outlasts, not one per progress report."""
        if not self._ledger.available:
            return  # the state is being rebuilt; every timer is re-armed from it after
        st = self._ledger.state
        ev = Fail(task_id, epoch, TIMEOUT_REASON)
        if fail_ignored(st, ev) is not None:
            return
        due = task_deadline(st, task_id)
        if due > self._clock():
            self.arm(due, task_id, epoch)
            return
        quarantined = fail_quarantines(st, task_id)
        await self._ledger.commit(ev)
        log_failure(self._ledger.state, task_id, TIMEOUT_REASON, quarantined=quarantined)

    def store_writable(self) -> None:
        """The time the store refused writes does not time tasks out: each gets a timeout
        from now."""
        if self._ledger.state.pending:
            # Applied before any timer can fire on the old deadlines (they run after a yield).
            _, durable = self._ledger.submit(Resume(self.from_now()))
            started(durable)
            self.rearm()

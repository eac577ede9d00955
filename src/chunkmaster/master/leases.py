"""Trainer-session leases: who was heard from when, and the one timer that ends silent sessions.

Leases are not state: they live in this process, on the monotonic clock, and a master that
takes over gives every session it recovers a fresh one (a trainer cannot be blamed for the time
no master was there to hear it). The live figures shown by `status` (last heard from, records
per second) are kept here too, since they are about this process's view of the trainers.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("chunkmaster.sessions")

RATE_WINDOW = 30.0  # seconds of (time, records consumed) samples behind a session's rate


@dataclass(frozen=True, slots=True)
class DataWait:
    """How long a trainer's training loop waited for data over its last `window` seconds of
    wall time, as the trainer measured and reported it."""

    p50: float  # seconds
    p99: float
    share: float  # of the window's wall time
    batches: int
    window: float


@dataclass
class Lease:
    expires: float  # time.monotonic()
    heard: float  # time.monotonic() of the last message
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    data_wait: DataWait | None = None  # the trainer's last report of it

    def rate(self) -> float:
        """Records per second over the last RATE_WINDOW seconds of progress samples."""
        if len(self.samples) < 2:
            return 0.0
        (t0, r0), (t1, r1) = self.samples[0], self.samples[-1]
        return (r1 - r0) / (t1 - t0) if t1 > t0 else 0.0


class LeaseKeeper:
    """Renews leases on every message and calls `on_expire(session)` for a silent one."""

    def __init__(
        self,
        ttl: float,
        on_expire: Callable[[str], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self._on_expire = on_expire
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._heap: list[tuple[float, str]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="session-leases")

    def grant(self, sessions: Iterable[str]) -> None:
        """A fresh lease for each session (a new one, or every one found at recovery)."""
        for sid in sessions:
            self.renew(sid)

    def renew(self, session: str, consumed: int | None = None) -> None:
        now = self._clock()
        lease = self._leases.get(session)
        if lease is None:
            lease = self._leases[session] = Lease(now + self.ttl, now)
        lease.heard = now
        lease.expires = now + self.ttl
        if not self._heap:
            self._wake.set()  # the timer sleeps until there is a lease to watch
        # Every lease has the same TTL, so a renewal never moves the earliest expiry closer:
        # the timer wakes at the superseded entry and looks again.
        heapq.heappush(self._heap, (lease.expires, session))
        if consumed is not None:
            s = lease.samples
            s.append((now, consumed))
            while len(s) > 2 and now - s[0][0] > RATE_WINDOW:
                s.popleft()
        if len(self._heap) > 4 * len(self._leases) + 64:  # drop superseded entries
            self._heap = [(lease.expires, sid) for sid, lease in self._leases.items()]
            heapq.heapify(self._heap)

    def drop(self, session: str) -> None:
        self._leases.pop(session, None)

    def get(self, session: str) -> Lease | None:
        return self._leases.get(session)

    def reset(self, sessions: Iterable[str]) -> None:
        """Keep leases only for `sessions` (the state was rebuilt), granting missing ones."""
        keep = set(sessions)
        for sid in [s for s in self._leases if s not in keep]:
            del self._leases[sid]
        self.grant(s for s in keep if s not in self._leases)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            if not self._heap:
                await self._wake.wait()
                continue
            expires, sid = self._heap[0]
            lease = self._leases.get(sid)
            if lease is None or lease.expires != expires:
                heapq.heappop(self._heap)  # renewed since, or ended
                continue
            delay = expires - self._clock()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
                continue
            heapq.heappop(self._heap)
            try:
                await self._on_expire(sid)
            except Exception:  # one failed expiry must not stop every later one
                log.exception("ending the expired session %s failed; retrying", sid)
                lease.expires = self._clock() + 1.0
                heapq.heappush(self._heap, (lease.expires, sid))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

"""Trainer-session leases: who was heard from when, and the one timer that ends silent sessions.

Leases are not state: they live in this process, on the monotonic clock, and a master that
takes over gives every session it recovers a fresh one (a trainer cannot be blamed for the time
no master was there to hear it). The live figures shown by `status` (last heard from, records
per second) are kept here too, since they are about this process's view of the trainers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from chunkmaster.master.timer_wait import cancel_and_wait, wait_woken

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
    #: time.monotonic() this process granted it (opened, or found at recovery): a session
    #: heard from after another's `since` was alive then (master/dispatch.py `_contest`)
    since: float = 0.0
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    data_wait: DataWait | None = None  # the trainer's last report of it

    def rate(self) -> float:
        """Records per second over the last RATE_WINDOW seconds of progress samples."""
        if len(self.samples) < 2:
            return 0.0
        (t0, r0), (t1, r1) = self.samples[0], self.samples[-1]
        return (r1 - r0) / (t1 - t0) if t1 > t0 else 0.0


class LeaseKeeper:
    """Renews leases on every message and calls `on_expire(session)` for a silent one.

    Every lease has the same TTL, so the order of expiry is the order of the last message:
    the leases are kept in that order (an insertion-ordered dict, a renewal moves its lease to
    the end), which makes a renewal O(1) and the oldest lease the first one. A keep-alive from
    each of 10,000 sessions every few seconds is the master's busiest path (docs/limits.md).
    A lease whose ending failed waits for its retry apart, in `_retrying`."""

    def __init__(
        self,
        ttl: float,
        on_expire: Callable[[str], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self._on_expire = on_expire
        self._clock = clock  # monotonic: the order of renewals is the order of expiry
        self._leases: OrderedDict[str, Lease] = OrderedDict()  # oldest renewal first
        self._retrying: dict[str, Lease] = {}  # their ending failed; retried at .expires
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
        leases = self._leases
        lease = leases.get(session)
        if lease is None:
            if not leases:
                self._wake.set()  # the timer sleeps until there is a lease to watch
            lease = self._retrying.pop(session, None) or Lease(now + self.ttl, now, now)
            leases[session] = lease
        else:
            # Its expiry moves past every other's: the timer, asleep until the oldest
            # lease's expiry, wakes then and looks at the new oldest.
            leases.move_to_end(session)
        lease.heard = now
        lease.expires = now + self.ttl
        if consumed is not None:
            s = lease.samples
            s.append((now, consumed))
            while len(s) > 2 and now - s[0][0] > RATE_WINDOW:
                s.popleft()

    def drop(self, session: str) -> None:
        self._leases.pop(session, None)
        self._retrying.pop(session, None)

    def get(self, session: str) -> Lease | None:
        lease = self._leases.get(session)
        return self._retrying.get(session) if lease is None else lease

    def reset(self, sessions: Iterable[str]) -> None:
        """Keep leases only for `sessions` (the state was rebuilt), granting missing ones."""
        keep = set(sessions)
        for held in (self._leases, self._retrying):
            for sid in [s for s in held if s not in keep]:
                del held[sid]
        self.grant(s for s in keep if self.get(s) is None)
        self._wake.set()

    def _next(self) -> tuple[str, Lease] | None:
        """The lease that expires first: the oldest renewal, or a retry due before it."""
        first = next(iter(self._leases.items()), None)
        if self._retrying:
            retry = min(self._retrying.items(), key=lambda item: item[1].expires)
            if first is None or retry[1].expires < first[1].expires:
                return retry
        return first

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            due = self._next()
            if due is None:
                await self._wake.wait()
                continue
            sid, lease = due
            delay = lease.expires - self._clock()
            if delay > 0:
                await wait_woken(self._clock, self._wake, delay)
                continue
            # Out of the order while it ends: ending it drops it; a message meanwhile grants
            # it a fresh lease (and ending it then drops that one).
            self._leases.pop(sid, None)
            self._retrying[sid] = lease
            try:
                await self._on_expire(sid)
            except Exception:  # one failed expiry must not stop every later one
                log.exception("ending the expired session %s failed; retrying", sid)
                if self._retrying.get(sid) is lease:
                    lease.expires = self._clock() + 1.0
                continue
            if self._retrying.get(sid) is lease:  # ended without a drop (already gone)
                del self._retrying[sid]

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

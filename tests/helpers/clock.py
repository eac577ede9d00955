"""A clock the test moves: handed to the service (or a lease keeper) as its time source, it
drives the master's timers too (chunkmaster.master.timer_wait): moving it wakes every timer
waiting on it, which looks at its deadlines on the new time; real time passing fires nothing."""

from __future__ import annotations

import asyncio
import contextlib


class Clock:
    """Seconds that pass only when the test sets `now` (from any thread)."""

    def __init__(self, now: float = 1000.0) -> None:
        self._now = now
        self._timers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def __call__(self) -> float:
        return self._now

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = value
        here = _running_loop()
        for loop, wake in list(self._timers):
            if loop is here:
                wake.set()
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed: nothing waits
                    loop.call_soon_threadsafe(wake.set)

    def idle_timers(self) -> int:
        """How many timers wait on the clock, having looked at their deadlines on the time
        it shows: a test waits for this to know that nothing more is due."""
        return sum(not wake.is_set() for _, wake in self._timers)

    async def wait(self, wake: asyncio.Event, delay: float) -> None:
        """A timer's wait: until `wake` is set, by its owner or by the clock moving."""
        timer = (asyncio.get_running_loop(), wake)
        self._timers.append(timer)
        try:
            await wake.wait()
        finally:
            self._timers.remove(timer)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

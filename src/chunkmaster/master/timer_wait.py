"""How the master's timers wait: until woken, or until their delay has passed on their clock.

A clock is a function returning seconds. One that also has `wait(wake, delay)` (a test's
virtual clock) says itself when the delay has passed, so that moving it fires the timers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class DrivenClock(Protocol):
    """A clock that wakes the timers waiting on it when it moves."""

    def __call__(self) -> float: ...

    async def wait(self, wake: asyncio.Event, delay: float) -> None: ...


async def wait_woken(clock: Callable[[], float], wake: asyncio.Event, delay: float) -> None:
    """Return once `wake` is set or `delay` seconds of `clock` have passed; the timer then
    looks at its deadlines again, so an early return is harmless."""
    if isinstance(clock, DrivenClock):
        await clock.wait(wake, delay)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), timeout=delay)


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a timer's task (None: there is none) and return once it has ended, so that a
    closed timer fires no more."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

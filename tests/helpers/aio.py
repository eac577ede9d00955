"""Small asyncio helpers for tests that drive async code from plain pytest functions."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run `coro` in a fresh loop, failing (not hanging) after `timeout` seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def eventually(
    attempt: Callable[[], Awaitable[T]], timeout: float = 10.0, interval: float = 0.02
) -> T:
    """Retry `attempt` until it stops raising; re-raise its last error after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await attempt()
        except Exception:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(interval)


async def until(cond: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Wait (yielding to the loop's other tasks) until `cond()`; fail naming `what` after
    `timeout` s."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def still_waiting(futures: Iterable[asyncio.Future[Any]], seconds: float = 0.1) -> bool:
    """Let the loop run everything else for up to `seconds`: whether none of `futures` is done
    by then (each waits for something only the test brings about)."""
    done, _ = await asyncio.wait(set(futures), timeout=seconds)
    return not done

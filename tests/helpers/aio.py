"""Small asyncio helpers for tests that drive async code from plain pytest functions."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
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

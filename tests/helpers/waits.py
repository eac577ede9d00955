"""Waiting on a condition with a deadline: a test that waits never hangs past it, and says
what it was waiting for."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    cond: Callable[[], object],
    what: str,
    timeout: float = 60.0,
    *,
    explain: Callable[[], str] = lambda: "",
) -> None:
    """Return once `cond()` is true; fail naming `what` (and `explain()`) after `timeout` s."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{explain()}")
        time.sleep(0.02)

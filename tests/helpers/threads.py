"""Running one function in many threads at once, as many trainers of one process do."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_threads(target: Callable[[], None], n: int, timeout: float = 120.0) -> None:
    """Run `target` in `n` threads at once and wait for them; raise the first error one of
    them raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]

"""Running one function in many threads at once, as many trainers of one process do."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable


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


class SeenPerPass:
    """The records trainer threads read, per pass, gathered under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: dict[int, Counter[int]] = defaultdict(Counter)

    def add(self, pass_id: int, records: Iterable[int]) -> None:
        with self._lock:
            self.seen[pass_id].update(records)

    def assert_each_once(self, passes: int, records: Iterable[int]) -> None:
        """Every one of `records` read exactly once in each of the first `passes` passes."""
        expected = Counter(records)
        for p in range(passes):
            assert self.seen[p] == expected, f"pass {p}"

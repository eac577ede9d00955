"""How long a training loop waits for its data: one sample per batch it takes.

A rank that starves (its reads are slow, its workers too few, a remote store far away) shows
here first: its waits grow while the others' stay near zero. The trainer measures them and its
session's keep-alives report the figures, which the master shows per trainer (status, metrics,
dashboard). Figures cover the last `window` seconds, at most `MAX_SAMPLES` batches of them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW = 60.0  # seconds of batches behind the figures
MAX_SAMPLES = 4096  # batches kept at most (the window shrinks above that rate)


@dataclass(frozen=True, slots=True)
class WaitFigures:
    p50: float  # seconds waited for one batch
    p99: float
    share: float  # of the window's wall time spent waiting
    batches: int
    window: float  # seconds of wall time the figures cover


class WaitMeter:
    """Waits for data, one sample per batch; `figures()` may be called from another thread."""

    def __init__(self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float]] = deque()  # (when it ended, seconds waited)
        self._started = clock()
        self.total = 0.0  # seconds waited, all batches
        self.batches = 0

    def restart(self) -> None:
        """The loop starts (again): time before now is not the loop's."""
        with self._lock:
            self._samples.clear()
            self._started = self._clock()

    def waited(self, seconds: float) -> None:
        now = self._clock()
        with self._lock:
            self._samples.append((now, seconds))
            self.total += seconds
            self.batches += 1
            if len(self._samples) > MAX_SAMPLES:
                self._samples.popleft()

    def figures(self) -> WaitFigures | None:
        """The last window's figures; None before the first batch."""
        now = self._clock()
        with self._lock:
            while self._samples and now - self._samples[0][0] > self._window:
                self._samples.popleft()
            if not self._samples:
                return None
            waits = sorted(w for _, w in self._samples)
            first = self._samples[0][0] - self._samples[0][1]  # when the oldest wait began
        span = max(now - max(first, self._started, now - self._window), 1e-9)
        n = len(waits)
        return WaitFigures(
            p50=waits[(n - 1) // 2],
            p99=waits[min(n - 1, (99 * n) // 100)],
            share=min(1.0, sum(waits) / span),
            batches=n,
            window=span,
        )

"""What the ledger knows of a store that refuses writes: the cause, since when, the attempts
made, when the next one is due, and when the failure was last logged. Plain bookkeeping: the
ledger gives it the times (`time.monotonic()`), and does the waiting and the logging.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StoreOutage:
    retry_first: float  # seconds before the first retry of a failing store
    retry_max: float  # the backoff's cap
    log_every: float  # seconds between two log lines about the same, continuing failure
    error: str | None = None  # why changes are refused now (None: the store takes writes)
    since: float | None = None  # when the first write of this outage failed
    attempts: int = 0  # writes (and rebuilds) that failed since then
    next_retry_at: float | None = None  # when the next attempt is due
    last_log: float = 0.0

    def begin(self, cause: str, now: float) -> None:
        """A write failed: the outage starts, logged now."""
        self.error, self.since, self.attempts, self.last_log = cause, now, 1, now

    def failed_again(self, cause: str, now: float) -> bool:
        """One more attempt failed; whether to log it (once every `log_every` seconds)."""
        self.attempts += 1
        self.error = cause
        if now - self.last_log < self.log_every:
            return False
        self.last_log = now
        return True

    def backoff(self, delay: float) -> float:
        """The wait after an attempt that followed a wait of `delay`: twice it, capped."""
        return min(delay * 2, self.retry_max)

    def lasted(self, now: float) -> float:
        """Seconds since the outage began (0 when there is none)."""
        return now - (self.since if self.since is not None else now)

    def end(self) -> None:
        """The store takes writes again."""
        self.error, self.since, self.next_retry_at, self.attempts = None, None, None, 0

    def refuse_for_good(self, cause: str) -> None:
        """Changes are refused from now on, with no retry (leadership lost)."""
        self.error, self.next_retry_at = cause, None

"""One wait's log lines: said as the wait starts, then every so often while it lasts, saying why.

Every loop of a trainer that waits (a task request answered "nothing yet", a call retried
through an outage, a report the master cannot take now, no address in etcd, a broken watch
of it) logs through a `WaitLog`, so a stuck trainer always says what it waits for, and how
long. It sits below the client and etcd packages, which both use it.
"""

from __future__ import annotations

import logging
import time

EVERY = 30.0
"""Seconds between two "still waiting" lines of one wait, unless its loop says otherwise."""


class WaitLog:
    """The log lines of the waits of one loop, one wait at a time (a new cause starts a new
    one). `what` opens every line: the call, or the pass waited on."""

    def __init__(self, logger: logging.Logger, what: str, every: float = EVERY) -> None:
        self._log = logger
        self.what = what
        self.every = every
        self._cause: object = None
        self._since = 0.0
        self._said = 0.0
        self.attempts = 0

    @property
    def waiting(self) -> bool:
        return self._cause is not None

    @property
    def since(self) -> float:
        """When the current wait began (time.monotonic())."""
        return self._since

    def wait(
        self,
        cause: object,
        why: object,
        *,
        every: float | None = None,
        first: int | None = logging.WARNING,
        still: int = logging.WARNING,
    ) -> bool:
        """The loop waits (again) for `cause` (a type or a value, compared with ==), `why`
        saying what for. Logged at level `first` as it starts (None: not then), and at `still`
        once `every` s passed since the last line. True if this started a new wait."""
        now = time.monotonic()
        self.attempts += 1
        if cause != self._cause:
            self._cause, self._since, self._said, self.attempts = cause, now, now, 1
            if first is not None:
                self._log.log(first, "%s: %s", self.what, why)
            return True
        if now - self._said >= (self.every if every is None else every):
            self._said = now
            self._log.log(
                still,
                "%s: %s (for %.0fs, %d tries)",
                self.what,
                why,
                now - self._since,
                self.attempts,
            )
        return False

    def over(self) -> float | None:
        """The wait ended: the seconds it lasted (None if there was none)."""
        if self._cause is None:
            return None
        self._cause = None
        return time.monotonic() - self._since

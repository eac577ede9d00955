"""What a trainer may still read of its tasks: the lease its session holds on them.

The master ends a session `ttl` seconds after it last heard from it, so a trainer that was
frozen or cut off may hold tasks that are someone else's already. The fence says the lease
certainly holds while the master answered a message sent less than LEASE_SAFE x ttl ago; past
that the trainer hands out no more records of its tasks until a ping is answered (the session
calls `on_alive`) or the session is found lost. While the trainer reads, the session pings
ahead of need, so that it never waits. A plain object on times it is given.
"""

from __future__ import annotations

LEASE_SAFE = 0.8
"""The part of the TTL after a message the master answered during which the trainer may go on
reading its tasks without hearing from the master again (its lease holds at least a TTL)."""


class LeaseFence:
    """The lease of one trainer's session, as the trainer knows it."""

    def __init__(self) -> None:
        self.ttl = 0.0  # the master's session TTL (0: no Welcome yet)
        self.heard_at = 0.0  # when the newest message the master answered was sent
        self.used_at = 0.0  # when the trainer last asked `ok()`
        self.waiting = False  # `ok()` said no: the trainer waits to hear from the master
        self.ping_due = False
        self.pinged_at = 0.0
        self.failure: Exception | None = None  # why the master is out of reach, if it is

    def welcomed(self, ttl: float) -> None:
        self.ttl = max(0.0, ttl)
        self.failure = None

    def ok(self, now: float) -> bool:
        """Whether the trainer may hand out records of its tasks now; if not, a ping is due.
        Raises why the master is out of reach, once its retries gave up."""
        if self.ttl <= 0:
            return True  # no Welcome yet, so no task either
        self.used_at = now
        if now < self.heard_at + LEASE_SAFE * self.ttl:
            return True
        if self.failure is not None:
            raise self.failure
        self.waiting = self.ping_due = True
        return False

    def heard(self, sent_at: float, now: float) -> bool:
        """The master answered a message sent at `sent_at`. Whether a trainer that waited may
        read again."""
        self.heard_at = max(self.heard_at, sent_at)
        if self.waiting and self.heard_at + LEASE_SAFE * self.ttl > now:
            self.waiting = False
            return True
        return False

    def unreachable(self, failure: Exception) -> bool:
        """The master stayed out of reach: whether a trainer that waited stops waiting (the
        next `ok()` raises `failure`)."""
        self.failure = failure
        waited, self.waiting = self.waiting, False
        return waited

    def ping(self, now: float) -> bool:
        """Whether to ask the master for an answer now (none asked for is in flight): the fence
        found the lease in doubt, or the trainer reads and the master has not answered for a
        third of the TTL."""
        reading = self.used_at > self.pinged_at
        if not self.ping_due and not (reading and now - self.heard_at > self.ttl / 3):
            return False
        self.ping_due = False
        self.pinged_at = now
        return True

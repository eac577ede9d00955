"""What the master needs from a leader election, and the election of a master alone.

A master on a shared store (etcd: `chunkmaster.etcd.journal.EtcdStore`) must hold the lock
before it recovers, publish its address only once it listens, and stop serving the moment
`lost` is set. A master on an embedded store (`Alone`) is the only one that can open it (the
SQLite file is locked; the in-memory store is its own): it leads at once and never loses, so
the runner follows one path for both.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Leadership(Protocol):
    """One candidate for leading a job."""

    @property
    def elected(self) -> bool:
        """Whether leading takes winning an election (a change of leader metrics count)."""
        ...

    @property
    def lost(self) -> asyncio.Event:
        """Set once leadership is lost for good; the master must stop serving at once."""
        ...

    async def campaign(self) -> None:
        """Block until this candidate leads (a standby waits here)."""
        ...

    async def publish_addr(self, addr: str) -> None:
        """Tell trainers where the leader listens; the record vanishes with the leadership."""
        ...

    async def shutdown(self) -> None:
        """Give up leadership (or the candidacy) and release resources. Idempotent."""
        ...


class Alone:
    """The leadership of a master on an embedded store: it leads from the start, has no
    address to publish (trainers are given it) and never loses."""

    elected = False

    def __init__(self) -> None:
        self._lost = asyncio.Event()  # never set

    @property
    def lost(self) -> asyncio.Event:
        return self._lost

    async def campaign(self) -> None:
        return None

    async def publish_addr(self, addr: str) -> None:
        return None

    async def shutdown(self) -> None:
        return None

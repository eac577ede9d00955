"""What the master needs from a leader election (on etcd: `chunkmaster.store.etcd.EtcdStore`).

A master with an embedded store has no election and serves at once. A master on a shared
store must hold the lock before it recovers, publish its address only once it listens, and stop
serving the moment `lost` is set.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Leadership(Protocol):
    """One candidate for leading a job."""

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

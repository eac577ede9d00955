"""The persistence boundary: a journal of encoded events plus a snapshot that folds them.

The master never writes its whole state per operation. Each acknowledged change is one small
journal entry; from time to time the shell writes a snapshot of the state after entry `seq`
and the store drops the entries it covers. Recovery = snapshot + the entries after it.
Entries and snapshots are opaque bytes here; `chunkmaster.core.codec` gives them meaning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class StoreError(Exception):
    """A store operation failed; nothing of that call may be assumed durable."""


class NotLeaderError(StoreError):
    """This master no longer holds the leader lock: it must stop serving at once."""


class StoreInUseError(StoreError):
    """Another master holds this store: two masters must never write one journal."""


class StoreUnsafeError(StoreError):
    """The store's directory lets another user rename, replace or delete its files: the master
    does not start on it. The message names the directory, its mode and owner, and the fix."""


class StoreDamagedError(StoreError):
    """The store on disk is damaged, foreign, or older than it was: the master must not start
    from it (it would start empty or at an older state). The message names the file, what is
    wrong and what the user can do."""


@dataclass(frozen=True)
class Recovered:
    """What a store hands back at start-up."""

    snapshot: bytes | None  # state after entry `snapshot_seq`; None means the empty state
    snapshot_seq: int  # 0 when there is no snapshot
    # (seq, entry) pairs with seq > snapshot_seq, ascending
    entries: Sequence[tuple[int, bytes]] = field(default_factory=tuple)


@runtime_checkable
class Store(Protocol):
    """A durable journal. Every method is a coroutine; a call that returns has persisted.

    Sequence numbers are assigned by the caller, start at 1 and grow by one with each entry.
    """

    async def load(self) -> Recovered:
        """Return the latest snapshot and the entries after it."""
        ...

    async def save(self, entries: Sequence[tuple[int, bytes]]) -> None:
        """Append entries atomically: all of them become durable, or none (raise StoreError)."""
        ...

    async def compact(self, snapshot: bytes, seq: int) -> None:
        """Store `snapshot` as the state after entry `seq` and drop entries up to `seq`."""
        ...

    async def shutdown(self) -> None:
        """Release resources (and, for a leader, the lock). Idempotent."""
        ...

    def describe(self) -> str:
        """A one-line human description, for the start-up log and status."""
        ...

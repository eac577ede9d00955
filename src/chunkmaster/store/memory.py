"""The in-memory store (`--store :memory:`): a job that need not outlive its master process
(tests, a throwaway run, a job restarted from a data checkpoint anyway); survives no crash."""

from __future__ import annotations

from collections.abc import Sequence

from chunkmaster.store.base import Recovered, StoreError


class InMemStore:
    def __init__(self) -> None:
        self._snapshot: bytes | None = None
        self._snapshot_seq = 0
        self._entries: list[tuple[int, bytes]] = []
        self._last_seq = 0

    async def load(self) -> Recovered:
        return Recovered(self._snapshot, self._snapshot_seq, tuple(self._entries))

    async def save(self, entries: Sequence[tuple[int, bytes]]) -> None:
        expected = self._last_seq + 1
        for seq, _ in entries:
            if seq != expected:
                raise StoreError(f"journal gap: got entry {seq}, expected {expected}")
            expected += 1
        self._entries.extend(entries)
        if entries:
            self._last_seq = entries[-1][0]

    async def compact(self, snapshot: bytes, seq: int) -> None:
        self._snapshot, self._snapshot_seq = snapshot, seq
        self._entries = [(s, e) for s, e in self._entries if s > seq]

    async def shutdown(self) -> None:
        return None

    def describe(self) -> str:
        return "in-memory store (state is lost when the master exits)"

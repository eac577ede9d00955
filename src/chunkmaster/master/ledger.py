"""The state and its journal: every change is applied once and acknowledged once durable.

Commits are grouped: while one batch of journal entries is being written, new events are
applied in memory and queue for the next batch, so a slow store (fsync, an etcd round trip)
costs latency but not throughput. Callers wait for their batch. If a write fails, every
waiting caller gets the error and the in-memory state is rebuilt from the store, so nothing
unacknowledged survives (defect D7): the state is always "durable prefix + waiting tail".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from chunkmaster.core.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from chunkmaster.core.errors import UnavailableError
from chunkmaster.core.events import Event
from chunkmaster.core.model import Task
from chunkmaster.core.state import MasterState, apply
from chunkmaster.store.base import NotLeaderError, Store

log = logging.getLogger("chunkmaster.ledger")

MIN_COMPACT_ENTRIES = 10_000


class Ledger:
    def __init__(self, store: Store, *, compact_min: int = MIN_COMPACT_ENTRIES) -> None:
        self.store = store
        self.state = MasterState()
        self.seq = 0  # last applied entry
        self.durable_seq = 0  # last entry the store acknowledged
        self.entries_since_snapshot = 0
        self.compact_min = compact_min
        self.error: str | None = None  # why we cannot commit right now, if we cannot
        self.lost_leadership = False
        self.on_reset: list[Callable[[], None]] = []  # called after the state was rebuilt
        self.on_change: list[Callable[[], None]] = []  # called after every applied event
        self._queue: list[tuple[int, bytes]] = []
        self._queue_done: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._repair: asyncio.Task[None] | None = None
        self._closed = False

    async def recover(self) -> None:
        """Load snapshot + journal from the store. Raises StoreError / CodecError."""
        rec = await self.store.load()
        state = MasterState() if rec.snapshot is None else decode_snapshot(rec.snapshot)
        seq = rec.snapshot_seq
        for entry_seq, data in rec.entries:
            if entry_seq != seq + 1:
                raise UnavailableError(f"journal gap after entry {seq} (next is {entry_seq})")
            apply(state, decode_event(data))
            seq = entry_seq
        self.state, self.seq, self.durable_seq = state, seq, seq
        self.entries_since_snapshot = len(rec.entries)
        self.error = None
        log.info(
            "recovered state at entry %d (snapshot at %d + %d journal entries)",
            seq,
            rec.snapshot_seq,
            len(rec.entries),
        )

    @property
    def available(self) -> bool:
        return self.error is None and not self._closed

    async def commit(self, event: Event) -> Task | bool | None:
        """Apply `event` now; return its result once it is durable (else raise)."""
        result, durable = self.submit(event)
        await durable
        return result

    def submit(self, event: Event) -> tuple[Task | bool | None, Awaitable[None]]:
        """Apply `event` now, synchronously; the awaitable completes once it is durable.

        For callers that must act on the result before yielding (e.g. arm a timer), so
        that neither a concurrent caller nor a cancellation can come in between.
        """
        if not self.available:
            raise UnavailableError(f"master cannot persist changes: {self.error or 'closed'}")
        data = encode_event(event)
        result = apply(self.state, event)
        self.seq += 1
        self._queue.append((self.seq, data))
        if self._queue_done is None:
            self._queue_done = asyncio.get_running_loop().create_future()
        done = self._queue_done
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name="ledger-flush")
        for cb in self.on_change:
            cb()
        return result, asyncio.shield(done)  # one caller's cancellation must not fail the batch

    async def _flush_loop(self) -> None:
        while self._queue:
            batch, done = self._queue, self._queue_done
            self._queue, self._queue_done = [], None
            assert done is not None
            try:
                await self.store.save(batch)
            except Exception as exc:
                self._fail(done, exc)
                return
            self.durable_seq = batch[-1][0]
            self.entries_since_snapshot += len(batch)
            done.set_result(None)
            if not self._queue and self._should_compact():
                try:
                    await self._compact()
                except Exception as exc:  # the journal is intact; try again later
                    log.warning("compaction failed (journal kept, will retry): %s", exc)
                    self.entries_since_snapshot = 0

    def _should_compact(self) -> bool:
        # A snapshot costs O(tasks) bytes; taking one every tasks/4 entries keeps both the
        # amortised bytes per operation and the journal replayed at recovery bounded.
        return self.entries_since_snapshot >= max(self.compact_min, self.state.num_tasks // 4)

    async def _compact(self) -> None:
        seq, snapshot = self.seq, encode_snapshot(self.state)
        await self.store.compact(snapshot, seq)
        self.entries_since_snapshot = self.seq - seq
        log.info("compacted the journal into a %d-byte snapshot at entry %d", len(snapshot), seq)

    def _fail(self, done: asyncio.Future[None], exc: Exception) -> None:
        """A write failed: fail every waiter, then rebuild the state from the store."""
        reason = f"{type(exc).__name__}: {exc}"
        err = UnavailableError(f"master could not persist the change: {reason}")
        waiting = [done] if self._queue_done is None else [done, self._queue_done]
        for fut in waiting:
            fut.set_exception(err)
            fut.exception()  # mark it retrieved: its waiters may all have gone
        self._queue, self._queue_done = [], None
        if isinstance(exc, NotLeaderError):
            self.lost_leadership = True
            self.error = f"no longer the leader: {exc}"
            log.critical("lost the master lock: %s; refusing every change from now on", exc)
            return
        self.error = reason
        log.error("store write failed, rolling back to the durable state: %s", reason)
        if self._repair is None or self._repair.done():
            self._repair = asyncio.create_task(self._repair_loop(), name="ledger-repair")

    async def _repair_loop(self) -> None:
        delay = 0.05
        while not self._closed:
            try:
                await self.recover()
            except Exception as exc:
                if isinstance(exc, NotLeaderError):
                    self.lost_leadership = True
                    self.error = f"no longer the leader: {exc}"
                    return
                self.error = f"{type(exc).__name__}: {exc}"
                log.warning("store still unavailable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            log.info("store is back; state rebuilt at entry %d", self.seq)
            for cb in self.on_reset:
                cb()
            for cb in self.on_change:
                cb()
            return

    async def close(self) -> None:
        """Let the current batch finish, then stop; later commits are refused."""
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait([self._flusher])
        self._closed = True
        if self._repair is not None:
            self._repair.cancel()

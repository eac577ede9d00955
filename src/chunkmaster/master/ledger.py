"""The state and its journal: every change is applied once and acknowledged once durable.

Commits are grouped: while one batch of journal entries is being written, new events are
applied in memory and queue for the next batch, so a slow store (fsync, an etcd round trip)
costs latency but not throughput. Callers wait for their batch. An event nobody waits for (a
progress report: `submit(lazy=True)`) does not start a write of its own: it goes with the
next event somebody waits for, or after LAZY_FLUSH seconds, so that reports many times a
second cost one write a LAZY_FLUSH, not one each. If a write fails, every
waiting caller gets the error and the in-memory state is rebuilt from the store, so nothing
unacknowledged survives: the state is always "durable prefix + waiting tail".

A store that keeps failing (full disk, read-only filesystem, I/O errors, etcd out of space)
puts the ledger in a failing state: every change is refused at once with the cause, the
cause is logged once and then at most every LOG_EVERY seconds, and a repair task retries
with exponential backoff (capped at RETRY_MAX seconds) by writing one harmless entry (the
limits in force, unchanged). Only when that write succeeds are changes taken again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from chunkmaster.core.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from chunkmaster.core.errors import UnavailableError
from chunkmaster.core.events import Configure, Event
from chunkmaster.core.master_state import MasterState
from chunkmaster.core.model import Task
from chunkmaster.core.state import apply
from chunkmaster.master.outage import StoreOutage
from chunkmaster.store.base import NotLeaderError, Store, StoreError

log = logging.getLogger("chunkmaster.ledger")
T = TypeVar("T")

MIN_COMPACT_ENTRIES = 10_000
RETRY_FIRST = 0.1  # seconds before the first retry of a failing store
RETRY_MAX = 5.0  # the backoff's cap: how long a store that works again may wait to be used
LOG_EVERY = 30.0  # seconds between two log lines about the same, continuing failure
LAZY_FLUSH = 0.1  # seconds a batch of events nobody waits for waits for company


Result = Task | bool | int | None  # what `apply` returns for an event


class LedgerSubscriber(Protocol):
    """What a part of the master hears of the ledger. A part subscribes once
    (`Ledger.subscribe`); subclassing this class gives it hooks that do nothing, for it to
    override those it needs."""

    def state_changed(self) -> None:
        """After every event applied, and after the state was rebuilt."""
        return None

    def state_rebuilt(self) -> None:
        """After the state was rebuilt from the store (a failed write, a replacement), before
        `state_changed`."""
        return None

    def store_writable(self) -> None:
        """When a failing store takes writes again."""
        return None

    def event_applied(self, event: Event, result: Result) -> None:
        """With each event `submit` applied and its result (metrics count them)."""
        return None

    def batch_written(self, entries: int, seconds: float) -> None:
        """With each batch written and the seconds its write took (metrics time them)."""
        return None


class Ledger:
    def __init__(
        self,
        store: Store,
        *,
        compact_min: int = MIN_COMPACT_ENTRIES,
        retry_first: float = RETRY_FIRST,
        retry_max: float = RETRY_MAX,
        log_every: float = LOG_EVERY,
        lazy_flush: float = LAZY_FLUSH,
    ) -> None:
        self.store = store
        self._state = MasterState()
        self.seq = 0  # last applied entry
        self.durable_seq = 0  # last entry the store acknowledged
        self.entries_since_snapshot = 0
        self.compact_min = compact_min
        #: a store refusing writes (times are time.monotonic())
        self.outage = StoreOutage(retry_first, retry_max, log_every)
        self._subscribers: list[LedgerSubscriber] = []
        self._lazy_flush = lazy_flush
        self._queue: list[tuple[int, bytes]] = []
        self._queue_done: asyncio.Future[None] | None = None
        self._queue_urgent = False  # somebody waits for an event of the queue
        self._hurry: asyncio.Future[None] | None = None  # the lazy wait, while it lasts
        #: the batch being written: its last entry, and the future its waiters share
        self._writing: tuple[int, asyncio.Future[None]] | None = None
        self._awaited_seq = 0  # the last entry submitted that is not lazy
        self._flusher: asyncio.Task[None] | None = None
        self._repair: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def state(self) -> MasterState:
        """The state, for reading: it changes only by the events this ledger applies."""
        return self._state

    def subscribe(self, subscriber: LedgerSubscriber) -> None:
        """Call `subscriber`'s hooks from now on, after those of the parts before it."""
        self._subscribers.append(subscriber)

    async def recover(self, *, level: int = logging.INFO) -> None:
        """Load snapshot + journal from the store. Raises StoreError / CodecError."""
        rec = await self.store.load()
        state = MasterState() if rec.snapshot is None else decode_snapshot(rec.snapshot)
        seq = rec.snapshot_seq
        for entry_seq, data in rec.entries:
            if entry_seq != seq + 1:
                raise UnavailableError(f"journal gap after entry {seq} (next is {entry_seq})")
            apply(state, decode_event(data))
            seq = entry_seq
        self._state, self.seq, self.durable_seq = state, seq, seq
        self._awaited_seq = min(self._awaited_seq, seq)  # the tail dropped is waited for no more
        self.entries_since_snapshot = len(rec.entries)
        log.log(
            level,
            "recovered state at entry %d (snapshot at %d + %d journal entries)",
            seq,
            rec.snapshot_seq,
            len(rec.entries),
        )

    @property
    def available(self) -> bool:
        return self.outage.error is None and not self._closed

    def unavailable(self) -> UnavailableError:
        """The error for a change refused now, with the store's cause."""
        out = self.outage
        if out.error is None:
            return UnavailableError("master cannot persist changes: it is shutting down")
        retry = ""
        if out.next_retry_at is not None:
            retry = f"; retrying in {max(0.0, out.next_retry_at - time.monotonic()):.1f}s"
        return UnavailableError(f"master cannot persist changes: {out.error}{retry}")

    async def commit(self, event: Event) -> Result:
        """Apply `event` now; return its result once it is durable (else raise)."""
        result, durable = self.submit(event)
        await durable
        return result

    def submit(self, event: Event, *, lazy: bool = False) -> tuple[Result, Awaitable[None]]:
        """Apply `event` now, synchronously; the awaitable completes once it is durable.

        For callers that must act on the result before yielding (e.g. arm a timer), so
        that neither a concurrent caller nor a cancellation can come in between. `lazy`:
        nobody waits for this one; it is written with the next event that is not lazy, or
        within LAZY_FLUSH seconds (a crash of the master meanwhile loses it).
        """
        if not self.available:
            raise self.unavailable()
        data = encode_event(event)
        result = apply(self._state, event)
        self.seq += 1
        self._queue.append((self.seq, data))
        if self._queue_done is None:
            self._queue_done = asyncio.get_running_loop().create_future()
        done = self._queue_done
        if not lazy:
            self._awaited_seq = self.seq
            self._hurry_up()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name="ledger-flush")
        for sub in self._subscribers:
            sub.state_changed()
        for sub in self._subscribers:
            sub.event_applied(event, result)
        return result, asyncio.shield(done)  # one caller's cancellation must not fail the batch

    async def _flush_loop(self) -> None:
        # One turn of the event loop first: the events that callers made ready together (a
        # session's finishes and the dispatch they ride with) then share one write.
        await asyncio.sleep(0)
        while self._queue:
            if not self._queue_urgent:
                self._hurry = asyncio.get_running_loop().create_future()
                try:
                    await asyncio.wait_for(self._hurry, self._lazy_flush)
                except TimeoutError:
                    pass
                finally:
                    self._hurry = None
            batch, done = self._queue, self._queue_done
            self._queue, self._queue_done, self._queue_urgent = [], None, False
            assert done is not None
            began = time.monotonic()
            self._writing = (batch[-1][0], done)
            try:
                await self.store.save(batch)
            except Exception as exc:
                self._writing = None
                self._fail(done, exc)
                return
            self._writing = None
            took = time.monotonic() - began
            for sub in self._subscribers:
                sub.batch_written(len(batch), took)
            self.durable_seq = batch[-1][0]
            self.entries_since_snapshot += len(batch)
            done.set_result(None)
            if not self._queue and self._should_compact():
                try:
                    await self._compact()
                except Exception as exc:  # the journal is intact; try again later
                    log.warning("compaction failed (journal kept, will retry): %s", exc)
                    self.entries_since_snapshot = 0

    def _hurry_up(self) -> None:
        """Write the queue as soon as the write in progress is over."""
        self._queue_urgent = True
        if self._hurry is not None and not self._hurry.done():
            self._hurry.set_result(None)

    async def sync(self) -> None:
        """Return once every event applied so far is durable, and every event applied
        meanwhile that somebody waits for (or raise as its write did): the state then holds
        nothing that is not durable but progress reports that came meanwhile, which are not
        waited for (under steady reports the queue is never empty, and their lazy delay is
        not the caller's)."""
        target = self.seq
        while self.available:
            want = max(target, self._awaited_seq)
            if self.durable_seq >= want:
                break
            writing = self._writing
            if writing is not None and writing[0] >= want:
                await asyncio.shield(writing[1])  # the write under way holds the last of them
            elif self._queue_done is not None:
                self._hurry_up()  # some are queued: written as soon as the write under way is
                await asyncio.shield(self._queue_done)
            elif writing is not None:
                await asyncio.shield(writing[1])
            else:
                break
        if not self.available:
            raise self.unavailable()

    def written(self) -> Awaitable[None]:
        """What a request that applies nothing awaits before its answer: the changes applied
        so far made durable. A retry (its first answer lost) finds its first try's events
        applied, maybe not yet written, and must not be answered before them."""
        if self.durable_seq >= self._awaited_seq:
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return started(self.sync())

    async def replace(self, events: list[Event]) -> None:
        """Start over from `events` on an empty state, dropping the state the store holds:
        one snapshot of the new state, written over the journal (a restore that replaces)."""
        self._hurry_up()
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait([self._flusher])
        if not self.available:
            raise self.unavailable()
        state = MasterState()
        for ev in events:
            apply(state, ev)
        await self.store.compact(encode_snapshot(state), self.seq)
        self._state = state
        self.durable_seq = self.seq
        self.entries_since_snapshot = 0
        self._notify_reset()

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
        """A write failed: fail every waiter, refuse changes, and repair in the background."""
        cause = _cause(exc)
        err = UnavailableError(f"master could not persist the change: {cause}")
        waiting = [done] if self._queue_done is None else [done, self._queue_done]
        for fut in waiting:
            fut.set_exception(err)
            fut.exception()  # mark it retrieved: its waiters may all have gone
        self._queue, self._queue_done, self._queue_urgent = [], None, False
        if isinstance(exc, NotLeaderError):
            self._lose_leadership(exc)
            return
        self.outage.begin(cause, time.monotonic())
        log.error(
            "store write failed: %s. Refusing changes and retrying with backoff until the "
            "store works again (nothing acknowledged is lost)",
            cause,
        )
        if self._repair is None or self._repair.done():
            self._repair = asyncio.create_task(self._repair_loop(), name="ledger-repair")

    def _lose_leadership(self, exc: Exception) -> None:
        self.outage.refuse_for_good(f"no longer the leader: {exc}")
        log.critical("lost the master lock: %s; refusing every change from now on", exc)

    async def _repair_loop(self) -> None:
        """Rebuild the durable state, then probe with one write, backing off between tries."""
        delay = self.outage.retry_first
        rebuilt = False
        while not self._closed:
            try:
                if not rebuilt:
                    # drops the tail that was never acknowledged
                    await self.recover(level=logging.DEBUG)
                    rebuilt = True
                    self._notify_reset()
                self.outage.next_retry_at = time.monotonic() + delay
                await asyncio.sleep(delay)
                await self._probe()
            except NotLeaderError as exc:
                self._lose_leadership(exc)
                return
            except Exception as exc:
                # A failed probe may still have reached the store: rebuild before the next.
                rebuilt = False
                delay = self.outage.backoff(delay)
                self._note_failure(exc, delay)
                continue
            log.warning(
                "store is writable again after %d failed attempt(s) over %.1fs; taking "
                "changes again at entry %d",
                self.outage.attempts,
                self.outage.lasted(time.monotonic()),
                self.seq,
            )
            self.outage.end()
            self._notify_reset()
            for sub in self._subscribers:
                sub.store_writable()
            return

    async def _probe(self) -> None:
        """Journal the limits in force, unchanged: a real write that changes nothing."""
        event = Configure(self.state.failure_max, self.state.failed_policy)
        seq = self.seq + 1
        await self.store.save([(seq, encode_event(event))])
        apply(self._state, event)
        self.seq = self.durable_seq = seq
        self.entries_since_snapshot += 1

    def _note_failure(self, exc: Exception, delay: float) -> None:
        cause = _cause(exc)
        now = time.monotonic()
        if self.outage.failed_again(cause, now):
            log.error(
                "store still failing (%d attempts over %.0fs): %s; next try in %.1fs",
                self.outage.attempts,
                self.outage.lasted(now),
                cause,
                delay,
            )

    def _notify_reset(self) -> None:
        for sub in self._subscribers:
            sub.state_rebuilt()
        for sub in self._subscribers:
            sub.state_changed()

    async def close(self) -> None:
        """Write what is queued, then stop; later commits are refused."""
        self._hurry_up()
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait([self._flusher])
        self._closed = True
        if self._repair is not None:
            self._repair.cancel()


def _cause(exc: Exception) -> str:
    """The failure in the user's terms: a store's own message names its file or endpoint."""
    if isinstance(exc, StoreError) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def started(aw: Awaitable[T]) -> asyncio.Future[T]:
    """`aw` running now, whether or not anyone awaits it: a write's failure is the ledger's to
    report, and must not be logged again as an exception nobody retrieved."""
    fut = asyncio.ensure_future(aw)
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return fut


async def after(durable: Awaitable[None] | None, result: int) -> int:
    """`result`, once `durable` (the write of the events that gave it) is."""
    if durable is not None:
        await durable
    return result

"""Leader election on etcd: a lease, the lock on it, and the fence every write goes through.

The lock is the etcd ``concurrency.Mutex`` recipe (same key shape as the Go master): each
candidate puts ``<lock prefix><lease-hex>`` on its own lease, and the lowest create revision
holds the lock. A standby watches the deletion of the key just before its own and takes over
at once.

Fencing: every write is a transaction comparing the create revision of our lock key. The key is
attached to our lease, so once the lease is revoked or expires, or the key is deleted, every
write fails with `NotLeaderError` (and `lost` is set): a deposed master cannot overwrite its
successor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from chunkmaster.etcd.connection import EtcdCompacted, EtcdConnection, EtcdWatch
from chunkmaster.etcd.keys import KeyLayout
from chunkmaster.etcd.protocol import (
    EVENT_DELETE,
    SORT_BY_CREATE,
    SORT_DESCEND,
    cmp_create_revision,
    op_put,
    op_range,
    prefix_end,
)
from chunkmaster.store.base import NotLeaderError, StoreError

__all__ = ["Election"]

log = logging.getLogger(__name__)


class Election:
    """One candidate for the master lock of a job, and, once it leads, the fence for writes.

    Order of use: `campaign()` → `publish_addr()` / `fenced()`... → `shutdown()`. Watch
    `lost`: once set, stop serving; every later fenced write raises NotLeaderError.
    """

    def __init__(self, conn: EtcdConnection, keys: KeyLayout, ttl_sec: int, timeout: float) -> None:
        if ttl_sec < 1:
            raise ValueError("ttl_sec must be at least 1")
        self.conn = conn
        self.keys = keys
        self.ttl_sec = int(ttl_sec)
        self.timeout = timeout
        #: Set the moment leadership is lost (lease gone, lock key gone, or a fence failed).
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self.lease_id = 0
        self.lock_key = b""
        self.lock_revision = 0
        self._leader = False
        self._closed = False
        self._lease_dead: asyncio.Event | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._lock_watch: EtcdWatch | None = None
        self._bg: set[asyncio.Task[Any]] = set()

    @property
    def is_leader(self) -> bool:
        return self._leader and not self.lost.is_set()

    @property
    def closed(self) -> bool:
        return self._closed

    async def campaign(self, timeout: float | None = None) -> None:
        """Block until this candidate holds the master lock (or `timeout` passes: TimeoutError).

        etcd being unreachable is retried with backoff: a standby should outlive an etcd restart.
        """
        if self._closed:
            raise StoreError("store is shut down")
        if self.lost.is_set():
            raise NotLeaderError("leadership was lost; a new store must campaign")
        if self._leader:
            return
        backoff = 0.05
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await self._campaign_once()
                    break
                except NotLeaderError:
                    raise
                except StoreError as exc:
                    if self._closed:
                        raise
                    log.warning("campaign for the master lock failed (%s); retrying", exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
        log.info("acquired the master lock %s (lease %x)", self.lock_key.decode(), self.lease_id)
        self._leader = True
        self._watch_task = asyncio.get_running_loop().create_task(self._watch_lock())

    async def _new_lease(self) -> None:
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.lease_id = await self.conn.lease_grant(self.ttl_sec)
        self._lease_dead = asyncio.Event()
        self.lock_key = self.keys.lock_prefix + b"%x" % self.lease_id
        self.lock_revision = 0
        self._keepalive_task = loop.create_task(
            self._keepalive(self.lease_id, self._lease_dead, started)
        )

    async def _campaign_once(self) -> None:
        if self.lease_id == 0 or self._lease_dead is None or self._lease_dead.is_set():
            await self._new_lease()
        assert self._lease_dead is not None
        lease_dead = self._lease_dead
        key = self.lock_key
        resp = await self.conn.txn(
            [cmp_create_revision(key, 0)],
            [op_put(key, b"", self.lease_id)],
            [op_range(key)],
        )
        if resp.succeeded:
            my_rev = int(resp.header.revision)
        else:
            my_rev = int(resp.responses[0].response_range.kvs[0].create_revision)
        self.lock_revision = my_rev
        announced = False
        while True:
            # The candidate just ahead of us; we hold the lock when there is none.
            ahead = await self.conn.range(
                self.keys.lock_prefix,
                prefix_end(self.keys.lock_prefix),
                sort_order=SORT_DESCEND,
                sort_target=SORT_BY_CREATE,
                max_create_revision=my_rev - 1,
                limit=1,
            )
            if not ahead.kvs:
                break
            if not announced:
                log.info("waiting for the master lock (held by %s)", ahead.kvs[0].key.decode())
                announced = True
            await self._wait_deleted(ahead.kvs[0].key, int(ahead.header.revision) + 1, lease_dead)
        mine = await self.conn.get(key)
        if mine is None or int(mine.create_revision) != my_rev or lease_dead.is_set():
            lease_dead.set()
            raise StoreError("our lease ended while waiting for the lock")

    async def _wait_deleted(self, key: bytes, from_rev: int, lease_dead: asyncio.Event) -> None:
        """Return once `key` is deleted (or our own lease died: the caller rechecks)."""
        try:
            watch = await self.conn.watch(key, start_revision=from_rev)
        except EtcdCompacted:
            return  # history is gone; the caller re-reads the candidates
        dead = asyncio.ensure_future(lease_dead.wait())
        try:
            while True:
                nxt = asyncio.ensure_future(watch.next())
                done, _ = await asyncio.wait({nxt, dead}, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in done:
                    nxt.cancel()
                    return
                if any(ev.type == EVENT_DELETE for ev in nxt.result()):
                    return
        finally:
            dead.cancel()
            watch.cancel()

    async def _keepalive(self, lease_id: int, dead: asyncio.Event, granted_at: float) -> None:
        """Refresh every TTL/3; declare the lease dead when refused or unrefreshed for a TTL."""
        loop = asyncio.get_running_loop()
        interval = max(self.ttl_sec / 3, 0.1)
        deadline = granted_at + self.ttl_sec
        reason = ""
        try:
            while True:
                now = loop.time()
                if now >= deadline:
                    reason = f"no keepalive answer for {self.ttl_sec}s"
                    break
                sent = now
                try:
                    ttl = await self.conn.lease_keepalive(
                        lease_id, timeout=max(0.05, min(self.timeout, deadline - now))
                    )
                except StoreError as exc:
                    log.warning("lease keepalive failed: %s", exc)
                    await asyncio.sleep(max(0.0, min(0.25, deadline - loop.time())))
                    continue
                if ttl <= 0:
                    reason = "lease expired or was revoked"
                    break
                deadline = sent + ttl
                await asyncio.sleep(interval)
        except asyncio.CancelledError:
            return
        dead.set()
        if self._leader:
            self._set_lost(reason)

    async def _watch_lock(self) -> None:
        """While leader: notice at once when our lock key disappears."""
        backoff = 0.05
        while not self.lost.is_set() and not self._closed:
            try:
                kv = await self.conn.get(self.lock_key)
                if kv is None or int(kv.create_revision) != self.lock_revision:
                    self._set_lost("our lock key is gone")
                    return
                rev = int(kv.mod_revision) + 1
                watch = await self.conn.watch(self.lock_key, start_revision=rev)
                self._lock_watch = watch
                backoff = 0.05
                try:
                    if self._closed:
                        return
                    while True:
                        events = await watch.next()
                        if any(ev.type == EVENT_DELETE for ev in events):
                            self._set_lost("our lock key was deleted (lease revoked or expired)")
                            return
                finally:
                    self._lock_watch = None
                    watch.cancel()
            except asyncio.CancelledError:
                return
            except StoreError as exc:
                log.debug("lock watch broke (%s); re-establishing", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _set_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self._leader = False
        self.lost_reason = reason
        log.error("lost the master lock: %s", reason)
        self.lost.set()
        if self._lease_dead is not None:
            self._lease_dead.set()
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        # Free the lock quickly in case etcd still thinks the lease is alive.
        if self.lease_id and not self._closed:
            self.spawn(self._revoke_quietly(self.lease_id))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` in the background until it ends or `shutdown()` cancels it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _revoke_quietly(self, lease_id: int) -> None:
        try:
            await self.conn.lease_revoke(lease_id, timeout=min(self.timeout, 2.0))
        except StoreError as exc:
            log.info("could not revoke lease %x: %s", lease_id, exc)

    async def publish_addr(self, addr: str) -> None:
        """Register `addr` at the address key, on our lease, so it vanishes with us."""
        await self.fenced([op_put(self.keys.addr, addr.encode(), self.lease_id)])
        log.info("published master address %s at %s", addr, self.keys.addr.decode())

    # --- fenced writes ----------------------------------------------------------------------

    def check_leader(self) -> None:
        """Raise NotLeaderError unless this candidate holds the lock."""
        if self._closed:
            raise NotLeaderError("store is shut down")
        if not self.is_leader:
            raise NotLeaderError(self.lost_reason or "this master does not hold the lock")

    async def fenced(self, ops: Sequence[Any]) -> Any:
        """Run `ops` only if our lock key is still ours; NotLeaderError otherwise."""
        self.check_leader()
        resp = await self.conn.txn([cmp_create_revision(self.lock_key, self.lock_revision)], ops)
        if not resp.succeeded:
            self._set_lost("a fenced write found our lock key gone")
            raise NotLeaderError("no longer holds the master lock")
        return resp

    async def shutdown(self) -> None:
        """Stop the background tasks and revoke the lease (frees the lock and the address at
        once). Leaves the connection open for its owner to close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._leader = False
        if self._lock_watch is not None:
            self._lock_watch.cancel()  # ends the stream even if a task cancel got lost in gRPC
        tasks = [t for t in (self._keepalive_task, self._watch_task, *self._bg) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)  # they all check closed; never hang here
        if self.lease_id:
            try:
                await self.conn.lease_revoke(self.lease_id, timeout=min(self.timeout, 3.0))
                log.info("released the master lock (lease %x revoked)", self.lease_id)
            except StoreError as exc:
                log.warning("could not revoke lease %x at shutdown: %s", self.lease_id, exc)

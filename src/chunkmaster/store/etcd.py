"""The etcd-backed journal store, with the leader lock that fences every write.

Key layout (``P`` is ``""`` without a job, ``/chunkmaster/<job>`` with one, so jobs sharing an
etcd never see each other's keys; paths are the constructor's, defaults shown)::

    P/master/lock/<lease-hex>        ""            lease  one per candidate; lowest create rev holds
    P/master/addr                    "ip:port"     lease  the leader's RPC address (gone with it)
    P/master/state/snap              manifest JSON        {seq, gen, parts, size, crc}
    P/master/state/s/<gen>/<i:08>    snapshot part        ≤ 1 MiB each; one generation per compact
    P/master/state/j/<seq:020>       journal record       first seq of the record, see below
    P/master/state/p/<id>/<i:08>     journal part         ≤ 1 MiB, for records too big to inline

A journal record is one tagged value: ``E<entry>`` (one entry, the usual case), ``B<batch>``
(several entries, packed when a save has too many for one transaction) or ``R<json>`` (a
reference to parts holding a batch, for saves over the inline budget). Parts are written first,
under a fresh id nobody reads, then one small fenced transaction makes them visible, so every
request stays far below etcd's 1.5 MiB default limit and 128-op transaction limit, and a save is
all-or-nothing. Bytes written per save depend only on that save's entries.

Fencing: every write is a transaction comparing the create revision of our lock key. The key is
attached to our lease, so once the lease is revoked or expires, or the key is deleted, every
write fails with `NotLeaderError` (and `lost` is set): a deposed master cannot overwrite its
successor. The lock is the etcd ``concurrency.Mutex`` recipe (same key shape as the Go master):
a standby watches the deletion of the key just before its own and takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import struct
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chunkmaster.store.base import NotLeaderError, Recovered, StoreError
from chunkmaster.store.etcd_client import (
    EVENT_DELETE,
    SORT_ASCEND,
    SORT_BY_CREATE,
    SORT_BY_KEY,
    SORT_DESCEND,
    EtcdCompacted,
    EtcdConnection,
    EtcdWatch,
    cmp_create_revision,
    op_delete,
    op_put,
    op_range,
    prefix_end,
)

__all__ = [
    "DEFAULT_ADDR_PATH",
    "DEFAULT_LOCK_PATH",
    "DEFAULT_STATE_PATH",
    "JOB_ROOT",
    "EtcdStore",
    "KeyLayout",
    "get_key",
]

log = logging.getLogger(__name__)

DEFAULT_LOCK_PATH = "/master/lock"
DEFAULT_ADDR_PATH = "/master/addr"
DEFAULT_STATE_PATH = "/master/state"
JOB_ROOT = "/chunkmaster"

PART_SIZE = 1024 * 1024  # one part per request: < 1.5 MiB with all overheads
INLINE_MAX = 256 * 1024  # larger entries go to parts
TXN_INLINE_BUDGET = 1024 * 1024  # total inline bytes in one transaction
TXN_MAX_PUTS = 100  # etcd's default --max-txn-ops is 128; leave room for compare/deletes
JOURNAL_WINDOW = 1024  # sequence numbers per journal read (see _scan_journal)
JOURNAL_PAGE_KEYS = 256  # journal records are small: fewer, larger pages (each < 64 MiB)
READ_PAGE_KEYS = 32  # ≤ 32 MiB per read response (parts are ≤ 1 MiB, inline values ≤ 256 KiB)
PARALLEL_PARTS = 4  # part writes in flight at once
KEEP_REVISIONS = 1000  # etcd history kept behind the latest snapshot switch

_BATCH_HEADER = struct.Struct(">QQ")  # seq, length


@dataclass(frozen=True)
class KeyLayout:
    """Every key the store touches, derived from the job name and the three paths."""

    root: str
    lock_prefix: bytes
    addr: bytes
    state: bytes

    @classmethod
    def build(cls, job: str | None, lock_path: str, addr_path: str, state_path: str) -> KeyLayout:
        if job is not None and (not job or "/" in job):
            raise ValueError(f"bad job name {job!r}: must be non-empty without '/'")
        root = f"{JOB_ROOT}/{job}" if job else ""
        for path in (lock_path, addr_path, state_path):
            if not path.startswith("/") or path.endswith("/"):
                raise ValueError(f"etcd path {path!r} must start and not end with '/'")
        return cls(
            root=root,
            lock_prefix=(root + lock_path + "/").encode(),
            addr=(root + addr_path).encode(),
            state=(root + state_path).encode(),
        )

    @property
    def journal(self) -> bytes:
        return self.state + b"/j/"

    @property
    def journal_parts(self) -> bytes:
        return self.state + b"/p/"

    @property
    def snap_manifest(self) -> bytes:
        return self.state + b"/snap"

    @property
    def snap_parts(self) -> bytes:
        return self.state + b"/s/"

    def journal_key(self, seq: int) -> bytes:
        return self.journal + b"%020d" % seq


async def get_key(client: Any, key: str | bytes, timeout: float) -> bytes | None:
    """Read one key's value with a deadline; works with `EtcdConnection` and `aetcd.Client`."""
    raw = key.encode() if isinstance(key, str) else key
    try:
        async with asyncio.timeout(timeout):
            kv = await client.get(raw)
    except TimeoutError as exc:
        raise StoreError(f"reading {raw!r} from etcd timed out after {timeout}s") from exc
    return None if kv is None else bytes(kv.value)


def _encode_batch(entries: Sequence[tuple[int, bytes]]) -> bytes:
    out = bytearray()
    for seq, data in entries:
        out += _BATCH_HEADER.pack(seq, len(data))
        out += data
    return bytes(out)


def _decode_batch(blob: bytes) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    pos, view = 0, memoryview(blob)
    while pos < len(blob):
        if pos + _BATCH_HEADER.size > len(blob):
            raise StoreError("corrupt journal batch: truncated header")
        seq, size = _BATCH_HEADER.unpack_from(blob, pos)
        pos += _BATCH_HEADER.size
        if pos + size > len(blob):
            raise StoreError("corrupt journal batch: truncated entry")
        out.append((seq, bytes(view[pos : pos + size])))
        pos += size
    return out


class EtcdStore:
    """A `Store` on etcd, plus the leader election around it. See the module docstring.

    Order of use: `campaign()` → `load()` → `publish_addr()` → `save()`/`compact()`... →
    `shutdown()`. Watch `lost`: once set, stop serving; every later write raises NotLeaderError.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        addr: str,
        lock_path: str = DEFAULT_LOCK_PATH,
        addr_path: str = DEFAULT_ADDR_PATH,
        state_path: str = DEFAULT_STATE_PATH,
        ttl_sec: int = 60,
        *,
        job: str | None = None,
        timeout: float = 5.0,
        ca_cert: str | None = None,
        cert_key: str | None = None,
        cert_cert: str | None = None,
        user: str | None = None,
        password: str | None = None,
        keep_revisions: int = KEEP_REVISIONS,
    ) -> None:
        if ttl_sec < 1:
            raise ValueError("ttl_sec must be at least 1")
        self.addr = addr
        self.job = job
        self.ttl_sec = int(ttl_sec)
        self.timeout = timeout
        self.keep_revisions = keep_revisions
        self.keys = KeyLayout.build(job, lock_path, addr_path, state_path)
        self.conn = EtcdConnection(
            endpoints,
            timeout=timeout,
            ca_cert=ca_cert,
            cert_key=cert_key,
            cert_cert=cert_cert,
            user=user,
            password=password,
        )
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
        self._write_lock = asyncio.Lock()
        self._groups: dict[int, int] = {}  # journal record first seq -> last seq
        self._snap_gen: str | None = None
        self._compacted_to = 0

    # --- leadership -------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader and not self.lost.is_set()

    def describe(self) -> str:
        job = self.job or "-"
        return (
            f"etcd {self.conn.describe()} job={job} state={self.keys.state.decode()} "
            f"lock={self.keys.lock_prefix.decode()} ttl={self.ttl_sec}s"
        )

    async def campaign(self, timeout: float | None = None) -> None:
        """Block until this store holds the master lock (or `timeout` passes: TimeoutError).

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
            self._spawn(self._revoke_quietly(self.lease_id))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _revoke_quietly(self, lease_id: int) -> None:
        try:
            await self.conn.lease_revoke(lease_id, timeout=min(self.timeout, 2.0))
        except StoreError as exc:
            log.info("could not revoke lease %x: %s", lease_id, exc)

    async def publish_addr(self) -> None:
        """Register `addr` at the address key, on our lease, so it vanishes with us."""
        await self._fenced([op_put(self.keys.addr, self.addr.encode(), self.lease_id)])
        log.info("published master address %s at %s", self.addr, self.keys.addr.decode())

    # --- fenced writes ----------------------------------------------------------------------

    def _check_leader(self) -> None:
        if self._closed:
            raise NotLeaderError("store is shut down")
        if not self.is_leader:
            raise NotLeaderError(self.lost_reason or "this master does not hold the lock")

    async def _fenced(self, ops: Sequence[Any]) -> Any:
        """Run `ops` only if our lock key is still ours; NotLeaderError otherwise."""
        self._check_leader()
        resp = await self.conn.txn([cmp_create_revision(self.lock_key, self.lock_revision)], ops)
        if not resp.succeeded:
            self._set_lost("a fenced write found our lock key gone")
            raise NotLeaderError("no longer holds the master lock")
        return resp

    async def _write_parts(self, prefix: bytes, blob: bytes) -> dict[str, Any]:
        """Write `blob` as ≤ PART_SIZE values under `prefix` (fenced); return its reference."""
        offsets = list(range(0, len(blob), PART_SIZE)) or [0]
        sem = asyncio.Semaphore(PARALLEL_PARTS)

        async def one(i: int, off: int) -> None:
            async with sem:
                part = blob[off : off + PART_SIZE]
                await self._fenced([op_put(prefix + b"%08d" % i, part)])

        tasks = [asyncio.ensure_future(one(i, off)) for i, off in enumerate(offsets)]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._spawn(self._delete_quietly(prefix))
            raise
        return {"parts": len(offsets), "size": len(blob), "crc": zlib.crc32(blob)}

    async def _delete_quietly(self, prefix: bytes) -> None:
        """Best-effort removal of parts nobody references (fenced, never raises)."""
        with contextlib.suppress(StoreError):
            await self._fenced([op_delete(prefix, prefix_end(prefix))])

    async def _read_parts(self, prefix: bytes, ref: dict[str, Any], revision: int) -> bytes:
        chunks: list[bytes] = []
        async for kv in self._scan(prefix, revision):
            chunks.append(bytes(kv.value))
        blob = b"".join(chunks)
        if (
            len(chunks) != ref["parts"]
            or len(blob) != ref["size"]
            or zlib.crc32(blob) != ref["crc"]
        ):
            raise StoreError(f"corrupt or incomplete parts under {prefix!r}")
        return blob

    async def _scan(self, prefix: bytes, revision: int, keys_only: bool = False) -> Any:
        """Yield every KeyValue under `prefix` in key order, a page at a time, at `revision`."""
        async for kv in self._scan_range(prefix, prefix_end(prefix), revision, keys_only):
            yield kv

    async def _scan_journal(self, revision: int) -> Any:
        """Yield the journal records in order, reading one window of sequence numbers at a time.

        etcd 3.4 visits every key of a range request's key range, whatever its limit, so paging
        through a long journal by limit alone costs O(n) per page. Windows of JOURNAL_WINDOW
        sequence numbers keep each request O(window); only a gap (after a record that packs
        many entries, or at the end) needs one look-ahead over the rest of the range.
        """
        journal = self.keys.journal
        start = journal
        while True:
            head = await self.conn.range(
                start, prefix_end(journal), revision=revision, limit=1, keys_only=True
            )
            if not head.kvs:
                return
            seq = int(bytes(head.kvs[0].key)[len(journal) :])
            while True:
                found = 0
                lo, hi = self.keys.journal_key(seq), self.keys.journal_key(seq + JOURNAL_WINDOW)
                async for kv in self._scan_range(lo, hi, revision, page=JOURNAL_PAGE_KEYS):
                    found += 1
                    yield kv
                seq += JOURNAL_WINDOW
                if not found:
                    break
            start = self.keys.journal_key(seq)

    async def _scan_range(
        self,
        start: bytes,
        end: bytes,
        revision: int,
        keys_only: bool = False,
        page: int = READ_PAGE_KEYS,
    ) -> Any:
        """Yield every KeyValue in [start, end) in key order, a page at a time."""
        while True:
            resp = await self.conn.range(
                start,
                end,
                revision=revision,
                limit=page,
                sort_order=SORT_ASCEND,
                sort_target=SORT_BY_KEY,
                keys_only=keys_only,
            )
            for kv in resp.kvs:
                yield kv
            if not resp.more or not resp.kvs:
                return
            start = bytes(resp.kvs[-1].key) + b"\0"

    # --- the Store protocol -----------------------------------------------------------------

    async def load(self) -> Recovered:
        """Snapshot + journal after it, read at one revision; also drops orphaned parts."""
        self._check_leader()
        async with self._write_lock:
            head = await self.conn.range(self.keys.snap_manifest)
            revision = int(head.header.revision)
            snapshot: bytes | None = None
            snap_seq = 0
            self._snap_gen = None
            if head.kvs:
                manifest = json.loads(bytes(head.kvs[0].value))
                self._snap_gen = str(manifest["gen"])
                snap_seq = int(manifest["seq"])
                prefix = self.keys.snap_parts + self._snap_gen.encode() + b"/"
                snapshot = await self._read_parts(prefix, manifest, revision)
            entries: list[tuple[int, bytes]] = []
            groups: dict[int, int] = {}
            refs: set[str] = set()
            async for kv in self._scan_journal(revision):
                first = int(bytes(kv.key)[len(self.keys.journal) :])
                value = bytes(kv.value)
                tag, body = value[:1], value[1:]
                if tag == b"E":
                    batch = [(first, body)]
                elif tag == b"B":
                    batch = _decode_batch(body)
                elif tag == b"R":
                    ref = json.loads(body)
                    refs.add(str(ref["id"]))
                    prefix = self.keys.journal_parts + str(ref["id"]).encode() + b"/"
                    batch = _decode_batch(await self._read_parts(prefix, ref, revision))
                else:
                    raise StoreError(f"corrupt journal record at {bytes(kv.key)!r}")
                if not batch or batch[0][0] != first:
                    raise StoreError(f"journal record at {bytes(kv.key)!r} does not match its key")
                groups[first] = batch[-1][0]
                entries.extend(e for e in batch if e[0] > snap_seq)
            for (a, _), (b, _) in itertools.pairwise(entries):
                if b <= a:
                    raise StoreError(f"journal out of order: {a} then {b}")
            self._groups = groups
            await self._collect_orphans(refs, revision)
        log.info(
            "loaded from etcd: snapshot %s bytes at seq %d, %d journal entries",
            0 if snapshot is None else len(snapshot),
            snap_seq,
            len(entries),
        )
        return Recovered(snapshot=snapshot, snapshot_seq=snap_seq, entries=tuple(entries))

    async def _collect_orphans(self, journal_refs: set[str], revision: int) -> None:
        """Delete part sets no record references (left by a crash between parts and switch)."""
        stale: list[bytes] = []
        for root, keep in (
            (self.keys.journal_parts, journal_refs),
            (self.keys.snap_parts, {self._snap_gen} if self._snap_gen else set()),
        ):
            seen: set[str] = set()
            async for kv in self._scan(root, revision, keys_only=True):
                name = bytes(kv.key)[len(root) :].split(b"/", 1)[0].decode()
                if name not in keep and name not in seen:
                    seen.add(name)
                    stale.append(root + name.encode() + b"/")
        for i in range(0, len(stale), TXN_MAX_PUTS):
            chunk = stale[i : i + TXN_MAX_PUTS]
            await self._fenced([op_delete(p, prefix_end(p)) for p in chunk])
        if stale:
            log.info("removed %d orphaned part sets", len(stale))

    async def save(self, entries: Sequence[tuple[int, bytes]]) -> None:
        """Append entries in one fenced transaction (after their parts, if they are large)."""
        if not entries:
            return
        seqs = [seq for seq, _ in entries]
        if any(b <= a for a, b in itertools.pairwise(seqs)) or seqs[0] < 1:
            raise ValueError("journal sequence numbers must be positive and ascending")
        async with self._write_lock:
            self._check_leader()
            first, last = seqs[0], seqs[-1]
            sizes = [len(data) for _, data in entries]
            parts_prefix: bytes | None = None
            if (
                len(entries) <= TXN_MAX_PUTS
                and max(sizes) < INLINE_MAX
                and sum(sizes) <= TXN_INLINE_BUDGET
            ):
                ops = [op_put(self.keys.journal_key(seq), b"E" + data) for seq, data in entries]
                new_groups = {seq: seq for seq in seqs}
                last_key = self.keys.journal_key(last)
            else:
                blob = _encode_batch(entries)
                if len(blob) < INLINE_MAX:
                    value = b"B" + blob
                else:
                    ref_id = uuid.uuid4().hex
                    parts_prefix = self.keys.journal_parts + ref_id.encode() + b"/"
                    ref = await self._write_parts(parts_prefix, blob)
                    value = b"R" + json.dumps({"id": ref_id, **ref}).encode()
                ops = [op_put(self.keys.journal_key(first), value)]
                new_groups = {first: last}
                last_key = self.keys.journal_key(first)
            # Drop any suffix left by an earlier save whose outcome was unknown (a timeout):
            # the journal must be exactly what the caller saved last.
            ops.append(op_delete(last_key + b"\0", prefix_end(self.keys.journal)))
            try:
                await self._fenced(ops)
            except BaseException:
                if parts_prefix is not None:
                    self._spawn(self._delete_quietly(parts_prefix))
                raise
            self._groups = {f: t for f, t in self._groups.items() if f < first}
            self._groups.update(new_groups)

    async def compact(self, snapshot: bytes, seq: int) -> None:
        """Write the snapshot as a new generation, switch the manifest, drop what it covers."""
        async with self._write_lock:
            self._check_leader()
            gen = f"{seq:020d}-{uuid.uuid4().hex[:12]}"
            prefix = self.keys.snap_parts + gen.encode() + b"/"
            ref = await self._write_parts(prefix, snapshot)
            manifest = json.dumps({"seq": seq, "gen": gen, **ref}).encode()
            # Records wholly covered by the snapshot go; one straddling `seq` stays (load
            # filters its early entries out).
            cut = self.keys.journal_key(seq + 1)
            for f, t in self._groups.items():
                if f <= seq < t:
                    cut = min(cut, self.keys.journal_key(f))
            ops = [
                op_put(self.keys.snap_manifest, manifest),
                op_delete(self.keys.journal, cut),
            ]
            if self._snap_gen is not None and self._snap_gen != gen:
                old = self.keys.snap_parts + self._snap_gen.encode() + b"/"
                ops.append(op_delete(old, prefix_end(old)))
            try:
                resp = await self._fenced(ops)
            except BaseException:
                self._spawn(self._delete_quietly(prefix))
                raise
            self._snap_gen = gen
            dropped = {f: t for f, t in self._groups.items() if t <= seq}
            self._groups = {f: t for f, t in self._groups.items() if t > seq}
            revision = int(resp.header.revision)
            if dropped:
                await self._drop_journal_parts(revision)
            await self._compact_history(revision)
        log.info("snapshot of %d bytes at seq %d stored as %s", len(snapshot), seq, gen)

    async def _drop_journal_parts(self, revision: int) -> None:
        """Remove part sets of journal records the snapshot made obsolete (best effort)."""
        try:
            refs: set[str] = set()
            async for kv in self._scan_journal(revision):
                value = bytes(kv.value)
                if value[:1] == b"R":
                    refs.add(str(json.loads(value[1:])["id"]))
            await self._collect_orphans(refs, revision)
        except StoreError as exc:
            log.warning("could not drop obsolete journal parts: %s", exc)

    async def _compact_history(self, revision: int) -> None:
        """Compact etcd's MVCC history so deleted journal keys and snapshots free their space.

        We keep `keep_revisions` of history so that short-lived watchers can resume; ours
        re-read the key on a compacted-revision error anyway.
        """
        target = revision - self.keep_revisions
        if target <= self._compacted_to:
            return
        try:
            await self.conn.compact(target)
            self._compacted_to = target
        except StoreError as exc:
            if "compacted" in str(exc):
                self._compacted_to = target
            else:
                log.warning("etcd history compaction to %d failed: %s", target, exc)

    async def shutdown(self) -> None:
        """Revoke the lease (frees the lock and the address at once) and close. Idempotent."""
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
            await asyncio.wait(tasks, timeout=1.0)  # they all check _closed; never hang here
        if self.lease_id:
            try:
                await self.conn.lease_revoke(self.lease_id, timeout=min(self.timeout, 3.0))
                log.info("released the master lock (lease %x revoked)", self.lease_id)
            except StoreError as exc:
                log.warning("could not revoke lease %x at shutdown: %s", self.lease_id, exc)
        await self.conn.close()

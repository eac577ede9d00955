"""The etcd-backed journal store: a `Store` on top of the election and chunked-value layers.

Key layout (``P`` is ``""`` without a job, ``/chunkmaster/<job>`` with one; see
`chunkmaster.etcd.keys`, paths are the constructor's, defaults shown)::

    P/master/lock/<lease-hex>        ""            lease  one per candidate; lowest create rev holds
    P/master/addr                    "ip:port"     lease  the leader's RPC address (gone with it)
    P/master/state/snap              manifest JSON        {seq, gen, parts, size, crc}
    P/master/state/s/<gen>/<i:08>    snapshot part        ≤ 1 MiB each; one generation per compact
    P/master/state/j/<seq:020>       journal record       first seq of the record, see below
    P/master/state/p/<id>/<i:08>     journal part         ≤ 1 MiB, for records too big to inline

A journal record is one tagged value: ``E<entry>`` (one entry, the usual case), ``B<batch>``
(several entries, packed when a save has too many for one transaction) or ``R<json>`` (a
reference to parts holding a batch, for saves over the inline budget). Parts are written first,
under a fresh id nobody reads (`chunkmaster.etcd.chunked`), then one small fenced transaction
makes them visible, so every request stays far below etcd's 1.5 MiB default limit and 128-op
transaction limit, and a save is all-or-nothing. Bytes written per save depend only on that
save's entries.

Every write goes through the fence of `chunkmaster.etcd.election`: once this master has lost
the lock, writes fail with `NotLeaderError` and never overwrite its successor's state.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from chunkmaster.etcd.chunked import PART_SIZE, Chunked
from chunkmaster.etcd.connection import EtcdConnection
from chunkmaster.etcd.election import Election
from chunkmaster.etcd.keys import (
    DEFAULT_ADDR_PATH,
    DEFAULT_LOCK_PATH,
    DEFAULT_STATE_PATH,
    KeyLayout,
)
from chunkmaster.etcd.options import EtcdOptions
from chunkmaster.etcd.protocol import op_delete, op_put, prefix_end
from chunkmaster.store.base import Recovered, StoreError

__all__ = ["PART_SIZE", "EtcdStore"]

log = logging.getLogger(__name__)

INLINE_MAX = 256 * 1024  # larger entries go to parts
TXN_INLINE_BUDGET = 1024 * 1024  # total inline bytes in one transaction
TXN_MAX_PUTS = 100  # etcd's default --max-txn-ops is 128; leave room for compare/deletes
JOURNAL_WINDOW = 1024  # sequence numbers per journal read (see _scan_journal)
JOURNAL_PAGE_KEYS = 256  # journal records are small: fewer, larger pages (each < 64 MiB)
KEEP_REVISIONS = 1000  # etcd history kept behind the latest snapshot switch

_BATCH_HEADER = struct.Struct(">QQ")  # seq, length


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
    """A `Store` on etcd, and the `Leadership` of the master that writes it.

    Order of use: `campaign()` → `load()` → `publish_addr()` → `save()`/`compact()`... →
    `shutdown()`. Watch `lost`: once set, stop serving; every later write raises NotLeaderError.
    """

    def __init__(
        self,
        options: EtcdOptions,
        *,
        ttl_sec: int = 60,
        job: str | None = None,
        timeout: float = 5.0,
        lock_path: str = DEFAULT_LOCK_PATH,
        addr_path: str = DEFAULT_ADDR_PATH,
        state_path: str = DEFAULT_STATE_PATH,
        keep_revisions: int = KEEP_REVISIONS,
    ) -> None:
        self.job = job
        self.keep_revisions = keep_revisions
        self.keys = KeyLayout.build(job, lock_path, addr_path, state_path)
        self.conn = EtcdConnection(options, timeout=timeout)
        self.election = Election(self.conn, self.keys, ttl_sec, timeout)
        self.parts = Chunked(self.conn, self.election)
        self._write_lock = asyncio.Lock()
        self._groups: dict[int, int] = {}  # journal record first seq -> last seq
        self._snap_gen: str | None = None
        self._compacted_to = 0

    # --- leadership (see chunkmaster.master.leadership) ---------------------------------------

    elected = True  # leading takes winning the election (master.leadership)

    @property
    def lost(self) -> asyncio.Event:
        """Set the moment leadership is lost (lease gone, lock key gone, or a fence failed)."""
        return self.election.lost

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    async def campaign(self, timeout: float | None = None) -> None:
        """Block until this store holds the master lock (or `timeout` passes: TimeoutError)."""
        await self.election.campaign(timeout)

    async def publish_addr(self, addr: str) -> None:
        """Register `addr` as the master's address, on our lease, so it vanishes with us."""
        await self.election.publish_addr(addr)

    def describe(self) -> str:
        job = self.job or "-"
        return (
            f"etcd {self.conn.describe()} job={job} state={self.keys.state.decode()} "
            f"lock={self.keys.lock_prefix.decode()} ttl={self.election.ttl_sec}s"
        )

    async def _scan_journal(self, revision: int) -> AsyncIterator[Any]:
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
                async for kv in self.parts.scan_range(lo, hi, revision, page=JOURNAL_PAGE_KEYS):
                    found += 1
                    yield kv
                seq += JOURNAL_WINDOW
                if not found:
                    break
            start = self.keys.journal_key(seq)

    # --- the Store protocol -----------------------------------------------------------------

    async def load(self) -> Recovered:
        """Snapshot + journal after it, read at one revision; also drops orphaned parts."""
        self.election.check_leader()
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
                snapshot = await self.parts.read(prefix, manifest, revision)
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
                    batch = _decode_batch(await self.parts.read(prefix, ref, revision))
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
            async for kv in self.parts.scan(root, revision, keys_only=True):
                name = bytes(kv.key)[len(root) :].split(b"/", 1)[0].decode()
                if name not in keep and name not in seen:
                    seen.add(name)
                    stale.append(root + name.encode() + b"/")
        for i in range(0, len(stale), TXN_MAX_PUTS):
            chunk = stale[i : i + TXN_MAX_PUTS]
            await self.election.fenced([op_delete(p, prefix_end(p)) for p in chunk])
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
            self.election.check_leader()
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
                    ref = await self.parts.write(parts_prefix, blob)
                    value = b"R" + json.dumps({"id": ref_id, **ref}).encode()
                ops = [op_put(self.keys.journal_key(first), value)]
                new_groups = {first: last}
                last_key = self.keys.journal_key(first)
            # Drop any suffix left by an earlier save whose outcome was unknown (a timeout):
            # the journal must be exactly what the caller saved last.
            ops.append(op_delete(last_key + b"\0", prefix_end(self.keys.journal)))
            try:
                await self.election.fenced(ops)
            except BaseException:
                if parts_prefix is not None:
                    self.parts.delete_later(parts_prefix)
                raise
            self._groups = {f: t for f, t in self._groups.items() if f < first}
            self._groups.update(new_groups)

    async def compact(self, snapshot: bytes, seq: int) -> None:
        """Write the snapshot as a new generation, switch the manifest, drop what it covers."""
        async with self._write_lock:
            self.election.check_leader()
            gen = f"{seq:020d}-{uuid.uuid4().hex[:12]}"
            prefix = self.keys.snap_parts + gen.encode() + b"/"
            ref = await self.parts.write(prefix, snapshot)
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
                resp = await self.election.fenced(ops)
            except BaseException:
                self.parts.delete_later(prefix)
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
        if self.election.closed:
            return
        await self.election.shutdown()
        await self.conn.close()

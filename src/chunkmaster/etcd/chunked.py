"""Values larger than one etcd request, stored as numbered parts under a prefix.

A blob is written as ``<prefix><i:08>`` values of at most PART_SIZE bytes, one fenced request
each, so every request stays far below etcd's 1.5 MiB default limit. The caller makes the parts
visible by writing a small reference to them (`{"parts", "size", "crc"}`) afterwards, so a
failed write leaves only parts nobody references; they are deleted on the spot when possible.
Reads page through a range at one revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator
from typing import Any

from chunkmaster.etcd.connection import EtcdConnection
from chunkmaster.etcd.election import Election
from chunkmaster.etcd.protocol import SORT_ASCEND, SORT_BY_KEY, op_delete, op_put, prefix_end
from chunkmaster.store.base import StoreError

__all__ = ["PART_SIZE", "READ_PAGE_KEYS", "Chunked"]

PART_SIZE = 1024 * 1024  # one part per request: < 1.5 MiB with all overheads
READ_PAGE_KEYS = 32  # ≤ 32 MiB per read response (parts are ≤ 1 MiB, inline values ≤ 256 KiB)
PARALLEL_PARTS = 4  # part writes in flight at once


class Chunked:
    """Part-wise writes fenced by `election`, and paged reads, on `conn`."""

    def __init__(self, conn: EtcdConnection, election: Election) -> None:
        self.conn = conn
        self.election = election

    async def write(self, prefix: bytes, blob: bytes) -> dict[str, Any]:
        """Write `blob` as ≤ PART_SIZE values under `prefix` (fenced); return its reference."""
        offsets = list(range(0, len(blob), PART_SIZE)) or [0]
        sem = asyncio.Semaphore(PARALLEL_PARTS)

        async def one(i: int, off: int) -> None:
            async with sem:
                part = blob[off : off + PART_SIZE]
                await self.election.fenced([op_put(prefix + b"%08d" % i, part)])

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
            self.delete_later(prefix)
            raise
        return {"parts": len(offsets), "size": len(blob), "crc": zlib.crc32(blob)}

    def delete_later(self, prefix: bytes) -> None:
        """Remove, in the background and best-effort, parts nobody references."""
        self.election.spawn(self._delete_quietly(prefix))

    async def _delete_quietly(self, prefix: bytes) -> None:
        with contextlib.suppress(StoreError):
            await self.election.fenced([op_delete(prefix, prefix_end(prefix))])

    async def read(self, prefix: bytes, ref: dict[str, Any], revision: int) -> bytes:
        """The blob `ref` describes, checked against its part count, size and CRC."""
        chunks: list[bytes] = []
        async for kv in self.scan(prefix, revision):
            chunks.append(bytes(kv.value))
        blob = b"".join(chunks)
        if (
            len(chunks) != ref["parts"]
            or len(blob) != ref["size"]
            or zlib.crc32(blob) != ref["crc"]
        ):
            raise StoreError(f"corrupt or incomplete parts under {prefix!r}")
        return blob

    def scan(self, prefix: bytes, revision: int, keys_only: bool = False) -> AsyncIterator[Any]:
        """Every KeyValue under `prefix` in key order, a page at a time, at `revision`."""
        return self.scan_range(prefix, prefix_end(prefix), revision, keys_only)

    async def scan_range(
        self,
        start: bytes,
        end: bytes,
        revision: int,
        keys_only: bool = False,
        page: int = READ_PAGE_KEYS,
    ) -> AsyncIterator[Any]:
        """Every KeyValue in [start, end) in key order, a page at a time, at `revision`."""
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

"""The etcd journal store against a real etcd: round trips, big values, compaction, quota."""

from __future__ import annotations

import os
from typing import Any

import pytest
from helpers.aio import run
from helpers.etcd_server import EtcdServer

from chunkmaster.etcd.chunked import PART_SIZE
from chunkmaster.etcd.connection import EtcdConnection
from chunkmaster.etcd.journal import EtcdStore
from chunkmaster.etcd.keys import DEFAULT_STATE_PATH
from chunkmaster.etcd.options import EtcdOptions
from chunkmaster.etcd.protocol import prefix_end
from chunkmaster.store.base import NotLeaderError, Store

MiB = 1024 * 1024


async def leader(endpoint: str, **kw: Any) -> EtcdStore:
    store = EtcdStore(EtcdOptions.parse(endpoint), ttl_sec=kw.pop("ttl_sec", 10), **kw)
    await store.campaign(timeout=10)
    return store


async def keys_under(endpoint: str, prefix: str) -> list[bytes]:
    conn = EtcdConnection(EtcdOptions.parse(endpoint))
    try:
        p = prefix.encode()
        resp = await conn.range(p, prefix_end(p), keys_only=True)
        return [bytes(kv.key) for kv in resp.kvs]
    finally:
        await conn.close()


def test_is_a_store(etcd_server: EtcdServer) -> None:
    store = EtcdStore(EtcdOptions.parse(etcd_server.endpoint))
    assert isinstance(store, Store)
    assert etcd_server.host_port in store.describe()


def test_load_requires_the_lock(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        store = EtcdStore(EtcdOptions.parse(etcd_server.host_port))  # host:port form, no scheme
        with pytest.raises(NotLeaderError):
            await store.load()
        with pytest.raises(NotLeaderError):
            await store.save([(1, b"a")])
        await store.shutdown()

    run(body())


def test_journal_round_trip_small_batched_and_huge(etcd_server: EtcdServer) -> None:
    huge = os.urandom(20 * MiB)  # the dataset entry: goes to parts
    many = [(i, b"e%05d" % i) for i in range(4, 304)]  # > 128 txn ops: packed in one record

    async def body() -> None:
        store = await leader(etcd_server.endpoint)
        first = await store.load()
        assert first.snapshot is None and first.snapshot_seq == 0 and list(first.entries) == []
        await store.save([(1, b"one"), (2, b""), (3, huge)])
        await store.save(many)
        await store.save([(304, b"last")])
        await store.shutdown()
        await store.shutdown()  # idempotent

        again = await leader(etcd_server.endpoint)
        got = await again.load()
        assert got.snapshot is None
        assert list(got.entries) == [(1, b"one"), (2, b""), (3, huge), *many, (304, b"last")]
        await again.shutdown()

    run(body(), timeout=60)


def test_compaction_splits_snapshot_and_drops_covered_entries(etcd_server: EtcdServer) -> None:
    snap1 = os.urandom(50 * MiB)
    snap2 = b"small snapshot"
    state = DEFAULT_STATE_PATH

    async def body() -> None:
        store = await leader(etcd_server.endpoint)
        await store.load()
        await store.save([(1, b"a"), (2, os.urandom(3 * MiB))])  # the second one has parts
        await store.save([(3, b"c")])
        await store.compact(snap1, 2)
        parts = await keys_under(etcd_server.endpoint, state + "/s/")
        assert len(parts) == 50 * MiB // PART_SIZE
        assert await keys_under(etcd_server.endpoint, state + "/p/") == []  # orphaned now: gone
        journal = await keys_under(etcd_server.endpoint, state + "/j/")
        assert journal == [f"{state}/j/{3:020d}".encode()]
        await store.save([(4, b"d")])
        await store.shutdown()

        again = await leader(etcd_server.endpoint)
        got = await again.load()
        assert got.snapshot == snap1 and got.snapshot_seq == 2
        assert list(got.entries) == [(3, b"c"), (4, b"d")]
        await again.compact(snap2, 4)
        assert len(await keys_under(etcd_server.endpoint, state + "/s/")) == 1  # old gen deleted
        assert await keys_under(etcd_server.endpoint, state + "/j/") == []
        await again.save([(5, b"e")])
        await again.shutdown()

        third = await leader(etcd_server.endpoint)
        got = await third.load()
        assert (got.snapshot, got.snapshot_seq, list(got.entries)) == (snap2, 4, [(5, b"e")])
        await third.shutdown()

    run(body(), timeout=60)


def test_snapshot_inside_a_batched_record_keeps_the_later_entries(
    etcd_server: EtcdServer,
) -> None:
    batch = [(i, b"x" * 10) for i in range(1, 201)]  # one packed record for seqs 1..200

    async def body() -> None:
        store = await leader(etcd_server.endpoint)
        await store.load()
        await store.save(batch)
        await store.compact(b"snap@100", 100)
        await store.shutdown()
        again = await leader(etcd_server.endpoint)
        got = await again.load()
        assert got.snapshot_seq == 100 and list(got.entries) == batch[100:]
        await again.shutdown()

    run(body())


def test_bytes_per_save_do_not_depend_on_dataset_size(etcd_server: EtcdServer) -> None:
    sent: list[int] = []

    async def body() -> None:
        store = await leader(etcd_server.endpoint)
        await store.load()
        await store.save([(1, os.urandom(20 * MiB))])
        await store.compact(os.urandom(30 * MiB), 1)
        original = store.conn.unary

        async def counting(stub: str, method: str, request: Any, timeout: Any = None) -> Any:
            if method == "Txn":
                sent.append(request.ByteSize())
            return await original(stub, method, request, timeout)

        store.conn.unary = counting  # type: ignore[method-assign]
        for seq in range(2, 102):
            await store.save([(seq, os.urandom(150))])
        await store.shutdown()

    run(body(), timeout=60)
    assert len(sent) == 100
    assert max(sent) < 400, sent  # key + 150-byte entry + fence + suffix delete


def test_failed_save_leaves_nothing_and_retry_after_unknown_outcome(
    etcd_server: EtcdServer,
) -> None:
    async def body() -> None:
        store = await leader(etcd_server.endpoint)
        await store.load()
        await store.save([(1, b"a"), (2, b"b"), (3, b"c")])
        # A later save reusing seq 2 (say after a timeout whose outcome was unknown) replaces
        # the old suffix: the journal is exactly what was saved last.
        await store.save([(2, b"B")])
        await store.shutdown()
        again = await leader(etcd_server.endpoint)
        assert list((await again.load()).entries) == [(1, b"a"), (2, b"B")]
        with pytest.raises(ValueError):
            await again.save([(3, b"x"), (3, b"y")])
        await again.shutdown()

    run(body())


def test_history_compaction_keeps_db_under_a_small_quota() -> None:
    quota = 64 * MiB
    entry = 32 * 1024
    saves = 3000  # 96 MiB of journal written through a 64 MiB quota
    with EtcdServer(quota_backend_bytes=quota) as server:

        async def body() -> tuple[list[int], int]:
            store = await leader(server.endpoint, keep_revisions=200)
            await store.load()
            payload = os.urandom(entry)
            for seq in range(1, saves + 1):
                await store.save([(seq, payload)])
                if seq % 250 == 0:
                    await store.compact(b"state after %d" % seq, seq)
            alarms = await store.conn.alarms()
            size = int((await store.conn.status()).dbSize)
            await store.shutdown()
            return alarms, size

        alarms, size = run(body(), timeout=60)
    assert saves * entry > quota
    assert alarms == []
    assert size < quota

"""The leader lock, fencing, the address key, job prefixes and etcd restarts, on real etcd."""

from __future__ import annotations

import asyncio
import logging
import time

import aetcd
import pytest
from helpers.aio import eventually, run
from helpers.etcd_server import EtcdServer

from chunkmaster.etcd.connection import EtcdConnection, get_key
from chunkmaster.etcd.journal import EtcdStore
from chunkmaster.etcd.keys import DEFAULT_ADDR_PATH
from chunkmaster.etcd.options import EtcdOptions
from chunkmaster.store.base import NotLeaderError, StoreError


async def read_raw(endpoint: str, key: str) -> bytes | None:
    conn = EtcdConnection(EtcdOptions.parse(endpoint))
    try:
        return await get_key(conn, key, 3.0)
    finally:
        await conn.close()


def test_t5_registered_address_is_readable_by_another_client(etcd_server: EtcdServer) -> None:
    """The Go TestNewServiceWithEtcd, with the address registered after campaign."""

    async def body() -> None:
        store = EtcdStore(EtcdOptions.parse(etcd_server.host_port), ttl_sec=30)
        await store.campaign(timeout=10)
        await store.load()
        await store.publish_addr("127.0.0.1:3306")
        client = aetcd.Client(host="127.0.0.1", port=etcd_server.client_port, timeout=3)
        try:
            assert await get_key(client, DEFAULT_ADDR_PATH, 3.0) == b"127.0.0.1:3306"
            got = await client.get(DEFAULT_ADDR_PATH.encode())
            assert got.lease == store.election.lease_id  # leased: it dies with the master
        finally:
            await client.close()
        await store.shutdown()
        assert await read_raw(etcd_server.endpoint, DEFAULT_ADDR_PATH) is None

    run(body())


def test_standby_takes_over_when_leader_shuts_down(
    etcd_server: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chunkmaster.etcd.election")

    async def body() -> float:
        a = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=30)
        b = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=30)
        await a.campaign(timeout=10)
        await a.load()
        await a.publish_addr("a:1")
        await a.save([(1, b"from a")])
        waiting = asyncio.create_task(b.campaign())
        # b is queued behind a: wait for its log line, then check it does not hold the lock.
        while "waiting for the master lock" not in caplog.text:
            await asyncio.sleep(0.01)
        await a.save([(2, b"still a")])
        assert not waiting.done() and not b.is_leader
        started = time.monotonic()
        await a.shutdown()
        await asyncio.wait_for(waiting, 10)
        took = time.monotonic() - started
        assert b.is_leader and not a.lost.is_set()
        got = await b.load()
        assert list(got.entries) == [(1, b"from a"), (2, b"still a")]
        await b.publish_addr("b:2")
        assert await read_raw(etcd_server.endpoint, DEFAULT_ADDR_PATH) == b"b:2"
        await b.shutdown()
        return took

    took = run(body())
    print(f"takeover after revoke on shutdown: {took * 1000:.1f} ms")


def test_lease_revoked_behind_our_back_fences_the_old_leader(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        a = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=30)
        b = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=30)
        await a.campaign(timeout=10)
        await a.load()
        await a.publish_addr("a:1")
        await a.save([(1, b"a1")])
        waiting = asyncio.create_task(b.campaign())

        other = EtcdConnection(EtcdOptions.parse(etcd_server.endpoint))
        started = time.monotonic()
        await other.lease_revoke(a.election.lease_id)
        await other.close()

        await asyncio.wait_for(a.lost.wait(), 10)  # noticed through the lock-key watch
        noticed = time.monotonic() - started
        assert not a.is_leader
        await asyncio.wait_for(waiting, 10)
        took = time.monotonic() - started
        print(f"revoked behind its back: lost after {noticed * 1000:.1f} ms, ", end="")
        print(f"standby leads after {took * 1000:.1f} ms")
        got = await b.load()
        assert list(got.entries) == [(1, b"a1")]
        await b.save([(2, b"b2")])
        with pytest.raises(NotLeaderError):
            await a.save([(2, b"a2 (stale leader)")])
        with pytest.raises(NotLeaderError):
            await a.compact(b"stale snapshot", 2)
        with pytest.raises(NotLeaderError):
            await a.publish_addr("a:1")
        await a.shutdown()
        await b.shutdown()

        c = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=30)
        await c.campaign(timeout=10)
        got = await c.load()
        assert got.snapshot is None and list(got.entries) == [(1, b"a1"), (2, b"b2")]
        await c.shutdown()

    run(body())


def test_fence_fails_even_before_the_watch_notices(etcd_server: EtcdServer) -> None:
    """Deleting the lock key (not the lease) makes the very next write fail."""

    async def body() -> None:
        a = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=30)
        await a.campaign(timeout=10)
        await a.load()
        if a.election._watch_task is not None:  # take the watch away: only the fence is left
            a.election._watch_task.cancel()
        other = EtcdConnection(EtcdOptions.parse(etcd_server.endpoint))
        await other.delete(a.election.lock_key)
        await other.close()
        with pytest.raises(NotLeaderError):
            await a.save([(1, b"x")])
        assert a.lost.is_set()
        await a.shutdown()

    run(body())


def test_jobs_are_isolated_by_prefix(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        one = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), job="one", ttl_sec=30)
        two = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), job="two", ttl_sec=30)
        await one.campaign(timeout=10)
        await two.campaign(timeout=10)  # both lead: different locks
        for store, name, addr in ((one, b"one", "one:1"), (two, b"two", "two:2")):
            await store.load()
            await store.publish_addr(addr)
            await store.save([(1, name)])
        await one.compact(b"snap one", 1)
        assert (await read_raw(etcd_server.endpoint, "/chunkmaster/one/master/addr")) == b"one:1"
        assert (await read_raw(etcd_server.endpoint, "/chunkmaster/two/master/addr")) == b"two:2"
        assert await read_raw(etcd_server.endpoint, DEFAULT_ADDR_PATH) is None
        await one.shutdown()
        await two.shutdown()
        again = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), job="two", ttl_sec=30)
        await again.campaign(timeout=10)
        got = await again.load()
        assert got.snapshot is None and list(got.entries) == [(1, b"two")]
        await again.shutdown()
        with pytest.raises(ValueError):
            EtcdStore(EtcdOptions.parse(etcd_server.endpoint), job="a/b")

    run(body())


def test_etcd_restart_fails_saves_then_recovers_without_loss(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        store = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=20, timeout=2.0)
        await store.campaign(timeout=10)
        await store.load()
        acked = []
        for seq in range(1, 11):
            await store.save([(seq, b"e%d" % seq)])
            acked.append((seq, b"e%d" % seq))
        etcd_server.kill()
        with pytest.raises(StoreError) as err:
            await store.save([(11, b"e11")])
        assert not isinstance(err.value, NotLeaderError)
        etcd_server.restart()
        await eventually(lambda: store.save([(11, b"e11")]))
        acked.append((11, b"e11"))
        await store.save([(12, b"e12")])
        acked.append((12, b"e12"))
        assert store.is_leader and not store.lost.is_set()
        await store.shutdown()

        again = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=20)
        await again.campaign(timeout=10)
        assert list((await again.load()).entries) == acked
        await again.shutdown()

    run(body(), timeout=45)


def test_hung_etcd_gives_a_timeout_not_a_hang(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        store = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=20, timeout=0.5)
        await store.campaign(timeout=10)
        await store.load()
        etcd_server.pause()
        try:
            with pytest.raises(StoreError):
                await store.save([(1, b"x")])
        finally:
            etcd_server.resume()
        await eventually(lambda: store.save([(1, b"x")]))
        await store.shutdown()

    run(body())


def test_lost_fires_when_keepalive_cannot_reach_etcd_for_a_ttl(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        store = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=1, timeout=0.5)
        await store.campaign(timeout=10)
        etcd_server.kill()  # no etcd at all: the lease cannot be refreshed
        await asyncio.wait_for(store.lost.wait(), 10)
        assert "keepalive" in store.election.lost_reason
        with pytest.raises(NotLeaderError):
            await store.save([(1, b"x")])
        await store.shutdown()

    run(body())


def test_failover_between_endpoints(etcd_server: EtcdServer) -> None:
    """A dead first endpoint is skipped: the store leads, and what it saves is in the live etcd."""
    from helpers.etcd_server import _free_ports

    dead = f"127.0.0.1:{_free_ports(1)[0]}"

    async def body() -> None:
        store = EtcdStore(EtcdOptions.parse([dead, etcd_server.endpoint]), ttl_sec=10)
        assert store.conn.current.target == dead  # the dead endpoint is tried first
        await store.campaign(timeout=10)
        assert store.is_leader
        assert store.conn.current.target == etcd_server.host_port  # moved on to the live one
        await store.load()
        await store.save([(1, b"x")])
        await store.publish_addr("a:1")
        assert await read_raw(etcd_server.endpoint, DEFAULT_ADDR_PATH) == b"a:1"
        await store.shutdown()
        # A store on the live endpoint alone finds the saved entry.
        again = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=10)
        await again.campaign(timeout=10)
        got = await again.load()
        assert list(got.entries) == [(1, b"x")]
        await again.shutdown()

    run(body())


def test_campaign_timeout_while_another_holds_the_lock(etcd_server: EtcdServer) -> None:
    async def body() -> None:
        a = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=30)
        b = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), ttl_sec=30)
        await a.campaign(timeout=10)
        with pytest.raises(TimeoutError):
            await b.campaign(timeout=0.3)
        assert not b.is_leader
        await b.shutdown()
        await a.save([(1, b"a still leads")])
        await a.shutdown()

    run(body())

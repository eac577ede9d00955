"""MasterLocator (trainer-side discovery) against a real etcd, from synchronous code."""

from __future__ import annotations

import asyncio
import time

from helpers.aio import run
from helpers.etcd_server import EtcdServer

from chunkmaster.etcd.connection import EtcdConnection
from chunkmaster.etcd.discovery import MasterLocator
from chunkmaster.etcd.journal import EtcdStore
from chunkmaster.etcd.keys import DEFAULT_ADDR_PATH
from chunkmaster.etcd.options import EtcdOptions

WAIT = 10.0
KEY = DEFAULT_ADDR_PATH.encode()


def put(endpoint: str, key: bytes, value: bytes) -> None:
    async def body() -> None:
        conn = EtcdConnection(EtcdOptions.parse(endpoint))
        try:
            await conn.put(key, value)
        finally:
            await conn.close()

    run(body())


def delete(endpoint: str, key: bytes) -> None:
    async def body() -> None:
        conn = EtcdConnection(EtcdOptions.parse(endpoint))
        try:
            await conn.delete(key)
        finally:
            await conn.close()

    run(body())


def test_follows_changes_deletes_and_rewrites(etcd_server: EtcdServer) -> None:
    ep = etcd_server.endpoint
    with MasterLocator(EtcdOptions.parse(ep), timeout=2.0) as loc:
        assert loc.wait_for_address(0.05) is None  # nothing registered yet, and no hang
        put(ep, KEY, b"10.0.0.1:8080")
        assert loc.wait_for_address(WAIT) == "10.0.0.1:8080"
        gen = loc.generation

        put(ep, KEY, b"10.0.0.2:8080")
        assert loc.wait_change("10.0.0.1:8080", WAIT) == "10.0.0.2:8080"
        assert loc.generation == gen + 1

        put(ep, KEY, b"10.0.0.2:8080")  # the same master came back at the same address
        assert loc.wait_generation(gen + 1, WAIT) == (gen + 2, "10.0.0.2:8080")

        delete(ep, KEY)
        assert loc.wait_change("10.0.0.2:8080", WAIT) is None
        assert loc.current() is None and loc.generation == gen + 3

        put(ep, KEY, b"")  # an empty value counts as no address
        put(ep, KEY, b"10.0.0.3:8080")
        assert loc.wait_change(None, WAIT) == "10.0.0.3:8080"


def test_follows_a_real_leader_and_its_death(etcd_server: EtcdServer) -> None:
    async def body(loc: MasterLocator) -> None:
        # The store lives in this loop; the locator's blocking waits run in worker threads.
        store = EtcdStore(EtcdOptions.parse(etcd_server.endpoint), job="j", ttl_sec=10)
        await store.campaign(timeout=10)
        await store.publish_addr("10.1.1.1:7000")
        assert await asyncio.to_thread(loc.wait_for_address, WAIT) == "10.1.1.1:7000"
        await store.shutdown()  # revoking the lease deletes the address
        assert await asyncio.to_thread(loc.wait_change, "10.1.1.1:7000", WAIT) is None

    with MasterLocator(EtcdOptions.parse(etcd_server.endpoint), job="j") as loc:
        run(body(loc))


def test_survives_an_etcd_restart(etcd_server: EtcdServer) -> None:
    ep = etcd_server.endpoint
    with MasterLocator(EtcdOptions.parse(ep), timeout=1.0) as loc:
        put(ep, KEY, b"a:1")
        assert loc.wait_for_address(WAIT) == "a:1"
        gen = loc.generation
        etcd_server.kill()
        etcd_server.restart()
        put(ep, KEY, b"b:2")  # maybe before the locator reconnected: it re-reads the key
        assert loc.wait_change("a:1", WAIT) == "b:2"
        assert loc.generation > gen
        # The watch is live again: a change after the reconnect arrives too.
        put(ep, KEY, b"c:3")
        assert loc.wait_change("b:2", WAIT) == "c:3"


def test_waits_return_while_etcd_is_down_and_close_is_prompt(etcd_server: EtcdServer) -> None:
    ep = etcd_server.endpoint
    loc = MasterLocator(EtcdOptions.parse(ep), timeout=0.5)
    put(ep, KEY, b"a:1")
    assert loc.wait_for_address(WAIT) == "a:1"
    etcd_server.kill()
    assert loc.wait_change("a:1", 0.2) == "a:1"  # times out, returns the unchanged value
    started = time.monotonic()
    loc.close()
    loc.close()  # idempotent
    assert not loc._thread.is_alive()
    assert loc.wait_for_address(WAIT) == "a:1"  # a closed locator never blocks
    assert time.monotonic() - started < WAIT

"""The master on etcd, as real processes: the address key, standby takeover, a lost lock, an
etcd outage. (Trainers following a failover are tested with the client, in test_failover.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aetcd
import pytest
from helpers.datasets import numbered_records
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess, wait_leader
from helpers.status_view import status_view

from chunkmaster import PassBeforeError, UnavailableError
from chunkmaster.client.connection import MasterConnection, TransportError
from chunkmaster.etcd.connection import get_key


def dataset(path: Path, n: int) -> str:
    return numbered_records(path, n, b"%04d")


def master(etcd: EtcdServer, *extra: str, ttl: int = 5) -> MasterProcess:
    return MasterProcess(
        ["--endpoints", etcd.endpoint, "--host", "127.0.0.1", "--ttl", str(ttl), *extra]
    )


def read_key(etcd: EtcdServer, key: str) -> bytes | None:
    async def main() -> bytes | None:
        host, port = etcd.host_port.split(":")
        async with aetcd.Client(host=host, port=int(port)) as client:
            return await get_key(client, key, 3.0)

    return asyncio.run(main())


def test_t5_the_registered_address_is_what_etcd_clients_read(etcd_server: EtcdServer) -> None:
    m = master(etcd_server).start()
    try:
        assert read_key(etcd_server, "/master/addr") == m.addr.encode()
        assert m.terminate() == 0
        assert read_key(etcd_server, "/master/addr") is None  # revoked with the lease
    finally:
        m.kill()


def test_job_prefix_namespaces_every_key(etcd_server: EtcdServer) -> None:
    a = master(etcd_server, "--job", "alpha").start()
    b = master(etcd_server, "--job", "beta").start()  # both lead: different jobs
    try:
        assert read_key(etcd_server, "/chunkmaster/alpha/master/addr") == a.addr.encode()
        assert read_key(etcd_server, "/chunkmaster/beta/master/addr") == b.addr.encode()
        assert read_key(etcd_server, "/master/addr") is None
    finally:
        a.kill()
        b.kill()


def test_standby_takes_over_with_the_state_after_sigkill_and_at_once_after_sigterm(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    data = dataset(tmp_path / "d.rio", 12)
    a = master(etcd_server, "--chunk-per-task", "1", "--task-timeout-dur", "1s").start()
    b = master(etcd_server, "--chunk-per-task", "1", "--task-timeout-dur", "1s").start(wait=False)
    c = master(etcd_server, "--chunk-per-task", "1", "--task-timeout-dur", "1s").start(wait=False)
    try:
        assert b.wait_log("waiting for the master lock") and c.wait_log(
            "waiting for the master lock"
        )
        with MasterConnection(a.addr) as conn:
            conn.set_dataset([data])
            tasks = [conn.get_task(0) for _ in range(5)]
            for t in tasks[:3]:
                conn.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
        a.kill()  # SIGKILL: the lease expires after the TTL
        new = wait_leader([b, c], 30)
        with MasterConnection(new.addr) as conn:
            st = status_view(conn.status())
            # the acknowledged finishes survive; the two pending tasks kept their deadlines
            # (1 s, long past after a TTL-long failover), so they come back by timeout
            assert st.done == 3 and st.pending + st.todo == 9
            finished = _drain_pass(conn, 0)
            assert sorted(finished) == sorted(set(range(12)) - {t.meta.id for t in tasks[:3]})
        standby = c if new is b else b
        assert new.terminate() == 0  # SIGTERM revokes the lease: no TTL wait
        assert standby.wait_serving(10)
        assert read_key(etcd_server, "/master/addr") == standby.addr.encode()
        with MasterConnection(standby.addr) as conn:
            assert status_view(conn.status()).cur_pass == 1
    finally:
        for m in (a, b, c):
            m.kill()


def test_a_master_that_loses_its_lock_stops_serving_and_stands_by(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    data = dataset(tmp_path / "d.rio", 4)
    a = master(etcd_server, ttl=30).start()
    b = master(etcd_server, ttl=30).start(wait=False)
    try:
        with MasterConnection(a.addr) as conn:
            conn.set_dataset([data])

        async def revoke_leader_lease() -> None:
            host, port = etcd_server.host_port.split(":")
            async with aetcd.Client(host=host, port=int(port)) as client:
                holders = await client.get_prefix(
                    b"/master/lock/", sort_order="ascend", sort_target="create"
                )
                await client.revoke_lease(holders[0].lease)  # behind the leader's back

        assert b.wait_log("waiting for the master lock")  # b is next in line
        asyncio.run(revoke_leader_lease())
        assert a.wait_log("lost the master lock")
        assert b.wait_serving(15)
        with MasterConnection(b.addr) as conn:
            st = status_view(conn.status())
            assert st.ready and st.num_tasks == 4  # the dataset set on a: 4 chunks, 1 a task
        assert a.wait_log("campaigning for the master lock again, as a standby")
        assert a.running  # a standby now, not an exited process
        assert b.terminate() == 0  # revokes b's lease: the standby need not wait for its TTL
        assert a.wait_serving(30)
        with MasterConnection(a.addr) as conn:
            assert status_view(conn.status()).num_tasks == 4
    finally:
        a.kill()
        b.kill()


def test_etcd_outage_refuses_changes_then_carries_on(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    data = dataset(tmp_path / "d.rio", 6)
    a = master(etcd_server, "--chunk-per-task", "1", ttl=60).start()
    try:
        with MasterConnection(a.addr, timeout=5) as conn:
            conn.set_dataset([data])
            t = conn.get_task(0)
            assert conn.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
            etcd_server.kill()
            with pytest.raises(UnavailableError):
                conn.get_task(0)
            st = status_view(conn.status())
            assert st.store.healthy is False and st.store.error
            etcd_server.restart()
            deadline = time.monotonic() + 30
            while not status_view(conn.status()).store.healthy:
                assert time.monotonic() < deadline, conn.status()["store"]
                time.sleep(0.05)
            st = status_view(conn.status())
            assert (st.done, st.pending, st.todo) == (1, 0, 5)  # nothing acked lost
            assert sorted(_drain_pass(conn, 0)) == sorted(set(range(6)) - {t.meta.id})
    finally:
        a.kill()


def _drain_pass(conn: MasterConnection, pass_id: int) -> list[int]:
    done = []
    while True:
        try:
            t = conn.get_task(pass_id, wait=20.0)
        except PassBeforeError:
            return done
        except (UnavailableError, TransportError):
            time.sleep(0.05)
            continue
        conn.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=pass_id)
        done.append(t.meta.id)

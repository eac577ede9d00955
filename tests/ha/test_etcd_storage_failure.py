"""etcd out of space (its backend quota reached, the NOSPACE alarm raised): the master on etcd
refuses changes with the cause, says so in status, logs the cause once and then rarely, and
resumes by itself once the operator frees space and disarms the alarm, losing nothing
acknowledged (issue 9: "same on etcd"). A full disk under etcd stops etcd itself; that case is
an etcd outage, soaked in bench/soak.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aetcd
import pytest
from helpers.datasets import numbered_records
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import UnavailableError

MiB = 1 << 20
QUOTA = 16 * MiB
NO_SPACE = "database space exceeded"


def finish_one(c: MasterConnection) -> int:
    t = c.get_task(0)
    assert c.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
    return t.meta.id


def _client(etcd: EtcdServer) -> aetcd.Client:
    host, port = etcd.host_port.split(":")
    return aetcd.Client(host=host, port=int(port))


def fill_etcd(etcd: EtcdServer) -> int:
    """Another tenant of the same etcd writes until the quota refuses it; the keys it wrote."""

    async def main() -> int:
        async with _client(etcd) as client:
            for i in range(10 * QUOTA // MiB):
                try:
                    await client.put(f"/other-tenant/{i}".encode(), bytes(MiB))
                except Exception as exc:  # aetcd raises its own class per gRPC status
                    assert NO_SPACE in str(exc), exc
                    return i
        raise AssertionError("etcd took 10x its quota")

    return asyncio.run(main())


def free_etcd(etcd: EtcdServer) -> None:
    """What an operator does: delete, compact, defragment, disarm the alarm."""

    async def main() -> None:
        async with _client(etcd) as client:
            deleted = await client.delete_prefix(b"/other-tenant/")
            await client.compact(deleted.header.revision, physical=True)
            await client.defragment()
            alarms = [alarm async for alarm in client.list_alarms()]
            for alarm in alarms:
                await client.disarm_alarm(alarm.member_id)

    asyncio.run(main())


def test_etcd_out_of_space_refuses_changes_says_why_and_resumes_by_itself(
    tmp_path: Path,
) -> None:
    data = numbered_records(tmp_path / "d.rio", 80, b"%03d")
    with EtcdServer(quota_backend_bytes=QUOTA) as etcd:
        args = ["--endpoints", etcd.endpoint, "--host", "127.0.0.1", "--ttl", "10"]
        master = MasterProcess([*args, "--chunk-per-task", "1"]).start()
        try:
            assert master.addr is not None
            with MasterConnection(master.addr) as c:
                c.set_dataset([data])
                acked = {finish_one(c) for _ in range(5)}
                assert fill_etcd(etcd) > 0
                with pytest.raises(UnavailableError, match=NO_SPACE):
                    for _ in range(20):
                        acked.add(finish_one(c))
                st = status_view(c.status())
                assert st.healthy is False and st.store.healthy is False
                assert NO_SPACE in st.store.error
                for _ in range(200):  # refused at once, with the cause
                    with pytest.raises(UnavailableError, match=NO_SPACE):
                        c.get_task(0)
                assert status_view(c.status()).store.failed_attempts < 20
                errors = [
                    ln for ln in master.log().splitlines() if "ERROR chunkmaster.ledger" in ln
                ]
                assert 1 <= len(errors) <= 3, errors
                assert NO_SPACE in errors[0]
                free_etcd(etcd)
                assert master.wait_log("store is writable again", timeout=60), master.log()
                assert status_view(c.status()).healthy is True
                acked |= {finish_one(c) for _ in range(3)}
                assert status_view(c.status()).done == len(acked)
            master.kill()
            master.start()
            assert master.addr is not None
            with MasterConnection(master.addr) as c:
                assert status_view(c.status()).done == len(acked)  # nothing acknowledged was lost
        finally:
            master.kill()

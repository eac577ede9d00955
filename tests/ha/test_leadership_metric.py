"""chunkmaster_leadership_changes_total as Prometheus scrapes it from masters on etcd: a master
serves metrics only while it leads, with a new registry each term, so the counter must start
each term from the process's count so far. (It was 1 at every term, and the alert
ChunkmasterLeadershipFlapping, an increase() over it, could never see a change.)"""

from __future__ import annotations

import asyncio
import urllib.request

import aetcd
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess
from prometheus_client.parser import text_string_to_metric_families

from chunkmaster.master.readiness import read_ready_file


def master(etcd: EtcdServer) -> MasterProcess:
    args = ["--endpoints", etcd.endpoint, "--host", "127.0.0.1", "--ttl", "30"]
    return MasterProcess([*args, "--metrics-port", "0"])


def changes(m: MasterProcess) -> float:
    """The counter in a scrape of the master's metrics (as it serves them now)."""
    info = read_ready_file(m.ready_file)
    assert info is not None
    with urllib.request.urlopen(f"http://{info['metrics_addr']}/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "chunkmaster_leadership_changes_total":
                return float(s.value)
    raise AssertionError("no chunkmaster_leadership_changes_total in the scrape")


def revoke_leader_lease(etcd: EtcdServer) -> None:
    async def main() -> None:
        host, port = etcd.host_port.split(":")
        async with aetcd.Client(host=host, port=int(port)) as client:
            holders = await client.get_prefix(
                b"/master/lock/", sort_order="ascend", sort_target="create"
            )
            await client.revoke_lease(holders[0].lease)  # behind the leader's back

    asyncio.run(main())


def test_the_leadership_changes_counter_grows_over_a_masters_terms(
    etcd_server: EtcdServer,
) -> None:
    a = master(etcd_server).start()
    b = master(etcd_server).start(wait=False)
    try:
        assert changes(a) == 1  # won
        assert b.wait_log("waiting for the master lock")
        revoke_leader_lease(etcd_server)
        assert a.wait_log("lost the master lock")
        assert b.wait_serving(15)
        assert changes(b) == 1
        assert a.wait_log("campaigning for the master lock again, as a standby")
        assert b.terminate() == 0  # SIGTERM revokes its lease: a leads again
        assert a.wait_serving(15)
        assert changes(a) == 3  # won, lost, won: what increase() over its series sees
    finally:
        a.kill()
        b.kill()

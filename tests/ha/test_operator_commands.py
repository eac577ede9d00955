"""The operator's commands on an HA deployment (issue 31, 1): `status`, `checkpoint save` and
`weights` find the master through etcd (`--endpoints`, `--job`), as `read` does, so a backup or
a re-weighting needs no lookup of the leader's address by hand; after the leader is SIGKILLed
they reach its successor. Without a master, or with --job but no etcd, they say so in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.cli import cli
from helpers.datasets import numbered_records
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess, wait_leader

from chunkmaster.client import Client, Connection
from chunkmaster.core.checkpoint import decode

TTL = 2


def start_master(etcd: EtcdServer, log: Path, *, wait: bool, job: str = "ops") -> MasterProcess:
    args = ["--endpoints", etcd.endpoint, "--job", job, "--host", "127.0.0.1", "--ttl", str(TTL)]
    return MasterProcess(args, log_path=log).start(wait=wait)


def test_operator_commands_reach_the_leader_through_etcd_and_its_successor(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    a = numbered_records(tmp_path / "a.rio", 40)
    b = numbered_records(tmp_path / "b.rio", 40)
    masters = [start_master(etcd_server, tmp_path / "m0.log", wait=True)]
    try:
        masters.append(start_master(etcd_server, tmp_path / "m1.log", wait=False))
        assert masters[1].wait_log("waiting for the master lock"), masters[1].log()
        where = ["--endpoints", etcd_server.endpoint, "--job", "ops"]
        with Client(
            etcd_endpoints=[etcd_server.endpoint],
            connection=Connection(etcd_job="ops"),
            session=False,
        ) as c:
            c.set_dataset({"a": str(a), "b": str(b)})
        leader = masters[0]
        for turn in range(2):
            st = cli("status", *where, "--json")
            assert st.returncode == 0, st.stderr
            assert json.loads(st.stdout)["num_tasks"] > 0
            saved = tmp_path / f"cp{turn}.ckpt"
            cp = cli(
                "checkpoint",
                "save",
                "--endpoints",
                etcd_server.endpoint,
                "--job",
                "ops",
                str(saved),
            )
            assert cp.returncode == 0, cp.stderr
            assert decode(saved.read_bytes()).mixture is not None
            w = cli(
                "weights", "--endpoints", etcd_server.endpoint, "--job", "ops", "--json", "a=3,b=1"
            )
            assert w.returncode == 0, w.stderr
            assert json.loads(w.stdout)["pass"] == 0
            if turn == 0:
                leader.kill()
                leader = wait_leader([m for m in masters if m.running])
        assert leader is not masters[0]
    finally:
        for m in masters:  # the successor too: no master outlives the test
            m.kill()


def test_without_a_master_or_without_etcd_they_say_so_in_one_line(
    etcd_server: EtcdServer,
) -> None:
    st = cli("status", "--endpoints", etcd_server.endpoint, "--job", "nobody", "--timeout", "1")
    assert st.returncode == 1
    assert st.stderr.strip().count("\n") == 0, st.stderr
    assert "no master address at" in st.stderr and "job 'nobody'" in st.stderr, st.stderr
    bad = cli("status", "--addr", "127.0.0.1:1", "--job", "ops")
    assert bad.returncode == 2 and "--job names a job in etcd: give --endpoints too" in bad.stderr

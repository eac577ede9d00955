"""The Service `chunkmaster` reaches the leader alone (issue 31): three `chunkmaster master`
processes on a real etcd, each asked the way the kubelet asks it, with the probe commands and the
variables of overlays/etcd's rendered StatefulSet. Exactly one is ready (`chunkmaster-health
--leader`), the leader, so a Service over the three routes to it alone; the standbys, with
nothing listening, are live (the liveness probe with CHUNKMASTER_HEALTH_STANDBY_OK) and not
ready. The leader SIGKILLed, exactly one other becomes ready once its lease has expired, the old
one is not ready, and `chunkmaster status --addr` at the ready one (where the Service would send
it) answers from the new leader with the job's state."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.cli import cli
from helpers.datasets import numbered_records
from helpers.deploy import server_pki
from helpers.etcd_server import EtcdServer
from helpers.kustomize import find, overlay
from helpers.master_process import MasterProcess, wait_leader

from chunkmaster.client import Client, Connection

TTL = 3
#: The certificate's name: what the probe checks (CHUNKMASTER_HEALTH_SERVER_NAME, rendered in
#: the overlay's namespace) and the Service's DNS name.
NAMESPACE = "training"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def manifest() -> tuple[list[str], list[str], dict[str, str]]:
    """overlays/etcd's readiness and liveness commands, and the variables the probes read."""
    objects = overlay("etcd")
    (c,) = find(objects, "StatefulSet", "chunkmaster")["spec"]["template"]["spec"]["containers"]
    env = {
        e["name"]: e["value"].replace("$(POD_NAMESPACE)", NAMESPACE)
        for e in c["env"]
        if e["name"].startswith("CHUNKMASTER_HEALTH_") or e["name"] == "CHUNKMASTER_TLS_CERT"
    }
    return c["readinessProbe"]["exec"]["command"], c["livenessProbe"]["exec"]["command"], env


class Probe:
    """The manifest's probes against one master, as the kubelet runs them: a process in the
    master's environment (its address from CHUNKMASTER_HOST and CHUNKMASTER_PORT), judged by
    its exit code."""

    def __init__(self, port: int, ca: str, cert: str) -> None:
        self.readiness, self.liveness, env = manifest()
        files = {"/etc/chunkmaster/tls/ca.crt": ca, "/etc/chunkmaster/tls/tls.crt": cert}
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKMASTER_")}
        self.env = {**clean, **{k: files.get(v, v) for k, v in env.items()}}
        self.env |= {"CHUNKMASTER_HOST": "127.0.0.1", "CHUNKMASTER_PORT": str(port)}

    def run(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        assert command[0] == "chunkmaster-health"
        return subprocess.run(
            [sys.executable, "-m", "chunkmaster.healthcheck", *command[1:]],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
        )

    def ready(self) -> bool:
        return self.run(self.readiness).returncode == 0

    def live(self) -> subprocess.CompletedProcess[str]:
        return self.run(self.liveness)


def test_the_leader_alone_is_ready_and_its_successor_after_a_sigkill(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    readiness, liveness, env = manifest()
    assert "--leader" not in liveness
    assert readiness[:2] == ["chunkmaster-health", "--leader"]
    assert env["CHUNKMASTER_HEALTH_STANDBY_OK"] == "1"  # the liveness probe's: standbys live
    ca, cert, key = server_pki(tmp_path, f"chunkmaster.{NAMESPACE}.svc", ips=("127.0.0.1",))
    token = tmp_path / "token"
    token.write_text("the-job-token-0123456789\n")
    common = ["--endpoints", etcd_server.endpoint, "--job", "svc", "--ttl", str(TTL)]
    common += ["--host", "127.0.0.1", "--tls-cert", cert, "--tls-key", key]
    common += ["--token-file", str(token)]
    masters: list[MasterProcess] = []
    probes: dict[int, Probe] = {}
    try:
        for i in range(3):
            port = free_port()
            m = MasterProcess(common, port=port, log_path=tmp_path / f"m{i}.log")
            masters.append(m.start(wait=i == 0))
            probes[id(m)] = Probe(port, ca, cert)
        for m in masters[1:]:
            assert m.wait_log("waiting for the master lock"), m.log()
        with Client(
            masters[0].addr, token=token.read_text().strip(), connection=Connection(tls_ca=ca)
        ) as c:
            c.set_dataset([str(numbered_records(tmp_path / "a.rio", 40))])

        assert _ready(masters, probes) == [masters[0]]
        for m in masters:
            live = probes[id(m)].live()
            assert live.returncode == 0, live.stderr
        standby = probes[id(masters[1])].run(readiness)
        assert standby.returncode == 1
        assert "nothing listening: not the leader" in standby.stderr, standby.stderr

        masters[0].kill()
        # The lease expires TTL seconds after the last keep-alive; then a standby recovers
        # (how long that takes is measured by bench/failover_bench.py, not asserted here).
        leader = wait_leader(masters[1:], timeout=TTL + 30)
        assert _ready(masters, probes) == [leader]
        assert not probes[id(masters[0])].ready()  # gone: nothing listens there any more
        (other,) = [m for m in masters[1:] if m is not leader]
        assert probes[id(other)].live().returncode == 0

        assert leader.addr is not None
        st = cli(
            "status", "--addr", leader.addr, "--tls-ca", ca, "--token-file", str(token), "--json"
        )
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["num_tasks"] > 0  # the job's state, from the new leader
    finally:
        for m in masters:
            m.kill()


def _ready(masters: list[MasterProcess], probes: dict[int, Any]) -> list[MasterProcess]:
    """The masters whose readiness probe passes (those a Service routes to)."""
    return [m for m in masters if probes[id(m)].ready()]

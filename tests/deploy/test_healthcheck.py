"""`chunkmaster-health`, the image's HEALTHCHECK and the Kubernetes manifests' exec probe, against
real master processes: with a token (the health service needs none), over TLS to a certificate
that names another host, and an etcd standby (which listens only once it leads)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.deploy import server_pki
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess

from chunkmaster.healthcheck import default_addr

#: The name the master's certificate carries, as a Kubernetes Service's DNS name would be.
SERVER_NAME = "chunkmaster.training.svc"


def probe(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The probe as Kubernetes and podman run it: a process, judged by its exit code."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKMASTER_")}
    return subprocess.run(
        [sys.executable, "-m", "chunkmaster.healthcheck", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_serving_master_is_healthy_without_the_token_and_a_stopped_one_is_not(
    master_process: Any, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("the-job-token-0123456789\n")
    m = master_process("--token-file", str(token))
    port = m.addr.rsplit(":", 1)[1]
    # The master's own variables are the defaults: a probe in its container takes no argument.
    ok = probe(CHUNKMASTER_PORT=port, CHUNKMASTER_HOST="0.0.0.0")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"127.0.0.1:{port}: SERVING"
    m.terminate()
    down = probe("--addr", f"127.0.0.1:{port}", "--timeout", "2")
    assert down.returncode == 1
    assert down.stderr.startswith(f"127.0.0.1:{port}: UNAVAILABLE"), down.stderr


def test_a_master_on_the_embedded_store_leads_for_the_leader_probe(master_process: Any) -> None:
    """overlays/embedded's readiness probe (`--leader`): its one master leads once it serves;
    nothing listening is not ready, --standby-ok or not (tests/deploy/test_leader_service.py
    has the masters on etcd)."""
    m = master_process()
    port = m.addr.rsplit(":", 1)[1]
    ok = probe("--leader", CHUNKMASTER_PORT=port)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"127.0.0.1:{port}: leading"
    m.terminate()
    down = probe(
        "--leader", "--timeout", "2", CHUNKMASTER_PORT=port, CHUNKMASTER_HEALTH_STANDBY_OK="1"
    )
    assert down.returncode == 1
    assert "nothing listening: not the leader" in down.stderr, down.stderr


def test_tls_needs_the_ca_and_the_certificates_name(master_process: Any, tmp_path: Path) -> None:
    ca, cert, key = server_pki(tmp_path, SERVER_NAME)
    token = tmp_path / "token"
    token.write_text("the-job-token-0123456789\n")
    m = master_process(
        "--tls-cert", cert, "--tls-key", key, "--token-file", str(token), "--host", "127.0.0.1"
    )
    addr = m.addr
    env = {"CHUNKMASTER_TLS_CERT": cert, "CHUNKMASTER_HEALTH_ADDR": addr}
    # The master's variables say TLS: without a CA the probe says what it needs, exit 2.
    bare = probe(**env)
    assert bare.returncode == 2
    assert "give --tls-ca (or CHUNKMASTER_HEALTH_TLS_CA)" in bare.stderr
    # The certificate names the Service, not 127.0.0.1: the handshake fails without the name...
    wrong = probe("--tls-ca", ca, "--timeout", "3", **env)
    assert wrong.returncode == 1, wrong.stdout
    # ...and passes with it, from the variables the manifests set.
    ok = probe(CHUNKMASTER_HEALTH_TLS_CA=ca, CHUNKMASTER_HEALTH_SERVER_NAME=SERVER_NAME, **env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"{addr}: SERVING"


def test_an_etcd_standby_is_alive_with_standby_ok_and_serving_once_it_leads(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """As overlays/etcd runs them: the probe's address from CHUNKMASTER_HOST, a DNS name
    (here localhost), which the master listens on and publishes once it leads."""
    common = ["--endpoints", etcd_server.endpoint, "--ttl", "2"]
    leader = MasterProcess([*common, "--host", "127.0.0.1"], log_path=tmp_path / "a.log").start()
    port = free_port()
    standby = MasterProcess(
        [*common, "--host", "localhost"], port=port, log_path=tmp_path / "b.log"
    ).start(wait=False)
    env = {"CHUNKMASTER_HOST": "localhost", "CHUNKMASTER_PORT": str(port)}
    try:
        assert standby.wait_log("state: etcd", timeout=30), standby.log()
        assert probe("--timeout", "2", **env).returncode == 1  # not serving: not ready
        alive = probe("--standby-ok", "--timeout", "2", **env)
        assert alive.returncode == 0, alive.stderr
        assert "nothing listening (a standby waiting to lead)" in alive.stdout
        leader.kill()
        assert standby.wait_serving(60), standby.log()
        assert standby.addr == f"localhost:{port}"  # the name, as published in etcd
        led = probe(CHUNKMASTER_HEALTH_STANDBY_OK="1", **env)
        assert led.returncode == 0, led.stderr
        assert led.stdout.strip() == f"localhost:{port}: SERVING"
    finally:
        leader.kill()
        standby.kill()


def test_default_address_from_the_masters_variables() -> None:
    assert default_addr({}) == "127.0.0.1:8080"
    assert default_addr({"CHUNKMASTER_HOST": "0.0.0.0", "CHUNKMASTER_PORT": "9000"}) == (
        "127.0.0.1:9000"
    )
    assert default_addr({"CHUNKMASTER_HOST": "10.1.2.3"}) == "10.1.2.3:8080"
    assert default_addr({"CHUNKMASTER_HOST": "fd00::7"}) == "[fd00::7]:8080"
    assert default_addr({"CHUNKMASTER_HEALTH_ADDR": "m:1", "CHUNKMASTER_HOST": "x"}) == "m:1"

"""The master on an etcd that demands TLS and a user: --etcd-ca/--etcd-cert/--etcd-key,
--etcd-user with CHUNKMASTER_ETCD_PASSWORD, against a real etcd started with client TLS
(certificates made by the tests) and authentication enabled through its own API. The
operator's commands and `read` find the master through the same etcd with the same flags (or
variables); without them they fail in one line."""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import Pki
from helpers.cli import cli
from helpers.datasets import numbered_records
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

from chunkmaster.client.connection import MasterConnection

PASSWORD = "etcd-pass-0123"


class TlsEtcd(EtcdServer):
    """An EtcdServer whose clients must speak TLS and present a certificate of the test CA."""

    def __init__(self, pki: Pki) -> None:
        self.pki = pki
        self.ctx = ssl.create_default_context(cafile=pki.ca)
        self.ctx.load_cert_chain(pki.client_cert, pki.client_key)
        super().__init__(
            extra_args=[
                *("--cert-file", pki.server_cert, "--key-file", pki.server_key),
                *("--trusted-ca-file", pki.ca, "--client-cert-auth"),
            ]
        )

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.client_port}"

    def wait_healthy(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    self.endpoint + "/health", timeout=1, context=self.ctx
                ) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not become healthy; log:\n{self.log_text()}")

    def api(self, path: str, body: dict[str, str]) -> None:
        req = urllib.request.Request(
            self.endpoint + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10, context=self.ctx) as r:
            r.read()

    def enable_auth(self) -> None:
        """A root user with a password, then authentication on (etcd's v3 JSON gateway)."""
        self.api("/v3/auth/role/add", {"name": "root"})
        self.api("/v3/auth/user/add", {"name": "root", "password": PASSWORD})
        self.api("/v3/auth/user/grant", {"user": "root", "role": "root"})
        self.api("/v3/auth/enable", {})


def test_a_master_on_an_etcd_with_tls_and_a_password(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    etcd = TlsEtcd(pki)
    try:
        etcd.enable_auth()
        etcd_args = ["--endpoints", etcd.endpoint, "--host", "127.0.0.1", "--ttl", "2"]
        etcd_args += ["--etcd-ca", pki.ca, "--etcd-cert", pki.client_cert]
        etcd_args += ["--etcd-key", pki.client_key, "--etcd-user", "root"]
        monkeypatch.setenv("CHUNKMASTER_ETCD_PASSWORD", PASSWORD)
        m = MasterProcess(etcd_args).start()
        try:
            assert m.addr is not None
            with MasterConnection(m.addr) as c:
                assert status_view(c.status()).store.healthy
            assert PASSWORD not in m.log()
        finally:
            m.kill()
        # The wrong password: the master does not lead, and says why (never the password).
        monkeypatch.setenv("CHUNKMASTER_ETCD_PASSWORD", "wrong-pass-42")
        bad = MasterProcess(etcd_args).start(wait=False)
        try:
            assert bad.wait_log("authentication failed"), bad.log()
            assert bad.addr is None
            assert "wrong-pass-42" not in bad.log()
        finally:
            bad.kill()
    finally:
        etcd.stop()


def test_operator_commands_and_read_find_the_master_through_an_etcd_with_tls_and_a_user(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    etcd = TlsEtcd(pki)
    try:
        etcd.enable_auth()
        creds = ["--etcd-ca", pki.ca, "--etcd-cert", pki.client_cert]
        creds += ["--etcd-key", pki.client_key, "--etcd-user", "root"]
        where = ["--endpoints", etcd.endpoint, "--job", "tls"]
        monkeypatch.setenv("CHUNKMASTER_ETCD_PASSWORD", PASSWORD)
        m = MasterProcess([*where, "--host", "127.0.0.1", "--ttl", "2", *creds]).start()
        env = dict(os.environ)
        try:
            data = numbered_records(tmp_path / "a.rio", 30)
            read = cli(
                "read", *where, *creds, "--dataset", str(data), "--passes", "1", "--json", env=env
            )
            assert read.returncode == 0, read.stderr
            assert json.loads(read.stdout.splitlines()[0])["records"] == 30
            st = cli("status", *where, *creds, "--json", env=env)
            assert st.returncode == 0, st.stderr
            assert json.loads(st.stdout)["num_tasks"] > 0
            saved = tmp_path / "c.ckpt"
            cp = cli("checkpoint", "save", *where, *creds, str(saved), env=env)
            assert cp.returncode == 0, cp.stderr
            assert saved.exists()
            # The same credentials from the master's variables.
            variables = dict(
                env,
                CHUNKMASTER_ETCD_CA=pki.ca,
                CHUNKMASTER_ETCD_CERT=pki.client_cert,
                CHUNKMASTER_ETCD_KEY=pki.client_key,
                CHUNKMASTER_ETCD_USER="root",
            )
            assert cli("status", *where, env=variables).returncode == 0
            # Without the password, or with an etcd flag but no etcd: one line, exit 2.
            no_password = {k: v for k, v in variables.items() if k != "CHUNKMASTER_ETCD_PASSWORD"}
            bad = cli("status", *where, env=no_password)
            assert bad.returncode == 2
            assert "CHUNKMASTER_ETCD_PASSWORD" in bad.stderr and len(bad.stderr.splitlines()) == 1
            assert m.addr is not None
            # The variables serve etcd's commands only: one with --addr asks no etcd.
            assert cli("status", "--addr", m.addr, env=no_password).returncode == 0
            stray = cli("status", "--addr", m.addr, "--etcd-ca", pki.ca, env=env)
            assert stray.returncode == 2
            assert "--etcd-ca is for etcd: give --endpoints" in stray.stderr
            # Without the credentials the command cannot read etcd: it says why, within its
            # timeout (gRPC's own log lines of the failed handshakes may come before).
            blind = cli("status", *where, "--timeout", "3", env=env)
            assert blind.returncode == 1
            last = blind.stderr.strip().splitlines()[-1]
            assert "cannot read /chunkmaster/tls/master/addr from etcd" in last, last
            assert "CERTIFICATE_VERIFY_FAILED" in last and "--etcd-ca" in last, last
        finally:
            m.kill()
    finally:
        etcd.stop()

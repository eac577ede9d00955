"""The master on an etcd that demands TLS and a user: --etcd-ca/--etcd-cert/--etcd-key,
--etcd-user with CHUNKMASTER_ETCD_PASSWORD, against a real etcd started with client TLS
(certificates made by the tests) and authentication enabled through its own API."""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import Pki
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

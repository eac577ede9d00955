"""The metrics and dashboard port follows the RPC port's rules: its token, its TLS."""

from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import TOKEN, Pki
from helpers.master_process import MasterProcess

from chunkmaster.master.readiness import read_ready_file


def get(url: str, ctx: ssl.SSLContext, headers: dict[str, str] | None = None) -> int:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_metrics_need_the_token_and_speak_tls(tmp_path: Path, pki: Pki, token_file: str) -> None:
    args = ["--store", ":memory:", "--metrics-port", "0", "--token-file", token_file]
    args += ["--tls-cert", pki.server_cert, "--tls-key", pki.server_key]
    m = MasterProcess(args).start()
    try:
        info = read_ready_file(m.ready_file)
        assert info is not None
        url = f"https://{info['metrics_addr']}/metrics"
        ctx = ssl.create_default_context(cafile=pki.ca)
        assert get(url, ctx) == 401
        assert get(url, ctx, {"Authorization": "Bearer wrong"}) == 401
        assert get(url, ctx, {"Authorization": f"Bearer {TOKEN}"}) == 200
        basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        assert get(url.replace("/metrics", "/"), ctx, {"Authorization": f"Basic {basic}"}) == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plaintext HTTP
            urllib.request.urlopen(url.replace("https", "http"), timeout=10)
    finally:
        m.kill()

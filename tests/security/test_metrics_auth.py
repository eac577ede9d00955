"""The metrics and dashboard port follows the RPC port's rules: its token, its TLS."""

from __future__ import annotations

import base64
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from conftest import TOKEN, Pki
from helpers.master_process import MasterProcess

import chunkmaster
from chunkmaster.client import Connection
from chunkmaster.client.connection import ChannelSecurity, MasterConnection
from chunkmaster.core.errors import UnauthenticatedError
from chunkmaster.master.readiness import read_ready_file
from chunkmaster.rpc import master_pb2 as pb


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


def test_a_wrong_token_is_refused_promptly_with_metrics_on(token_file: str) -> None:
    """The RPC metrics interceptor wraps the token check's refusal: the Session stream must
    still end UNAUTHENTICATED (not UNKNOWN), so a trainer raises instead of retrying."""
    args = ["--store", ":memory:", "--metrics-port", "0", "--token-file", token_file]
    m = MasterProcess(args).start()
    try:
        assert m.addr is not None
        hello = pb.SessionRequest(seq=1, hello=pb.Hello(name="intruder"))
        with MasterConnection(m.addr, security=ChannelSecurity(token="wrong")) as conn:
            with pytest.raises(UnauthenticatedError):
                conn.status()
            call = conn.open_session(iter([hello]))
            with pytest.raises(grpc.RpcError) as info:
                list(call)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with chunkmaster.Client(
            m.addr, token="wrong", connection=Connection(retry_timeout=60)
        ) as client:
            with pytest.raises(UnauthenticatedError):
                client.status()
            client.start_get_records(0)
            began = time.monotonic()
            with pytest.raises(UnauthenticatedError):
                client.next_record(timeout=60)
            assert time.monotonic() - began < 30, "the session retried instead of raising"
        with MasterConnection(m.addr, security=ChannelSecurity(token=TOKEN)) as conn:
            assert conn.status()["trainers"] == []
        assert "Traceback" not in m.log() and "TypeError" not in m.log(), m.log()
    finally:
        m.kill()

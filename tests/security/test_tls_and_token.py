"""TLS, mutual TLS and the shared token, against real in-process masters over real gRPC."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from conftest import RECORDS, TOKEN, Pki
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.inproc import InProcessMaster
from helpers.status_view import status_view

import chunkmaster
from chunkmaster.client import Connection
from chunkmaster.client.connection import ChannelSecurity, MasterConnection, TransportError
from chunkmaster.core.errors import PermissionDeniedError, UnauthenticatedError
from chunkmaster.master.auth import server_credentials
from chunkmaster.rpc import master_pb2 as pb


def _master(**server_options: Any) -> InProcessMaster:
    return InProcessMaster(chunks_per_task=4, server_options=server_options)


def _status(addr: str, security: ChannelSecurity) -> dict[str, Any]:
    with MasterConnection(addr, timeout=3.0, security=security) as conn:
        return conn.status()


@pytest.fixture
def tls_master(pki: Pki) -> Iterator[InProcessMaster]:
    creds = server_credentials(pki.server_cert, pki.server_key)
    with _master(credentials=creds) as m:
        yield m


@pytest.fixture
def mtls_master(pki: Pki) -> Iterator[InProcessMaster]:
    creds = server_credentials(pki.server_cert, pki.server_key, pki.ca)
    with _master(credentials=creds, token=TOKEN) as m:
        yield m


@pytest.fixture
def token_master() -> Iterator[InProcessMaster]:
    with _master(token=TOKEN) as m:
        yield m


def test_tls_answers_a_client_that_trusts_its_ca(tls_master: InProcessMaster, pki: Pki) -> None:
    st = _status(tls_master.addr, ChannelSecurity.load(tls_ca=pki.ca))
    assert st["ready"] is False


def test_tls_refuses_plaintext_and_an_untrusted_master(
    tls_master: InProcessMaster, pki: Pki
) -> None:
    with pytest.raises(TransportError):
        _status(tls_master.addr, ChannelSecurity())
    with pytest.raises(TransportError):  # the client does not trust the master's certificate
        _status(tls_master.addr, ChannelSecurity.load(tls_ca=pki.other_ca))


def test_mutual_tls_needs_a_certificate_from_the_trusted_ca(
    mtls_master: InProcessMaster, pki: Pki
) -> None:
    with pytest.raises(TransportError):
        _status(mtls_master.addr, ChannelSecurity.load(TOKEN, tls_ca=pki.ca))
    rogue = ChannelSecurity.load(TOKEN, pki.ca, pki.rogue_cert, pki.rogue_key)
    with pytest.raises(TransportError):
        _status(mtls_master.addr, rogue)
    good = ChannelSecurity.load(TOKEN, pki.ca, pki.client_cert, pki.client_key)
    assert _status(mtls_master.addr, good)["ready"] is False


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x", ""])
def test_a_missing_or_wrong_token_is_unauthenticated_on_unary_calls(
    token_master: InProcessMaster, dataset: str, token: str | None
) -> None:
    with MasterConnection(token_master.addr, security=ChannelSecurity(token=token)) as conn:
        with pytest.raises(UnauthenticatedError):
            conn.status()
        with pytest.raises(UnauthenticatedError):
            conn.set_dataset([dataset])
        with pytest.raises(UnauthenticatedError):
            conn.get_task(0)
    assert token_master.status_view().ready is False  # nothing changed


def test_a_wrong_token_is_unauthenticated_on_the_session_stream(
    token_master: InProcessMaster,
) -> None:
    hello = pb.SessionRequest(seq=1, hello=pb.Hello(name="intruder", report_every=0))
    with MasterConnection(token_master.addr, security=ChannelSecurity(token="nope")) as conn:
        call = conn.open_session(iter([hello]))
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert token_master.status()["trainers"] == []


def test_health_stays_open_and_the_token_is_never_logged(
    token_master: InProcessMaster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with grpc.insecure_channel(token_master.addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    secret = "a-secret-the-log-must-not-hold"
    with pytest.raises(UnauthenticatedError):
        _status(token_master.addr, ChannelSecurity(token=secret))
    assert _status(token_master.addr, ChannelSecurity(token=TOKEN))["ready"] is False
    assert "refused /chunkmaster.v1.Master/Status: wrong token" in caplog.text
    assert secret not in caplog.text and TOKEN not in caplog.text


def test_the_client_takes_the_token_from_the_environment(
    token_master: InProcessMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUNKMASTER_TOKEN", TOKEN)
    with chunkmaster.Client(
        token_master.addr, session=False, connection=Connection(retry_timeout=5)
    ) as client:
        assert status_view(client.status()).ready is False


def test_a_client_with_token_and_mutual_tls_reads_a_whole_pass(
    mtls_master: InProcessMaster, pki: Pki, dataset: str
) -> None:
    with chunkmaster.Client(
        mtls_master.addr,
        token=TOKEN,
        connection=Connection(
            tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key, retry_timeout=10
        ),
    ) as client:
        client.set_dataset([dataset])
        records = list(client.records(0))
        assert client.session_id
    assert sorted(records) == [b"%06d" % i for i in range(RECORDS)]


def test_a_trainer_with_a_wrong_token_gets_the_error_not_a_hang(
    token_master: InProcessMaster,
) -> None:
    with chunkmaster.Client(
        token_master.addr, token="wrong", connection=Connection(retry_timeout=5)
    ) as client:
        client.start_get_records(0)
        with pytest.raises(UnauthenticatedError):
            client.next_record(timeout=30)
        with pytest.raises(UnauthenticatedError):
            client.set_dataset(["/nowhere/*.rio"])


def _hello(conn: MasterConnection, session_id: str = "") -> pb.SessionResponse:
    hello = pb.SessionRequest(seq=1, hello=pb.Hello(session_id=session_id, name="t"))
    replies = list(conn.open_session(iter([hello])))
    assert len(replies) == 1
    return replies[0]


@contextlib.contextmanager
def two_identities(
    master: InProcessMaster, pki: Pki
) -> Iterator[tuple[MasterConnection, MasterConnection]]:
    """Connections to `master` under two client certificates of the same CA."""
    a = ChannelSecurity.load(TOKEN, pki.ca, pki.client_cert, pki.client_key)
    b = ChannelSecurity.load(TOKEN, pki.ca, pki.other_client_cert, pki.other_client_key)
    with (
        MasterConnection(master.addr, security=a) as conn_a,
        MasterConnection(master.addr, security=b) as conn_b,
    ):
        yield conn_a, conn_b


def test_under_mutual_tls_a_session_is_bound_to_its_certificate(
    mtls_master: InProcessMaster, pki: Pki
) -> None:
    with two_identities(mtls_master, pki) as (conn_a, conn_b):
        sid = _hello(conn_a).welcome.session_id
        assert sid
        refused = _hello(conn_b, sid)
        assert refused.WhichOneof("body") == "error"
        assert refused.error.error == "PermissionDeniedError"
        assert refused.error.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        assert _hello(conn_a, sid).welcome.session_id == sid  # its owner resumes it
        assert _hello(conn_b).welcome.session_id not in ("", sid)  # b opens its own


def test_under_mutual_tls_a_trainer_cannot_report_another_trainers_task(
    mtls_master: InProcessMaster, pki: Pki, dataset: str
) -> None:
    with two_identities(mtls_master, pki) as (conn_a, conn_b):
        conn_a.set_dataset([dataset])
        task = conn_a.get_task(0)
        for epoch in (task.meta.epoch, 0):  # 0: "not said" reports the pending dispatch
            with pytest.raises(PermissionDeniedError, match="another trainer's certificate"):
                conn_b.task_finished(task.meta.id, epoch=epoch, pass_id=0)
        with pytest.raises(PermissionDeniedError, match="another trainer's certificate"):
            conn_b.task_failed(task.meta, "not mine")
        assert status_view(conn_a.status()).pending == 1  # the refusals changed nothing
        assert conn_a.task_finished(task.meta.id, epoch=task.meta.epoch, pass_id=0)
        mine = conn_b.get_task(0)
        assert conn_b.task_failed(mine.meta, "read error")  # its own task: allowed

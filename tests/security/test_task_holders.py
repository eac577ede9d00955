"""Under mutual TLS a task is reported by its holder only, on every path, across restarts.

A real master process with `--tls-client-ca`, two trainer certificates of the same CA
(trainer-a and trainer-b): B tries to finish, fail, move, commit and hand back A's task,
through its own session stream and through the unary calls, with the epoch A holds, an older
one and 0 ("not said"); each attempt is refused and changes nothing, before and after a
restart of the master. B cannot resume A's session after a restart either.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Pki
from helpers.master_process import MasterProcess
from helpers.raw_session import RawSession

from chunkmaster.client.connection import ChannelSecurity, MasterConnection
from chunkmaster.core.errors import PermissionDeniedError
from chunkmaster.core.model import TaskMeta
from chunkmaster.recordio import Writer
from chunkmaster.rpc import master_pb2 as pb

RECORDS = 20  # one task: every dispatch is of task 0


@pytest.fixture
def master(tmp_path: Path, pki: Pki) -> Iterator[MasterProcess]:
    data = tmp_path / "d.rio"
    with Writer(str(data), max_chunk_size=1) as w:
        for i in range(RECORDS):
            w.write(b"%06d" % i)
    m = MasterProcess(
        ["--store", str(tmp_path / "s.db"), "--chunk-per-task", str(RECORDS),
         "--tls-cert", pki.server_cert, "--tls-key", pki.server_key,
         "--tls-client-ca", pki.ca, "--trainer-ttl", "60", "--task-timeout-dur", "10m"],
        log_path=tmp_path / "master.log",
    ).start()  # fmt: skip
    try:
        with MasterConnection(_addr(m), security=_a(pki)) as conn:
            conn.set_dataset([str(data)])
        yield m
    finally:
        m.kill()


def _addr(m: MasterProcess) -> str:
    assert m.addr is not None
    return m.addr


def _a(pki: Pki) -> ChannelSecurity:
    return ChannelSecurity.load(None, pki.ca, pki.client_cert, pki.client_key)


def _b(pki: Pki) -> ChannelSecurity:
    return ChannelSecurity.load(None, pki.ca, pki.other_client_cert, pki.other_client_key)


def _session(m: MasterProcess, security: ChannelSecurity, sid: str = "") -> tuple[RawSession, Any]:
    s = RawSession(_addr(m), security)
    return s, s.hello(session_id=sid)


def _task(s: RawSession) -> Any:
    s.send(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=5))
    resp = s.recv()
    assert resp.WhichOneof("body") == "task", resp
    return resp.task


def _pos(task_id: int, epoch: int, records: int = RECORDS) -> pb.TaskPosition:
    return pb.TaskPosition(task_id=task_id, epoch=epoch, pass_id=0, records=records)


def _refused(s: RawSession, error: str = "PermissionDeniedError", **body: Any) -> str:
    seq = s.send(**body)
    resp = s.recv()
    assert resp.seq == seq and resp.WhichOneof("body") == "error", resp
    assert resp.error.error == error, resp
    return str(resp.error.message)


def _status(m: MasterProcess, pki: Pki) -> dict[str, Any]:
    with MasterConnection(_addr(m), security=_a(pki)) as conn:
        return conn.status()


def _unchanged(m: MasterProcess, pki: Pki, epoch: int, holder: str) -> None:
    """A still holds the task at `epoch`, nothing of it is finished, consumed or committed."""
    st = _status(m, pki)
    assert st["done"] == 0 and st["cur_pass"] == 0 and st["tasks_with_failures"] == 0, st
    assert [(t["id"], t["epoch"]) for t in st["pending_tasks"]] == [(0, epoch)], st
    held = {t["session"]: (t["tasks_held"], t["records_consumed"]) for t in st["trainers"]}
    if holder:
        assert held[holder] == (1, 0), held
    assert st["ledger"][-1]["consumed"] == 0 and st["ledger"][-1]["committed"] == 0, st


def test_another_certificate_cannot_report_a_sessions_task_on_any_path(
    master: MasterProcess, pki: Pki
) -> None:
    # A first session takes task 0 and hands it back, so that A holds it at epoch 2 and an
    # older epoch (1) exists.
    first, _ = _session(master, _a(pki))
    assert _task(first).meta.epoch == 1
    first.send(goodbye=pb.Goodbye())
    assert first.recv().ack.applied == 1
    first.close()
    a, welcome = _session(master, _a(pki))
    sid_a = welcome.welcome.session_id
    assert _task(a).meta.epoch == 2
    b, _ = _session(master, _b(pki))
    for epoch in (2, 1, 0):  # the epoch A holds, an older one, "not said"
        for want_task in (False, True):
            msg = _refused(
                b,
                next=pb.NextTask(finished=[_pos(0, epoch)], want_task=want_task, wait_seconds=1),
            )
            assert "task 0 is held by another trainer's session" in msg
        _refused(b, failed=pb.TaskFailedRequest(meta=pb.TaskMeta(id=0, epoch=epoch), reason="x"))
        _refused(b, keep_alive=pb.KeepAlive(progress=[_pos(0, epoch, 5)]))
    assert "is held by another trainer" in _refused(b, commit=pb.Commit(positions=[_pos(0, 2, 5)]))
    for epoch in (1, 0):  # a dispatch that is not the current one: no longer anyone's
        msg = _refused(b, "CheckpointRefusedError", commit=pb.Commit(positions=[_pos(0, epoch)]))
        assert "task 0" in msg
    with MasterConnection(_addr(master), security=_b(pki)) as conn_b:
        for epoch in (2, 1, 0):
            with pytest.raises(PermissionDeniedError, match="task 0 is held by a trainer session"):
                conn_b.task_finished(0, epoch=epoch, pass_id=0)
            with pytest.raises(PermissionDeniedError, match="task 0"):
                conn_b.task_failed(TaskMeta(0, epoch), "not mine")
    b.send(goodbye=pb.Goodbye(progress=[_pos(0, 2, 7)]))  # A's position: changes nothing
    assert b.recv().ack.applied == 0
    b.close()
    _unchanged(master, pki, 2, sid_a)
    a.send(next=pb.NextTask(finished=[_pos(0, 2)]))
    assert a.recv().ack.applied == 1  # its holder finishes it
    # Finished, the task is nobody's to hold, but only A's certificate may commit it.
    b, _ = _session(master, _b(pki))
    msg = _refused(b, commit=pb.Commit(positions=[_pos(0, 2)]))
    assert "task 0 of pass 0 was not finished by this trainer's certificate" in msg
    assert _status(master, pki)["ledger"][0]["committed"] == 0
    a.send(commit=pb.Commit(positions=[_pos(0, 2)]))
    assert a.recv().ack.applied == 1
    a.close()
    b.close()


def test_after_a_restart_another_certificate_cannot_resume_a_session(
    master: MasterProcess, pki: Pki
) -> None:
    a, welcome = _session(master, _a(pki))
    sid_a = welcome.welcome.session_id
    assert _task(a).meta.epoch == 1
    a.close()
    master.restart()  # the binding lived in the master's memory only: the first to resume won
    b2 = RawSession(_addr(master), _b(pki))
    refused = b2.hello(session_id=sid_a)
    assert refused.WhichOneof("body") == "error", refused
    assert refused.error.error == "PermissionDeniedError"
    assert "belongs to another trainer's certificate" in refused.error.message
    b2.close()
    _unchanged(master, pki, 1, sid_a)
    a2, welcome = _session(master, _a(pki), sid_a)
    assert welcome.welcome.session_id == sid_a
    a2.send(next=pb.NextTask(finished=[_pos(0, 1)]))
    assert a2.recv().ack.applied == 1  # its holder finishes it
    a2.close()


def test_a_refused_resume_does_not_keep_the_session_alive(master: MasterProcess, pki: Pki) -> None:
    """B's Hello naming A's session is refused before the lease is touched: else B could keep
    the session of a dead trainer A, and its tasks, from ever ending."""
    a, welcome = _session(master, _a(pki))
    sid_a = welcome.welcome.session_id
    _task(a)
    a.close()

    def lease_left() -> float:
        (trainer,) = [t for t in _status(master, pki)["trainers"] if t["session"] == sid_a]
        return float(trainer["lease_expires_in"])

    deadline = time.monotonic() + 60
    while lease_left() > 58:  # of 60 s: A has been silent for 2 s
        assert time.monotonic() < deadline, "the lease never ran down"
    b = RawSession(_addr(master), _b(pki))
    refused = b.hello(session_id=sid_a)
    assert refused.error.error == "PermissionDeniedError", refused
    b.close()
    assert lease_left() <= 58


def test_another_certificate_cannot_report_a_unary_task_before_or_after_a_restart(
    master: MasterProcess, pki: Pki
) -> None:
    with (
        MasterConnection(_addr(master), security=_a(pki)) as conn_a,
        MasterConnection(_addr(master), security=_b(pki)) as conn_b,
    ):
        first = conn_a.get_task(0)
        assert conn_a.task_failed(first.meta, "read error")  # back in the queue: epoch 2 next
        task = conn_a.get_task(0)
        assert task.meta.epoch == 2
    for restarted in (False, True):
        if restarted:
            master.restart()
        with MasterConnection(_addr(master), security=_b(pki)) as conn_b:
            for epoch in (2, 1, 0):
                with pytest.raises(PermissionDeniedError, match="another trainer's certificate"):
                    conn_b.task_finished(0, epoch=epoch, pass_id=0)
                with pytest.raises(PermissionDeniedError, match="another trainer's certificate"):
                    conn_b.task_failed(TaskMeta(0, epoch), "not mine")
        b, _ = _session(master, _b(pki))  # nor through a session of its own
        _refused(b, next=pb.NextTask(finished=[_pos(0, 1)]))
        _refused(b, failed=pb.TaskFailedRequest(meta=pb.TaskMeta(id=0, epoch=2), reason="x"))
        b.close()
        st = _status(master, pki)
        assert [(t["id"], t["epoch"]) for t in st["pending_tasks"]] == [(0, 2)], st
        assert st["done"] == 0 and st["failed_tasks"][0]["failures"] == 1, st
    with MasterConnection(_addr(master), security=_a(pki)) as conn_a:
        assert conn_a.task_finished(0, epoch=2, pass_id=0)  # its holder finishes it

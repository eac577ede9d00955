"""What one client may make a master hold (issue 19, "unbounded per-stream and per-string
state"): a bounded number of messages waiting on one stream, and strings of a bounded length,
with their control characters escaped wherever the master shows them. Raw gRPC clients
(tests/helpers/raw_session.py) against real master processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.raw_session import RawSession
from helpers.status_view import status_view

import chunkmaster
from chunkmaster.cli.main import main
from chunkmaster.client import Connection
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import InvalidArgumentError
from chunkmaster.core.model import TaskMeta
from chunkmaster.rpc import master_pb2 as pb

FLOOD = 40_000  # waiting NextTask messages on one stream


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def master(tmp_path: Path) -> Any:
    m = MasterProcess(["--store", str(tmp_path / "s.db"), "--chunk-per-task", "1"]).start()
    yield m
    m.kill()


def test_a_stream_that_floods_waiting_requests_is_ended_and_memory_stays_bounded(
    master: MasterProcess,
) -> None:
    assert master.addr is not None and master.proc is not None
    s = RawSession(master.addr)
    try:
        assert s.hello().WhichOneof("body") == "welcome"
        before = rss_kib(master.proc.pid)
        # No dataset yet: each NextTask waits (up to 300 s) for one.
        for seq in range(2, FLOOD + 2):
            wait = pb.NextTask(want_task=True, pass_id=0, wait_seconds=300, request_id=f"r{seq}")
            s.send_raw(pb.SessionRequest(seq=seq, next=wait).SerializeToString())
        # A last message answered at once: its answer means every message before it was read.
        last = FLOOD + 2
        s.send_raw(
            pb.SessionRequest(
                seq=last, failed=pb.TaskFailedRequest(meta=pb.TaskMeta(id=0, epoch=1))
            ).SerializeToString()
        )
        answers = []
        while True:
            resp = s.recv(timeout=120)
            if resp is None or isinstance(resp, grpc.RpcError):
                break
            answers.append(resp)
            if resp.seq == last:
                break
        grown = rss_kib(master.proc.pid) - before
        assert grown < 100 * 1024, f"the master grew by {grown} KiB"
        errors = [a for a in answers if a.WhichOneof("body") == "error"]
        assert errors, answers[:5]
        assert errors[0].error.error == InvalidArgumentError.__name__
        assert "wait for their answers already" in errors[0].error.message
        assert resp is None or isinstance(resp, grpc.RpcError)  # and the stream ended
    finally:
        s.close()
    with MasterConnection(master.addr) as c:  # the master goes on serving
        assert status_view(c.status()).sessions == 1


def test_a_failure_reason_of_megabytes_is_cut(master: MasterProcess, tmp_path: Path) -> None:
    assert master.addr is not None
    data = numbered_records(tmp_path / "d.rio", 4)
    reason = "x" * (3_900_000)
    with MasterConnection(master.addr) as c:
        c.set_dataset([data])
        for _ in range(2):
            task = c.get_task(0)
            c.task_failed(TaskMeta(task.meta.id, task.meta.epoch), reason)
        st = c.status()
    reasons = [r["reason"] for t in st["failed_tasks"] for r in t["reasons"]]
    assert len(reasons) == 2
    for r in reasons:
        assert len(r.encode()) <= 1000 and r.startswith("xxx") and "bytes, cut" in r
    with chunkmaster.Client(
        master.addr, session=False, connection=Connection(retry_timeout=10)
    ) as client:
        assert status_view(client.status()).failed == 0
    assert main(["status", "--addr", master.addr]) == 0
    assert master.wait_log("task 1 failed")
    long_lines = [ln for ln in master.log().splitlines() if len(ln) > 2000]
    assert not long_lines, f"{len(long_lines)} log lines over 2000 characters"


def test_over_long_identifiers_are_refused(master: MasterProcess) -> None:
    assert master.addr is not None
    with MasterConnection(master.addr) as c:
        with pytest.raises(InvalidArgumentError, match="globs is 5000 bytes long"):
            c.set_dataset(["/data/" + "a" * 4994])
        with pytest.raises(InvalidArgumentError, match="request_id is 5000 bytes long"):
            c.get_task(0, request_id="r" * 5000)
        assert status_view(c.status()).ready is False


def test_control_characters_are_escaped_in_the_log_and_in_status(
    master: MasterProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert master.addr is not None
    data = numbered_records(tmp_path / "d.rio", 4)
    evil = "eve\x1b[2J\x1b[31m\nFORGED chunkmaster.master: all is well\r\u202e"
    with MasterConnection(master.addr) as c:
        c.set_dataset([data])
    s = RawSession(master.addr)
    try:
        assert s.hello(name=evil).WhichOneof("body") == "welcome"
        s.send(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=5, request_id="a"))
        task = s.recv().task
        meta = pb.TaskMeta(id=task.meta.id, epoch=task.meta.epoch)
        s.send(failed=pb.TaskFailedRequest(meta=meta, reason=f"bad\nchunk {evil}"))
        assert s.recv().WhichOneof("body") == "ack"
        assert master.wait_log(r"failed \(bad")
        capsys.readouterr()
        assert main(["status", "--addr", master.addr]) == 0
        shown = capsys.readouterr().out
        assert main(["status", "--addr", master.addr, "--json"]) == 0
        st = json.loads(capsys.readouterr().out)
    finally:
        s.close()
    escaped = "eve\\x1b[2J\\x1b[31m\\nFORGED chunkmaster.master: all is well\\r\\u202e"
    for text in (master.log(), shown):
        assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
        assert not any(ln.startswith("FORGED") for ln in text.splitlines())
        assert escaped in text
    assert st["trainers"][0]["name"] == escaped
    assert st["failed_tasks"][0]["reasons"][0]["reason"] == f"bad\\nchunk {escaped}"


def test_a_trainer_with_a_long_name_reads_its_pass(master: MasterProcess, tmp_path: Path) -> None:
    """Cutting free text is the master's business: the trainer goes on as usual."""
    assert master.addr is not None
    data = numbered_records(tmp_path / "d.rio", 6)
    with chunkmaster.Client(
        master.addr, name="n" * 5000, connection=Connection(retry_timeout=30)
    ) as client:
        client.set_dataset([data])
        assert sorted(client.records(0)) == [b"%06d" % i for i in range(6)]
        (trainer,) = client.status()["trainers"]  # type: ignore[misc]
    assert len(trainer["name"].encode()) <= 1000

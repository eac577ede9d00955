"""The master's side of trainer sessions, spoken raw over a real gRPC stream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import write_records
from helpers.inproc import InProcessMaster
from helpers.raw_session import RawSession, position

from chunkmaster.rpc import master_pb2 as pb

RECORDS_PER_TASK = 10


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    # 4 tasks of 10 records: one chunk of 10 records per task (chunks_per_task=1)
    path = tmp_path / "d.rio"
    records = [b"%03d" % i for i in range(40)]
    write_records(path, records, max_chunk_size=30)
    return str(path)


@pytest.fixture
def master(dataset: str) -> Iterator[InProcessMaster]:
    with InProcessMaster(chunks_per_task=1, trainer_ttl=30.0) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.set_dataset([dataset]))
        yield m


def wait_for(cond: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def next_task(s: RawSession, pass_id: int = 0, finished: list[Any] | None = None) -> Any:
    seq = s.send(
        next=pb.NextTask(finished=finished or [], want_task=True, pass_id=pass_id, wait_seconds=5)
    )
    resp = s.recv()
    assert resp.seq == seq
    assert resp.WhichOneof("body") == "task", resp
    return resp.task


def test_a_session_gets_tasks_and_a_finish_travels_with_the_next_request(
    master: InProcessMaster,
) -> None:
    s = RawSession(master.addr)
    welcome = s.hello(name="alice")
    assert welcome.welcome.session_id
    assert welcome.welcome.ttl_seconds == 30.0
    t1 = next_task(s)
    assert t1.start == 0
    t2 = next_task(s, finished=[position(t1, RECORDS_PER_TASK)])
    assert t2.meta.id != t1.meta.id
    st = master.status()
    assert st["done"] == 1 and st["pending"] == 1
    (trainer,) = st["trainers"]
    assert trainer["name"] == "alice" and trainer["tasks_held"] == 1
    assert trainer["records_consumed"] == RECORDS_PER_TASK
    s.close()


def test_progress_moves_the_position_a_task_is_handed_out_again_at(
    master: InProcessMaster,
) -> None:
    a = RawSession(master.addr)
    a.hello(name="a")
    t = next_task(a)
    a.send(keep_alive=pb.KeepAlive(progress=[position(t, 7)]))
    wait_for(lambda: master.status()["trainers"][0]["records_consumed"] == 7, "progress")
    seq = a.send(goodbye=pb.Goodbye(progress=[position(t, 8)]))
    resp = a.recv()
    assert resp.seq == seq and resp.ack.applied == 1  # one task handed back
    a.close()
    b = RawSession(master.addr)
    b.hello(name="b")
    again = next_task(b)
    assert again.meta.id == t.meta.id  # first in line
    assert again.start == 8
    led = master.status()["ledger"][-1]
    assert led["consumed"] == 8
    assert led["redispatched"] == {}  # a goodbye says exactly where it stopped
    b.close()


def test_a_silent_trainer_loses_its_session_and_its_tasks_go_back(dataset: str) -> None:
    with InProcessMaster(chunks_per_task=1, trainer_ttl=0.5, timeout_dur=3600) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.set_dataset([dataset]))
        a = RawSession(m.addr)
        sid = a.hello(name="a").welcome.session_id
        t = next_task(a)
        a.send(keep_alive=pb.KeepAlive(progress=[position(t, 3)]))
        wait_for(lambda: m.status()["ledger"][-1]["consumed"] == 3, "progress")
        a.close()  # silent from now on
        wait_for(lambda: m.status()["sessions"] == 0, "the lease to run out")
        st = m.status()
        assert st["pending"] == 0 and st["todo"] == 4
        assert st["tasks_with_failures"] == 0  # "trainer lost" is not the task's failure
        assert st["ledger"][-1]["redispatched"] == {"trainer lost": RECORDS_PER_TASK - 3}
        b = RawSession(m.addr)
        resp = b.hello(session_id=sid)
        assert resp.error.error == "SessionExpiredError"
        b.hello(name="b")
        again = next_task(b)
        assert (again.meta.id, again.start) == (t.meta.id, 3)
        b.close()


def test_commit_is_acknowledged_and_counted(master: InProcessMaster) -> None:
    s = RawSession(master.addr)
    s.hello()
    t = next_task(s)
    seq = s.send(commit=pb.Commit(positions=[position(t, 4)]))
    resp = s.recv()
    assert resp.seq == seq and resp.ack.applied == 1
    assert master.status()["ledger"][-1]["committed"] == 4
    bad = position(t, 4)
    bad.epoch = 99
    seq = s.send(commit=pb.Commit(positions=[bad]))
    resp = s.recv()
    assert resp.seq == seq and resp.error.error == "CheckpointRefusedError"
    assert "epoch 99" in resp.error.message
    s.close()


def test_messages_before_hello_and_malformed_bytes_are_refused(master: InProcessMaster) -> None:
    s = RawSession(master.addr)
    s.send(keep_alive=pb.KeepAlive())
    resp = s.recv()
    assert resp.error.error == "InvalidArgumentError"
    s.send_raw(b"\xff\xff\xff")
    resp = s.recv()
    assert resp.error.error == "InvalidArgumentError"
    assert s.recv() is None  # the master ends the stream
    s.close()
    assert master.status()["sessions"] == 0

"""Sessions survive the master: a restart on the embedded store, a failover on etcd.

A trainer (a raw Session stream) holds a task and has reported progress; the master is
SIGKILLed. The master that comes back (the same one restarted, or a standby taking over)
gives every session it recovers a fresh lease: the trainer reconnects with its session ID,
still holds its task at its reported position, and its finish completes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.datasets import ten_record_chunks
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess
from helpers.raw_session import RawSession, position
from helpers.status_view import master_status
from helpers.waits import wait_for

from chunkmaster.client.connection import MasterConnection
from chunkmaster.rpc import master_pb2 as pb


def dataset(tmp_path: Path) -> str:
    return ten_record_chunks(tmp_path / "d.rio")


def durable_progress(addr: str) -> int | None:
    """The records consumed of the pass once every applied entry is durable (a report is
    journaled lazily, docs/sessions.md), else None."""
    st = master_status(addr)
    store = st["store"]
    return st["ledger"][-1]["consumed"] if store["durable_seq"] == store["seq"] else None


def hold_a_task(addr: str, data: str) -> tuple[str, Any]:
    with MasterConnection(addr, timeout=60) as c:
        c.set_dataset([data])
    s = RawSession(addr)
    sid = s.hello(name="survivor").welcome.session_id
    s.send(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=5))
    task = s.recv().task
    s.send(keep_alive=pb.KeepAlive(progress=[position(task, 6)]))
    wait_for(lambda: durable_progress(addr) == 6, "the progress to be durable")
    s.close()
    return sid, task


def resume_and_finish(addr: str, sid: str, task: Any) -> None:
    st = master_status(addr)
    (trainer,) = st["trainers"]
    assert trainer["session"] == sid and trainer["tasks_held"] == 1
    assert st["ledger"][-1]["consumed"] == 6
    s = RawSession(addr)
    welcome = s.hello(session_id=sid)
    assert welcome.welcome.session_id == sid, welcome
    s.send(next=pb.NextTask(finished=[position(task, 10)], want_task=False))
    assert s.recv().ack.applied == 1
    st = master_status(addr)
    assert st["done"] == 1 and st["pending"] == 0
    assert st["ledger"][-1]["redispatched"] == {}
    s.close()


def test_a_session_survives_a_restart_on_the_embedded_store(tmp_path: Path) -> None:
    args = ["--store", str(tmp_path / "m.db"), "--chunk-per-task", "1", "--trainer-ttl", "30"]
    m = MasterProcess(args).start()
    try:
        assert m.addr is not None
        sid, task = hold_a_task(m.addr, dataset(tmp_path))
        m.restart()
        assert m.addr is not None
        resume_and_finish(m.addr, sid, task)
    finally:
        m.kill()


def test_a_session_survives_a_failover_on_etcd(tmp_path: Path, etcd_server: EtcdServer) -> None:
    args = ["--endpoints", etcd_server.endpoint, "--host", "127.0.0.1", "--ttl", "2"]
    args += ["--chunk-per-task", "1", "--trainer-ttl", "30"]
    leader = MasterProcess(args).start()
    standby = MasterProcess(args).start(wait=False)
    try:
        assert leader.addr is not None
        sid, task = hold_a_task(leader.addr, dataset(tmp_path))
        leader.kill()
        assert standby.wait_serving(60), standby.log()
        assert standby.addr is not None
        resume_and_finish(standby.addr, sid, task)
    finally:
        leader.kill()
        standby.kill()

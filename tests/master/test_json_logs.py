"""`--log-format json`: every line the master writes is one JSON object, and the lines about a
task or a trainer say which."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.raw_session import RawSession

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.model import TaskMeta
from chunkmaster.rpc import master_pb2 as pb


def test_json_lines_name_the_task_and_the_trainer(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", 4)
    m = MasterProcess(["--store", ":memory:", "--chunk-per-task", "1", "--log-format", "json"])
    m.start()
    try:
        assert m.addr is not None
        with MasterConnection(m.addr) as c:
            c.set_dataset([data])
            task = c.get_task(0)
            c.task_failed(TaskMeta(task.meta.id, task.meta.epoch), "bad chunk")
        s = RawSession(m.addr)
        s.hello(name="alice")
        s.send(goodbye=pb.Goodbye())
        s.recv()
        s.close()
        assert m.wait_log(r"ended \(returned\)")
    finally:
        m.terminate()
    lines = [json.loads(line) for line in m.log().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    failed = [ln for ln in lines if ln.get("reason") == "bad chunk"]
    assert failed and failed[0]["task"] == task.meta.id and failed[0]["pass_id"] == 0
    sessions = [ln for ln in lines if ln.get("trainer") == "alice"]
    assert len(sessions) == 2  # opened, ended
    assert all(ln["session"] for ln in sessions)

"""A task timeout means "stuck", not "slow" (docs/failures.md, docs/sessions.md).

A trainer with a session reports its progress; its tasks time out only once it has made no
progress for `--task-timeout-dur`. Real master and trainer processes:

* a session trainer that reads one task slowly, for three timeouts, and makes progress all
  along keeps the task, while another trainer waits for work: nothing is handed out again,
  nothing read twice, no timeout counted;
* a session that stays alive (keep-alives) but stops making progress loses its task one
  timeout after its last progress, and the task is handed out again from there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.raw_session import RawSession
from helpers.status_view import master_status, master_status_view
from helpers.waits import wait_for

from chunkmaster.client.connection import MasterConnection
from chunkmaster.rpc import master_pb2 as pb

TRAINER = str(Path(__file__).resolve().parents[1] / "helpers" / "session_trainer.py")
RECORDS = 30  # one task of them all
TIMEOUT = 3.0  # --task-timeout-dur, seconds
STEP = 0.3  # seconds a record: the task takes 3 timeouts to read


def start_trainer(addr: str, out: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, TRAINER, "--addr", addr, "--out", str(out), "--passes", "1"]
    cmd += ["--report-every", "1", "--name", name, *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    with open(out.with_suffix(".log"), "w") as err:
        return subprocess.Popen(cmd, stderr=err, env=env)


def records(out: Path) -> list[int]:
    lines = out.read_text().splitlines() if out.exists() else []
    return [int(ln.split()[2]) for ln in lines if ln.startswith("r 0 ")]


def master(tmp_path: Path) -> MasterProcess:
    data = numbered_records(tmp_path / "data.rio", RECORDS)
    args = ["--store", ":memory:", "--chunk-per-task", str(RECORDS)]
    args += ["--task-timeout-dur", f"{TIMEOUT:g}s"]
    m = MasterProcess(args, log_path=tmp_path / "master.log").start()
    assert m.addr is not None
    with MasterConnection(m.addr) as c:
        c.set_dataset([data])
    return m


def test_a_slow_trainer_making_progress_keeps_its_task(tmp_path: Path) -> None:
    m = master(tmp_path)
    addr = m.addr
    assert addr is not None
    slow_out, other_out = tmp_path / "slow.out", tmp_path / "other.out"
    trainers = []
    try:
        trainers.append(start_trainer(addr, slow_out, "slow", "--step-time", str(STEP)))
        wait_for(lambda: master_status_view(addr).pending == 1, "the slow trainer to hold the task")
        # Another trainer, idle, that a timed-out task would go to.
        trainers.append(start_trainer(addr, other_out, "other"))
        for t in trainers:
            assert t.wait(timeout=120) == 0, slow_out.with_suffix(".log").read_text()[-3000:]
        st = master_status(addr)
    finally:
        for t in trainers:
            if t.poll() is None:
                t.kill()
        m.kill()
    slow, other = records(slow_out), records(other_out)
    assert Counter(slow + other) == Counter(range(RECORDS))  # each record once
    assert sorted(slow) == list(range(RECORDS)) and other == []  # the slow trainer kept it
    assert st["tasks_with_failures"] == 0, st["failed_tasks"]
    assert st["ledger"][-1]["redispatched"] == {}


def test_a_live_session_that_stops_progressing_loses_its_task(tmp_path: Path) -> None:
    m = master(tmp_path)
    addr = m.addr
    assert addr is not None
    s = RawSession(addr)
    try:
        s.hello(name="stuck")
        s.send(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=10))
        task = s.recv().task
        at = pb.TaskPosition(task_id=task.meta.id, epoch=task.meta.epoch, pass_id=0, records=5)
        s.send(keep_alive=pb.KeepAlive(progress=[at]))  # 5 records read, then no more

        def timed_out() -> bool:
            s.send(keep_alive=pb.KeepAlive(progress=[at]))  # alive, the same position
            return master_status_view(addr).tasks_with_failures == 1

        wait_for(timed_out, "the stuck session's task to time out", 60)
        st = master_status(addr)
        assert st["sessions"] == 1  # alive all along: its lease never ran out
        assert [r["reason"] for r in st["failed_tasks"][0]["reasons"]] == ["timeout"]
        # Handed out again from the position the session reported.
        s.send(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=10))
        again = s.recv().task
        assert (again.meta.id, again.meta.epoch, again.start) == (task.meta.id, 2, 5)
    finally:
        s.close()
        m.kill()

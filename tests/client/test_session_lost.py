"""A trainer frozen past its lease (SIGSTOP): its tasks go to another trainer; thawed
(SIGCONT), it opens a new session, and its next commit() is refused with
CheckpointRefusedError: its model holds records that will be delivered again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.datasets import write_records
from helpers.master_process import MasterProcess
from helpers.status_view import status_view
from helpers.waits import wait_for

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.checkpoint import decode

TRAINER = str(Path(__file__).resolve().parents[1] / "helpers" / "session_trainer.py")


def _trainer(addr: str, out: Path, *args: str) -> subprocess.Popen[bytes]:
    err = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - the process owns it
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, TRAINER, "--addr", addr, "--out", str(out), "--passes", "1", *args]
    return subprocess.Popen(cmd, stderr=err, env=env)


def _records(out: Path) -> int:
    if not out.exists():
        return 0
    return sum(1 for ln in out.read_text().splitlines() if ln.startswith("r "))


def test_a_trainer_thawed_after_its_lease_gets_a_new_session_and_a_refused_commit(
    tmp_path: Path, master_process: Any
) -> None:
    data = write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(400)], max_chunk_size=50)
    master = master_process(
        "--chunk-per-task", "4", "--trainer-ttl", "1", "--task-timeout-dur", "10m"
    )
    addr = str(master.addr)
    a_out, b_out = tmp_path / "a.out", tmp_path / "b.out"
    a = b = None
    try:
        with MasterConnection(addr, timeout=60) as c:
            c.set_dataset([str(data)])
        a = _trainer(addr, a_out, "--step-time", "0.02", "--commit-every", "7")
        wait_for(lambda: _records(a_out) >= 10, "trainer a to read")
        a.send_signal(signal.SIGSTOP)

        def sessions() -> int:
            with MasterConnection(addr) as c:
                return int(status_view(c.status()).sessions)

        wait_for(lambda: sessions() == 0, "a's lease to run out")
        # b takes a's tasks (first in line) and holds them: it reads slowly.
        b = _trainer(addr, b_out, "--step-time", "2")
        wait_for(lambda: _records(b_out) >= 1, "trainer b to read")
        a.send_signal(signal.SIGCONT)
        assert a.wait(60) != 0
        log = a_out.with_suffix(".log").read_text()
        assert "ended while this trainer was away" in log, log[-3000:]
        assert "CheckpointRefusedError" in log and "handed to another trainer" in log, log[-3000:]
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(10)
        master.kill()


REPORT_EVERY = 10  # records a run holds at most: a thawed trainer reads at most one more


def _lines(out: Path) -> list[list[str]]:
    return [ln.split() for ln in out.read_text().splitlines()] if out.exists() else []


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_thawed_trainer_stops_reading_the_tasks_it_lost_and_its_commit_is_refused(
    tmp_path: Path, master_process: Any
) -> None:
    """Issue 19, item 4: frozen past its lease with task 0 read and tasks 1 and 2 held (30
    records into task 1, in the middle of a run, all of it reported), the trainer is thawed
    after another trainer has read the whole pass (so tasks 1 and 2 are finished by their
    new holder: not pending) and committed it. Thawed, it reads at most the rest of the run
    in its hands, and its commit, which covers task 1, is refused naming it; the data
    checkpoint then holds exactly what was committed, and a master restored from it
    delivers the rest once."""
    records = 600  # 6 tasks of 100 records: chunks of 25, 4 a task
    data = write_records(
        tmp_path / "d.rio", [b"%06d" % i for i in range(records)], max_chunk_size=25 * 6
    )
    master = master_process(
        "--chunk-per-task", "4", "--trainer-ttl", "1", "--task-timeout-dur", "10m"
    )
    addr = str(master.addr)
    a_out, b_out = tmp_path / "a.out", tmp_path / "b.out"
    a = b = None
    common = ["--report-every", str(REPORT_EVERY), "--commit-every", "1000"]
    try:
        with MasterConnection(addr, timeout=60) as c:
            c.set_dataset([str(data)])
            assert status_view(c.status()).num_tasks == 6
        a = _trainer(addr, a_out, *common, "--freeze-after", "130")
        wait_for(lambda: ["z"] in _lines(a_out) and _stopped(a.pid), "trainer a to freeze")

        def sessions() -> int:
            with MasterConnection(addr) as c:
                return int(status_view(c.status()).sessions)

        wait_for(lambda: sessions() == 0, "a's lease to run out")
        b = _trainer(addr, b_out, *common)
        assert b.wait(120) == 0, b_out.with_suffix(".log").read_text()[-3000:]
        a.send_signal(signal.SIGCONT)
        assert a.wait(60) != 0  # its commit is refused: CheckpointRefusedError
        log = a_out.with_suffix(".log").read_text()
        assert "CheckpointRefusedError" in log and "task 1 (epoch 1) was taken" in log, log[-3000:]
        with MasterConnection(addr, timeout=60) as c:
            blob = c.data_checkpoint()
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
        master.kill()

    a_lines = _lines(a_out)
    frozen = a_lines.index(["z"])
    before = [int(ln[2]) for ln in a_lines[:frozen] if ln[0] == "r"]
    after = [int(ln[2]) for ln in a_lines[frozen:] if ln[0] == "r"]
    assert before == list(range(130))
    read_by_b = [int(ln[2]) for ln in _lines(b_out) if ln[0] == "r"]
    twice = set(before + after) & set(read_by_b)
    # The master knew a's position (130) when it froze: only what a read after the thaw is
    # read twice, at most the rest of the run in its hands.
    assert set(after) == twice and len(after) < REPORT_EVERY, after
    assert sorted(set(before + after) | set(read_by_b)) == list(range(records))

    # The checkpoint holds b's commits (tasks 1 to 5, whole), not a's refused one (task 0).
    cp = decode(blob)
    assert cp.floor == 0 and [p.full for p in cp.passes] == [frozenset(range(1, 6))], cp
    ckpt = tmp_path / "job.ckpt"
    ckpt.write_bytes(blob)
    fresh = MasterProcess(
        ["--store", str(tmp_path / "fresh.db"), "--chunk-per-task", "4", "--restore", str(ckpt)],
        log_path=tmp_path / "fresh.log",
    ).start()  # fmt: skip
    c_out = tmp_path / "c.out"
    try:
        c = _trainer(str(fresh.addr), c_out)
        assert c.wait(120) == 0, c_out.with_suffix(".log").read_text()[-3000:]
    finally:
        fresh.kill()
    restored = [int(ln[2]) for ln in _lines(c_out) if ln[0] == "r" and ln[1] == "0"]
    assert sorted(restored) == list(range(100))  # task 0, each record once

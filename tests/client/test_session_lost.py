"""A trainer frozen past its lease (SIGSTOP): its tasks go to another trainer; thawed
(SIGCONT), it opens a new session, and its next commit() is refused with
CheckpointRefusedError: its model holds records that will be delivered again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from helpers.datasets import write_records
from helpers.master_process import MasterProcess

from chunkmaster.client.connection import MasterConnection

TRAINER = str(Path(__file__).resolve().parents[1] / "helpers" / "session_trainer.py")


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _trainer(addr: str, out: Path, *args: str) -> subprocess.Popen[bytes]:
    err = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - the process owns it
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, TRAINER, "--addr", addr, "--out", str(out), "--passes", "1", *args]
    return subprocess.Popen(cmd, stderr=err, env=env)


def _records(out: Path) -> int:
    if not out.exists():
        return 0
    return sum(1 for ln in out.read_text().splitlines() if ln.startswith("r "))


def test_a_trainer_thawed_after_its_lease_gets_a_new_session_and_a_refused_commit(
    tmp_path: Path,
) -> None:
    data = write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(400)], max_chunk_size=50)
    master = MasterProcess(
        ["--store", str(tmp_path / "s.db"), "--chunk-per-task", "4", "--trainer-ttl", "1",
         "--task-timeout-dur", "10m"],
        log_path=tmp_path / "m.log",
    ).start()  # fmt: skip
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
                return int(c.status()["sessions"])

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

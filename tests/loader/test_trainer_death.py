"""A trainer SIGKILLed while its Loader's workers run leaves no process behind: its DataLoader
workers, the forkserver they were forked from and the resource tracker all exit (torch's
workers watch their parent, which under the forkserver is not the trainer; readers.py's
watch of the trainer's pid ends them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess

TRAINER = """
import sys, threading
from chunkmaster.torch import Loader

if __name__ == "__main__":
    loader = Loader(sys.argv[1], dataset=[sys.argv[2]], batch_size=4, num_workers=2,
                    multiprocessing_context=sys.argv[3] if sys.argv[3] != "default" else None)
    for i, batch in enumerate(loader):
        if i == 2:
            print("READY", flush=True)
            threading.Event().wait()  # a trainer stuck in its step, until it is killed
"""


def descendants(pid: int) -> set[int]:
    """The living processes under `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            found.add(kid)
            todo.append(kid)
    return found


def living(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.add(pid)
        except OSError:
            pass
    return out


@pytest.mark.parametrize("context", ["default", "spawn"])
def test_a_sigkilled_trainer_leaves_no_worker_nor_forkserver(tmp_path: Path, context: str) -> None:
    data = numbered_records(tmp_path / "a.rio", 2000, max_chunk_size=4000)
    m = MasterProcess(["--store", str(tmp_path / "s.db")]).start()
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    trainer = subprocess.Popen(
        [sys.executable, str(script), str(m.addr), data, context],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    left: set[int] = set()
    try:
        assert trainer.stdout is not None
        assert trainer.stdout.readline().strip() == "READY"
        under = descendants(trainer.pid)
        assert len(under) >= 2, under  # the two workers (and the forkserver, the tracker)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        deadline = time.monotonic() + 60
        while (left := living(under)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"still running after the trainer died: {sorted(left)}"
    finally:
        for pid in living(left):
            os.kill(pid, signal.SIGKILL)
        if trainer.poll() is None:
            trainer.kill()
        m.kill()

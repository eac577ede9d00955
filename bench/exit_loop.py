"""Trainer exits: many short `chunkmaster read` runs against one master, a few at a time, each
given a deadline to exit; any that does not is dumped (py-spy, if installed, then faulthandler's
stacks via SIGABRT into its log) and counted.

A trainer once hung at exit about once in 60 runs on a loaded machine: a call object deleted
by the garbage collector while the interpreter finalized waited for a lock held by gRPC's
frozen thread (docs/client.md, "Threads and performance"). The hang needs load to show: run it
with the machine busy, and with more runs at once than cores.

    .venv/bin/python bench/exit_loop.py --runs 600 --parallel 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers.datasets import write_records
from helpers.master_process import MasterProcess


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=40.0, help="seconds for one run to exit")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="exit-loop-"))
    data = write_records(work / "d.rio", [b"%06d" % i for i in range(400)], max_chunk_size=40)
    master = MasterProcess(["--store", str(work / "state.db"), "--chunk-per-task", "1"]).start()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    env = dict(os.environ, PYTHONFAULTHANDLER="1")

    def one(i: int) -> bool:
        """Whether run `i` exited in time."""
        cmd = [sys.executable, "-m", "chunkmaster", "read", "--addr", str(master.addr)]
        cmd += ["--dataset", str(data), "--passes", "1", "--json"]
        with open(work / f"run{i}.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)
            try:
                proc.wait(args.deadline)
                return True
            except subprocess.TimeoutExpired:
                if os.path.exists(spy):
                    subprocess.run([spy, "dump", "--pid", str(proc.pid)], stdout=log, check=False)
                proc.send_signal(signal.SIGABRT)
                proc.wait(10)
                return False

    start = time.monotonic()
    try:
        with ThreadPoolExecutor(args.parallel) as pool:
            exited = list(pool.map(one, range(args.runs)))
    finally:
        master.kill()
    hung = [i for i, ok in enumerate(exited) if not ok]
    print(
        f"{args.runs} runs, {args.parallel} at a time, {time.monotonic() - start:.0f} s: "
        f"{len(hung)} did not exit within {args.deadline:g} s"
        + (f" (logs: {', '.join(str(work / f'run{i}.log') for i in hung)})" if hung else "")
    )
    return 1 if hung else 0


if __name__ == "__main__":
    sys.exit(main())

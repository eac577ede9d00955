"""What a master needs per million tasks: memory, disk, CPU per dispatch, recovery time.

One real `chunkmaster master` process on the embedded store (synchronous=full), a dataset of
N one-chunk tasks (`--chunk-per-task 1`), then:

* RSS before and after set_dataset (the state's memory per task);
* the store's files after set_dataset (the dataset entry), and after a window of dispatch
  cycles by 8 clients (GetTask + TaskFinished: the journal's bytes per cycle) with the master's
  CPU seconds per 1,000 cycles (from /proc: utime + stime);
* a SIGKILL and a restart on the same store: seconds to the ready file (recovery), and RSS.

Figures for docs/deploy.md ("What a master needs").

    .venv/bin/python bench/footprint.py                 # 1M tasks, a 30 s window
    .venv/bin/python bench/footprint.py --tasks 100000 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from dispatch_bench import Master, make_dataset, measure

from chunkmaster.client.connection import MasterConnection


def store_bytes(db: Path) -> int:
    """The store's files together: the database, its -wal and -shm files, the witness."""
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=30.0, help="the dispatch window")
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="footprint-"))
    data = make_dataset(root, args.tasks)
    db = root / "state.db"
    common = ["--store", str(db), "--chunk-per-task", "1", "--task-timeout-dur", "1h"]
    m = Master(common)
    out: dict[str, float] = {"tasks": args.tasks}
    try:
        idle = m.rss()
        t0 = time.perf_counter()
        with MasterConnection(m.addr, timeout=900) as c:
            c.set_dataset([data])
        out["set_dataset_s"] = round(time.perf_counter() - t0, 2)
        out["rss_idle_mb"] = round(idle / 2**20, 1)
        out["rss_dataset_mb"] = round(m.rss() / 2**20, 1)
        out["bytes_per_task_rss"] = round((m.rss() - idle) / args.tasks, 1)
        out["store_dataset_mb"] = round(store_bytes(db) / 2**20, 1)
        before_bytes, before_cpu = store_bytes(db), cpu_seconds(m.proc.pid)
        t0 = time.perf_counter()
        rate = measure(m.addr, args.clients, 2.0, args.seconds)
        elapsed = time.perf_counter() - t0
        cycles = rate * args.seconds
        out["cycles_per_s"] = round(rate)
        out["cpu_s_per_1k_cycles"] = round(
            (cpu_seconds(m.proc.pid) - before_cpu) / (rate * elapsed) * 1000, 3
        )
        out["store_bytes_per_cycle"] = round((store_bytes(db) - before_bytes) / cycles, 1)
        out["store_after_window_mb"] = round(store_bytes(db) / 2**20, 1)
        out["rss_after_window_mb"] = round(m.rss() / 2**20, 1)
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait(30)
    finally:
        if m.proc.poll() is None:
            m.stop()
    t0 = time.perf_counter()
    again = Master(common)
    try:
        out["recovery_after_sigkill_s"] = round(time.perf_counter() - t0, 2)
        out["rss_recovered_mb"] = round(again.rss() / 2**20, 1)
    finally:
        again.stop()
    out["store_after_clean_stop_mb"] = round(store_bytes(db) / 2**20, 1)
    print(json.dumps(out, indent=1))
    subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    main()

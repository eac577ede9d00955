"""Mixtures (docs/mixtures.md): what 100 sources cost a master, against one dataset of the
same tasks, in one run.

* Dispatch: GetTask + TaskFinished cycles per second (dispatch_bench.py's clients) on a job
  whose dataset is 100 RecordIO files of one-record chunks (one chunk a task), set once as one
  list of patterns and once as a mixture of 100 sources, one file each, with unequal weights
  (1 to 100). The window spans several passes, so each mixture pass's plan (made when the
  pass begins) is paid for. Runs alternate (dataset, mixture, dataset, mixture, ...) so that
  the machine's load falls on both; the figure is the ratio of the medians.
* At scale (`--big-tasks`, 1M by default): a 100-source mixture on the embedded store after a
  window of dispatch: the data checkpoint's size and save time (DataCheckpoint RPC), beside
  one dataset's; the time to recover after a SIGKILL (restart on the store to ready), and the
  time to restore the checkpoint into a fresh master (start with --restore to ready).

    .venv/bin/python bench/mixture_bench.py                 # about four minutes here
    .venv/bin/python bench/mixture_bench.py --big-tasks 100000 --rounds 2 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from dispatch_bench import Master, chunk_bytes, measure
from footprint import cpu_seconds

from chunkmaster.client.connection import MasterConnection
from chunkmaster.rpc import master_pb2 as pb

SOURCES = 100


def make_sources(root: Path, tasks: int) -> list[str]:
    """SOURCES RecordIO files sharing `tasks` one-record chunks (a valid file, built fast)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(SOURCES):
        n = tasks // SOURCES + (1 if i < tasks % SOURCES else 0)
        path = root / f"src-{i:03d}.rio"
        path.write_bytes(chunk_bytes() * n)
        paths.append(str(path))
    return paths


def sources_pb(paths: list[str]) -> list[pb.Source]:
    return [
        pb.Source(name=f"s{i:03d}", globs=[p], weight=float(1 + i)) for i, p in enumerate(paths)
    ]


def set_dataset(addr: str, paths: list[str], mixture: bool) -> float:
    """Seconds to set the job's dataset: the files as one list, or as 100 sources."""
    t0 = time.perf_counter()
    with MasterConnection(addr, timeout=900) as c:
        if mixture:
            c.set_dataset([], 900, sources_pb(paths))
        else:
            c.set_dataset(paths, 900)
    return time.perf_counter() - t0


def dispatch(paths: list[str], rounds: int, clients: int, warmup: float, secs: float) -> dict:
    """Cycles/s of each kind of job, and the master's CPU per 1,000 cycles (from /proc: less
    sensitive than the rate to what else the machine runs)."""
    rates: dict[str, list[float]] = {"dataset": [], "mixture": []}
    cpu: dict[str, list[float]] = {"dataset": [], "mixture": []}
    for _ in range(rounds):
        for kind in ("dataset", "mixture"):
            m = Master(["--store", ":memory:", "--chunk-per-task", "1", "--task-timeout-dur", "1h"])
            try:
                set_dataset(m.addr, paths, kind == "mixture")
                before = cpu_seconds(m.proc.pid)
                rate = measure(m.addr, clients, warmup, secs)
                cycles = rate * (warmup + secs)  # the warmup's cycles too
                cpu[kind].append((cpu_seconds(m.proc.pid) - before) / cycles * 1000)
                rates[kind].append(rate)
                with MasterConnection(m.addr) as c:
                    passes = c.status()["cur_pass"]
            finally:
                m.stop()
            row = {kind: round(rate), "cpu_s_per_1k": round(cpu[kind][-1], 3), "passes": passes}
            print(json.dumps(row), flush=True)
    one, mix = statistics.median(rates["dataset"]), statistics.median(rates["mixture"])
    one_cpu, mix_cpu = statistics.median(cpu["dataset"]), statistics.median(cpu["mixture"])
    return {
        "dataset_cycles_per_s": round(one),
        "mixture_cycles_per_s": round(mix),
        "ratio": round(mix / one, 3),
        "dataset_cpu_s_per_1k_cycles": round(one_cpu, 3),
        "mixture_cpu_s_per_1k_cycles": round(mix_cpu, 3),
        "cpu_ratio": round(one_cpu / mix_cpu, 3),
        "runs": {k: [round(x) for x in v] for k, v in rates.items()},
    }


def ready_seconds(args: list[str]) -> tuple[float, Master]:
    t0 = time.perf_counter()
    m = Master(args)
    return time.perf_counter() - t0, m


def at_scale(root: Path, paths: list[str], clients: int, secs: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("dataset", "mixture"):
        db = root / f"{kind}.db"
        common = ["--store", str(db), "--chunk-per-task", "1", "--task-timeout-dur", "1h"]
        m = Master(common)
        try:
            out[f"{kind}_set_dataset_s"] = round(set_dataset(m.addr, paths, kind == "mixture"), 2)
            measure(m.addr, clients, 1.0, secs)  # some tasks finished: a position to save
            with MasterConnection(m.addr, timeout=600) as c:
                t0 = time.perf_counter()
                blob = c.data_checkpoint()
                out[f"{kind}_checkpoint_save_s"] = round(time.perf_counter() - t0, 3)
            out[f"{kind}_checkpoint_bytes"] = len(blob)
            ckpt = root / f"{kind}.ckpt"
            ckpt.write_bytes(blob)
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(30)
        finally:
            if m.proc.poll() is None:
                m.stop()
        took, again = ready_seconds(common)
        again.stop()
        out[f"{kind}_recovery_after_sigkill_s"] = round(took, 2)
        fresh = ["--store", str(root / f"{kind}-restored.db"), "--chunk-per-task", "1"]
        took, restored = ready_seconds([*fresh, "--restore", str(ckpt)])
        restored.stop()
        out[f"{kind}_restore_from_checkpoint_s"] = round(took, 2)
        print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tasks",
        type=int,
        default=2_000,
        help="tasks of the dispatch runs (small: passes roll over)",
    )
    ap.add_argument("--big-tasks", type=int, default=1_000_000, help="tasks at scale (0: skip)")
    ap.add_argument("--rounds", type=int, default=3, help="dispatch runs of each kind (0: skip)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mixture-bench-"))
    try:
        paths = make_sources(root / "small", args.tasks)
        result: dict[str, Any] = {"sources": SOURCES, "dispatch_tasks": args.tasks}
        if args.rounds:
            result.update(dispatch(paths, args.rounds, args.clients, args.warmup, args.seconds))
        if args.big_tasks:
            big = make_sources(root / "big", args.big_tasks)
            result["big_tasks"] = args.big_tasks
            result.update(at_scale(root, big, args.clients, args.seconds))
        print(json.dumps(result, indent=1))
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    main()

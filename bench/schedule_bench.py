"""What a weight schedule costs a master (docs/limits.md, "Mixtures"): a mixture of three
(`--sources`) small sources, set_weights with a schedule of P points, then K sources added one
call each (each keeps the schedule in force, the added source at weight 1 at every point).
Reports the master's RSS after each step, each call's time, the longest stall of the master's
event loop seen by a prober (a Status call every 20 ms from another thread, timed), the
store's bytes on disk, and the time to recover after a SIGKILL (restart on the same store to
ready).

    .venv/bin/python bench/schedule_bench.py --points 20000 --adds 100
    .venv/bin/python bench/schedule_bench.py --points 60000 --mode linear --adds 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
from pathlib import Path

from dispatch_bench import Master, chunk_bytes

from chunkmaster.client.connection import MasterConnection
from chunkmaster.rpc import master_pb2 as pb


def disk_bytes(store: Path) -> int:
    """The store's bytes: its file and those beside it (SQLite's -wal, -shm)."""
    return sum(p.stat().st_size for p in store.parent.glob(store.name + "*") if p.is_file())


class Prober:
    """Times a Status call every 20 ms: the longest answer is the loop's longest stall."""

    def __init__(self, addr: str) -> None:
        self.addr, self.worst, self.stop = addr, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conn = MasterConnection(self.addr, timeout=600)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            with contextlib.suppress(Exception):  # a bench: the stall is what counts
                conn._call("Status", pb.StatusRequest(), 600)
            self.worst = max(self.worst, time.perf_counter() - t0)
            time.sleep(0.02)

    def take(self) -> float:
        w, self.worst = self.worst, 0.0
        return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=20_000)
    ap.add_argument("--mode", default="step")
    ap.add_argument("--adds", type=int, default=100, help="sources added, one call each")
    ap.add_argument("--sources", type=int, default=3, help="the mixture's sources at first")
    ap.add_argument("--tasks", type=int, default=10, help="one-record tasks a source")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="schedule-bench-"))
    files = []
    for i in range(args.sources + args.adds):
        path = root / f"s{i}.rio"
        path.write_bytes(chunk_bytes() * args.tasks)
        files.append(str(path))
    store = root / "store"
    master = Master(["--store", str(store), "--chunk-per-task", "1"])
    out: dict[str, object] = {
        "sources": args.sources,
        "points": args.points,
        "mode": args.mode,
        "adds": args.adds,
    }
    try:
        conn = MasterConnection(master.addr, timeout=600)
        sources = [
            pb.Source(name=f"s{i}", globs=[files[i]], weight=1.0) for i in range(args.sources)
        ]
        conn.set_dataset([], 600, sources)
        out["rss_set_MB"] = master.rss() / 1e6
        names = [f"s{i}" for i in range(args.sources)]
        points = [
            pb.WeightPoint(
                records=k * 10,
                weights=[
                    pb.SourceWeight(name=n, weight=1.0 + (k + j) % 7) for j, n in enumerate(names)
                ],
            )
            for k in range(args.points)
        ]
        prober = Prober(master.addr)
        time.sleep(0.2)
        out["probe_quiet_s"] = prober.take()
        t0 = time.perf_counter()
        conn.set_weights(points, args.mode)
        out["set_weights_s"] = time.perf_counter() - t0
        time.sleep(0.1)
        out["set_weights_stall_s"] = prober.take()
        out["rss_weights_MB"] = master.rss() / 1e6
        out["store_weights_MB"] = disk_bytes(store) / 1e6
        times = []
        for i in range(args.sources, args.sources + args.adds):
            t0 = time.perf_counter()
            try:
                conn.set_weights(
                    [], "step", [pb.Source(name=f"s{i}", globs=[files[i]], weight=1.0)], 600
                )
            except Exception as exc:
                out["add_refused"] = f"at add {i - args.sources}: {exc}"
                break
            times.append(time.perf_counter() - t0)
        if times:
            out["add_s_first_last_max"] = (times[0], times[-1], max(times))
        time.sleep(0.1)
        out["add_stall_s"] = prober.take()
        prober.stop.set()
        out["rss_end_MB"] = master.rss() / 1e6
        out["store_end_MB"] = disk_bytes(store) / 1e6
        master.proc.kill()
        master.proc.wait()
        print(json.dumps(out), flush=True)  # what was measured, if the restart fails
        t0 = time.perf_counter()
        try:
            again = Master(["--store", str(store), "--chunk-per-task", "1"])
        except Exception as exc:  # a bench: say so and go on
            out["restart_s"] = f"not ready: {exc}"
        else:
            out["restart_s"] = time.perf_counter() - t0
            out["rss_restart_MB"] = again.rss() / 1e6
            again.stop()
    finally:
        if master.proc.poll() is None:
            master.proc.kill()
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}))


if __name__ == "__main__":
    main()

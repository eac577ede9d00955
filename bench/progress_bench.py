"""What a session with record-level progress costs one trainer, against the same client without.

    .venv/bin/python bench/progress_bench.py [--mb 800] [--repeat 11] [--sizes 100,4096]

A pass must last long enough to time: at 4 KiB records 100 MB is ~30 ms a pass, mostly
noise; 800 MB (the default) is 0.2-0.3 s at 4 KiB and ~2.5 s at 100 B.

One trainer reads whole passes from a `chunkmaster master` process, counting records, in three
modes, interleaved run by run (so the machine's noise hits them alike):
* unary:     the baseline, `Client(session=False)`: no session, no progress; tasks by unary
             GetTask and finishes by a reporter thread;
* session:   `Client()` with progress every 1,000 records (the default): one Session stream,
             finishes riding on task requests, runs cut at 1,000 records, keep-alives carrying
             the positions read off the runs' iterators;
* no-report: a session with `report_every=0` (positions only with the periodic keep-alive).
Each is measured with `for r in client.records(p)` and with `client.next_record()`. Besides
records per second (wall clock), records per CPU second of the trainer process (all of its
threads: the session's and gRPC's included) and of the trainer's thread alone (what the hot
path pays) are shown: on a machine shared with other work, CPU time is the steadier measure.

Why the unary client is the honest baseline: it is the fastest way this package reads a pass
from a master, with the same files, chunk reads and checks and the same loop body; the only
difference is what a session adds (the stream, the cut runs, the progress). Figures are the
median of --repeat runs; the ratios are against the unary client's median of the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_bench import CHUNK, CHUNKS_PER_TASK, make_files, start_master

from chunkmaster.client import Client, EndOfPass, Session

MODES: dict[str, dict[str, Any]] = {
    "unary": {"session": False},
    "session": {"session": Session(report_every=1000)},
    "no-report": {"session": Session(report_every=0)},
}


def read_records(c: Client, pass_id: int) -> int:
    n = 0
    for _ in c.records(pass_id):
        n += 1
    return n


def read_next(c: Client, pass_id: int) -> int:
    c.start_get_records(pass_id)
    nr = c.next_record
    n = 0
    try:
        while True:
            nr()
            n += 1
    except EndOfPass:
        return n


def one_pass(addr: str, pass_id: int, mode: str, loop: Any) -> tuple[int, float, float, float]:
    """Records; wall seconds; CPU seconds of this process (every thread of the client) and of
    the trainer's thread alone."""
    with Client(addr, **MODES[mode]) as c:
        c.status()  # connected (and the session opened) before the clock starts
        while c.session_id == "":
            time.sleep(0.001)
        t, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
        n = loop(c, pass_id)
        return (
            n,
            time.perf_counter() - t,
            time.process_time() - cpu,
            time.thread_time() - own,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=800)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--sizes", default="100,4096", help="record sizes in bytes")
    args = ap.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, ~{args.mb} MB per size, "
        f"{CHUNK >> 20} MiB chunks, {CHUNKS_PER_TASK} chunks per task, median of {args.repeat}"
    )
    print(
        f"{'records':>8} {'loop':>12} {'mode':>10} {'records/s':>12} {'vs unary':>9} "
        f"{'records/cpu-s':>14} {'vs unary':>9} {'/trainer-cpu-s':>14} {'vs unary':>9}"
    )
    loops = {"records()": read_records, "next_record": read_next}
    with tempfile.TemporaryDirectory(prefix="progress-bench-") as tmp:
        for size in (int(x) for x in args.sizes.split(",") if x):
            paths, total = make_files(Path(tmp), size, args.mb)
            master, addr = start_master(Path(tmp))
            try:
                with Client(addr, session=False) as c:
                    c.set_dataset(paths)
                pass_id = 0
                label = f"{size >> 10} KiB" if size >= 1024 else f"{size} B"
                for loop_name, loop in loops.items():
                    rates: dict[str, list[float]] = {m: [] for m in MODES}
                    cpu_rates: dict[str, list[float]] = {m: [] for m in MODES}
                    own_rates: dict[str, list[float]] = {m: [] for m in MODES}
                    for _ in range(args.repeat):
                        for mode in MODES:
                            n, dt, cpu, own = one_pass(addr, pass_id, mode, loop)
                            pass_id += 1
                            assert n == total, (mode, n, total)
                            rates[mode].append(n / dt)
                            cpu_rates[mode].append(n / cpu)
                            own_rates[mode].append(n / own)
                    base = statistics.median(rates["unary"])
                    cpu_base = statistics.median(cpu_rates["unary"])
                    own_base = statistics.median(own_rates["unary"])
                    for mode, rs in rates.items():
                        med = statistics.median(rs)
                        cpu_med = statistics.median(cpu_rates[mode])
                        own_med = statistics.median(own_rates[mode])
                        print(
                            f"{label:>8} {loop_name:>12} {mode:>10} {med:12,.0f} "
                            f"{med / base:8.3f}x {cpu_med:14,.0f} {cpu_med / cpu_base:8.3f}x "
                            f"{own_med:14,.0f} {own_med / own_base:8.3f}x",
                            flush=True,
                        )
            finally:
                master.terminate()
                master.wait(30)
            for p in paths:
                os.unlink(p)


if __name__ == "__main__":
    main()

"""How fast one trainer gets records through the Client, against reading the files directly.

    .venv/bin/python bench/stream_bench.py [--mb 200] [--repeat 3] [--procs 1,2,4] [--sizes ...]

For 100-byte and 64 KiB records (uncompressed, page-cached, ~--mb MB each), it measures:
* scan:        the baseline: `for r in recordio.scan(path)` over every file, in one process;
* next_record: one Client, `client.next_record()` until EndOfPass;
* records():   one Client, `for r in client.records(p)`;
* N procs:     N trainer processes (records()), total records/s from the first start to the
               last end; the master is a separate `chunkmaster master` process.
Every loop body does the same (counts the record), so the differences are the hand-over.

Why the direct scan is the honest baseline: it is the fastest plain way to do the same work in
one process. It reads the same files in the same chunk order as the Client (the master hands
out tasks in file order), with the same checks (CRC, decompression, the framing of every
record) and the same result (every record as `bytes`), through recordio's fastest read path
(one read per chunk; for large records a reused buffer, so no page faults per chunk). It has no
master, no threads and no hand-over; a plain file read without the checks would not be the same
work. Each figure is the best of --repeat runs; the ratio is against the scan of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chunkmaster.client import Client, EndOfPass
from chunkmaster.master.readiness import wait_ready
from chunkmaster.recordio import Compressor, Writer, scan

CHUNK = 4 << 20
CHUNKS_PER_TASK = 10  # given: PaddlePaddle's default, the master's before it chose one


def make_files(directory: Path, size: int, total_mb: int, files: int = 4) -> tuple[list[str], int]:
    per_file = total_mb * (1 << 20) // size // files
    paths = []
    for f in range(files):
        path = directory / f"r{size}-{f}.rio"
        record = bytes(range(256)) * (size // 256) + bytes(size % 256)
        with Writer(str(path), max_chunk_size=CHUNK, compressor=Compressor.NONE) as w:
            for i in range(per_file):
                w.write(i.to_bytes(8, "big") + record[8:])
        paths.append(str(path))
    for p in paths:  # into the page cache
        Path(p).read_bytes()
    return paths, per_file * files


def bench_scan(paths: list[str]) -> tuple[int, float]:
    n = 0
    t = time.perf_counter()
    for p in paths:
        for _ in scan(p):
            n += 1
    return n, time.perf_counter() - t


def bench_next_record(addr: str, pass_id: int) -> tuple[int, float]:
    with Client(addr) as c:
        c.status()  # connected before the clock starts
        t = time.perf_counter()
        c.start_get_records(pass_id)
        nr = c.next_record
        n = 0
        try:
            while True:
                nr()
                n += 1
        except EndOfPass:
            pass
        return n, time.perf_counter() - t


def bench_records(addr: str, pass_id: int) -> tuple[int, float]:
    with Client(addr) as c:
        c.status()
        t = time.perf_counter()
        n = 0
        for _ in c.records(pass_id):
            n += 1
        return n, time.perf_counter() - t


def worker(addr: str, pass_id: int) -> None:
    """Trainer process: connect, wait for "go" on stdin, read one pass, print the timing."""
    with Client(addr) as c:
        c.status()
        print("ready", flush=True)
        sys.stdin.readline()
        t0 = time.time()
        n = 0
        for _ in c.records(pass_id):
            n += 1
        print(json.dumps({"n": n, "t0": t0, "t1": time.time()}), flush=True)


def bench_procs(addr: str, pass_id: int, procs: int) -> tuple[int, float]:
    cmd = [sys.executable, __file__, "--worker", addr, str(pass_id)]
    ps = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    for p in ps:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in ps:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in ps:
        assert p.stdout is not None
        results.append(json.loads(p.stdout.readline()))
        p.wait(60)
    n = sum(r["n"] for r in results)
    return n, max(r["t1"] for r in results) - min(r["t0"] for r in results)


def start_master(directory: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    ready = directory / "master.ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chunkmaster", "master", "--port", "0", "--store", ":memory:",
         "--chunk-per-task", str(CHUNKS_PER_TASK), "--task-timeout-dur", "10m",
         "--ready-file", str(ready), *extra],
        stdout=subprocess.DEVNULL, stderr=open(directory / "master.log", "w"), text=True,  # noqa: SIM115
    )  # fmt: skip
    info = wait_ready(ready, proc, 60, (directory / "master.log").read_text)
    return proc, str(info["addr"])


class Runner:
    """Best of `repeat` runs; each Client run reads the master's next pass."""

    def __init__(self, paths: list[str], addr: str, total: int, repeat: int) -> None:
        self.paths, self.addr, self.total, self.repeat = paths, addr, total, repeat
        self.next_pass = 0

    def best(self, fn: Any, *extra: Any) -> float:
        """Records/s of `fn(addr, pass, *extra)`, or of the direct scan when fn is None."""
        rates = []
        for _ in range(self.repeat):
            if fn is None:
                n, dt = bench_scan(self.paths)
            else:
                n, dt = fn(self.addr, self.next_pass, *extra)
                self.next_pass += 1
            assert n == self.total, (fn, n, self.total)
            rates.append(n / dt)
        return max(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--procs", default="1,2,4", help="trainer process counts ('' for none)")
    ap.add_argument("--sizes", default="100,65536", help="record sizes in bytes")
    ap.add_argument("--worker", nargs=2, metavar=("ADDR", "PASS"))
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, ~{args.mb} MB per size, "
        f"{CHUNK >> 20} MiB chunks, {CHUNKS_PER_TASK} chunks per task"
    )
    print(f"{'records':>9} {'mode':>12} {'records/s':>12} {'MB/s':>9} {'vs scan':>8}")
    with tempfile.TemporaryDirectory(prefix="stream-bench-") as tmp:
        for size in (int(x) for x in args.sizes.split(",") if x):
            paths, total = make_files(Path(tmp), size, args.mb)
            master, addr = start_master(Path(tmp))
            try:
                with Client(addr) as c:
                    c.set_dataset(paths)
                run = Runner(paths, addr, total, args.repeat)
                ceiling = run.best(None)
                rows = [("scan", ceiling)]
                rows.append(("next_record", run.best(bench_next_record)))
                rows.append(("records()", run.best(bench_records)))
                for k in (int(x) for x in args.procs.split(",") if x):
                    rows.append((f"{k} procs", run.best(bench_procs, k)))
                label = f"{size >> 10} KiB" if size >= 1024 else f"{size} B"
                for mode, rate in rows:
                    print(
                        f"{label:>9} {mode:>12} {rate:12,.0f} {rate * size / 1e6:9.1f} "
                        f"{rate / ceiling:7.2f}x",
                        flush=True,
                    )
            finally:
                master.terminate()
                master.wait(30)
            for p in paths:
                os.unlink(p)


if __name__ == "__main__":
    main()

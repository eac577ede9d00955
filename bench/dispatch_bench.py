"""Dispatch throughput: GetTask + TaskFinished cycles per second over gRPC on loopback.

A real `chunkmaster master` process serves; load comes from separate client processes
(asyncio gRPC clients, one channel each), so the master's own CPU is what is measured.
For each store (in-memory, embedded SQLite) and dataset size (1k .. 1M tasks, one chunk a
task), it reports cycles/s with 1, 8 and 64 concurrent clients; then the master's memory
per task and the time to set a dataset of 10,000 files.

Baselines, in the same run: the rate at 1k tasks is the baseline for the larger datasets (the
cost of a cycle must not grow with the dataset), and the in-memory store is the baseline for
the embedded one (what durability costs: an fsync per group commit). There is no faster plain
way to hand out a task over gRPC than the master's own in-memory path with the same RPCs; the
gRPC floor itself (an empty unary call) is what issue 10's streaming sessions will be measured
against.

    .venv/bin/python bench/dispatch_bench.py            # full table (several minutes)
    .venv/bin/python bench/dispatch_bench.py --quick    # 1k and 100k only, short windows
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from chunkmaster.client.connection import MasterConnection
from chunkmaster.master.readiness import MasterNotReady, wait_ready
from chunkmaster.recordio import Compressor, Writer
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc import master_pb2_grpc as pb_grpc

ONE_CHUNK = None  # bytes of a one-record chunk, computed once


def chunk_bytes() -> bytes:
    global ONE_CHUNK
    if ONE_CHUNK is None:
        path = Path(tempfile.mkdtemp()) / "one.rio"
        with Writer(str(path), compressor=Compressor.NONE) as w:
            w.write(b"x")
        ONE_CHUNK = path.read_bytes()
    return ONE_CHUNK


def make_dataset(root: Path, tasks: int) -> str:
    """A file of `tasks` identical one-record chunks (a valid RecordIO file, built fast)."""
    path = root / f"tasks-{tasks}.rio"
    if not path.exists():
        path.write_bytes(chunk_bytes() * tasks)
    return str(path)


class Master:
    """A master process on a free port; its address comes from its ready file."""

    def __init__(self, args: list[str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dispatch-bench-"))
        ready = self.dir / "ready.json"
        cmd = [sys.executable, "-m", "chunkmaster", "master", "--port", "0", "--log-level", "info"]
        cmd += ["--ready-file", str(ready)]
        self.proc = subprocess.Popen(
            cmd + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        lines: list[str] = []

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                lines.append(line)
                if "ERROR" in line or "CRITICAL" in line or "Traceback" in line:
                    sys.stderr.write("master: " + line)

        threading.Thread(target=pump, daemon=True).start()
        try:
            self.addr = str(wait_ready(ready, self.proc, 60, lambda: "".join(lines))["addr"])
        except MasterNotReady:
            self.proc.kill()
            raise

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def _client_loop(addr: str, stop_at: float, counts: list[int], slot: int) -> None:
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = pb_grpc.MasterStub(ch)
        status = json.loads((await stub.Status(pb.StatusRequest())).json)
        pass_id = status["cur_pass"]
        while time.monotonic() < stop_at:
            try:
                reply = await stub.GetTask(
                    pb.GetTaskRequest(pass_id=pass_id, wait_seconds=2.0), timeout=10
                )
            except grpc.aio.AioRpcError as exc:
                if "smaller than master" in (exc.details() or ""):
                    pass_id += 1
                    continue
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DEADLINE_EXCEEDED):
                    continue
                raise
            t = reply.task
            await stub.TaskFinished(
                pb.TaskFinishedRequest(task_id=t.meta.id, epoch=t.meta.epoch, pass_id=t.pass_id)
            )
            counts[slot] += 1


def _load_process(addr: str, clients: int, warmup: float, seconds: float, out: mp.Queue) -> None:
    async def main() -> None:
        counts = [0] * clients
        start = time.monotonic()
        stop_at = start + warmup + seconds
        tasks = [
            asyncio.create_task(_client_loop(addr, stop_at, counts, i)) for i in range(clients)
        ]
        await asyncio.sleep(warmup)
        before = sum(counts)
        t0 = time.monotonic()
        await asyncio.gather(*tasks)
        out.put((sum(counts) - before, time.monotonic() - t0))

    asyncio.run(main())


def measure(
    addr: str,
    clients: int,
    warmup: float,
    seconds: float,
    target: Callable[..., None] = _load_process,
    extra: tuple[Any, ...] = (),
) -> float:
    """Cycles/s of `clients` clients spread over two processes running `target(*extra, addr,
    clients_here, warmup, seconds, queue)` (the unary GetTask+TaskFinished loop by default)."""
    procs_n = min(clients, 2)
    per = [clients // procs_n + (1 if i < clients % procs_n else 0) for i in range(procs_n)]
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*extra, addr, n, warmup, seconds, q)) for n in per]
    for p in procs:
        p.start()
    results = [q.get(timeout=warmup + seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    return sum(n for n, _ in results) / max(dt for _, dt in results)


def bench_rates(
    root: Path, sizes: list[int], clients: list[int], warmup: float, secs: float
) -> list[dict]:
    rows = []
    for store in ("memory", "sqlite"):
        for size in sizes:
            data = make_dataset(root, size)
            store_args = (
                ["--store", ":memory:"]
                if store == "memory"
                else ["--store", str(root / f"s-{size}-{time.time_ns()}.db")]
            )
            m = Master([*store_args, "--chunk-per-task", "1", "--task-timeout-dur", "10m"])
            try:
                t0 = time.perf_counter()
                with MasterConnection(m.addr, timeout=600) as c:
                    c.set_dataset([data])
                set_s = time.perf_counter() - t0
                row = {"store": store, "tasks": size, "set_dataset_s": round(set_s, 2)}
                for n in clients:
                    row[f"c{n}"] = round(measure(m.addr, n, warmup, secs))
                row["rss_mb"] = round(m.rss() / 2**20, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
            finally:
                m.stop()
    return rows


def bench_memory(root: Path, size: int) -> float:
    data = make_dataset(root, size)
    m = Master(["--store", ":memory:", "--chunk-per-task", "1"])
    try:
        before = m.rss()
        with MasterConnection(m.addr, timeout=600) as c:
            c.set_dataset([data])
        return (m.rss() - before) / size
    finally:
        m.stop()


def bench_many_files(root: Path, files: int) -> float:
    d = root / f"files-{files}"
    if not d.exists():
        d.mkdir()
        blob = chunk_bytes() * 3
        for i in range(files):
            (d / f"part-{i:05d}.rio").write_bytes(blob)
    m = Master(["--store", ":memory:"])
    try:
        t0 = time.perf_counter()
        with MasterConnection(m.addr, timeout=600) as c:
            c.set_dataset([str(d / "part-*.rio")])
        return time.perf_counter() - t0
    finally:
        m.stop()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--sizes", default="")
    ap.add_argument("--clients", default="1,8,64")
    args = ap.parse_args()
    sizes = [1_000, 10_000, 100_000, 1_000_000]
    if args.quick:
        sizes, args.seconds = [1_000, 100_000], 2.0
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    clients = [int(c) for c in args.clients.split(",")]
    root = Path(tempfile.mkdtemp(prefix="dispatch-bench-"))
    print(
        f"cpus={os.cpu_count()} python={sys.version.split()[0]} window={args.seconds}s", flush=True
    )
    rows = bench_rates(root, sizes, clients, args.warmup, args.seconds)
    per_task = bench_memory(root, max(sizes))
    many = bench_many_files(root, 10_000)

    print()
    print("GetTask+TaskFinished cycles/s over gRPC (loopback; master in its own process)")
    head = f"{'store':8} {'tasks':>9} " + " ".join(f"{f'{n} cl':>8}" for n in clients)
    head += f" {'set_dataset':>12} {'rss MB':>8}"
    print(head)
    for r in rows:
        line = f"{r['store']:8} {r['tasks']:>9} " + " ".join(f"{r[f'c{n}']:>8}" for n in clients)
        line += f" {r['set_dataset_s']:>11}s {r['rss_mb']:>8}"
        print(line)
    for store in ("memory", "sqlite"):
        mine = {r["tasks"]: r for r in rows if r["store"] == store}
        lo, hi = min(mine), max(mine)
        for n in clients:
            ratio = mine[hi][f"c{n}"] / mine[lo][f"c{n}"]
            print(f"{store} {n} clients: rate at {hi} tasks / rate at {lo} = {ratio:.2f}")
    print(f"master memory per task (in-memory store, {max(sizes)} tasks): {per_task:.0f} bytes")
    print(f"set_dataset of 10,000 files: {many:.2f} s")


if __name__ == "__main__":
    main()

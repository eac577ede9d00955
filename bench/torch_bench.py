"""A DataLoader over chunkmaster against the same DataLoader over the same local files, and what
a commit after every step costs.

    .venv/bin/python bench/torch_bench.py [--sizes 1k,64k,1m] [--mb N] [--repeat 5]
        [--workers 2] [--batch 64]

**Reading.** RecordIO records of each size of SIZES (uncompressed; 1 KiB in chunks of 64 KiB,
64 KiB in chunks of 4 MiB, 1 MiB in chunks of 16 MiB; `64k-1`: 64 KiB records one a chunk,
tasks of 32 chunks, as issue 30 measured them; `64k-d`: 64 KiB records in the writer's default
32 MiB chunks, a chunk a task), and Parquet at 1 KiB (row groups of 1,024
rows); each record becomes a uint8 tensor of its bytes, and batches of `--batch` are stacked by
torch's default_collate, in `--workers` DataLoader workers. Two ways, interleaved pass by pass,
medians of `--repeat` rounds (the ratio: the median of each round's ratio):

* baseline: the fastest plain way to read the same files with a DataLoader: a map-style
  dataset over the files' preloaded chunk offsets with `__getitems__`, which reads each
  batch's records with one read of each chunk (row group) it touches, RecordIO records as
  views of recordio's reused chunk buffer (`scan(copy=False)`: no copy out of it), a
  sequential sampler (no shuffle: the files are read in order, as chunkmaster reads each
  task's chunks), `DataLoader(batch_size=B, num_workers=W, persistent_workers=True)`;
* chunkmaster: `chunkmaster.torch.Loader(batch_size=B, num_workers=W, persistent_workers=True)`
  over a master on the embedded store (a full pass: tasks handed out, read by the workers,
  finishes and progress reported).

**Commits.** One Loader's training loop of `--step-ms` per step (a sleep: the accelerator's
time), `--steps` steps, with `loader.commit()` after every step against without: p50 and p99 of
the commit call, and the loop's time per step with commits against without.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from chunkmaster.master.readiness import wait_ready
from chunkmaster.recordio import Compressor, Writer, load_index, scan
from chunkmaster.torch import Loader

SIZES = {
    # record size: (chunk size, chunks per task, MB of records)
    "1k": (1 << 10, 64 << 10, 32, 64),  # tasks of about 2 MB
    "64k": (64 << 10, 4 << 20, 4, 256),  # 64 records a chunk, tasks of 16 MB
    "1m": (1 << 20, 16 << 20, 1, 512),  # 16 records a chunk, tasks of 16 MB
    "64k-1": (64 << 10, 64 << 10, 32, 256),  # one record a chunk, tasks of 2 MB
    # The writer's default 32 MiB chunks (512 records), a chunk a task (the master's choice
    # for a dataset of 8 chunks): a task is one run of records.
    "64k-d": (64 << 10, 32 << 20, 1, 256),
}


def as_tensor(record: Any) -> torch.Tensor:
    data = record["data"] if isinstance(record, dict) else record
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def make_recordio(d: Path, mb: int, record: int = 1024, chunk: int = 64 << 10) -> tuple[str, int]:
    n = mb * (1 << 20) // record
    path = d / "data.rio"
    payload = bytes(range(256)) * (record // 256)
    with Writer(str(path), max_chunk_size=chunk, compressor=Compressor.NONE) as w:
        for i in range(n):
            w.write(i.to_bytes(8, "big") + payload[8:])
    path.read_bytes()
    return str(path), n


def make_parquet(d: Path, mb: int, record: int = 1024) -> tuple[str, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = mb * (1 << 20) // record
    payload = bytes(range(256)) * (record // 256)
    rows = [i.to_bytes(8, "big") + payload[8:] for i in range(n)]
    path = d / "data.parquet"
    pq.write_table(pa.table({"data": pa.array(rows, pa.binary())}), path, row_group_size=1024)
    path.read_bytes()
    return str(path), n


class RecordIOFiles(Dataset[torch.Tensor]):
    """Record i of a RecordIO file; each chunk is decoded once (the last one is kept), its
    records views of recordio's reused, page-aligned chunk buffer (no copy out of it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.index = load_index(path)
        self.firsts = [self.index.first_record(c) for c in range(self.index.num_chunks)]
        self.n = self.index.num_records
        self._chunk, self._records = -1, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for i in indices:
            c = bisect.bisect_right(self.firsts, i) - 1
            if c != self._chunk:
                count = self.index.chunk_records[c]
                self._records = []  # its buffer is free for the next chunk (buffers.py)
                self._records = list(scan(self.path, self.index, self.firsts[c], count, copy=False))
                self._chunk = c
            out.append(as_tensor(self._records[i - self.firsts[c]]))
        return out


class ParquetFiles(Dataset[torch.Tensor]):
    """Row i of a Parquet file; a batch reads each row group it touches once."""

    def __init__(self, path: str) -> None:
        import pyarrow.parquet as pq

        self.path = path
        meta = pq.ParquetFile(path).metadata
        self.firsts, total = [], 0
        for g in range(meta.num_row_groups):
            self.firsts.append(total)
            total += meta.row_group(g).num_rows
        self.n = total
        self._file: Any = None
        self._group, self._column = -1, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        import pyarrow.parquet as pq

        if self._file is None:
            self._file = pq.ParquetFile(self.path)
        out: list[torch.Tensor] = []
        for i in indices:
            g = bisect.bisect_right(self.firsts, i) - 1
            if g != self._group:
                table = self._file.read_row_group(g, columns=["data"])
                self._column = table.column(0).to_pylist()
                self._group = g
            out.append(as_tensor(self._column[i - self.firsts[g]]))
        return out


def start_master(d: Path, chunks_per_task: int = 32) -> tuple[subprocess.Popen[str], str]:
    ready = d / "ready.json"
    log = open(d / "master.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "chunkmaster", "master", "--port", "0", "--store", str(d / "s.db"),
         "--chunk-per-task", str(chunks_per_task), "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=log, text=True,
    )  # fmt: skip
    info = wait_ready(ready, proc, 60, (d / "master.log").read_text)
    return proc, str(info["addr"])


def time_pass(batches: Any) -> tuple[int, float]:
    t = time.perf_counter()
    n = sum(len(b) for b in batches)
    return n, time.perf_counter() - t


def bench_reading(
    d: Path, fmt: str, size: str, mb: int | None, repeat: int, workers: int, batch: int
) -> None:
    record, chunk, per_task, default_mb = SIZES[size]
    mb = mb or default_mb
    if fmt == "recordio":
        path, n = make_recordio(d, mb, record, chunk)
    else:
        path, n = make_parquet(d, mb, record)
    plain = DataLoader(
        RecordIOFiles(path) if fmt == "recordio" else ParquetFiles(path),
        batch_size=batch,
        num_workers=workers,
        persistent_workers=True,
    )
    proc, addr = start_master(d, per_task)
    ours = Loader(
        addr,
        dataset=[path],
        transform=as_tensor,
        batch_size=batch,
        num_workers=workers,
        persistent_workers=True,
    )
    rates: dict[str, list[float]] = {"baseline": [], "chunkmaster": []}
    try:
        for _ in range(repeat + 1):  # the first round warms both up (workers, page cache)
            for name, loader in (("baseline", plain), ("chunkmaster", ours)):
                got, dt = time_pass(loader)
                assert got == n, (name, got, n)
                rates[name].append(got / dt)
    finally:
        ours.close()
        proc.terminate()
        proc.wait(30)
    base = statistics.median(rates["baseline"][1:])
    mine = statistics.median(rates["chunkmaster"][1:])
    # Each round's two passes run back to back: the median of the rounds' ratios is what the
    # machine's drifts (other work starting and stopping) disturb least.
    ratio = statistics.median(
        m / b for m, b in zip(rates["chunkmaster"][1:], rates["baseline"][1:], strict=True)
    )
    print(
        f"{fmt:8} {size:>5} {n:>6} records  baseline {base:>9,.0f} rec/s  chunkmaster "
        f"{mine:>9,.0f} rec/s  {ratio:.2f}x (median of {len(rates['baseline']) - 1} rounds)",
        flush=True,
    )


def bench_commits(d: Path, steps: int, step_ms: float) -> None:
    path, _ = make_recordio(d, 48)
    proc, addr = start_master(d)
    try:
        per_step: dict[bool, list[float]] = {False: [], True: []}
        commits: list[float] = []
        with Loader(addr, dataset=[path], batch_size=64, num_workers=2) as loader:
            it = iter(loader)
            for round_ in range(4):  # interleaved: with, without, with, without
                commit = round_ % 2 == 0
                t0 = time.perf_counter()
                for _ in range(steps):
                    next(it)
                    time.sleep(step_ms / 1000)  # the accelerator's step
                    if commit:
                        c = time.perf_counter()
                        loader.commit()
                        commits.append(time.perf_counter() - c)
                per_step[commit].append((time.perf_counter() - t0) / steps)
    finally:
        proc.terminate()
        proc.wait(30)
    commits.sort()
    p50 = commits[len(commits) // 2] * 1000
    p99 = commits[min(len(commits) - 1, len(commits) * 99 // 100)] * 1000
    with_c = statistics.mean(per_step[True]) * 1000
    without = statistics.mean(per_step[False]) * 1000
    print(
        f"commit every step at {1000 / step_ms:.0f} steps/s: commit p50 {p50:.2f} ms, p99 "
        f"{p99:.2f} ms; step {with_c:.1f} ms with, {without:.1f} ms without "
        f"({100 * (with_c / without - 1):+.1f}%)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, help="MB of records per size (default: SIZES')")
    ap.add_argument("--sizes", default="1k,64k,1m", help="record sizes, of " + ",".join(SIZES))
    ap.add_argument("--formats", default="recordio,parquet", help="parquet: 1 KiB records only")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--only", choices=["reading", "commits"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if args.only in (None, "reading"):
            for size in args.sizes.split(","):
                for fmt in args.formats.split(","):
                    if fmt == "parquet" and size != "1k":
                        continue  # row groups of 1,024 rows
                    sub = d / f"{fmt}-{size}"
                    sub.mkdir()
                    bench_reading(sub, fmt, size, args.mb, args.repeat, args.workers, args.batch)
        if args.only in (None, "commits"):
            sub = d / "commits"
            sub.mkdir()
            bench_commits(sub, args.steps, args.step_ms)


if __name__ == "__main__":
    main()

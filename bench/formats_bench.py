"""Reading Parquet, JSON Lines and text datasets through a master, against pyarrow and plain
Python loops over the same files, in the same run.

    .venv/bin/python bench/formats_bench.py [--mb 64] [--repeat 3]
    .venv/bin/python bench/formats_bench.py --chunk-sizes 16KiB,32KiB,256KiB,4MiB --mb 50

The second form measures what the master's --chunk-size costs for JSON Lines and text: at each
size, the chunks and tasks of the dataset (at 10 chunks a task, given), the master's index
pass in MB/s, and one trainer's records/s through a master started with that --chunk-size,
beside the plain loop (below) in the same run.

One trainer (`Client`) reads whole passes from a `chunkmaster master` process (one per format,
embedded store in memory); files are generated in a temp dir and read once first, so every
figure is page-cached. Each figure is the median of --repeat runs, baselines and ours
interleaved run by run (this machine is shared: the noise hits both alike). Besides records per
second (wall clock), records per CPU second of the bench process (every thread: the client's,
gRPC's and pyarrow's; the master is another process) are shown: on a machine shared with other
work, CPU time is the steadier measure.

Baselines, each the fastest plain way to do the same work:
* Parquet batches: `pyarrow.parquet.ParquetFile(path).read_row_group(i)` for every row group
  of every file, one after the other, all columns: pyarrow's own reader, with nothing around
  it. Our `client.batches()` does the same reads plus the dispatch (tasks over gRPC, progress).
* Parquet rows: the same reads plus `Table.to_pylist()`, pyarrow's C++ conversion to row dicts
  (the plain way to get rows); pyarrow's batch read is shown beside it for scale.
* JSON Lines: `for line in f: json.loads(line)` over each file opened in binary mode (json
  accepts bytes; no decode step): the loop everybody writes, nothing else in it.
* Text: `for line in f` over each file in text mode (UTF-8, universal newlines): Python's own
  buffered line splitting and decoding.
* JSON Lines indexing: the master's pass (`LinesFormat.index`: read blocks, cut at the last
  newline before the chunk size, 32 KiB by default, count newlines) against `f.read(4 MiB)`
  until the end of the same file: the bytes/s of just getting the data into memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_bench import start_master

from chunkmaster.client import Client, Reading
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.sizes import size_text
from chunkmaster.formats.lines import CHUNK_SIZE, JSONL, TEXT, index_lines
from chunkmaster.formats.storage import LOCAL
from chunkmaster.master.config import parse_size

FILES = 4


def make_parquet(d: Path, mb: int) -> tuple[list[str], int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows_per_file = mb * (1 << 20) // 40 // FILES  # ~40 bytes a row uncompressed
    paths = []
    for f in range(FILES):
        n = rows_per_file
        base = f * n
        table = pa.table(
            {
                "id": pa.array(range(base, base + n), pa.int64()),
                "x": pa.array([i * 0.5 for i in range(n)], pa.float64()),
                "label": pa.array([i % 1000 for i in range(n)], pa.int32()),
                "text": pa.array([f"item-{i % 5000}" for i in range(n)]),
            }
        )
        path = d / f"part-{f}.parquet"
        pq.write_table(table, path, row_group_size=64 * 1024)
        paths.append(str(path))
    return paths, rows_per_file * FILES


def make_lines(d: Path, mb: int) -> tuple[list[str], list[str], int]:
    jsonl, text = [], []
    per_file = mb * (1 << 20) // FILES
    total = 0
    for f in range(FILES):
        jp, tp = d / f"part-{f}.jsonl", d / f"part-{f}.txt"
        with open(jp, "w") as j, open(tp, "w") as t:
            size = 0
            i = 0
            while size < per_file:
                line = json.dumps({"id": i, "file": f, "text": f"record {i} " + "ab" * (i % 40)})
                j.write(line + "\n")
                t.write(line + "\n")
                size += len(line) + 1
                i += 1
            total += i
        jsonl.append(str(jp))
        text.append(str(tp))
    return jsonl, text, total


def warm(paths: list[str]) -> None:
    for p in paths:
        Path(p).read_bytes()


def timed(fn: Callable[[], int]) -> tuple[int, float, float]:
    """fn()'s result, wall seconds and CPU seconds of this process."""
    t, cpu = time.perf_counter(), time.process_time()
    n = fn()
    return n, time.perf_counter() - t, time.process_time() - cpu


class Master:
    """A master process serving one dataset; each run reads its next pass."""

    def __init__(self, d: Path, pattern: str, *extra: str, prefetch_tasks: int = 1) -> None:
        d.mkdir()
        self.prefetch_tasks = prefetch_tasks
        self.proc, self.addr = start_master(d, *extra)
        with MasterConnection(self.addr, timeout=600) as c:
            c.set_dataset([pattern])
            self.status = c.status()
        self.next_pass = 0

    def read(self, how: str) -> tuple[int, float, float]:
        """Records of the next pass, and the wall and CPU seconds they took from a connected
        client (its session open) to the pass's end."""
        p = self.next_pass
        self.next_pass += 1
        n = 0
        with Client(self.addr, reading=Reading(prefetch_tasks=self.prefetch_tasks)) as c:
            c.status()
            while c.session_id == "":
                time.sleep(0.001)
            t, cpu = time.perf_counter(), time.process_time()
            if how == "batches":
                for b in c.batches(p):
                    n += b.num_rows
            else:
                for _ in c.records(p):
                    n += 1
            return n, time.perf_counter() - t, time.process_time() - cpu

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def pq_batches(paths: list[str]) -> int:
    import pyarrow.parquet as pq

    n = 0
    for path in paths:
        pf = pq.ParquetFile(path)
        for i in range(pf.metadata.num_row_groups):
            n += pf.read_row_group(i).num_rows
    return n


def pq_rows(paths: list[str]) -> int:
    import pyarrow.parquet as pq

    n = 0
    for path in paths:
        pf = pq.ParquetFile(path)
        for i in range(pf.metadata.num_row_groups):
            for _ in pf.read_row_group(i).to_pylist():
                n += 1
    return n


def json_loop(paths: list[str]) -> int:
    n = 0
    loads = json.loads
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                loads(line)
                n += 1
    return n


def text_loop(paths: list[str]) -> int:
    n = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for _ in f:
                n += 1
    return n


def read_blocks(paths: list[str]) -> int:
    size = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while block := f.read(4 << 20):
                size += len(block)
    return size


def index_all(paths: list[str], chunk_size: int = CHUNK_SIZE) -> int:
    size = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            _, _, lengths = index_lines(f, chunk_size)
        size += sum(lengths)
    return size


def chunk_sizes(
    sizes: list[int], jsonl: list[str], text: list[str], d: Path, repeat: int, prefetch: int
) -> None:
    """What --chunk-size costs: the index pass and one trainer, at each size."""
    print(
        f"{'format':>6} {'chunk':>7} {'chunks':>7} {'tasks':>6} {'index MB/s':>11} "
        f"{'records/s':>11} {'loop/s':>11} {'ratio':>6}"
    )
    cases = (("jsonl", jsonl, "*.jsonl", json_loop), ("text", text, "*.txt", text_loop))
    for fmt, paths, pattern, loop in cases:
        for size in sizes:
            m = Master(
                d / f"m-{fmt}-{size}",
                str(d / pattern),
                "--chunk-size",
                str(size),
                prefetch_tasks=prefetch,
            )
            try:
                rows = []
                for _ in range(repeat):
                    n, dt, _ = timed(lambda: index_all(paths, size))  # noqa: B023
                    b, bdt, _ = timed(lambda: loop(paths))  # noqa: B023
                    r, rdt, _ = m.read("records")
                    assert b == r, (fmt, size, b, r)
                    rows.append((n / dt, r / rdt, b / bdt))
            finally:
                m.stop()
            ix, ours, base = (statistics.median(r[i] for r in rows) for i in range(3))
            print(
                f"{fmt:>6} {size_text(size):>7} {m.status['dataset']['chunks']:>7} "
                f"{m.status['num_tasks']:>6} {ix / 1e6:>11,.0f} {ours:>11,.0f} {base:>11,.0f} "
                f"{ours / base:>5.2f}x"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64, help="size of each dataset (all its files)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--chunk-sizes",
        help="comma-separated --chunk-size values (32KiB,4MiB): measure those for JSON Lines "
        "and text instead of the format comparison",
    )
    ap.add_argument(
        "--prefetch-tasks", type=int, default=1, help="the trainer's Client(prefetch_tasks=)"
    )
    args = ap.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, ~{args.mb} MB per dataset, "
        f"{FILES} files, median of {args.repeat}"
    )
    with tempfile.TemporaryDirectory(prefix="formats-bench-") as tmp:
        d = Path(tmp)
        jsonl, text, line_total = make_lines(d, args.mb)
        if args.chunk_sizes:
            warm(jsonl + text)
            sizes = [parse_size(s) for s in args.chunk_sizes.split(",")]
            chunk_sizes(sizes, jsonl, text, d, args.repeat, args.prefetch_tasks)
            return
        pq_paths, pq_rows_total = make_parquet(d, args.mb)
        warm(pq_paths + jsonl + text)
        assert sum(len(JSONL.index(p, LOCAL).records) for p in jsonl) > 0
        assert sum(len(TEXT.index(p, LOCAL).records) for p in text) > 0
        masters = {
            "parquet": Master(d / "m-parquet", str(d / "*.parquet")),
            "jsonl": Master(d / "m-jsonl", str(d / "*.jsonl")),
            "text": Master(d / "m-text", str(d / "*.txt")),
        }
        Ours = Callable[[], tuple[int, float, float]]
        cases: list[tuple[str, str, int, Ours, Callable[[], int]]] = [
            ("parquet", "batches", pq_rows_total,
             lambda: masters["parquet"].read("batches"), lambda: pq_batches(pq_paths)),
            ("parquet", "rows", pq_rows_total,
             lambda: masters["parquet"].read("records"), lambda: pq_rows(pq_paths)),
            ("jsonl", "records", line_total,
             lambda: masters["jsonl"].read("records"), lambda: json_loop(jsonl)),
            ("text", "records", line_total,
             lambda: masters["text"].read("records"), lambda: text_loop(text)),
        ]  # fmt: skip
        try:
            print(
                f"{'format':>8} {'read':>8} {'records/s':>12} {'baseline/s':>12} {'ratio':>6}"
                f" {'rec/cpu-s':>12} {'baseline':>12} {'ratio':>6}"
            )
            for fmt, how, total, ours, base in cases:
                rows: list[tuple[float, float, float, float]] = []
                for _ in range(args.repeat):
                    n, dt, cpu = timed(base)
                    assert n == total, (fmt, how, n, total)
                    m, mdt, mcpu = ours()
                    assert m == total, (fmt, how, m, total)
                    rows.append((m / mdt, n / dt, m / mcpu, n / cpu))
                a, b, c, d = (statistics.median(r[i] for r in rows) for i in range(4))
                print(
                    f"{fmt:>8} {how:>8} {a:>12,.0f} {b:>12,.0f} {a / b:>5.2f}x"
                    f" {c:>12,.0f} {d:>12,.0f} {c / d:>5.2f}x"
                )
            rates: list[tuple[float, float]] = []
            for _ in range(args.repeat):
                n, dt, _ = timed(lambda: read_blocks(jsonl))
                m, mdt, _ = timed(lambda: index_all(jsonl))
                rates.append((m / mdt, n / dt))
            a, b = (statistics.median(r[i] for r in rates) for i in range(2))
            print(
                f"JSON Lines indexing: {a / 1e6:,.0f} MB/s, f.read(4 MiB) of the same files "
                f"{b / 1e6:,.0f} MB/s: {a / b:.2f}x"
            )
        finally:
            for master in masters.values():
                master.stop()


if __name__ == "__main__":
    main()

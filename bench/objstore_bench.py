"""Reading a RecordIO dataset from an S3 server, and setting a dataset of 1,000 objects.

    .venv/bin/python bench/objstore_bench.py [--mb 48] [--chunk-kb 512] [--concurrency 8]
                                             [--objects 1000] [--repeat 3]

The S3 server is moto's standalone server (tests/helpers/s3_server.py), a real HTTP server on
loopback in its own process, reached through s3fs as any S3 endpoint would be. It runs on the
same two cores as everything else, so the absolute figures say little about a real object
store; the ratios, measured run by run in one process against the same server, are the point.

1. One trainer's MB/s: `Client(reading=Reading(storage_options=..., read_ahead=K))` reads a
   pass of a RecordIO dataset of incompressible records (chunks of --chunk-kb) from a
   `chunkmaster master` process, every chunk fetched by the client's read-ahead, CRC-checked
   and cut into records.
   Baseline: s3fs's own concurrent ranged reads, `S3FileSystem.cat_ranges` of exactly the same
   byte ranges (each chunk's offset and length) with `batch_size=K`, the same concurrency: the
   fastest plain way to move those bytes through s3fs, with no master, no checks, no records.
   The client folds neighbouring chunks into requests of up to 4 MiB (client/readahead.py),
   which is its design; `cat_ranges` asks for each range on its own. Target: at least 0.8x.
2. The master's set_dataset for --objects small RecordIO objects: a fresh master process each
   run, timed from the trainer's call to its answer (listing, every object's chunk index read
   in worker threads, the dataset committed). Baseline: s3fs's listing of the same pattern
   plus one ranged read of each object's first chunk header (`cat_ranges` of 20 bytes each,
   with the master's 32 index threads as `batch_size`): the least a master can do to know
   every object's chunks.

Runs are interleaved (each repeat runs both sides), figures are medians of --repeat runs.
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

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent / "tests")]

from helpers.datasets import write_records  # noqa: E402
from helpers.master_process import MasterProcess  # noqa: E402
from helpers.s3_server import S3Server  # noqa: E402

from chunkmaster.client import Client, EndOfPass, Reading  # noqa: E402
from chunkmaster.client.connection import MasterConnection  # noqa: E402
from chunkmaster.formats.recordio import FORMAT as RECORDIO  # noqa: E402
from chunkmaster.formats.storage import LOCAL  # noqa: E402
from chunkmaster.master.indexing import MAX_INDEX_THREADS  # noqa: E402
from chunkmaster.recordio import Compressor  # noqa: E402
from chunkmaster.remote import shared  # noqa: E402

RECORD = 4096
CHUNKS_PER_TASK = 10


def make_dataset(
    s3: S3Server, tmp: Path, total_mb: int, chunk_kb: int, files: int = 4
) -> tuple[list[tuple[str, int, int]], int, int]:
    """Upload the dataset; its chunks as (url, offset, length), its records and its bytes."""
    per_file = total_mb * (1 << 20) // files // RECORD
    ranges: list[tuple[str, int, int]] = []
    size = 0
    for i in range(files):
        local = write_records(
            tmp / f"part-{i}.rio",
            [os.urandom(RECORD) for _ in range(per_file)],
            max_chunk_size=chunk_kb * 1024,
            compressor=Compressor.NONE,
        )
        key = f"bench/ds/part-{i}.rio"
        s3.fs().put_file(str(local), key)
        idx = RECORDIO.index(str(local), LOCAL)
        ranges += [(f"s3://{key}", o, n) for o, n in zip(idx.offsets, idx.lengths, strict=True)]
        size += idx.size
    return ranges, per_file * files, size


def master(s3: S3Server, tmp: Path, name: str) -> MasterProcess:
    return MasterProcess(
        [
            "--store", str(tmp / f"{name}.db"),
            "--chunk-per-task", str(CHUNKS_PER_TASK),
            "--task-timeout-dur", "10m",
            "--data-root", "s3://bench/",
            "--storage-option", f"endpoint_url={s3.endpoint}",
            "--storage-option", f"key={s3.storage_options()['key']}",
            "--storage-option", f"secret={s3.storage_options()['secret']}",
        ],
        log_path=tmp / f"{name}.log",
    ).start(60)  # fmt: skip


def trainer_pass(c: Client, pass_id: int) -> tuple[int, float]:
    n = 0
    t0 = time.perf_counter()
    try:
        for _ in c.records(pass_id):
            n += 1
    except EndOfPass:
        pass
    return n, time.perf_counter() - t0


def baseline_ranges(s3: S3Server, ranges: list[tuple[str, int, int]], k: int) -> float:
    """Seconds s3fs's cat_ranges takes to fetch the chunks' byte ranges, K at once."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options())
    paths = [u.removeprefix("s3://") for u, _, _ in ranges]
    starts = [o for _, o, _ in ranges]
    ends = [o + n for _, o, n in ranges]
    fs.cat_file(paths[0], start=0, end=1)  # the connection and credentials: not timed
    t0 = time.perf_counter()
    blobs = fs.cat_ranges(paths, starts, ends, batch_size=k, on_error="raise")
    dt = time.perf_counter() - t0
    assert sum(map(len, blobs)) == sum(n for _, _, n in ranges)
    return dt


def make_objects(s3: S3Server, tmp: Path, n: int) -> None:
    local = write_records(tmp / "small.rio", [b"x" * 100] * 10, max_chunk_size=400)
    blob = local.read_bytes()
    s3.fs().pipe({f"bench/many/part-{i:05d}.rio": blob for i in range(n)})


def baseline_listing(s3: S3Server, n: int) -> float:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options())
    t0 = time.perf_counter()
    paths = fs.glob("bench/many/*.rio")
    fs.cat_ranges(paths, [0] * len(paths), [20] * len(paths), batch_size=MAX_INDEX_THREADS)
    dt = time.perf_counter() - t0
    assert len(paths) == n
    return dt


def set_dataset_time(s3: S3Server, tmp: Path, run: int, n: int) -> float:
    m = master(s3, tmp, f"many{run}")
    try:
        with Client(m.addr) as c:
            t0 = time.perf_counter()
            c.set_dataset(["s3://bench/many/*.rio"], timeout=600)
            dt = time.perf_counter() - t0
        with MasterConnection(m.addr) as conn:
            assert conn.status()["dataset"]["files"] == n
    finally:
        m.terminate()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=48)
    ap.add_argument("--chunk-kb", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--objects", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    k = args.concurrency
    s3 = S3Server()
    try:
        s3.fs().mkdir("bench")
        with tempfile.TemporaryDirectory(prefix="objstore-bench-") as d:
            tmp = Path(d)
            ranges, records, size = make_dataset(s3, tmp, args.mb, args.chunk_kb)
            make_objects(s3, tmp, args.objects)
            m = master(s3, tmp, "read")
            opts: dict[str, Any] = s3.storage_options()
            client_s, base_s, set_s, list_s = [], [], [], []
            try:
                with Client(m.addr, reading=Reading(storage_options=opts, read_ahead=k)) as c:
                    c.set_dataset(["s3://bench/ds/*.rio"])
                    # The connection and credentials, as the baseline's first read warms its.
                    shared(opts).read_ranges(ranges[0][0], [(0, 1)])
                    for run in range(args.repeat):
                        n, dt = trainer_pass(c, run)
                        assert n == records, (n, records)
                        client_s.append(dt)
                        base_s.append(baseline_ranges(s3, ranges, k))
            finally:
                m.terminate()
            for run in range(args.repeat):
                set_s.append(set_dataset_time(s3, tmp, run, args.objects))
                list_s.append(baseline_listing(s3, args.objects))
    finally:
        s3.stop()
    mb = size / (1 << 20)
    client_rate = mb / statistics.median(client_s)
    base_rate = mb / statistics.median(base_s)
    print(
        f"dataset: {mb:.0f} MiB in {len(ranges)} chunks of ~{args.chunk_kb} KiB, 4 objects; "
        f"concurrency {k}; medians of {args.repeat} runs"
    )
    print(f"  s3fs cat_ranges (baseline)  {base_rate:8.1f} MB/s")
    print(f"  trainer, read-ahead {k:<2}      {client_rate:8.1f} MB/s  "
          f"{client_rate / base_rate:.2f}x  (target >= 0.8x)")  # fmt: skip
    st, bl = statistics.median(set_s), statistics.median(list_s)
    print(f"set_dataset of {args.objects} objects:")
    print(f"  s3fs glob + one 20-byte read each (baseline)  {bl:6.2f} s "
          f"({bl / args.objects * 1000:.2f} ms/object)")  # fmt: skip
    print(f"  master set_dataset                           {st:6.2f} s "
          f"({st / args.objects * 1000:.2f} ms/object, "
          f"{bl / st:.2f}x the baseline's speed)")  # fmt: skip


if __name__ == "__main__":
    main()

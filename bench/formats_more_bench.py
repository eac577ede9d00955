"""TFRecord and WebDataset read speed against plain loops measured in the same run.

Run:  .venv/bin/python bench/formats_more_bench.py [--mb 64] [--repeat 3]
Files are generated in a temp dir and read once first, so every figure is page-cached; each
figure is the median of --repeat runs, ours and the baselines interleaved run by run (this
machine is shared: the noise hits both alike); each ratio is between medians of the same run.

What is timed for chunkmaster:
* `trainer`: one `Client` reading a whole pass with `for r in client.records(p)` from a
  `chunkmaster master` process (its own process, as in production) holding the one file;
* `loader`: the format alone, one trainer's work per chunk without the master: the chunk's
  bytes fetched through LocalStorage (one ranged read), every check the format makes, and every
  record taken from the `Loaded` the buffer consumes;
* `index`: the master's walk of the file (headers only), in MB of file per second.

Baselines (each the fastest plain way to do the same work, so a ratio cannot flatter us):

* TFRecord, `plain loop`: the whole file read with one `read()`, then one loop over the
  frames: `struct.unpack_from` of the header, both masked CRC32Cs with the same library
  (google-crc32c), a slice per record. It has no chunks, no counts to match and no error paths.
  `per-frame reads`: a loop reading each frame from the file (`readinto` of the header, `read`
  of the record, `readinto` of its CRC), faster for large records (one copy of each, not two).
  The ratios are against the faster of the two.
* WebDataset, `tarfile loop`: the stdlib's `tarfile` iterating the same members of the whole
  file and reading each one's bytes (`extractfile(m).read()`), grouping nothing. It is how a
  plain Python program reads a tar; it checks header checksums as we do.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from chunkmaster.client import Client
from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import FileIndex
from chunkmaster.formats.storage import LOCAL as STORAGE
from chunkmaster.formats.tfrecord import TFRecordFormat, crc32c, write_frames
from chunkmaster.formats.webdataset import WebDatasetFormat
from chunkmaster.master.readiness import wait_ready

HEADER = struct.Struct("<QI")
U32 = struct.Struct("<I")
DELTA = 0xA282EAD8


class Master:
    """A `chunkmaster master` process, and one pass of a Client reading the dataset it holds."""

    def __init__(self, directory: str, dataset: str) -> None:
        ready = Path(directory) / "master.ready.json"
        ready.unlink(missing_ok=True)
        log = Path(directory) / "master.log"
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chunkmaster", "master", "--port", "0", "--store",
                 ":memory:", "--task-timeout-dur", "10m", "--chunk-per-task", "10",
                 "--ready-file", str(ready)],
                stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        self.addr = str(wait_ready(ready, self.proc, 60, log.read_text)["addr"])
        self.passes = 0
        with Client(self.addr) as c:
            c.set_dataset([dataset])

    def one_pass(self) -> int:
        with Client(self.addr) as c:
            n = 0
            for _ in c.records(self.passes):
                n += 1
        self.passes += 1
        return n

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def medians(fns: dict[str, Callable[[], int]], n: int) -> dict[str, tuple[float, int]]:
    """Median wall time of n runs of each fn (which returns how many records it produced),
    run round-robin, so the machine's noise hits them alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    counts: dict[str, int] = {}
    for _ in range(n):
        for name, fn in fns.items():
            t = time.perf_counter()
            counts[name] = fn()
            times[name].append(time.perf_counter() - t)
    return {k: (statistics.median(v), counts[k]) for k, v in times.items()}


def ours(path: str, index: FileIndex, fmt: TFRecordFormat | WebDatasetFormat) -> int:
    loader = fmt.loader()
    n = 0
    for offset, count, length in zip(index.offsets, index.records, index.lengths, strict=True):
        loaded = loader.load(Chunk(path, offset, count, length), STORAGE)
        for _ in loaded.cut(0, loaded.count)[0]:
            n += 1
    return n


def masked(c: int) -> int:
    return (((c >> 15) | (c << 17)) + DELTA) & 0xFFFFFFFF


def tfrecord_plain(path: str) -> int:
    with open(path, "rb", buffering=0) as f:
        data = f.read()
    size = len(data)
    unpack, u32, crc = HEADER.unpack_from, U32.unpack_from, crc32c
    pos = n = 0
    while pos < size:
        length, lcrc = unpack(data, pos)
        if masked(crc(data[pos : pos + 8])) != lcrc:
            raise ValueError("length crc")
        start = pos + 12
        record = data[start : start + length]
        if masked(crc(record)) != u32(data, start + length)[0]:
            raise ValueError("data crc")
        pos = start + length + 4
        n += 1
    return n


def tfrecord_per_frame(path: str) -> int:
    header = bytearray(12)
    tail = bytearray(4)
    unpack, u32, crc = HEADER.unpack_from, U32.unpack_from, crc32c
    n = 0
    with open(path, "rb") as f:
        while f.readinto(header) == 12:
            length, lcrc = unpack(header)
            if masked(crc(bytes(header[:8]))) != lcrc:
                raise ValueError("length crc")
            record = f.read(length)
            f.readinto(tail)
            if masked(crc(record)) != u32(tail)[0]:
                raise ValueError("data crc")
            n += 1
    return n


def tar_plain(path: str) -> int:
    n = 0
    with tarfile.open(path) as tar:
        for m in tar:
            if m.isreg():
                f = tar.extractfile(m)
                assert f is not None
                f.read()
                n += 1
    return n


def write_tar(path: str, samples: int, member_bytes: int) -> int:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(samples):
            for ext, size in (("jpg", member_bytes), ("cls", 2), ("json", 60)):
                info = tarfile.TarInfo(f"shard/{i:08d}.{ext}")
                info.size = size
                tar.addfile(info, io.BytesIO(os.urandom(size)))
    return samples * 3


def bench_tfrecord(tmp: str, record_bytes: int, mb: int, repeat: int) -> str:
    path = os.path.join(tmp, f"r{record_bytes}.tfrecord")
    count = mb // (record_bytes + 16)
    record = os.urandom(record_bytes)
    with open(path, "wb") as f:
        write_frames(f, (record for _ in range(count)))
    fmt = TFRecordFormat()
    size = os.path.getsize(path)
    tfrecord_plain(path)  # into the page cache
    index = fmt.index(path, STORAGE)
    master = Master(tmp, path)
    try:
        r = medians(
            {
                "trainer": master.one_pass,
                "loader": lambda: ours(path, index, fmt),
                "plain": lambda: tfrecord_plain(path),
                "frames": lambda: tfrecord_per_frame(path),
                "index": lambda: sum(fmt.index(path, STORAGE).records),
            },
            repeat,
        )
    finally:
        master.stop()
    assert {n for _, n in r.values()} == {count}
    rate = {k: count / t / 1e3 for k, (t, _) in r.items()}
    best = max(rate["plain"], rate["frames"])
    return (
        f"tfrecord {record_bytes:>6} B records ({size / 1e6:.0f} MB), k records/s:"
        f" trainer {rate['trainer']:7.1f}, loader {rate['loader']:7.1f}, plain loop"
        f" {rate['plain']:7.1f}, per-frame reads {rate['frames']:7.1f}; trainer/fastest plain"
        f" {rate['trainer'] / best:.2f}x, loader/fastest plain {rate['loader'] / best:.2f}x;"
        f" index walk {size / r['index'][0] / 1e6:.0f} MB/s"
    )


def bench_webdataset(tmp: str, member_bytes: int, mb: int, repeat: int) -> str:
    path = os.path.join(tmp, f"s{member_bytes}.tar")
    samples = mb // (member_bytes + 2048)
    members = write_tar(path, samples, member_bytes)
    fmt = WebDatasetFormat()
    size = os.path.getsize(path)
    tar_plain(path)  # into the page cache
    index = fmt.index(path, STORAGE)
    master = Master(tmp, path)
    try:
        r = medians(
            {
                "trainer": master.one_pass,
                "loader": lambda: ours(path, index, fmt),
                "tarfile": lambda: tar_plain(path) // 3,
                "index": lambda: sum(fmt.index(path, STORAGE).records),
            },
            repeat,
        )
    finally:
        master.stop()
    assert {n for _, n in r.values()} == {samples} and members == 3 * samples
    rate = {k: samples / t / 1e3 for k, (t, _) in r.items()}
    return (
        f"webdataset {member_bytes:>6} B jpg + 2 small members ({size / 1e6:.0f} MB),"
        f" k samples/s: trainer {rate['trainer']:6.2f}, loader {rate['loader']:6.2f},"
        f" tarfile loop {rate['tarfile']:6.2f}; trainer/tarfile"
        f" {rate['trainer'] / rate['tarfile']:.2f}x, loader/tarfile"
        f" {rate['loader'] / rate['tarfile']:.2f}x;"
        f" index walk {size / r['index'][0] / 1e6:.0f} MB/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="size of each generated file")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    mb = args.mb << 20
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench_tfrecord(tmp, n, mb, args.repeat) for n in (100, 64 << 10)]
        rows += [bench_webdataset(tmp, n, mb, args.repeat) for n in (1000, 100_000)]
    print(f"median of {args.repeat} runs, {args.mb} MiB files, page-cached")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()

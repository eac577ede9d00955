"""TFRecord and WebDataset read speed against plain loops measured in the same run.

Run:  .venv/bin/python bench/formats_more_bench.py [--mb 64] [--repeat 3]
Files are generated in a temp dir and read once first, so every figure is page-cached; each row
is the median of --repeat passes, and each ratio is taken between medians of the same run.

What is timed for chunkmaster ("ours") is one trainer's work per chunk: the chunk's bytes
fetched through the Storage (one ranged read), every check the format makes, and every record
taken from the `Loaded` the buffer consumes. The master's index walk is timed too (headers
only), in MB of file per second.

Baselines (each the fastest plain way to do the same work, so a ratio cannot flatter us):

* TFRecord, `plain loop`: the whole file read with one `readinto` into a preallocated buffer,
  then one loop over the frames: `struct.unpack_from` of the header, both masked CRC32Cs with the
  same library (google-crc32c), a slice per record. It has no chunks, no counts to match and no
  error paths. A loop that reads each frame from the file (`readinto` of the header, `read` of
  the record) is measured too and shown; it is slower for small records (three calls each).
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
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import IO

from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import FileIndex
from chunkmaster.formats.tfrecord import TFRecordFormat, crc32c, write_frames
from chunkmaster.formats.webdataset import WebDatasetFormat

HEADER = struct.Struct("<QI")
U32 = struct.Struct("<I")
DELTA = 0xA282EAD8


class Files:
    """Local files as a Storage: one pread per range."""

    def open(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        fd = os.open(path, os.O_RDONLY)
        try:
            return [os.pread(fd, length, offset) for offset, length in ranges]
        finally:
            os.close(fd)


STORAGE = Files()


def median(fn: Callable[[], int], n: int) -> tuple[float, int]:
    """Median wall time of n runs of fn, which returns how many records it produced."""
    times, count = [], 0
    for _ in range(n):
        t = time.perf_counter()
        count = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), count


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
    size = os.path.getsize(path)
    buf = bytearray(size)
    with open(path, "rb", buffering=0) as f:
        f.readinto(buf)
    data = bytes(buf)  # the frames are sliced as bytes, as a reader hands them out
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
    t_index, _ = median(lambda: len(fmt.index(path, STORAGE).offsets), repeat)
    index = fmt.index(path, STORAGE)
    t_ours, n_ours = median(lambda: ours(path, index, fmt), repeat)
    t_plain, n_plain = median(lambda: tfrecord_plain(path), repeat)
    t_frame, n_frame = median(lambda: tfrecord_per_frame(path), repeat)
    assert n_ours == n_plain == n_frame == count
    return (
        f"tfrecord {record_bytes:>6} B records: ours {count / t_ours / 1e6:6.3f} M rec/s"
        f" ({size / t_ours / 1e6:5.0f} MB/s), plain loop {count / t_plain / 1e6:6.3f} M rec/s,"
        f" per-frame reads {count / t_frame / 1e6:6.3f} M rec/s; ours/plain"
        f" {t_plain / t_ours:.2f}x; index walk {size / t_index / 1e6:.0f} MB/s"
    )


def bench_webdataset(tmp: str, member_bytes: int, mb: int, repeat: int) -> str:
    path = os.path.join(tmp, f"s{member_bytes}.tar")
    samples = mb // (member_bytes + 2048)
    members = write_tar(path, samples, member_bytes)
    fmt = WebDatasetFormat()
    size = os.path.getsize(path)
    tar_plain(path)  # into the page cache
    t_index, _ = median(lambda: len(fmt.index(path, STORAGE).offsets), repeat)
    index = fmt.index(path, STORAGE)
    t_ours, n_ours = median(lambda: ours(path, index, fmt), repeat)
    t_plain, n_plain = median(lambda: tar_plain(path), repeat)
    assert n_ours == samples and n_plain == members
    return (
        f"webdataset {member_bytes:>6} B jpg + 2 small members: ours"
        f" {samples / t_ours / 1e3:6.1f} k samples/s ({size / t_ours / 1e6:5.0f} MB/s),"
        f" tarfile loop {samples / t_plain / 1e3:6.1f} k samples/s; ours/tarfile"
        f" {t_plain / t_ours:.2f}x; index walk {size / t_index / 1e6:.0f} MB/s"
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

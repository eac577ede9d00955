"""RecordIO read throughput against baselines measured in the same run.

Run:  .venv/bin/python bench/recordio_bench.py [--mb 256] [--repeat 3]
Files are generated in a temp dir and read once first, so every figure is page-cached; each row
is the best of --repeat passes.

Baselines (each the fastest plain way to do the same work, so a ratio cannot flatter us):

* 64 KiB records, `raw readinto`: the file read front to back with `readinto` into one reused,
  page-aligned buffer (an anonymous mmap), allocated and faulted in outside the timed passes.
  The kernel's copy out of the page cache is all it does: no allocation, no page fault, no
  Python per byte. Page-aligned because a `bytearray`'s data starts 16 bytes into a page, and
  the test VM's CPU (AMD EPYC) copies page cache pages to such a destination ~4x slower. Block
  sizes of 1, 4, 8 and 16 MiB are measured and the fastest is the baseline. The plain `read()`
  loop at that block size is shown beside it (a fresh `bytes` per call), and readinto with one
  chunk-sized 32 MiB buffer, the size a scan must hold (it checks a chunk's CRC before handing
  out any of its records), for reference.
* 100 B records, `bare split loop`: a generator cutting the records out of the chunk payloads
  already in memory (no I/O, no CRC, no framing check), one `unpack_from` and one slice per record.
  It was the fastest of the plain splits tried (a list of record ends walked with `pairwise`,
  `map` over `slice` objects); the per-record Python work is the cost there, not the read.
* snappy / gzip: the decoder alone over the in-memory payloads (cramjam snappy; zlib and isal
  gzip), i.e. what a scan would cost if splitting and checking were free.
* CRC-32: `zlib.crc32` beside the `isal_zlib.crc32` we use.
The reference recordio 0.1.7 (one run) is a comparison, not a baseline. `scan(copy=False)`
(memoryviews instead of bytes) is shown beside the default scan.
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from itertools import repeat
from pathlib import Path

import cramjam
from isal import igzip, isal_zlib

from chunkmaster.recordio import Compressor, Writer, read_chunk_headers, scan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "recordio"))
from rio_reference import read_all, reference_module

LENGTH_FROM = struct.Struct("<I").unpack_from
ROWS: list[tuple[str, str, str, str]] = []


def best(fn: Callable[[], tuple[int, int]], n: int) -> tuple[float, int, int]:
    """Best wall time of n runs of fn, which returns (bytes, records)."""
    times, out = [], (0, 0)
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out[0], out[1]


def row(name: str, seconds: float, nbytes: int, records: int, note: str = "") -> float:
    mbs = nbytes / seconds / 1e6
    rps = records / seconds if records else 0.0
    ROWS.append((name, f"{mbs:9.0f}", f"{rps / 1e6:8.2f}" if records else "       -", note))
    return rps or mbs


def write_file(path: Path, record: Callable[[int], bytes], count: int, comp: Compressor) -> None:
    with Writer(path, compressor=comp) as w:
        for i in range(count):
            w.write(record(i))


def raw_read(path: Path, block: int = 8 << 20) -> tuple[int, int]:
    """The plain read() loop: a fresh bytes object per call."""
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(block):
            n += len(chunk)
    return n, 0


def raw_readinto(path: Path, view: memoryview) -> tuple[int, int]:
    """The raw-read baseline: readinto one reused buffer (its size is the block size)."""
    n = 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(view):
            n += got
    return n, 0


def aligned_view(size: int) -> memoryview:
    """A page-aligned buffer with every page already faulted in."""
    view = memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE))
    view[:] = bytes(size)
    return view


def best_readinto(path: Path, block: int, n: int) -> tuple[float, int, int]:
    view = aligned_view(block)
    return best(lambda: raw_readinto(path, view), n)


def ours(path: Path, copy: bool = True) -> tuple[int, int]:
    n = c = 0
    for r in scan(path, copy=copy):
        n += len(r)
        c += 1
    return n, c


def payloads(path: Path) -> list[tuple[int, bytes]]:
    with open(path, "rb") as f:
        out = []
        for info in read_chunk_headers(path):
            f.seek(info.offset + 20)
            out.append((info.header.num_records, f.read(info.header.compressed_size)))
        return out


def bare_split(chunks: list[tuple[int, bytes]]) -> tuple[int, int]:
    """The ceiling of any Python record iterator: a generator splitting in-memory bytes."""

    def gen() -> Iterator[bytes]:
        for count, data in chunks:
            pos = 0
            for _ in repeat(None, count):
                (ln,) = LENGTH_FROM(data, pos)
                pos += 4
                end = pos + ln
                yield data[pos:end]
                pos = end

    n = c = 0
    for r in gen():
        n += len(r)
        c += 1
    return n, c


def reference(mod: object, path: Path) -> tuple[int, int]:
    recs = read_all(mod, str(path))  # type: ignore[arg-type]
    return sum(map(len, recs)), len(recs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256, help="size of each uncompressed test file")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    size = args.mb << 20
    ref = reference_module()
    with tempfile.TemporaryDirectory(prefix="rio-bench-") as tmp:
        d = Path(tmp)
        big, small = d / "64k.rio", d / "100b.rio"
        rec64 = os.urandom(64 << 10)
        write_file(big, lambda i: rec64, size // len(rec64), Compressor.NONE)
        rec100 = [os.urandom(100) for _ in range(1000)]
        write_file(small, lambda i: rec100[i % 1000], size // 104, Compressor.NONE)
        text = [f"{i}:{'abcdefgh' * (i % 40)}".encode() for i in range(4096)]
        nsnap = (size // 2) // 170
        snap, gz = d / "snappy.rio", d / "gzip.rio"
        write_file(snap, lambda i: text[i % 4096], nsnap, Compressor.SNAPPY)
        write_file(gz, lambda i: text[i % 4096], nsnap, Compressor.GZIP)
        for p in (big, small, snap, gz):
            raw_read(p)  # page-cache them

        for label, path in (("64 KiB records", big), ("100 B records", small)):
            mb = path.stat().st_size / 1e6
            ROWS.append((f"--- {label}, NONE, {mb:.0f} MB file", "", "", ""))
            raw_mbs, raw_block = 0.0, 0
            for block_mib in (1, 4, 8, 16):
                t, n, _ = best_readinto(path, block_mib << 20, args.repeat)
                mbs = row(f"raw readinto, {block_mib} MiB reused buffer", t, n, 0)
                if mbs > raw_mbs:
                    raw_mbs, raw_block = mbs, block_mib
            ROWS.append((f"  baseline: readinto {raw_block} MiB", "", "", ""))
            t, n, _ = best(lambda: raw_read(path, raw_block << 20), args.repeat)  # noqa: B023
            row(f"raw read() loop, {raw_block} MiB", t, n, 0)
            t, n, _ = best_readinto(path, 32 << 20, args.repeat)
            chunk_mbs = row("raw readinto, 32 MiB (one chunk)", t, n, 0)
            chunks = payloads(path)
            t, n, c = best(lambda: bare_split(chunks), args.repeat)  # noqa: B023
            bare = row("bare split loop, in memory", t, n, c)
            t, n, c = best(lambda: ours(path), args.repeat)  # noqa: B023
            ours_rps = row("chunkmaster scan (CRC on)", t, n, c)
            ours_mbs = n / t / 1e6
            t, n, c = best(lambda: ours(path, copy=False), args.repeat)  # noqa: B023
            row("chunkmaster scan(copy=False), views", t, n, c)
            views_mbs = n / t / 1e6
            t, n, c = best(lambda: reference(ref, path), 1)  # noqa: B023
            ref_rps = row("reference recordio 0.1.7", t, n, c)
            ROWS.append(
                (
                    "  ratios",
                    "",
                    "",
                    f"scan/raw readinto {ours_mbs / raw_mbs:.2f}x  "
                    f"views/raw readinto {views_mbs / raw_mbs:.2f}x  "
                    f"scan/readinto 32 MiB {ours_mbs / chunk_mbs:.2f}x  "
                    f"scan/bare {ours_rps / bare:.2f}x  scan/ref {ours_rps / ref_rps:.1f}x",
                )
            )
            del chunks

        for label, path, comp in (("snappy", snap, 1), ("gzip", gz, 2)):
            chunks = payloads(path)
            raw_total = sum(len(cramjam.snappy.decompress(p)) if comp == 1 else
                            len(igzip.decompress(p)) for _, p in chunks)  # fmt: skip
            ROWS.append((f"--- {label}, text records, {raw_total / 1e6:.0f} MB raw", "", "", ""))
            t, _, c = best(lambda: ours(path), args.repeat)  # noqa: B023
            row("chunkmaster scan (MB/s of raw)", t, raw_total, c)
            if comp == 1:
                t, _, _ = best(
                    lambda: (sum(len(cramjam.snappy.decompress(p)) for _, p in chunks), 0),  # noqa: B023
                    args.repeat,
                )
                row("cramjam.snappy.decompress only", t, raw_total, 0)
            else:
                t, _, _ = best(
                    lambda: (sum(len(zlib.decompress(p, 31)) for _, p in chunks), 0),  # noqa: B023
                    args.repeat,
                )
                row("zlib.decompress only", t, raw_total, 0)
                t, _, _ = best(
                    lambda: (sum(len(isal_zlib.decompress(p, 31)) for _, p in chunks), 0),  # noqa: B023
                    args.repeat,
                )
                row("isal_zlib.decompress only", t, raw_total, 0)
            t, n, c = best(lambda: reference(ref, path), 1)  # noqa: B023
            row("reference recordio 0.1.7", t, raw_total, c)

        buf = os.urandom(256 << 20)
        ROWS.append(("--- CRC-32 of 256 MiB", "", "", ""))
        for name, fn in (("zlib.crc32", zlib.crc32), ("isal_zlib.crc32 (used)", isal_zlib.crc32)):
            t, n, _ = best(lambda: (fn(buf) and 0, 0) and (len(buf), 0), args.repeat)  # noqa: B023
            row(name, t, n, 0)

    print(f"{'case':44} {'MB/s':>9} {'Mrec/s':>8}  note")
    for name, mbs, rps, note in ROWS:
        print(f"{name:44} {mbs:>9} {rps:>8}  {note}")


if __name__ == "__main__":
    main()

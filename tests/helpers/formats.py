"""Datasets of every format for the format tests: the files, and the records a trainer must get
(as the writer knows them, not as our readers read them back).

`MAKERS` maps a format's name to `make(dir, files, records) -> (pattern, records)`; a format's
tests add their own maker here (tests/formats/test_formats_process.py runs every one).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chunkmaster.digest import Digest
from helpers.datasets import write_records

Maker = Callable[[Path, int, int], tuple[str, list[Any]]]


def digest_of(records: list[Any]) -> Digest:
    d = Digest()
    for r in records:
        d.add(r)
    return d


def row(file: int, i: int) -> dict[str, Any]:
    """A record with every JSON type (and text with non-ASCII), distinct per file and index."""
    return {
        "file": file,
        "i": i,
        "name": f"r{file}-{i}-é" * (i % 4),
        "score": i / 7,
        "ok": i % 3 == 0,
        "tags": [f"t{j}" for j in range(i % 3)],
        "none": None,
    }


def write_jsonl(path: Path, values: list[Any], *, final_newline: bool = True) -> Path:
    text = "\n".join(json.dumps(v, ensure_ascii=False) for v in values)
    path.write_bytes((text + ("\n" if final_newline and values else "")).encode())
    return path


def write_text(path: Path, lines: list[str], *, final_newline: bool = True) -> Path:
    text = "\n".join(lines)
    path.write_bytes((text + ("\n" if final_newline and lines else "")).encode())
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def make_recordio(d: Path, files: int, n: int) -> tuple[str, list[Any]]:
    out: list[Any] = []
    for f in range(files):
        recs = [b""] + [f"f{f}-{i}".encode() + b"\x00" * (i % 5) for i in range(1, n)]
        write_records(d / f"part-{f:05d}.rio", recs, max_chunk_size=400)
        out += recs
    return str(d / "part-*.rio"), out


def make_parquet(d: Path, files: int, n: int) -> tuple[str, list[Any]]:
    out: list[Any] = []
    for f in range(files):
        rows = [{**row(f, i), "blob": bytes([i % 256]) * (i % 5)} for i in range(n)]
        write_parquet(d / f"part-{f:05d}.parquet", rows, row_group_size=15)
        out += rows
    return str(d / "part-*.parquet"), out


def make_jsonl(d: Path, files: int, n: int) -> tuple[str, list[Any]]:
    """The last file has no final newline. Chunks are small when the master's --chunk-size
    is (SMALL_CHUNKS)."""
    out: list[Any] = []
    for f in range(files):
        values: list[Any] = [row(f, i) for i in range(n)]
        values[1] = [1, "two", None]  # not only objects
        values[2] = f"just a string {f}"
        write_jsonl(d / f"part-{f:05d}.jsonl", values, final_newline=f != files - 1)
        out += values
    return str(d / "part-*.jsonl"), out


def make_text(d: Path, files: int, n: int) -> tuple[str, list[Any]]:
    out: list[Any] = []
    for f in range(files):
        lines = [f"line {i} of file {f} ü" + "x" * (i % 30) for i in range(n)]
        lines[3] = ""  # an empty line is a record
        write_text(d / f"part-{f:05d}.txt", lines, final_newline=f != files - 1)
        out += lines
    return str(d / "part-*.txt"), out


def write_tfrecord(path: Path, records: list[bytes]) -> Path:
    """TFRecord frames: u64 length, masked CRC32C of it, the record, masked CRC32C of it."""
    import struct

    import google_crc32c

    def masked(data: bytes) -> bytes:
        c = google_crc32c.value(data)
        return struct.pack("<I", (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF)

    with path.open("wb") as f:
        for r in records:
            length = struct.pack("<Q", len(r))
            f.write(length + masked(length) + r + masked(r))
    return path


def write_shard(path: Path, samples: list[dict[str, Any]]) -> Path:
    """A WebDataset tar: each sample's members `key.ext`, consecutive."""
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for sample in samples:
            for ext, data in sample.items():
                if ext != "__key__":
                    info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return path


def make_tfrecord(d: Path, files: int, n: int) -> tuple[str, list[Any]]:
    """Chunks are small when the master's --chunk-size is (SMALL_CHUNKS)."""
    out: list[Any] = []
    for f in range(files):
        recs = [b""] + [f"f{f}-{i}".encode() + b"\x00" * (i % 5) for i in range(1, n)]
        write_tfrecord(d / f"part-{f:05d}.tfrecord", recs)
        out += recs
    return str(d / "part-*.tfrecord"), out


def make_webdataset(d: Path, files: int, n: int) -> tuple[str, list[Any]]:
    """Chunks are small when the master's --chunk-size is (SMALL_CHUNKS); every 10th key is
    longer than tar's 100-byte name field."""
    out: list[Any] = []
    for f in range(files):
        samples: list[dict[str, Any]] = []
        for i in range(n):
            stem = "long" * 30 if i % 10 == 0 else "s"
            sample: dict[str, Any] = {"__key__": f"shard{f}/{stem}{i:05d}", "cls": b"%d" % i}
            if i % 3:
                sample["jpg"] = bytes([i % 256]) * (i * 7)
            samples.append(sample)
        write_shard(d / f"shard-{f:05d}.tar", samples)
        out += samples
    return str(d / "shard-*.tar"), out


#: The master's --chunk-size (CHUNKMASTER_CHUNK_SIZE) that cuts the makers' files into several
#: chunks each (RecordIO and Parquet files have their own small chunks: they ignore it).
SMALL_CHUNKS: dict[str, str] = {
    "recordio": "700",
    "parquet": "700",
    "jsonl": "700",
    "text": "700",
    "tfrecord": "700",
    "webdataset": "8KiB",
}

MAKERS: dict[str, Maker] = {
    "recordio": make_recordio,
    "parquet": make_parquet,
    "jsonl": make_jsonl,
    "text": make_text,
    "tfrecord": make_tfrecord,
    "webdataset": make_webdataset,
}

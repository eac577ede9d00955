"""RecordIO files for tests, written with the real writer."""

from __future__ import annotations

import io
from array import array
from collections.abc import Sequence
from pathlib import Path

from chunkmaster.core.dataset import Dataset
from chunkmaster.recordio import ChunkHeader, Compressor, Writer, load_index
from chunkmaster.recordio.codecs import crc32


def write_records(
    path: Path,
    records: Sequence[bytes],
    *,
    max_chunk_size: int = 1,
    compressor: Compressor = Compressor.NONE,
) -> Path:
    """With the default limit of 1 byte every non-empty record is its own chunk."""
    with Writer(str(path), max_chunk_size=max_chunk_size, compressor=compressor) as w:
        for r in records:
            w.write(r)
    return path


def numbered_records(path: Path, n: int, fmt: bytes = b"%06d", *, max_chunk_size: int = 1) -> str:
    """n records `fmt % i`, by default one chunk each (a task of k chunks is k consecutive
    records)."""
    return str(write_records(path, [fmt % i for i in range(n)], max_chunk_size=max_chunk_size))


def ten_record_chunks(path: Path, chunks: int = 4) -> str:
    """`chunks` chunks of ten records b"%03d" each: chunk k holds records 10k .. 10k+9."""
    return numbered_records(path, 10 * chunks, b"%03d", max_chunk_size=30)


def checksum_broken(path: Path) -> tuple[str, list[bytes], set[bytes], int]:
    """60 records in chunks of two, the third chunk's checksum broken (a payload byte
    flipped): the file, every record, the records of the broken chunk, and its offset."""
    records = [f"rec{i:03d}".encode() * 5 for i in range(60)]
    write_records(path, records, max_chunk_size=150)
    index = load_index(str(path))
    bad_offset = index.chunk_offsets[2]
    raw = bytearray(path.read_bytes())
    raw[bad_offset + 30] ^= 0xFF
    path.write_bytes(bytes(raw))
    return (
        str(path),
        records,
        set(records[index.first_record(2) : index.first_record(3)]),
        bad_offset,
    )


def chunk_dataset(records_per_chunk: Sequence[int], chunks_per_task: int) -> Dataset:
    """An indexed dataset of one file whose chunks hold these many records each (for the
    pure core: nothing is on disk)."""
    n = len(records_per_chunk)
    return Dataset(
        ("x",),
        ("f",),
        array("I", [0] * n),
        array("Q", range(n)),
        array("I", records_per_chunk),
        chunks_per_task,
    )


def one_chunk(records: Sequence[bytes], compressor: Compressor) -> bytes:
    """The bytes of one RecordIO chunk holding `records`, as the real writer makes it."""
    out = io.BytesIO()
    with Writer(out, max_chunk_size=1 << 40, compressor=compressor) as w:
        for r in records:
            w.write(r)
        w.flush()
        return out.getvalue()


def raw_chunk(compressor: int, payload: bytes, count: int) -> bytes:
    """A chunk of any `payload` bytes (its header's CRC right), claiming `count` records."""
    return ChunkHeader(crc32(payload), compressor, len(payload), count).pack() + payload


def bomb_records(inflated: int, record_size: int = 1 << 20) -> list[bytes]:
    """Records of zero bytes, `inflated` bytes in all: they compress to almost nothing."""
    return [bytes(record_size)] * (inflated // record_size)

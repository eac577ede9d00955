"""RecordIO files for tests, written with the real writer."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from chunkmaster.recordio import ChunkHeader, Compressor, Writer
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


def numbered_records(path: Path, n: int, fmt: bytes = b"%06d") -> str:
    """n records `fmt % i`, one chunk each (a task of k chunks is k consecutive records)."""
    return str(write_records(path, [fmt % i for i in range(n)]))


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

"""RecordIO files for tests, written with the real writer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from chunkmaster.recordio import Compressor, Writer


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

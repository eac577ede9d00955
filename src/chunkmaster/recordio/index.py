"""The chunk index: where each chunk starts and how many records it holds."""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import NamedTuple

from chunkmaster.recordio.errors import TruncatedChunkError
from chunkmaster.recordio.header import HEADER_SIZE, ChunkHeader, parse_header
from chunkmaster.recordio.source import Opened, Source, file_size, open_source, read_exact


class Index:
    """Chunk offsets and record counts of one file, with O(log n) record lookup.

    Same content as the reference's Index (`ChunkOffsets`, `ChunkRecords`, `NumRecords`). It is
    built from plain lists so that a trainer can rebuild a one-chunk index from the
    (offset, count) pair the master sends it: `Index([offset], [count])`.
    """

    __slots__ = ("_ends", "chunk_offsets", "chunk_records", "num_records")

    def __init__(self, chunk_offsets: Sequence[int], chunk_records: Sequence[int]) -> None:
        if len(chunk_offsets) != len(chunk_records):
            raise ValueError(
                f"{len(chunk_offsets)} chunk offsets but {len(chunk_records)} record counts"
            )
        if any(o < 0 for o in chunk_offsets) or any(c < 0 for c in chunk_records):
            raise ValueError("chunk offsets and record counts must be non-negative")
        self.chunk_offsets: list[int] = [int(o) for o in chunk_offsets]
        self.chunk_records: list[int] = [int(c) for c in chunk_records]
        # _ends[k] = global index one past the last record of chunk k (running total).
        self._ends: list[int] = list(accumulate(self.chunk_records))
        self.num_records: int = self._ends[-1] if self._ends else 0

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_offsets)

    def first_record(self, chunk: int) -> int:
        """Global index of the first record of `chunk`."""
        return self._ends[chunk] - self.chunk_records[chunk]

    def chunk_index(self, i: int) -> Index:
        """A one-chunk index of chunk `i`, records numbered from 0 (the master's task unit)."""
        if not 0 <= i < self.num_chunks:
            raise IndexError(f"chunk {i} out of range (index has {self.num_chunks} chunks)")
        return Index([self.chunk_offsets[i]], [self.chunk_records[i]])

    def locate(self, i: int) -> tuple[int, int]:
        """(chunk, position in chunk) of global record `i`, exactly like the reference.

        (-1, -1) when `i` is past the end; a negative `i` lands in chunk 0 at position `i`.
        """
        k = bisect_right(self._ends, i)
        if k == len(self._ends):
            return (-1, -1)
        return (k, i - (self._ends[k] - self.chunk_records[k]))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Index):
            return NotImplemented
        return (self.chunk_offsets, self.chunk_records) == (
            other.chunk_offsets,
            other.chunk_records,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable lists inside

    def __repr__(self) -> str:
        return f"Index(chunk_offsets={self.chunk_offsets!r}, chunk_records={self.chunk_records!r})"


class ChunkInfo(NamedTuple):
    """One chunk as seen by a header walk: its offset and decoded header."""

    chunk: int
    offset: int
    header: ChunkHeader


def next_header(src: Opened, chunk: int, pos: int, end: int | None) -> ChunkHeader | None:
    """Read the header of chunk `chunk` at `pos`: None at a clean end of file.

    Raises when the payload it announces runs past `end` (the file's size, when known):
    the reference only finds that out when it reads the chunk.
    """
    raw = read_exact(src.file, HEADER_SIZE)
    if not raw:
        return None
    header = parse_header(raw, path=src.name, chunk=chunk, offset=pos)
    nxt = pos + HEADER_SIZE + header.compressed_size
    if end is not None and nxt > end:
        raise TruncatedChunkError(
            f"payload of {header.compressed_size} bytes runs {nxt - end} bytes past the end "
            f"of the file (Failed to read chunk data: EOF)",
            path=src.name,
            chunk=chunk,
            offset=pos,
        )
    return header


def walk_headers(src: Opened) -> Iterator[ChunkInfo]:
    """Read every chunk header from the file's start, seeking past payloads.

    Strict where the reference is lenient: a short trailing header, or a payload that runs past
    the end of the file, raises instead of producing a phantom or truncated chunk.
    """
    f = src.file
    size = file_size(f)
    end = None if size is None else size - src.base
    pos = 0
    chunk = 0
    f.seek(src.base)
    while True:
        if end is not None and pos >= end:
            return
        header = next_header(src, chunk, pos, end)
        if header is None:
            return
        yield ChunkInfo(chunk, pos, header)
        f.seek(header.compressed_size, os.SEEK_CUR)
        pos += HEADER_SIZE + header.compressed_size
        chunk += 1


def load_index(source: Source) -> Index:
    """Build the Index of a file by reading its chunk headers only (payloads are skipped).

    On any error no partial index is returned, as in the reference.
    """
    with open_source(source) as src:
        offsets: list[int] = []
        counts: list[int] = []
        for info in walk_headers(src):
            offsets.append(info.offset)
            counts.append(info.header.num_records)
        return Index(offsets, counts)


def read_chunk_headers(source: Source) -> list[ChunkInfo]:
    """Every chunk header of a file (for inspection tools)."""
    with open_source(source) as src:
        return list(walk_headers(src))

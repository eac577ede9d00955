"""Reading records: whole files, record ranges, and single chunks (the master's task unit).

One chunk is read with one read call, its CRC-32 is checked, it is decompressed, and its record
framing is validated as a whole before any of its records is handed out. Only the current chunk
is held in memory. Records are produced by C-level iterators chained per chunk, which keeps the
per-record cost close to that of a bare Python loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import chain
from typing import Literal, cast, overload

from chunkmaster.inflate import DEFAULT_MAX_INFLATED
from chunkmaster.recordio import buffers
from chunkmaster.recordio.codecs import (
    crc32,
    decompress,
    frame_ends,
    iter_record_views,
    iter_records,
)
from chunkmaster.recordio.errors import (
    ChecksumError,
    RecordOverrunError,
    TruncatedChunkError,
    Where,
)
from chunkmaster.recordio.header import HEADER_SIZE, ChunkHeader, parse_header
from chunkmaster.recordio.index import Index, next_header
from chunkmaster.recordio.source import Opened, Source, file_size, open_source, read_exact

Records = Iterator[bytes] | Iterator[memoryview]


@overload
def scan(
    source: Source,
    index: Index | None = ...,
    start: int = ...,
    length: int = ...,
    *,
    copy: Literal[True] = ...,
    max_inflated: int = ...,
) -> Iterator[bytes]: ...


@overload
def scan(
    source: Source,
    index: Index | None = ...,
    start: int = ...,
    length: int = ...,
    *,
    copy: Literal[False],
    max_inflated: int = ...,
) -> Iterator[memoryview]: ...


@overload
def scan(
    source: Source,
    index: Index | None = ...,
    start: int = ...,
    length: int = ...,
    *,
    copy: bool,
    max_inflated: int = ...,
) -> Records: ...


def scan(
    source: Source,
    index: Index | None = None,
    start: int = 0,
    length: int = -1,
    *,
    copy: bool = True,
    max_inflated: int = DEFAULT_MAX_INFLATED,
) -> Records:
    """Yield the records with global numbers in [start, start + length), in file order.

    Range rules are the reference's: a negative start means 0; a negative length, or one that
    reaches past the end, means "to the end"; a start past the end yields nothing.

    With `index` (e.g. a one-chunk index from the master) only the chunks it lists are read, at
    their offsets. Without it, the file is read front to back in one pass, header by header,
    skipping (seeking past) chunks before `start`; a damaged chunk then raises when it is reached.

    `copy=False` yields read-only memoryviews into the chunk's buffer instead of `bytes`: no
    per-record copy. A view stays valid for as long as it is referenced (a buffer still viewed
    is never reused), but holding views across chunks costs a fresh buffer per chunk.

    A compressed chunk that would inflate to more than `max_inflated` bytes raises
    InflatedTooLargeError while it is decoded (a decompression bomb never takes the memory).
    """
    if index is None:
        chunks = _stream_chunks(source, max(start, 0), length, copy, max_inflated)
    else:
        chunks = _indexed_chunks(source, index, start, length, copy, max_inflated)
    return cast(Records, chain.from_iterable(chunks))


def read_chunk(src: Opened, chunk: int, offset: int, expected: int | None = None) -> ChunkHeader:
    """Read and check the header at `offset` (relative to the file's base); return it.

    Leaves the file positioned at the payload.
    """
    raw = read_exact(src.file, HEADER_SIZE)
    if len(raw) < HEADER_SIZE and raw[:1] == b"":
        raise TruncatedChunkError(
            "Failed to parse chunk header: EOF", path=src.name, chunk=chunk, offset=offset
        )
    header = parse_header(raw, path=src.name, chunk=chunk, offset=offset)
    if expected is not None and header.num_records != expected:
        raise RecordOverrunError(
            f"header says {header.num_records} records but the index says {expected} "
            f"(stale index or wrong offset)",
            path=src.name,
            chunk=chunk,
            offset=offset,
        )
    return header


def _load(
    src: Opened,
    header: ChunkHeader,
    chunk: int,
    offset: int,
    lo: int,
    hi: int | None,
    copy: bool,
    max_inflated: int,
) -> Records:
    """Read the payload following `header`, verify and decode it, return its records lo..hi-1.

    A separate function so that nothing of the previous chunk stays referenced while the next
    one is read: the scan loops hold no chunk data in their own frames.
    """
    where: Where = {"path": src.name, "chunk": chunk, "offset": offset}
    size = header.compressed_size
    count = header.num_records
    if (
        header.compressor == 0
        and (not copy or (count and size // count >= _LARGE_RECORD))
        and _has_readinto(src)
    ):
        buf = buffers.take(size)
        view = buffers.place(buf, size, src.base + offset + HEADER_SIZE)
        _read_checked(src, view, header, where)
        ends = frame_ends(view, count, where)
        return iter_record_views(view, ends, lo, hi, copy, lambda: buffers.give_back(buf))
    data, ends = _decode(src, header, where, max_inflated)
    if copy:
        return iter_records(data, ends, lo, hi)
    return iter_record_views(memoryview(data), ends, lo, hi, False, None)


def check_crc(actual: int, header: ChunkHeader, where: Where) -> None:
    """Raise ChecksumError unless `actual` is the header's CRC-32.

    Neither value is shown: the CRC-32 of a payload of 4 bytes or less gives the bytes back.
    """
    if actual != header.checksum:
        raise ChecksumError(
            "Checksum checking failed. (the payload's CRC-32 differs from the header's)", **where
        )


def _decode(
    src: Opened, header: ChunkHeader, where: Where, max_inflated: int
) -> tuple[bytes, list[int]]:
    """Read the payload following `header`; check its CRC, decompress it, validate framing."""
    size = header.compressed_size
    payload = read_exact(src.file, size)
    if len(payload) != size:
        raise TruncatedChunkError(
            f"payload has {len(payload)} of {size} bytes (Failed to read chunk data: EOF)", **where
        )
    check_crc(crc32(payload), header, where)
    data = decompress(header.compressor, payload, where, max_inflated)
    del payload
    return data, frame_ends(data, header.num_records, where)


def load_chunk(
    source: Source, offset: int, num_records: int, max_inflated: int = DEFAULT_MAX_INFLATED
) -> tuple[bytes, list[int]]:
    """One chunk read whole and checked like scan() checks it: its record data and record ends.

    Record i is `data[start : ends[i]]` with start 4 past the previous end (0 for i == 0). The
    same checks and errors as `scan(source, Index([offset], [num_records]))`; nothing is
    returned unless the chunk's CRC, compression and framing are all valid. For callers that
    cut records out later, in another thread (the client).
    """
    with open_source(source) as src:
        src.file.seek(src.base + offset)
        header = read_chunk(src, 0, offset, num_records)
        where: Where = {"path": src.name, "chunk": 0, "offset": offset}
        return _decode(src, header, where, max_inflated)


_LARGE_RECORD = 4096
"""Average record size from which an uncompressed chunk is read into a reused buffer.

Reading a 32 MiB chunk into a fresh bytes object costs a page fault per 4 KiB page; for large
records, reading into a reused buffer (see buffers.py) and copying each record out is faster.
For small records the per-record copy out of a memoryview (~150 ns vs ~60 ns to slice bytes)
would dominate, so they keep the plain bytes path unless the caller asked for views.
"""


def _read_checked(src: Opened, view: memoryview, header: ChunkHeader, where: Where) -> None:
    """Fill `view` with the payload and check its CRC-32.

    (Checksumming each 1 MiB piece right after reading it, while in cache, measured no faster.)
    """
    size = len(view)
    got = 0
    f = src.file
    while got < size:
        n = f.readinto(view[got:])
        if not n:
            raise TruncatedChunkError(
                f"payload has {got} of {size} bytes (Failed to read chunk data: EOF)", **where
            )
        got += n
    check_crc(crc32(view), header, where)


def _indexed_chunks(
    source: Source, index: Index, start: int, length: int, copy: bool, max_inflated: int
) -> Iterator[Records]:
    total = index.num_records
    start = max(start, 0)
    if length < 0 or start + length >= total:
        length = total - start
    if total == 0 and index.num_chunks:
        # Only zero-record chunks: read them anyway, so that a header count damaged down to 0
        # is reported rather than silently losing the chunk's records.
        yield from _zero_record_chunks(source, index, copy, max_inflated)
        return
    if start >= total or length <= 0:
        return
    first, lo = index.locate(start)
    last, hi_in_last = index.locate(start + length - 1)
    # Zero-record chunks (never written by a correct writer) that sit inside the range are read
    # too, so that their damage is reported instead of silently stepped over.
    if lo == 0:
        while first > 0 and index.chunk_records[first - 1] == 0:
            first -= 1
    if start + length == total:
        while last + 1 < index.num_chunks and index.chunk_records[last + 1] == 0:
            last += 1
    with open_source(source) as src:
        f = src.file
        pos: int | None = None  # our position relative to base, when known
        for k in range(first, last + 1):
            offset = index.chunk_offsets[k]
            count = index.chunk_records[k]
            if pos != offset:
                f.seek(src.base + offset)
            header = read_chunk(src, k, offset, count)
            lo_k = lo if k == first else 0
            hi_k = hi_in_last + 1 if k == last else None
            yield _load(src, header, k, offset, lo_k, hi_k, copy, max_inflated)
            pos = offset + HEADER_SIZE + header.compressed_size


def _zero_record_chunks(
    source: Source, index: Index, copy: bool, max_inflated: int
) -> Iterator[Records]:
    with open_source(source) as src:
        for k, (offset, count) in enumerate(
            zip(index.chunk_offsets, index.chunk_records, strict=True)
        ):
            src.file.seek(src.base + offset)
            header = read_chunk(src, k, offset, count)
            yield _load(src, header, k, offset, 0, None, copy, max_inflated)


def _stream_chunks(
    source: Source, start: int, length: int, copy: bool, max_inflated: int
) -> Iterator[Records]:
    stop = start + length if length >= 0 else None
    if stop is not None and stop <= start:
        return
    with open_source(source) as src:
        f = src.file
        size = file_size(f)
        end = None if size is None else size - src.base
        seekable = end is not None
        pos = 0
        chunk = 0
        first = 0  # global number of the chunk's first record
        while stop is None or first < stop:
            header = next_header(src, chunk, pos, end)
            if header is None:
                return
            n = header.num_records
            if first < start and first + n <= start:  # wholly before the range: skip it
                if seekable:
                    f.seek(header.compressed_size, os.SEEK_CUR)
                elif len(read_exact(f, header.compressed_size)) != header.compressed_size:
                    raise TruncatedChunkError(
                        "Failed to read chunk data: EOF", path=src.name, chunk=chunk, offset=pos
                    )
            else:
                lo = max(start - first, 0)
                hi = None if stop is None or stop >= first + n else stop - first
                yield _load(src, header, chunk, pos, lo, hi, copy, max_inflated)
            pos += HEADER_SIZE + header.compressed_size
            chunk += 1
            first += n


def _has_readinto(src: Opened) -> bool:
    return callable(getattr(src.file, "readinto", None))

"""RecordIO as a dataset format: the master indexes a file by its chunk headers, a trainer reads
one chunk of a task in its own thread, the way a direct scan reads it.

The chunk is read whole and checked (CRC, decompression, the framing of every record) before
any record of it is handed out; the checks and errors are recordio's (`load_chunk`), built from
its public pieces. Records are cut out one at a time when asked for, by C-level iterators (one
step of one is atomic under the GIL). Each record of a chunk of large uncompressed records is
read straight into bytes of its own, the CRC taken as they come (a chunk buffer would cost a
copy of every byte out of it); if the chunk turns out damaged it is read again into one buffer
reused from chunk to chunk, for the checks' own error. Other chunks are read as bytes and each
record is a slice of them. A chunk whose bytes were fetched ahead (a ranged read from an
object store) is checked and cut the same way from those bytes.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterator
from itertools import chain, repeat
from typing import IO

from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import FileIndex, Indexed, Storage
from chunkmaster.formats.storage import LocalStorage
from chunkmaster.inflate import DEFAULT_MAX_INFLATED, check_limit
from chunkmaster.recordio.codecs import crc32, decompress, frame_ends
from chunkmaster.recordio.errors import ChecksumError, TruncatedChunkError, Where
from chunkmaster.recordio.header import HEADER_SIZE, parse_header
from chunkmaster.recordio.index import walk_headers
from chunkmaster.recordio.scanner import read_chunk
from chunkmaster.recordio.source import Opened, Source, open_source, read_exact

LARGE_RECORD = 4096
"""Average record size from which each record of an uncompressed local chunk is read into bytes
of its own (two reads a record, no chunk buffer copied out of: a copy less of every byte)."""

_LENGTH = struct.Struct("<I").unpack


class LoadedChunk:
    """A checked chunk: record i is data[ends[i-1] + 4 : ends[i]] (from 4 for i == 0)."""

    __slots__ = ("_copy", "_data", "ends")

    def __init__(self, data: bytes | memoryview, ends: list[int], *, copy: bool) -> None:
        self._data: bytes = data  # type: ignore[assignment]  # sliced alike
        self.ends = ends
        self._copy = copy  # data is the reused buffer: copy each record out as bytes

    @property
    def count(self) -> int:
        return len(self.ends)

    def cut(self, a: int, b: int) -> tuple[Iterator[bytes], Iterator[int]]:
        """Records a..b-1, and the list iterator over their ends that drives them.

        The records come from C-level iterators whose innermost step is that list iterator,
        so `operator.length_hint(ends)` is, at any moment and from any thread, how many of
        the records are not taken yet: progress is known without any work per record.
        """
        ends = self.ends[a:b]
        it = iter(ends)
        first = self.ends[a - 1] if a else 0
        starts = map(operator.add, chain((first,), ends), repeat(4))
        records = map(self._data.__getitem__, map(slice, starts, it))
        return (map(bytes, records) if self._copy else records), it


class RecordList:
    """A checked chunk whose records were each read into bytes of their own."""

    __slots__ = ("_records",)

    def __init__(self, records: list[bytes]) -> None:
        self._records = records

    @property
    def count(self) -> int:
        return len(self._records)

    def cut(self, a: int, b: int) -> tuple[Iterator[bytes], Iterator[bytes]]:
        """Records a..b-1; the one list iterator both hands them out and tells, through
        `operator.length_hint`, how many are not taken yet (as LoadedChunk.cut's)."""
        it = iter(self._records[a:b])
        return it, it


Checked = LoadedChunk | RecordList
"""A chunk read and checked, its records to cut out."""


def _read_records(f: IO[bytes], size: int, count: int, checksum: int) -> list[bytes] | None:
    """The `count` records of an uncompressed payload of `size` bytes at `f`'s position, each
    read straight into bytes of its own (no chunk buffer to copy them out of), the CRC-32
    taken over them as they come; None unless the framing tiles the payload exactly and the
    CRC is the header's (the caller then reads the chunk again for the checks' own error)."""
    read = f.read
    records: list[bytes] = []
    append = records.append
    crc = 0
    left = size
    for _ in repeat(None, count):
        prefix = read(4)
        if len(prefix) != 4 or left < 4:
            return None
        n = _LENGTH(prefix)[0]
        left -= 4 + n
        if left < 0:
            return None
        record = read(n)
        if len(record) != n:
            return None
        crc = crc32(record, crc32(prefix, crc))
        append(record)
    if left or crc != checksum:
        return None
    return records


class ChunkReader:
    """Loads chunks one after the other for one consumer; owns the reused buffer.

    A chunk's records must all be taken before the next chunk is loaded: the buffer is
    overwritten then. A compressed chunk that would inflate to more than `max_inflated`
    bytes is refused while it is decoded (InflatedTooLargeError).
    """

    def __init__(self, max_inflated: int = DEFAULT_MAX_INFLATED) -> None:
        self._buffer = bytearray()
        self.max_inflated = check_limit(max_inflated)

    def load(self, source: Source, offset: int, num_records: int) -> Checked:
        with open_source(source) as src:
            return self._load(src, offset, num_records)

    def load_file(self, f: IO[bytes], path: str, offset: int, num_records: int) -> Checked:
        """The chunk at `offset` of `f`, an open file of `path` (the name errors give)."""
        return self._load(Opened(f, path, 0), offset, num_records)

    def _load(self, src: Opened, offset: int, num_records: int) -> Checked:
        src.file.seek(src.base + offset)
        header = read_chunk(src, 0, offset, num_records)
        where: Where = {"path": src.name, "chunk": 0, "offset": offset}
        size = header.compressed_size
        count = header.num_records
        large = header.compressor == 0 and count and size // count >= LARGE_RECORD
        if large and callable(getattr(src.file, "readinto", None)):
            records = _read_records(src.file, size, count, header.checksum)
            if records is not None:
                return RecordList(records)
            # Damaged or short: read it again whole, for the checks' own error.
            src.file.seek(src.base + offset + HEADER_SIZE)
            view = self._read_into(src.file, size, where)
            _check_crc(view, header.checksum, where)
            return LoadedChunk(view, frame_ends(view, count, where), copy=True)
        payload = read_exact(src.file, size)
        if len(payload) != size:
            raise _truncated(len(payload), size, where)
        _check_crc(payload, header.checksum, where)
        data = decompress(header.compressor, payload, where, self.max_inflated)
        del payload
        return LoadedChunk(data, frame_ends(data, count, where), copy=False)

    def load_bytes(self, data: bytes, path: str, offset: int, num_records: int) -> LoadedChunk:
        """The chunk at `offset` of `path` from its bytes (header and payload) fetched ahead."""
        where: Where = {"path": path, "chunk": 0, "offset": offset}
        if len(data) < HEADER_SIZE and not data:
            raise TruncatedChunkError("Failed to parse chunk header: EOF", **where)
        header = parse_header(data[:HEADER_SIZE], path=path, chunk=0, offset=offset)
        if header.num_records != num_records:
            from chunkmaster.recordio.errors import RecordOverrunError

            raise RecordOverrunError(
                f"header says {header.num_records} records but the index says {num_records} "
                f"(stale index or wrong offset)",
                **where,
            )
        size = header.compressed_size
        payload = data[HEADER_SIZE : HEADER_SIZE + size]
        if len(payload) != size:
            raise _truncated(len(payload), size, where)
        _check_crc(payload, header.checksum, where)
        out = decompress(header.compressor, payload, where, self.max_inflated)
        return LoadedChunk(out, frame_ends(out, header.num_records, where), copy=False)

    def _read_into(self, f: object, size: int, where: Where) -> memoryview:
        if len(self._buffer) < size:
            self._buffer = bytearray(size)
        view = memoryview(self._buffer)[:size]
        readinto = f.readinto  # type: ignore[attr-defined]
        got = 0
        while got < size:
            n = readinto(view[got:])
            if not n:
                raise _truncated(got, size, where)
            got += n
        return view


def _check_crc(data: bytes | memoryview, checksum: int, where: Where) -> None:
    actual = crc32(data)
    if actual != checksum:
        raise ChecksumError(
            f"Checksum checking failed. (header 0x{checksum:08x}, payload 0x{actual:08x})",
            **where,
        )


def _truncated(got: int, size: int, where: Where) -> TruncatedChunkError:
    return TruncatedChunkError(
        f"payload has {got} of {size} bytes (Failed to read chunk data: EOF)", **where
    )


class RecordIOLoader:
    """The trainer's side: a chunk from its bytes, fetched ahead or read with one ranged read
    (for a local file one pread, on the descriptor a trainer keeps open: client/files.py); a
    local chunk of large records (or of unknown length) from the open file, through
    `ChunkReader` (large uncompressed records each into bytes of its own)."""

    __slots__ = ("_reader",)

    def __init__(self, max_inflated: int = DEFAULT_MAX_INFLATED) -> None:
        self._reader = ChunkReader(max_inflated)

    def load(self, chunk: Chunk, storage: Storage, data: bytes | None = None) -> Checked:
        if data is None:
            small = 0 < chunk.length < LARGE_RECORD * max(1, chunk.num_records)
            if isinstance(storage, LocalStorage) and not small:
                with storage.open(chunk.path) as f:
                    return self._reader.load_file(f, chunk.path, chunk.offset, chunk.num_records)
            if chunk.length <= 0:
                with storage.open(chunk.path) as f:
                    return self._reader.load(f, chunk.offset, chunk.num_records)
            data = storage.read_ranges(chunk.path, [(chunk.offset, chunk.length)])[0]
        return self._reader.load_bytes(data, chunk.path, chunk.offset, chunk.num_records)


class RecordIOFormat(Indexed):
    """PaddlePaddle RecordIO (chunkmaster.recordio): a chunk is a RecordIO chunk."""

    name = "recordio"
    suffixes = (".rio", ".recordio")
    ranged = True
    chunk_size: int | None = None  # the writer chose the chunks

    def read_index(
        self, path: str, storage: Storage, chunk_size: int | None, max_inflated: int
    ) -> FileIndex:
        """The chunk headers (payloads are not read, so nothing is inflated here)."""
        offsets: list[int] = []
        records: list[int] = []
        lengths: list[int] = []
        with storage.open(path) as f, open_source(f) as src:
            src.name = path
            for info in walk_headers(src):
                offsets.append(info.offset)
                records.append(info.header.num_records)
                lengths.append(HEADER_SIZE + info.header.compressed_size)
        return FileIndex(offsets, records, lengths, storage.size(path))

    def loader(self, *, max_inflated: int = DEFAULT_MAX_INFLATED) -> RecordIOLoader:
        return RecordIOLoader(max_inflated)


FORMAT = RecordIOFormat()

"""Writing RecordIO files, byte-identical to the reference writer for none and snappy."""

from __future__ import annotations

import contextlib
from typing import Any

from chunkmaster.closing import Closing
from chunkmaster.recordio.codecs import Compressor, compress, crc32, resolve_compressor
from chunkmaster.recordio.errors import RecordIOError, WriterClosedError
from chunkmaster.recordio.header import HEADER, LENGTH, MAGIC, MAX_UINT32
from chunkmaster.recordio.source import Source, open_source

DEFAULT_MAX_CHUNK_SIZE = 32 * 1024 * 1024

_pack_length = LENGTH.pack


class Writer(Closing):
    """Append records to a RecordIO file, cutting chunks exactly like the reference.

    Cut rule: before adding a record, if the open chunk's record payload bytes (length prefixes
    not counted) plus the new record's length exceed `max_chunk_size` (strictly), the open chunk
    is flushed first. A negative limit means the 32 MiB default; 0 is honoured. A chunk with no
    records is never written. A negative compressor means snappy; an unknown id raises
    UnknownCompressorError at once (the reference only fails at the first flush).

    `write` after `close` raises WriterClosedError, which is both a RecordIOError and a
    ValueError. A file object target is flushed but not closed.
    """

    def __init__(
        self,
        target: Source,
        max_chunk_size: int = DEFAULT_MAX_CHUNK_SIZE,
        compressor: int = Compressor.SNAPPY,
    ) -> None:
        self.max_chunk_size = DEFAULT_MAX_CHUNK_SIZE if max_chunk_size < 0 else max_chunk_size
        self.compressor = resolve_compressor(compressor)
        self._stack = contextlib.ExitStack()
        src = self._stack.enter_context(open_source(target, "wb"))
        self._file: Any = src.file
        self.name = src.name
        self._parts: list[bytes] = []  # length prefix, record, length prefix, record, ...
        self._bytes = 0  # record payload bytes in the open chunk
        self._closed = False
        self.num_records = 0
        self.num_chunks = 0

    def write(self, record: bytes) -> None:
        """Add one record (any bytes-like value; it is copied unless it is already bytes)."""
        if self._closed:
            raise WriterClosedError("Cannot write since writer had been closed", path=self.name)
        if type(record) is not bytes:
            record = bytes(record)
        n = len(record)
        if n > MAX_UINT32:
            raise ValueError(f"record of {n} bytes: the format limits records to 4 GiB - 1")
        if self._bytes + n > self.max_chunk_size:
            self._flush()
        self._parts += (_pack_length(n), record)
        self._bytes += n

    def _flush(self) -> None:
        count = len(self._parts) // 2
        if count == 0:
            return
        payload = compress(self.compressor, b"".join(self._parts))
        if len(payload) > MAX_UINT32:
            raise RecordIOError(
                f"chunk payload of {len(payload)} bytes does not fit the 32-bit size field",
                path=self.name,
                chunk=self.num_chunks,
            )
        self._file.write(HEADER.pack(MAGIC, crc32(payload), self.compressor, len(payload), count))
        self._file.write(payload)
        self._parts = []
        self._bytes = 0
        self.num_records += count
        self.num_chunks += 1

    def flush(self) -> None:
        """Write the open chunk now (ends it early: later records start a new chunk)."""
        if not self._closed:
            self._flush()
            self._file.flush()

    def close(self) -> None:
        """Flush the open chunk and close the file if we opened it. A second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._flush()
            self._file.flush()
        finally:
            self._stack.close()

    @property
    def closed(self) -> bool:
        return self._closed

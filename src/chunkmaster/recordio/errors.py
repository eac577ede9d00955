"""Exceptions raised by the RecordIO reader and writer.

Every error carries where it happened (file, chunk number, byte offset of the chunk header) so
that an operator can find the damaged spot, and so that the master can report a precise task
failure. Nothing else (struct.error, zlib.error, cramjam errors, EOFError...) escapes the package.
"""

from __future__ import annotations

import errno
import os
from typing import TypedDict


class Where(TypedDict):
    """Keyword arguments locating an error: file, chunk number, chunk header offset."""

    path: str | None
    chunk: int | None
    offset: int | None


class RecordIOError(Exception):
    """Base class of every RecordIO failure.

    `reason` is the bare description (the reference's text where it has one); `str(exc)` also
    names the file, the chunk and its offset when they are known.
    """

    def __init__(
        self,
        reason: str,
        *,
        path: str | None = None,
        chunk: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.path = path
        self.chunk = chunk
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where: list[str] = []
        if self.path is not None:
            where.append(self.path)
        if self.chunk is not None:
            where.append(f"chunk {self.chunk}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        return f"{', '.join(where)}: {self.reason}" if where else self.reason

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default pickling; errors cross processes.
        return (_rebuild, (type(self), self.reason, self.path, self.chunk, self.offset))


def _rebuild(
    cls: type[RecordIOError], reason: str, path: str | None, chunk: int | None, offset: int | None
) -> RecordIOError:
    return cls(reason, path=path, chunk=chunk, offset=offset)


class BadMagicError(RecordIOError):
    """Bytes at a chunk boundary are not a chunk header (bad magic, trailing garbage)."""


class ChecksumError(RecordIOError):
    """The CRC-32 of a stored payload does not match its header."""


class TruncatedChunkError(RecordIOError):
    """The file ends inside a chunk header or payload."""


class UnknownCompressorError(RecordIOError):
    """A chunk (or a writer argument) names a compressor id other than 0, 1, 2."""


class CorruptPayloadError(RecordIOError):
    """The decompressor rejected a payload whose outer checksum was fine."""


class InflatedTooLargeError(RecordIOError):
    """A compressed payload inflates to more than the reader's limit (`max_inflated`): refused
    while it was being decoded, so it never takes the memory (a decompression bomb)."""


class RecordOverrunError(RecordIOError):
    """Record lengths do not tile the chunk data, or the record count disagrees."""


class WriterClosedError(RecordIOError, ValueError):
    """`Writer.write` after `close()`; also a ValueError, like writing to a closed file."""


class NotRegularFileError(OSError):
    """A local path names a FIFO, device, socket or directory: refused before it is opened.

    An I/O condition like FileNotFoundError, not corruption, so not a RecordIOError. (Opening a
    FIFO that has no writer would block for ever; reading a device need never end.)
    """

    def __init__(self, path: str, kind: str) -> None:
        code = errno.EISDIR if kind == "directory" else errno.EINVAL
        super().__init__(code, f"is a {kind}, not a regular file", path)
        self.kind = kind

    def __str__(self) -> str:
        return f"{os.fsdecode(self.filename)}: {self.strerror}"

    def __reduce__(self) -> tuple[object, ...]:
        # OSError's own pickling would call __init__ with (errno, strerror, filename).
        return (type(self), (self.filename, self.kind))

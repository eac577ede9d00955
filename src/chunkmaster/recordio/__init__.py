"""PaddlePaddle RecordIO: a reader and writer compatible with github.com/PaddlePaddle/recordio.

See docs/recordio.md for the format and for where we are deliberately stricter than the reference.
"""

from chunkmaster.recordio.codecs import Compressor
from chunkmaster.recordio.errors import (
    BadMagicError,
    ChecksumError,
    CorruptPayloadError,
    InflatedTooLargeError,
    NotRegularFileError,
    RecordIOError,
    RecordOverrunError,
    TruncatedChunkError,
    UnknownCompressorError,
    WriterClosedError,
)
from chunkmaster.recordio.header import HEADER_SIZE, MAGIC, ChunkHeader
from chunkmaster.recordio.index import ChunkInfo, Index, load_index, read_chunk_headers
from chunkmaster.recordio.scanner import scan
from chunkmaster.recordio.source import Source
from chunkmaster.recordio.writer import DEFAULT_MAX_CHUNK_SIZE, Writer

__all__ = [
    "DEFAULT_MAX_CHUNK_SIZE",
    "HEADER_SIZE",
    "MAGIC",
    "BadMagicError",
    "ChecksumError",
    "ChunkHeader",
    "ChunkInfo",
    "Compressor",
    "CorruptPayloadError",
    "Index",
    "InflatedTooLargeError",
    "NotRegularFileError",
    "RecordIOError",
    "RecordOverrunError",
    "Source",
    "TruncatedChunkError",
    "UnknownCompressorError",
    "Writer",
    "WriterClosedError",
    "load_index",
    "read_chunk_headers",
    "scan",
]

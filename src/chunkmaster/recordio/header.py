"""The 20-byte chunk header: five little-endian uint32 (magic, crc32, compressor, size, count)."""

from __future__ import annotations

import struct
from typing import NamedTuple

from chunkmaster.recordio.errors import BadMagicError, TruncatedChunkError

MAGIC = 0x01020304
MAGIC_BYTES = MAGIC.to_bytes(4, "little")
HEADER = struct.Struct("<5I")
HEADER_SIZE = HEADER.size  # 20
LENGTH = struct.Struct("<I")
MAX_UINT32 = 0xFFFFFFFF


class ChunkHeader(NamedTuple):
    """A decoded chunk header (the magic is checked, not kept)."""

    checksum: int
    compressor: int
    compressed_size: int
    num_records: int

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC, self.checksum, self.compressor, self.compressed_size, self.num_records
        )


def parse_header(raw: bytes, *, path: str, chunk: int, offset: int) -> ChunkHeader:
    """Decode `raw` (what was read at a chunk boundary), rejecting short or foreign bytes.

    Unlike the reference, a short header is never zero-filled into a phantom chunk: 1-19 bytes
    that could be the start of a header are a TruncatedChunkError, anything else BadMagicError.
    The error never shows the bytes found: any file may be handed to us, secrets included.
    """
    if len(raw) < HEADER_SIZE:
        if raw[:4] == MAGIC_BYTES[: len(raw)]:
            raise TruncatedChunkError(
                f"file ends {len(raw)} bytes into a chunk header (needs {HEADER_SIZE})",
                path=path,
                chunk=chunk,
                offset=offset,
            )
        raise BadMagicError(
            f"Failed to parse magic number (only {len(raw)} trailing bytes)",
            path=path,
            chunk=chunk,
            offset=offset,
        )
    magic, checksum, compressor, size, count = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise BadMagicError(
            "Failed to parse magic number (not a RecordIO chunk header)",
            path=path,
            chunk=chunk,
            offset=offset,
        )
    return ChunkHeader(checksum, compressor, size, count)

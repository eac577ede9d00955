"""Decompression with a bound on what comes out.

A payload of a few megabytes can inflate to gigabytes (a decompression bomb): decompressed
whole, it takes a trainer's, or the master's, memory before anything can look at it, and the
kernel kills the process. Every decompressor in chunkmaster goes through here with a limit
(`DEFAULT_MAX_INFLATED`, or a trainer's `max_inflated_bytes` and the master's
`--max-inflated-bytes`) and is stopped as soon as its output would pass it:

- gzip (RecordIO chunks, `.jsonl.gz`/`.txt.gz`, `.tfrecord.gz`) is inflated with isal's
  `max_length`: the decoder never produces more than limit + 1 bytes, whatever the stream
  says of its size (gzip's own size field is not trusted). `iter_gunzip` gives the output a
  piece at a time, for counting without holding it (the master's indexing);
- the Snappy framing format (RecordIO) and zstd (`.zst`) are walked before they are decoded:
  their frame and block headers bound what each piece yields (the decoders refuse a piece that
  yields more than its header allows), so an oversized payload is refused before a byte of it
  is inflated.

Errors never quote the payload: `Damaged` says what kind of damage was seen, and keeps the
decoder's exception for callers that can name it safely.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Final

import cramjam
from isal import isal_zlib

DEFAULT_MAX_INFLATED: Final = 1 << 30
"""What one chunk may inflate to by default (1 GiB): far above a RecordIO writer's 32 MiB chunks
and a TFRecord or JSON Lines shard, far below a trainer's memory."""

#: The setting that raises the limit, as an error names it: the trainer's, or the master's.
TRAINER_SETTING: Final = "the trainer's max_inflated_bytes, read --max-inflated-bytes"
MASTER_SETTING: Final = "the master's --max-inflated-bytes"

GZIP_MAGIC: Final = b"\x1f\x8b\x08"  # ID1, ID2, CM = deflate
_READ: Final = 1 << 20  # compressed bytes read at a time when streaming
_U32: Final = struct.Struct("<I")
_ZSTD_MAGIC: Final = 0xFD2FB528
_ZSTD_BLOCK_MAX: Final = 128 << 10  # a zstd block never decodes to more (the format's bound)


class TooLarge(Exception):
    """The payload inflates to more than `limit` bytes; refused while it was inflated."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"inflates to more than {limit} bytes")
        self.limit = limit

    def reason(self, stored: int | None, setting: str = TRAINER_SETTING) -> str:
        """The one-line reason, with the stored size when known and the setting to raise."""
        source = "" if stored is None else f" from {stored} stored bytes"
        return (
            f"refused: it inflates to more than {self.limit} bytes{source}, the limit on what "
            f"one chunk may inflate to ({setting})"
        )


class Damaged(Exception):
    """The payload is not a valid stream of its kind: `kind` is "empty", "header" (it does not
    start like one), "trailing" (bytes after the last member or frame), "truncated" or "data"
    (the decoder refused it: `cause`, whose text is the decoder's own)."""

    def __init__(self, kind: str, cause: BaseException | None = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.cause = cause


def check_limit(limit: int) -> int:
    """`limit` if it is a usable bound (at least 1 byte); ValueError otherwise."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"the limit on inflated bytes must be a whole number >= 1, not {limit!r}")
    return limit


# ---- gzip --------------------------------------------------------------------------------------


def gunzip(data: bytes, limit: int, *, zero_padding: bool = False) -> bytes:
    """The concatenated gzip members of `data`, refused (TooLarge) once past `limit` bytes.

    Strict like Go's reader: an empty payload and bytes after the last member are Damaged;
    `zero_padding` accepts zero bytes after a member (as Python's gzip module does).
    """
    if data[: len(GZIP_MAGIC)] == GZIP_MAGIC:  # the usual case, one member: one call
        d = isal_zlib.decompressobj(31)
        try:
            out = d.decompress(data, limit + 1)
        except Exception as exc:  # isal's IsalError, a zlib.error lookalike
            raise Damaged("data", exc) from None
        if len(out) > limit:
            raise TooLarge(limit)
        if d.eof and not d.unused_data:
            return out
    given = [data]  # several members, trailing bytes, truncation: the general path says which
    parts = list(iter_gunzip(lambda: given.pop() if given else b"", limit, zero_padding))
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)


def iter_gunzip(
    read: Callable[[], bytes], limit: int, zero_padding: bool = False, block: int | None = None
) -> Iterator[bytes]:
    """The output of the gzip members that `read()` gives piece by piece (b"" at the end),
    at most `block` bytes a piece (None: as much as one call gives); TooLarge as soon as the
    output passes `limit`, Damaged as `gunzip`."""
    total = 0
    members = 0
    pending = b""
    ended = False
    while True:
        while not ended:  # the next member's start: enough bytes for its magic, or the end
            if members and zero_padding:
                pending = pending.lstrip(b"\0")
            if len(pending) >= len(GZIP_MAGIC):
                break
            piece = read()
            if piece:
                pending += piece
            else:
                ended = True
        if members and zero_padding:
            pending = pending.lstrip(b"\0")
        if not pending:
            if members:
                return
            raise Damaged("empty")
        if pending[: len(GZIP_MAGIC)] != GZIP_MAGIC:
            raise Damaged("trailing" if members else "header")
        d = isal_zlib.decompressobj(31)
        data = pending
        while True:
            room = limit - total
            ask = room + 1 if block is None else min(block, room + 1)
            try:
                out = d.decompress(data, ask)
            except Exception as exc:  # isal's IsalError, a zlib.error lookalike
                raise Damaged("data", exc) from None
            total += len(out)
            if total > limit:
                raise TooLarge(limit)
            if out:
                yield out
            if d.eof:
                break
            data = d.unconsumed_tail
            if not data and len(out) < ask:  # the decoder wants more input
                data = b"" if ended else read()
                if not data:
                    raise Damaged("truncated")
        pending = d.unused_data
        members += 1


# ---- snappy (framing format) --------------------------------------------------------------------


def snappy_framed_size(data: bytes | memoryview) -> int:
    """The bytes a Snappy framing-format stream decodes to, from its chunk headers alone.

    A compressed chunk yields exactly the length its block's varint preamble declares, an
    uncompressed one its data: the decoder refuses a chunk that yields anything else (and
    one over 64 KiB), so this sum bounds the output before anything is decoded. Damaged when
    the headers do not tile `data`.
    """
    n = len(data)
    pos = 0
    total = 0
    while pos < n:
        if pos + 4 > n:
            raise Damaged("truncated")
        kind = data[pos]
        end = pos + 4 + (data[pos + 1] | data[pos + 2] << 8 | data[pos + 3] << 16)
        if end > n:
            raise Damaged("truncated")
        if kind == 0x00:  # compressed: a masked CRC, then a raw block led by its length
            total += _varint(data, pos + 8, end)
        elif kind == 0x01:  # uncompressed: a masked CRC, then the data
            if end - pos < 8:
                raise Damaged("data")
            total += end - pos - 8
        elif kind < 0x80:  # reserved, unskippable
            raise Damaged("data")
        pos = end  # padding, skippable chunks and the stream identifier yield nothing
    return total


def _varint(data: bytes | memoryview, pos: int, end: int) -> int:
    value = 0
    for shift in range(0, 35, 7):
        if pos >= end:
            raise Damaged("data")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
    raise Damaged("data")


def unsnappy(data: bytes, limit: int) -> bytes:
    """Decode a Snappy framing-format stream, refused (TooLarge) before decoding when its
    headers say it yields more than `limit` bytes."""
    if snappy_framed_size(data) > limit:
        raise TooLarge(limit)
    try:
        return bytes(cramjam.snappy.decompress(data))
    except Exception as exc:  # cramjam's DecompressionError, and sometimes others
        raise Damaged("data", exc) from None


# ---- zstd ----------------------------------------------------------------------------------------


def zstd_bound(data: bytes | memoryview) -> int:
    """The most bytes a zstd stream can decode to, from its frame and block headers alone.

    Raw and RLE blocks yield exactly the size their header gives; a compressed block at most
    128 KiB (the format's Block_Maximum_Size, enforced by the decoder). Skippable frames yield
    nothing. A frame's declared content size is not used: the decoder checks it only at the
    frame's end, after the output is made. Damaged when the headers do not tile `data`.
    """
    n = len(data)
    pos = 0
    total = 0
    while pos < n:
        if pos + 4 > n:
            raise Damaged("trailing" if pos else "header")
        (magic,) = _U32.unpack_from(data, pos)
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame
            if pos + 8 > n:
                raise Damaged("truncated")
            pos += 8 + _U32.unpack_from(data, pos + 4)[0]
            continue
        if magic != _ZSTD_MAGIC:
            raise Damaged("trailing" if pos else "header")
        if pos + 5 > n:
            raise Damaged("truncated")
        fhd = data[pos + 4]
        if fhd & 0x08:  # the reserved bit
            raise Damaged("data")
        single = fhd & 0x20
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
        pos += (1 if single else 0, 2, 4, 8)[fhd >> 6]
        while True:
            if pos + 3 > n:
                raise Damaged("truncated")
            header = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            pos += 3
            kind = (header >> 1) & 3
            size = header >> 3
            if kind == 0:  # raw
                total += size
                pos += size
            elif kind == 1:  # RLE: one byte, repeated `size` times
                total += size
                pos += 1
            elif kind == 2:  # compressed
                total += _ZSTD_BLOCK_MAX
                pos += size
            else:
                raise Damaged("data")
            if pos > n:
                raise Damaged("truncated")
            if header & 1:  # the frame's last block
                break
        if fhd & 0x04:  # a content checksum follows
            pos += 4
        if pos > n:
            raise Damaged("truncated")
    return total


def unzstd(data: bytes, limit: int) -> bytes:
    """Decode a zstd stream, refused (TooLarge) before decoding when its headers allow more
    than `limit` bytes."""
    if not data:
        raise Damaged("empty")
    if zstd_bound(data) > limit:
        raise TooLarge(limit)
    try:
        return bytes(cramjam.zstd.decompress(data))
    except Exception as exc:
        raise Damaged("data", exc) from None

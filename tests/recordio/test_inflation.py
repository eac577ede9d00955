"""Decompression bombs: a RecordIO chunk whose payload is small and inflates far beyond the
reader's limit is refused while it is decoded, naming the file, the chunk, its offset and the
sizes, and never takes the memory (docs/recordio.md, "Bounded inflation")."""

from __future__ import annotations

import gzip
import struct
import tracemalloc
from pathlib import Path

import cramjam
import pytest
from helpers.datasets import bomb_records, one_chunk, raw_chunk

from chunkmaster import inflate
from chunkmaster.core.model import Chunk
from chunkmaster.formats.recordio import RecordIOFormat
from chunkmaster.formats.storage import LocalStorage
from chunkmaster.recordio import (
    Compressor,
    CorruptPayloadError,
    InflatedTooLargeError,
    load_index,
    scan,
)
from chunkmaster.recordio.header import HEADER_SIZE

LIMIT = 1 << 20  # the test's limit: small, so that nothing here really eats memory


def _bomb_file(tmp_path: Path, compressor: Compressor, inflated: int = 32 << 20) -> Path:
    """A good chunk, then one whose payload inflates to `inflated` bytes, then a good one."""
    path = tmp_path / f"bomb-{compressor.name.lower()}.rio"
    good = one_chunk([b"a", b"b"], compressor)
    path.write_bytes(good + one_chunk(bomb_records(inflated), compressor) + good)
    return path


@pytest.mark.parametrize("compressor", [Compressor.GZIP, Compressor.SNAPPY], ids=["gzip", "snappy"])
def test_a_chunk_that_inflates_past_the_limit_is_refused_naming_it(
    tmp_path: Path, compressor: Compressor
) -> None:
    path = _bomb_file(tmp_path, compressor)
    index = load_index(str(path))
    offset = index.chunk_offsets[1]
    stored = index.chunk_offsets[2] - offset - HEADER_SIZE
    assert stored * 16 < 32 << 20 and LIMIT < 32 << 20  # small stored, beyond the limit inflated
    with pytest.raises(InflatedTooLargeError) as err:
        list(scan(str(path), max_inflated=LIMIT))
    text = str(err.value)
    assert str(path) in text and "chunk 1" in text and f"offset {offset}" in text, text
    assert f"more than {LIMIT} bytes from {stored} stored bytes" in text, text
    assert "max_inflated_bytes" in text, text
    # The trainer's loader (one chunk of a task) says the same.
    loader = RecordIOFormat().loader(max_inflated=LIMIT)
    with pytest.raises(InflatedTooLargeError, match=f"offset {offset}: refused"):
        loader.load(Chunk(str(path), offset, 32), LocalStorage())
    # Under the default limit (1 GiB) the same honest chunk reads, whole.
    assert sum(1 for _ in scan(str(path))) == 2 + 32 + 2


def test_a_gzip_bomb_is_stopped_while_it_inflates_not_after(tmp_path: Path) -> None:
    """A gzip stream whose own size field lies (it says 16 bytes, it holds 256 MiB): the reader
    stops at the limit, holding about that much, and never gets as far as the trailer."""
    payload = bytearray(gzip.compress(bytes(256 << 20), 9))
    payload[-4:] = struct.pack("<I", 16)  # ISIZE: "16 bytes"
    path = tmp_path / "liar.rio"
    path.write_bytes(raw_chunk(Compressor.GZIP, bytes(payload), 4))
    tracemalloc.start()
    try:
        with pytest.raises(InflatedTooLargeError, match="more than 1048576 bytes"):
            list(scan(str(path), max_inflated=LIMIT))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * LIMIT + len(payload), peak  # not 256 MiB


def test_a_snappy_chunk_whose_block_lies_about_its_length_is_refused_not_inflated(
    tmp_path: Path,
) -> None:
    """Snappy's framing is walked before decoding (each block declares what it yields); a block
    that declares 10 bytes and holds 64 KiB fails as corrupt instead of yielding 64 KiB."""
    block = bytearray(cramjam.snappy.compress_raw(bytes(65536)))
    assert block[:3] == b"\x80\x80\x04"  # the varint 65536
    lying = bytes([10]) + bytes(block[3:])
    body = b"\x00\x00\x00\x00" + lying  # a masked CRC (never reached), then the block
    stream = b"\xff\x06\x00\x00sNaPpY" + b"\x00" + len(body).to_bytes(3, "little") + body
    assert inflate.snappy_framed_size(stream) == 10
    path = tmp_path / "liar.rio"
    path.write_bytes(raw_chunk(Compressor.SNAPPY, stream, 1))
    with pytest.raises(CorruptPayloadError, match="snappy: corrupt input"):
        list(scan(str(path), max_inflated=LIMIT))


def test_the_limit_holds_across_concatenated_gzip_members() -> None:
    member = gzip.compress(bytes(LIMIT // 2))
    assert len(inflate.gunzip(member * 2, LIMIT)) == LIMIT
    with pytest.raises(inflate.TooLarge):
        inflate.gunzip(member * 3, LIMIT)


def test_streamed_gunzip_gives_pieces_and_stops_at_the_limit() -> None:
    data = gzip.compress(bytes(8 << 20))
    pieces = iter([data[:100], data[100:]])
    sizes = [len(p) for p in inflate.iter_gunzip(lambda: next(pieces, b""), 8 << 20, block=LIMIT)]
    assert sum(sizes) == 8 << 20 and max(sizes) <= LIMIT
    pieces = iter([data])
    with pytest.raises(inflate.TooLarge):
        for _ in inflate.iter_gunzip(lambda: next(pieces, b""), LIMIT, block=LIMIT):
            pass


def test_zstd_is_bounded_by_its_block_headers_before_decoding() -> None:
    data = bytes(cramjam.zstd.compress(b"line\n" * (2 << 20)))  # 10 MiB in a few KB
    assert inflate.zstd_bound(data) >= 10 << 20
    with pytest.raises(inflate.TooLarge):
        inflate.unzstd(data, LIMIT)
    assert inflate.unzstd(data, 16 << 20) == b"line\n" * (2 << 20)
    with pytest.raises(inflate.Damaged):
        inflate.unzstd(data[:-3], 16 << 20)

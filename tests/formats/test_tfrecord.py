"""TFRecord: index from frame headers, load with both CRCs, every kind of damage named."""

from __future__ import annotations

import gzip
import operator
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import google_crc32c
import pytest

from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import FileIndex, FormatError
from chunkmaster.formats.storage import LOCAL as STORAGE
from chunkmaster.formats.tfrecord import TFRecordFormat, masked_crc


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return (
        length
        + struct.pack("<I", mask(google_crc32c.value(length)))
        + record
        + struct.pack("<I", mask(google_crc32c.value(record)))
    )


def write(path: Path, records: Sequence[bytes]) -> str:
    path.write_bytes(b"".join(frame(r) for r in records))
    return str(path)


def records_of(n: int, seed: int = 0) -> list[bytes]:
    """Distinct records of varied sizes, zero-length ones included."""
    return [(b"rec%d-%d|" % (seed, i)) * (i % 50) for i in range(n)]


def read_all(path: str, index: FileIndex, fmt: TFRecordFormat) -> list[bytes]:
    loader = fmt.loader()
    out: list[bytes] = []
    for offset, count, length in zip(index.offsets, index.records, index.lengths, strict=True):
        loaded = loader.load(Chunk(path, offset, count, length), STORAGE)
        assert loaded.count == count
        records, left = loaded.cut(0, count)
        out.extend(records)
        assert list(left) == []
    return out


def assert_tiles(index: FileIndex) -> None:
    ends = [o + n for o, n in zip(index.offsets, index.lengths, strict=True)]
    assert list(index.offsets[1:]) == ends[:-1]
    assert (ends[-1] if ends else 0) == index.size


def test_masked_crc_matches_known_values() -> None:
    assert google_crc32c.value(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert masked_crc(b"") == 0xA282EAD8
    assert masked_crc(b"1234567890asdfghjkl") == 4134599430


def test_round_trip_over_many_chunks(tmp_path: Path) -> None:
    records = records_of(3000)
    path = write(tmp_path / "a.tfrecord", records)
    fmt = TFRecordFormat(max_bytes=16 << 10)
    index = fmt.index(path, STORAGE)
    assert len(index.offsets) > 10
    assert sum(index.records) == len(records)
    assert max(index.lengths) <= 16 << 10
    assert_tiles(index)
    assert read_all(path, index, fmt) == records


def test_chunks_are_bounded_in_records_too(tmp_path: Path) -> None:
    records = records_of(1000)
    path = write(tmp_path / "a.tfrecord", records)
    fmt = TFRecordFormat(max_records=64)
    index = fmt.index(path, STORAGE)
    assert list(index.records) == [64] * 15 + [40]
    assert read_all(path, index, fmt) == records


def test_empty_file_has_no_chunks(tmp_path: Path) -> None:
    path = write(tmp_path / "empty.tfrecord", [])
    assert TFRecordFormat().index(path, STORAGE) == FileIndex([], [], [], 0)


def test_one_record_and_an_empty_record(tmp_path: Path) -> None:
    for records in ([b"only"], [b""]):
        path = write(tmp_path / "one.tfrecord", records)
        fmt = TFRecordFormat()
        index = fmt.index(path, STORAGE)
        assert list(index.records) == [1]
        assert read_all(path, index, fmt) == records


def test_a_record_larger_than_a_chunk_is_a_chunk_of_its_own(tmp_path: Path) -> None:
    big = os.urandom(5 << 20)
    records = [b"small", big, b"after"]
    path = write(tmp_path / "big.tfrecord", records)
    fmt = TFRecordFormat()
    index = fmt.index(path, STORAGE)
    assert list(index.records) == [1, 1, 1]
    assert index.lengths[1] == len(big) + 16
    assert read_all(path, index, fmt) == records


def test_prefetched_bytes_are_used(tmp_path: Path) -> None:
    records = records_of(100)
    path = write(tmp_path / "a.tfrecord", records)
    fmt = TFRecordFormat()
    index = fmt.index(path, STORAGE)
    (offset,), (count,), (length,) = index.offsets, index.records, index.lengths
    data = Path(path).read_bytes()
    os.remove(path)  # only the given bytes can be read now
    loaded = fmt.loader().load(Chunk(path, offset, count, length), STORAGE, data)
    assert list(loaded.cut(0, count)[0]) == records


def test_cut_reports_what_is_left(tmp_path: Path) -> None:
    records = records_of(10)
    path = write(tmp_path / "a.tfrecord", records)
    fmt = TFRecordFormat()
    index = fmt.index(path, STORAGE)
    loaded = fmt.loader().load(Chunk(path, 0, 10, index.lengths[0]), STORAGE)
    got, left = loaded.cut(3, 8)
    assert next(got) == records[3]
    assert operator.length_hint(left) == 4
    assert list(got) == records[4:8]


# ---- damaged input -----------------------------------------------------------------------

SECRET = b"do-not-quote-me"


def damaged(tmp_path: Path, n: int = 200, pad: int = 0) -> tuple[str, bytes, list[int]]:
    """A file of `n` records that all contain SECRET (and `pad` more bytes each), and each
    frame's start."""
    records = [SECRET + b"%d" % i * 30 + b"\x00" * pad for i in range(n)]
    frames = [frame(r) for r in records]
    starts = [sum(len(f) for f in frames[:i]) for i in range(n)]
    path = str(tmp_path / "d.tfrecord")
    return path, b"".join(frames), starts


def refused(path: str, fmt: TFRecordFormat | None = None) -> FormatError:
    with pytest.raises(FormatError) as info:
        (fmt or TFRecordFormat()).index(path, STORAGE)
    assert SECRET.decode() not in str(info.value)
    assert str(info.value).startswith(path)
    return info.value


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    path, data, starts = damaged(tmp_path)
    for cut in (len(data) - 1, starts[-1] + 5, starts[-1] + 14):
        Path(path).write_bytes(data[:cut])
        err = refused(path)
        assert err.chunk == 0
        assert f"(at byte {starts[-1]})" in str(err)


def test_bad_length_crc_is_refused_naming_chunk_and_record(tmp_path: Path) -> None:
    path, data, starts = damaged(tmp_path)
    bad = bytearray(data)
    bad[starts[150] + 9] ^= 0x01  # the length's CRC
    Path(path).write_bytes(bytes(bad))
    err = refused(path, TFRecordFormat(max_records=100))
    assert err.chunk == 1
    assert err.offset == starts[100]
    assert "record 150: length checksum mismatch" in str(err)
    assert f"(at byte {starts[150]})" in str(err)


# Chunks of small records are fetched whole; of large ones, read frame by frame.
SIZES = pytest.mark.parametrize("pad", [0, 20 << 10], ids=["small", "large"])


@SIZES
def test_bad_data_crc_fails_the_chunk_not_the_index(tmp_path: Path, pad: int) -> None:
    path, data, starts = damaged(tmp_path, pad=pad)
    bad = bytearray(data)
    bad[starts[42] + 12 + 3] ^= 0x40  # a byte of record 42
    Path(path).write_bytes(bytes(bad))
    fmt = TFRecordFormat()
    index = fmt.index(path, STORAGE)
    chunk = Chunk(path, index.offsets[0], index.records[0], index.lengths[0])
    with pytest.raises(FormatError) as info:
        fmt.loader().load(chunk, STORAGE)
    message = str(info.value)
    assert message.startswith(
        f"{path}, chunk 0 at offset 0: the chunk's record 42: data checksum mismatch"
    )
    assert f"(at byte {starts[42]})" in message
    assert SECRET.decode() not in message


@SIZES
def test_file_changed_after_indexing_fails_the_chunk(tmp_path: Path, pad: int) -> None:
    path, data, starts = damaged(tmp_path, pad=pad)
    Path(path).write_bytes(data)
    fmt = TFRecordFormat(max_bytes=len(data))
    index = fmt.index(path, STORAGE)
    chunk = Chunk(path, index.offsets[-1], index.records[-1], index.lengths[-1])
    assert chunk.num_records == 200
    Path(path).write_bytes(data[:-10])
    truncated = "ends inside the chunk's record 199" if pad else "ends 10 bytes before"
    with pytest.raises(FormatError, match=truncated):
        fmt.loader().load(chunk, STORAGE)
    Path(path).write_bytes(data + data[:100])
    more = Chunk(path, chunk.offset, chunk.num_records, chunk.length + 100)
    with pytest.raises(FormatError, match="100 bytes after the chunk's 200 records"):
        fmt.loader().load(more, STORAGE)
    fewer = Chunk(path, chunk.offset, 199, chunk.length)
    after = f"bytes after the chunk's 199 records .at byte {starts[199]}"
    with pytest.raises(FormatError, match=after):
        fmt.loader().load(fewer, STORAGE)


@pytest.mark.parametrize(
    "content",
    [
        b'{"a": 1}\n' * 100,  # JSON Lines
        bytes(1024),  # a tar's end blocks
        b"\x01\x02",  # shorter than a header
    ],
)
def test_content_that_is_not_tfrecord_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.tfrecord"
    path.write_bytes(content)
    err = refused(str(path))
    assert "not a TFRecord file" in str(err) or "ends inside its header" in str(err)


def test_gzip_content_under_a_plain_name_is_refused_with_a_hint(tmp_path: Path) -> None:
    path, data, _ = damaged(tmp_path)
    Path(path).write_bytes(gzip.compress(data))
    assert "name it *.tfrecord.gz" in str(refused(path))


# ---- .tfrecord.gz: one chunk -------------------------------------------------------------


def test_gzip_file_is_one_chunk(tmp_path: Path) -> None:
    records = records_of(500)
    path = tmp_path / "a.tfrecord.gz"
    path.write_bytes(gzip.compress(b"".join(frame(r) for r in records)))
    fmt = TFRecordFormat(max_records=10)
    index = fmt.index(str(path), STORAGE)
    assert index == FileIndex([0], [500], [path.stat().st_size], path.stat().st_size)
    assert read_all(str(path), index, fmt) == records


def test_damaged_gzip_is_refused(tmp_path: Path) -> None:
    records = records_of(500)
    packed = gzip.compress(b"".join(frame(r) for r in records))
    path = tmp_path / "a.tfrecord.gz"
    path.write_bytes(packed[:-20])
    with pytest.raises(FormatError, match="gzip stream is truncated"):
        TFRecordFormat().index(str(path), STORAGE)
    path.write_bytes(b"plain text, not gzip")
    with pytest.raises(FormatError, match="not a gzip file"):
        TFRecordFormat().index(str(path), STORAGE)


# ---- the dataset: format by name, digests ------------------------------------------------


def test_master_indexes_tfrecord_files_by_name_and_refuses_a_mismatch(tmp_path: Path) -> None:
    from chunkmaster.core.errors import DatasetError
    from chunkmaster.master.indexing import load_dataset

    for i in range(3):
        write(tmp_path / f"part-{i}.tfrecord", records_of(200, seed=i))
    dataset = load_dataset([str(tmp_path / "*.tfrecord")], 1)
    assert dataset.format == "tfrecord"
    assert sum(dataset.chunk_records) == 600
    (tmp_path / "part-3.tfrecord").write_bytes(b'{"not": "tfrecord"}\n')
    with pytest.raises(DatasetError) as info:
        load_dataset([str(tmp_path / "*.tfrecord")], 1)
    assert f"{tmp_path / 'part-3.tfrecord'}: not a TFRecord file" in str(info.value)


def test_digest_of_loaded_records_is_the_digest_of_the_written_ones(tmp_path: Path) -> None:
    from chunkmaster.digest import Digest

    records = records_of(2000)
    path = write(tmp_path / "a.tfrecord", records)
    fmt = TFRecordFormat(max_bytes=8 << 10)
    written, loaded = Digest(), Digest()
    for r in records:
        written.add(r)
    for r in read_all(path, fmt.index(path, STORAGE), fmt):
        loaded.add(r)
    assert loaded == written
    assert loaded.count == 2000


def test_client_reads_passes_with_a_damaged_chunk_failing_its_task(tmp_path: Path) -> None:
    from helpers.inproc import InProcessMaster

    from chunkmaster.client import Client
    from chunkmaster.client.errors import EndOfPass, TaskReadError

    good = records_of(300, seed=1)
    write(tmp_path / "a-good.tfrecord", good)
    _, data, starts = damaged(tmp_path)
    bad = bytearray(data)
    bad[starts[7] + 12] ^= 0x01
    (tmp_path / "b-bad.tfrecord").write_bytes(bytes(bad))
    with InProcessMaster(chunks_per_task=1) as m, Client(m.addr) as c:
        c.set_dataset([str(tmp_path / "*.tfrecord")])
        got: list[bytes] = []
        errors: list[str] = []
        c.start_get_records(0)
        while True:
            try:
                got.append(c.next_record())
            except TaskReadError as exc:
                errors.append(str(exc))
            except EndOfPass:
                break
    assert got == good  # the damaged chunk gave nothing, each time it was dispatched
    assert errors
    for error in errors:
        assert "b-bad.tfrecord, chunk 0 at offset 0: the chunk's record 7: data checksum" in error
        assert SECRET.decode() not in error

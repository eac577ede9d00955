"""Each corrupted reference file fails with the right error, never with wrong data."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest
from helpers.vectors import load_errors, load_manifest, manifest_records, vector_path, vectors_dir

from chunkmaster.recordio import (
    BadMagicError,
    ChecksumError,
    ChunkHeader,
    CorruptPayloadError,
    Index,
    RecordIOError,
    RecordOverrunError,
    TruncatedChunkError,
    UnknownCompressorError,
    load_index,
    scan,
)

# file -> (load_index error or None, full-scan error, damaged chunk, its offset, text in message)
# Where we differ from the reference (it accepts the file or yields padded/dropped records) the
# expectation is our documented strict behaviour.
Expectation = tuple[tuple[type[RecordIOError], ...] | None, type[RecordIOError], int, int, str]
EXPECTED: dict[str, Expectation]
EXPECTED = {
    "bad_magic_first": ((BadMagicError,), BadMagicError, 0, 0, "Failed to parse magic number"),
    "bad_magic_chunk2": ((BadMagicError,), BadMagicError, 2, 68, "Failed to parse magic number"),
    "checksum_mismatch_chunk1": (None, ChecksumError, 1, 29, "Checksum checking failed."),
    "checksum_field_wrong_chunk1": (None, ChecksumError, 1, 29, "Checksum checking failed."),
    "truncated_payload": ((TruncatedChunkError,), TruncatedChunkError, 4, 134, "chunk data"),
    "truncated_header_10": ((TruncatedChunkError,), TruncatedChunkError, 4, 134, "header"),
    "truncated_header_3": ((TruncatedChunkError, BadMagicError), RecordIOError, 4, 134, ""),
    "unknown_compressor_chunk1": (
        None,
        UnknownCompressorError,
        1,
        29,
        "Unknown compression algorithm: 3",
    ),
    "num_records_minus1_chunk0": (None, RecordOverrunError, 0, 0, "left over"),
    "record_len_overrun_chunk0": (None, RecordOverrunError, 0, 0, "overrun"),
    "snappy_corrupt_frame": (None, CorruptPayloadError, 0, 0, "snappy: corrupt input"),
    "snappy_no_stream_identifier": (None, CorruptPayloadError, 0, 0, "snappy: corrupt input"),
    "gzip_bad_header": (None, CorruptPayloadError, 0, 0, "gzip: invalid header"),
}


def _cases() -> list[str]:
    return sorted(EXPECTED)


def _case(name: str) -> dict[str, Any]:
    for case in load_errors()["cases"]:
        if case["file"] == f"errors/{name}.recordio":
            return dict(case)
    raise AssertionError(f"errors.json has no case {name}")


def _base_records(case: dict[str, Any]) -> list[bytes]:
    return manifest_records(load_manifest(case["base"].removesuffix(".recordio")))


def test_every_error_file_is_covered() -> None:
    cases = load_errors()["cases"]
    names = {c["file"].removeprefix("errors/").removesuffix(".recordio") for c in cases}
    files = (vectors_dir() / "errors").glob("*.recordio")
    on_disk = {p.name.removesuffix(".recordio") for p in files}
    assert names == on_disk == set(EXPECTED)


def _check_error(exc: RecordIOError, path: str, chunk: int, offset: int, text: str) -> None:
    assert exc.path == path
    assert exc.chunk == chunk
    assert exc.offset == offset
    assert path in str(exc) and f"chunk {chunk}" in str(exc) and f"offset {offset}" in str(exc)
    assert text in str(exc)


@pytest.mark.parametrize("name", _cases())
def test_load_index(name: str) -> None:
    case = _case(name)
    path = str(vector_path(f"errors/{name}"))
    index_error, _, chunk, offset, text = EXPECTED[name]
    if index_error is None:
        idx = load_index(path)
        assert case["load_index_ok"]
        assert idx.chunk_offsets == case["index_chunk_offsets"]
        assert idx.chunk_records == case["index_records_per_chunk"]
    else:
        with pytest.raises(index_error) as info:
            load_index(path)
        expected_text = text if index_error[0] is BadMagicError else ""
        _check_error(info.value, path, chunk, offset, expected_text)


@pytest.mark.parametrize("name", _cases())
@pytest.mark.parametrize("with_index", [False, True])
def test_full_scan_never_yields_wrong_data(name: str, with_index: bool) -> None:
    case = _case(name)
    path = str(vector_path(f"errors/{name}"))
    index_error, scan_error, chunk, offset, text = EXPECTED[name]
    truth = _base_records(case)
    yielded: list[bytes] = []
    with pytest.raises(RecordIOError) as info:
        idx = load_index(path) if with_index else None
        for record in scan(path, idx):
            yielded.append(record)
    assert isinstance(info.value, scan_error)
    _check_error(info.value, path, chunk, offset, text)
    assert yielded == truth[: len(yielded)]
    if with_index and index_error is not None:
        assert yielded == []  # no partial index, as in the reference


UNINDEXABLE_BY_REFERENCE = ("bad_magic_first", "bad_magic_chunk2", "truncated_header_3")


@pytest.mark.parametrize("name", [n for n in _cases() if n not in UNINDEXABLE_BY_REFERENCE])
def test_per_chunk_scans(name: str) -> None:
    """Using the index the reference builds (what a master would have stored), the intact chunks
    read exactly as the reference reads them; the damaged one raises."""
    case = _case(name)
    assert case["load_index_ok"]
    path = str(vector_path(f"errors/{name}"))
    _, scan_error, damaged, offset, _ = EXPECTED[name]
    for entry in case["per_chunk_scan"]:
        k = entry["chunk"]
        idx = Index([case["index_chunk_offsets"][k]], [case["index_records_per_chunk"][k]])
        want = [bytes.fromhex(h) for h in entry["yielded_hex"]]
        if k == damaged:
            with pytest.raises(scan_error) as info:
                list(scan(path, idx, -1, -1))
            assert info.value.chunk == 0  # chunk numbers are relative to the index given
            assert info.value.offset == offset
        else:
            assert "error" not in entry
            assert list(scan(path, idx, -1, -1)) == want


def test_truncated_file_object_and_pipe_like_streams() -> None:
    """Without a known size (a pipe), truncation is still found by the short read."""
    data = vector_path("errors/truncated_payload").read_bytes()

    class Pipe:
        name = "<pipe>"

        def __init__(self) -> None:
            self.pos = 0

        def read(self, n: int) -> bytes:
            out = data[self.pos : self.pos + min(n, 7)]  # short reads, like a pipe
            self.pos += len(out)
            return out

        def seekable(self) -> bool:
            return False

    got: list[bytes] = []
    with pytest.raises(TruncatedChunkError) as info:
        got.extend(scan(Pipe()))
    assert info.value.chunk == 4 and info.value.path == "'<pipe>'"
    assert got == _base_records(_case("truncated_payload"))[:6]


SECRET = b"password=hunter2\nuser=root\n" * 4


def _assert_no_secret(exc: BaseException) -> None:
    text = str(exc) + repr(exc) + str(exc.__cause__ or "")
    assert "hunter2" not in text and "password" not in text
    assert f"{int.from_bytes(SECRET[:4], 'little'):08x}" not in text  # not even as hex


def test_error_on_a_foreign_file_names_it_but_never_quotes_it(tmp_path: Path) -> None:
    path = tmp_path / "credentials.txt"
    path.write_bytes(SECRET)
    with pytest.raises(BadMagicError) as info:
        load_index(path)
    assert str(path) in str(info.value) and "offset 0" in str(info.value)
    _assert_no_secret(info.value)
    with pytest.raises(BadMagicError) as info:
        list(scan(path))
    _assert_no_secret(info.value)


def _chunk(compressor: int, payload: bytes, crc: int | None = None) -> bytes:
    checksum = zlib.crc32(payload) if crc is None else crc
    return ChunkHeader(checksum, compressor, len(payload), 1).pack() + payload


@pytest.mark.parametrize(
    ("compressor", "error"),
    [(1, CorruptPayloadError), (2, CorruptPayloadError), (0, RecordOverrunError)],
)
def test_decoder_errors_never_quote_the_payload(
    tmp_path: Path, compressor: int, error: type[RecordIOError]
) -> None:
    """cramjam's own text can quote payload bytes ("unexpected chunk type byte 112")."""
    path = tmp_path / "bad.rio"
    path.write_bytes(_chunk(compressor, SECRET))
    for copy in (True, False):
        with pytest.raises(error) as info:
            list(scan(path, copy=copy))
        assert str(path) in str(info.value)
        _assert_no_secret(info.value)
        if compressor == 1:
            assert info.value.reason == "Failed to deflate chunk data: snappy: corrupt input"


def test_checksum_error_shows_neither_crc(tmp_path: Path) -> None:
    """The CRC-32 of a payload of 4 bytes or less gives the payload back."""
    path = tmp_path / "crc.rio"
    payload = b"\x00\x00\x00\x00"  # one empty record
    path.write_bytes(_chunk(0, payload, crc=0x12345678))
    with pytest.raises(ChecksumError) as info:
        list(scan(path))
    text = str(info.value)
    assert "Checksum checking failed." in text and str(path) in text
    assert "12345678" not in text and f"{zlib.crc32(payload):08x}" not in text

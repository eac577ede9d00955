"""Every reference vector reads back exactly as its manifest says, and our writer reproduces it."""

from __future__ import annotations

import io
from typing import Any

import pytest
from helpers.vectors import MANIFESTS, load_manifest, manifest_records, vector_path

from chunkmaster.recordio import Compressor, Index, Writer, load_index, scan


@pytest.fixture(params=MANIFESTS)
def vector(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[bytes]]:
    manifest = load_manifest(request.param)
    return manifest, manifest_records(manifest)


def test_vector_file_matches_manifest(vector: tuple[dict[str, Any], list[bytes]]) -> None:
    manifest, _ = vector
    data = vector_path(manifest["file"].removesuffix(".recordio")).read_bytes()
    assert len(data) == manifest["file_size"]


def test_index(vector: tuple[dict[str, Any], list[bytes]]) -> None:
    manifest, records = vector
    idx = load_index(vector_path(manifest["file"].removesuffix(".recordio")))
    chunks = manifest.get("chunks", [])
    assert idx.num_records == manifest["num_records"] == len(records)
    assert idx.num_chunks == manifest["num_chunks"]
    assert idx.chunk_offsets == [c["offset"] for c in chunks]
    assert idx.chunk_records == [c["num_records"] for c in chunks]
    assert [idx.first_record(k) for k in range(idx.num_chunks)] == [
        c["first_record"] for c in chunks
    ]


def test_full_scan(vector: tuple[dict[str, Any], list[bytes]]) -> None:
    manifest, records = vector
    path = vector_path(manifest["file"].removesuffix(".recordio"))
    assert list(scan(path)) == records
    assert list(scan(str(path), load_index(path))) == records
    with open(path, "rb") as fh:  # an open file object works and is left open
        assert list(scan(fh)) == records
        assert not fh.closed


def test_locate(vector: tuple[dict[str, Any], list[bytes]]) -> None:
    manifest, _ = vector
    idx = load_index(vector_path(manifest["file"].removesuffix(".recordio")))
    for case in manifest.get("locate", []):
        assert idx.locate(case["record"]) == (case["chunk"], case["in_chunk"]), case


def test_range_scans(vector: tuple[dict[str, Any], list[bytes]]) -> None:
    manifest, records = vector
    path = vector_path(manifest["file"].removesuffix(".recordio"))
    idx = load_index(path)
    cases = manifest.get("range_scans", [])
    for case in cases:
        first, count = case["expected_first"], case["expected_count"]
        want = records[first : first + count] if count else []
        assert list(scan(path, idx, case["start"], case["len"])) == want, case
        assert list(scan(path, None, case["start"], case["len"])) == want, case


def test_per_chunk_scans(vector: tuple[dict[str, Any], list[bytes]]) -> None:
    """The master's unit of work: a one-chunk index, scanned with (-1, -1)."""
    manifest, records = vector
    path = vector_path(manifest["file"].removesuffix(".recordio"))
    idx = load_index(path)
    for chunk in manifest.get("chunks", []):
        k, first, n = chunk["index"], chunk["first_record"], chunk["num_records"]
        want = records[first : first + n]
        assert list(scan(path, idx.chunk_index(k), -1, -1)) == want
        # What a trainer builds from the (offset, count) pair it receives.
        assert list(scan(path, Index([chunk["offset"]], [n]), -1, -1)) == want


def _writer_args(manifest: dict[str, Any]) -> tuple[int, int]:
    return manifest.get("writer_max_chunk_size_arg", -1), manifest.get("writer_compressor_arg", -1)


def test_writer_reproduces_vector(vector: tuple[dict[str, Any], list[bytes]]) -> None:
    manifest, records = vector
    path = vector_path(manifest["file"].removesuffix(".recordio"))
    max_chunk, compressor = _writer_args(manifest)
    buf = io.BytesIO()
    with Writer(buf, max_chunk, compressor) as w:
        for r in records:
            w.write(r)
    assert not buf.closed
    ours = buf.getvalue()
    if manifest.get("effective_compressor", 0) == Compressor.GZIP:
        # Go's deflate differs from ours; same records and the same chunk boundaries.
        buf.seek(0)
        assert list(scan(buf)) == records
        assert load_index(io.BytesIO(ours)).chunk_records == manifest["records_per_chunk"]
    else:
        assert ours == path.read_bytes()


def test_hello_world_worked_example() -> None:
    buf = io.BytesIO()
    with Writer(buf, compressor=Compressor.NONE) as w:
        w.write(b"Hello")
        w.write(b"World!")
    assert buf.getvalue().hex() == (
        "04030201837e47590000000013000000020000000500000048656c6c6f06000000576f726c6421"
    )


def test_fsspec_url_round_trip() -> None:
    records = [b"a", b"", b"xyz" * 2000]
    with Writer("memory://chunkmaster-test/r.rio", 10, Compressor.GZIP) as w:
        for r in records:
            w.write(r)
    assert list(scan("memory://chunkmaster-test/r.rio")) == records
    idx = load_index("memory://chunkmaster-test/r.rio")
    assert idx.chunk_records == [2, 1]
    assert list(scan("memory://chunkmaster-test/r.rio", idx.chunk_index(1))) == records[2:]


def test_write_after_close_and_bad_compressor() -> None:
    from chunkmaster.recordio import UnknownCompressorError, WriterClosedError

    w = Writer(io.BytesIO())
    w.close()
    w.close()  # harmless
    with pytest.raises(WriterClosedError, match="Cannot write since writer had been closed"):
        w.write(b"x")
    with pytest.raises(UnknownCompressorError, match="Unknown compression algorithm: 3"):
        Writer(io.BytesIO(), compressor=3)

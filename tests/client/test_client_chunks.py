"""The hand-over unit: a checked chunk cut into records in the trainer's thread."""

from __future__ import annotations

from typing import Any

from chunkmaster.client.chunks import cut_records, last_record
from chunkmaster.recordio import load_index, scan
from chunkmaster.recordio.scanner import load_chunk


def test_cut_records_match_scan_chunk_by_chunk(rio: Any) -> None:
    records = [b"", b"a", b"\x00" * 300, bytes(range(256)), b"", b"z" * 5000, b"q"]
    path = rio("cut.rio", records, max_chunk_size=400)
    index = load_index(path)
    got: list[bytes] = []
    for offset, count in zip(index.chunk_offsets, index.chunk_records, strict=True):
        data, ends = load_chunk(path, offset, count)
        assert len(ends) == count
        assert list(cut_records(data, ends, count)) == list(cut_records(data, ends, count))
        head = list(cut_records(data, ends, count - 1))
        assert [*head, last_record(data, ends)] == list(cut_records(data, ends, count))
        got.extend(cut_records(data, ends, count))
    assert got == list(scan(path)) == records

"""Property tests: round trips, the cut rule, and random corruption."""

from __future__ import annotations

import contextlib
import io
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunkmaster.recordio import (
    DEFAULT_MAX_CHUNK_SIZE,
    Compressor,
    RecordIOError,
    Writer,
    load_index,
    scan,
)

records_st = st.lists(st.binary(max_size=300), max_size=40)
chunk_st = st.one_of(st.integers(-3, 0), st.integers(1, 1200))


def model_counts(lengths: list[int], max_chunk: int) -> list[int]:
    """The reference cut rule, written independently: records per chunk."""
    limit = DEFAULT_MAX_CHUNK_SIZE if max_chunk < 0 else max_chunk
    counts: list[int] = []
    open_bytes, open_count = 0, 0
    for n in lengths:
        if open_bytes + n > limit and open_count:
            counts.append(open_count)
            open_bytes, open_count = 0, 0
        open_bytes += n
        open_count += 1
    if open_count:
        counts.append(open_count)
    return counts


def write(records: list[bytes], max_chunk: int, compressor: int) -> bytes:
    buf = io.BytesIO()
    with Writer(buf, max_chunk, compressor) as w:
        for r in records:
            w.write(r)
    return buf.getvalue()


@settings(max_examples=150, deadline=None)
@given(records=records_st, max_chunk=chunk_st, compressor=st.sampled_from(list(Compressor)))
def test_round_trip_and_cut_rule(records: list[bytes], max_chunk: int, compressor: int) -> None:
    data = write(records, max_chunk, compressor)
    assert list(scan(io.BytesIO(data))) == records
    assert [bytes(v) for v in scan(io.BytesIO(data), copy=False)] == records
    idx = load_index(io.BytesIO(data))
    assert idx.chunk_records == model_counts([len(r) for r in records], max_chunk)
    assert idx.num_records == len(records)
    per_chunk = [list(scan(io.BytesIO(data), idx.chunk_index(k))) for k in range(idx.num_chunks)]
    assert [r for chunk in per_chunk for r in chunk] == records


@settings(max_examples=100, deadline=None)
@given(
    records=records_st,
    start=st.integers(-5, 50),
    length=st.integers(-5, 50),
    max_chunk=st.integers(0, 400),
)
def test_range_scan_matches_slicing(
    records: list[bytes], start: int, length: int, max_chunk: int
) -> None:
    data = write(records, max_chunk, Compressor.NONE)
    s = max(start, 0)
    want = records[s:] if length < 0 else records[s : s + length]
    idx = load_index(io.BytesIO(data))
    assert list(scan(io.BytesIO(data), idx, start, length)) == want
    assert list(scan(io.BytesIO(data), None, start, length)) == want
    views = scan(io.BytesIO(data), idx, start, length, copy=False)
    assert [bytes(v) for v in views] == want


corruption_st = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 255)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(st.binary(min_size=0, max_size=60), min_size=1, max_size=12),
    max_chunk=st.integers(0, 100),
    compressor=st.sampled_from(list(Compressor)),
    corruptions=st.lists(corruption_st, min_size=1, max_size=3),
)
def test_random_corruption_is_an_error_or_the_truth(
    records: list[bytes],
    max_chunk: int,
    compressor: int,
    corruptions: list[tuple[str, int, int]],
) -> None:
    data = bytearray(write(records, max_chunk, compressor))
    for kind, where, value in corruptions:
        pos = where % (len(data) + 1)
        if kind == "flip" and pos < len(data):
            data[pos] ^= value
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = bytes([value])
    truncated = any(kind == "truncate" for kind, _, _ in corruptions)
    got: list[bytes] = []
    try:
        got.extend(scan(io.BytesIO(bytes(data))))
    except RecordIOError:
        assert got == records[: len(got)]  # a prefix of the truth, never different data
    else:
        # A file cut exactly at a chunk boundary is a valid shorter file: only a prefix then.
        assert got == (records[: len(got)] if truncated else records)
    viewed: list[bytes] = []
    with contextlib.suppress(RecordIOError):
        viewed.extend(bytes(v) for v in scan(io.BytesIO(bytes(data)), copy=False))
    assert viewed == got  # the same records and the same point of failure as with copies
    try:
        idx = load_index(io.BytesIO(bytes(data)))
    except RecordIOError:
        return
    for k in range(idx.num_chunks):
        try:
            chunk = list(scan(io.BytesIO(bytes(data)), idx.chunk_index(k)))
        except RecordIOError:
            continue
        # Header counts may be damaged, so global numbering can shift: the chunk's records
        # must still be some contiguous run of the true records.
        assert _is_run_of(chunk, records)


def _is_run_of(part: list[bytes], whole: list[bytes]) -> bool:
    n = len(part)
    return any(whole[i : i + n] == part for i in range(len(whole) - n + 1))


def test_scan_holds_one_chunk_at_a_time(tmp_path: Path) -> None:
    """~64 MiB file of 1 MiB chunks: peak traced memory stays within a few chunks."""
    chunk = 1 << 20
    record = bytes(range(256)) * 16  # 4 KiB
    path = tmp_path / "big.rio"
    with Writer(path, chunk, Compressor.NONE) as w:
        for _ in range(64 * 256):
            w.write(record)
    assert path.stat().st_size > 64 * chunk
    for index in (None, load_index(path)):
        tracemalloc.start()
        try:
            n = 0
            for r in scan(path, index):
                n += len(r)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert n == 64 * chunk
        assert peak < 3 * chunk, f"peak {peak} bytes while scanning 1 MiB chunks"

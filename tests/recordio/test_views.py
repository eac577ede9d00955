"""scan(copy=False): zero-copy memoryviews, and the reused chunk buffers behind them."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from chunkmaster.recordio import Compressor, Writer, buffers, load_index, scan

RECORDS = [bytes([i % 251]) * (5000 + i) for i in range(40)]  # ~200 KiB, > 4 KiB each


def _write(path: Path, compressor: Compressor = Compressor.NONE) -> Path:
    with Writer(path, 40_000, compressor) as w:  # ~8 records per chunk
        for r in RECORDS:
            w.write(r)
    return path


@pytest.mark.parametrize("compressor", list(Compressor))
def test_views_hold_the_records(tmp_path: Path, compressor: Compressor) -> None:
    path = _write(tmp_path / "v.rio", compressor)
    views = list(scan(path, copy=False))
    assert all(isinstance(v, memoryview) and v.readonly for v in views)
    assert [bytes(v) for v in views] == RECORDS
    assert [bytes(v) for v in scan(path, load_index(path), 7, 20, copy=False)] == RECORDS[7:27]


def test_kept_views_are_never_overwritten(tmp_path: Path) -> None:
    """Views kept across chunks and across scans keep their records: a buffer still viewed is
    never reused for a later chunk."""
    path = _write(tmp_path / "v.rio")
    first = list(scan(path, copy=False))
    second = list(scan(path, copy=False))
    copies = list(scan(path))
    assert [bytes(v) for v in first] == [bytes(v) for v in second] == copies == RECORDS


def test_buffers_are_reused_once_released(tmp_path: Path) -> None:
    path = _write(tmp_path / "v.rio")
    for _ in scan(path):
        pass
    gc.collect()
    idle = list(buffers._idle)
    assert 1 <= len(idle) <= buffers.MAX_IDLE
    for _ in scan(path):
        pass
    assert any(b is a for b in buffers._idle for a in idle)  # the same buffer served again


def test_is_shared_sees_a_live_view() -> None:
    buf = buffers.take(10_000)
    view = buffers.place(buf, 100, 4096 + 20)
    assert buffers.is_shared(buf)
    part = view[10:20]
    view.release()
    assert buffers.is_shared(buf)  # the slice still looks at it
    del part
    assert not buffers.is_shared(buf)
    assert buffers.take(10_000) is not buf  # not given back: never handed out twice
    buffers.give_back(buf)
    assert buffers.take(10_000) is buf


def test_place_keeps_the_file_offset_within_a_page() -> None:
    buf = buffers.take(3 * buffers.PAGE)
    for pos in (0, 20, buffers.PAGE - 1, 5 * buffers.PAGE + 123):
        view = buffers.place(buf, 2 * buffers.PAGE, pos)
        assert len(view) == 2 * buffers.PAGE
        view.release()

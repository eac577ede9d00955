"""Paddle-style reader creators against a live master, and their local twin."""

from __future__ import annotations

import pickle
from collections import Counter
from typing import Any

import pytest
from helpers.inproc import InProcessMaster
from helpers.status_view import status_view

from chunkmaster.core.errors import DatasetError
from chunkmaster.paddle import cloud_reader, recordio

OBJECTS: list[Any] = [
    {"x": [1.5, 2.5], "label": 3},
    b"\x00raw\x00bytes",
    "",
    None,
    (0, "\x00"),
    *[{"i": i, "pad": b"\x00" * (i % 7)} for i in range(200)],
]


def _pickled(protocol: int) -> list[bytes]:
    return [pickle.dumps(o, protocol=protocol) for o in OBJECTS]


def _key(o: Any) -> str:
    return repr(o)


def test_cloud_reader_yields_unpickled_records_pass_by_pass(rio: Any) -> None:
    # The highest protocol is full of NUL bytes: the original forced protocol 0 (D9).
    path = rio("objs.rio", _pickled(pickle.HIGHEST_PROTOCOL), max_chunk_size=300)
    with InProcessMaster(chunks_per_task=2, timeout_dur=30.0) as m:
        reader = cloud_reader([path], None, addr=m.addr)
        try:
            reader()  # creating the generator uses no pass (the v2 argument check does this)
            for p in range(3):
                assert Counter(map(_key, reader())) == Counter(map(_key, OBJECTS)), p
                assert m.status_view().cur_pass == p + 1
        finally:
            reader.close()  # type: ignore[attr-defined]


def test_pass_counter_belongs_to_the_reader(rio: Any) -> None:
    """D14: the original shared one module-global pass counter between every reader."""
    path = rio("objs.rio", _pickled(2), max_chunk_size=300)
    with InProcessMaster(chunks_per_task=2) as m1, InProcessMaster(chunks_per_task=2) as m2:
        r1 = cloud_reader(path, None, addr=m1.addr)
        r2 = cloud_reader(path, None, addr=m2.addr)
        try:
            for _ in r1():
                pass
            for _ in r1():
                pass
            assert len(list(r2())) == len(OBJECTS)  # r2's first pass is its pass 0
            assert (status_view(m1.status()).cur_pass, status_view(m2.status()).cur_pass) == (2, 1)
        finally:
            r1.close()  # type: ignore[attr-defined]
            r2.close()  # type: ignore[attr-defined]


def test_cloud_reader_raises_the_masters_errors(tmp_path: Any) -> None:
    with InProcessMaster() as m, pytest.raises(DatasetError, match="no valid dataset"):
        cloud_reader(str(tmp_path / "none-*.rio"), None, addr=m.addr)


def test_local_recordio_reader_is_the_twin(rio: Any) -> None:
    a = rio("a.rio", _pickled(pickle.HIGHEST_PROTOCOL)[:100], max_chunk_size=200)
    b = rio("b.rio", _pickled(pickle.HIGHEST_PROTOCOL)[100:], max_chunk_size=200)
    reader = recordio(f"{a},{b}")
    for _ in range(2):
        assert list(map(_key, reader())) == list(map(_key, OBJECTS))
    pattern = a.replace("a.rio", "*.rio")
    assert Counter(map(_key, recordio([pattern])())) == Counter(map(_key, OBJECTS))

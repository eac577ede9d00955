"""Shared fixtures: datasets on real files, etcd servers, masters."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from helpers.etcd_server import etcd_server  # noqa: E402, F401

from chunkmaster.recordio import Compressor, Writer  # noqa: E402

MakeDataset = Callable[..., Path]


def write_records(
    path: Path,
    records: Sequence[bytes],
    *,
    max_chunk_size: int = 1,
    compressor: Compressor = Compressor.NONE,
) -> Path:
    with Writer(str(path), max_chunk_size=max_chunk_size, compressor=compressor) as w:
        for r in records:
            w.write(r)
    return path


@pytest.fixture
def make_dataset(tmp_path: Path) -> MakeDataset:
    """make_dataset(name, records, max_chunk_size=1): a RecordIO file; with the default
    limit of 1 byte every non-empty record is its own chunk."""

    def make(name: str, records: Sequence[bytes], **kw: object) -> Path:
        return write_records(tmp_path / name, records, **kw)  # type: ignore[arg-type]

    return make

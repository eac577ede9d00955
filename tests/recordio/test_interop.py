"""Interop with the reference library itself (Go via ctypes, PyPI recordio==0.1.7)."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest
from helpers.reference_recordio import read_all, reference_module, write_all

from chunkmaster.recordio import Compressor, Writer, load_index, scan


@pytest.fixture(scope="session")
def ref() -> ModuleType:
    # No skip: CI has PyPI access, and a missing reference must not pass silently.
    return reference_module()


def _records() -> list[bytes]:
    rng = __import__("random").Random(7)
    out = [b"", b"x", b"Hello", b"\x00" * 5, os.urandom(70_000), b"ab" * 40_000]
    out += [rng.randbytes(rng.randrange(0, 300)) for _ in range(500)]
    out += [b""] * 3
    return out


def test_reference_library_loads(ref: ModuleType) -> None:
    assert Path(ref.__file__).name == "__init__.py"
    assert hasattr(ref, "reader") and hasattr(ref, "writer")
    assert ref.recordio.lib.create_recordio_reader is not None  # ctypes .so loaded on this host


@pytest.mark.parametrize("compressor", list(Compressor))
@pytest.mark.parametrize("max_chunk", [-1, 0, 1000])
def test_ours_then_theirs(
    ref: ModuleType, tmp_path: Path, compressor: Compressor, max_chunk: int
) -> None:
    records = _records()
    path = tmp_path / "ours.rio"
    with Writer(path, max_chunk, compressor) as w:
        for r in records:
            w.write(r)
    got = read_all(ref, str(path))
    assert len(got) == len(records)  # None means EOF *or* error: the count must match exactly
    assert got == records


def test_theirs_then_ours(ref: ModuleType, tmp_path: Path) -> None:
    records = _records()
    path = tmp_path / "theirs.rio"
    write_all(ref, str(path), records)
    assert list(scan(path)) == records
    assert load_index(path).num_records == len(records)
    ours = tmp_path / "ours.rio"
    with Writer(ours) as w:  # same defaults: 32 MiB, snappy -> byte-identical
        for r in records:
            w.write(r)
    assert ours.read_bytes() == path.read_bytes()


def test_empty_file_both_ways(ref: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "empty.rio"
    Writer(path).close()
    assert path.read_bytes() == b""
    assert read_all(ref, str(path)) == []
    write_all(ref, str(tmp_path / "e2.rio"), [])
    assert list(scan(tmp_path / "e2.rio")) == []

"""Local paths that are not regular files are refused at once, never opened in a way that blocks."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from chunkmaster.recordio import (
    Index,
    NotRegularFileError,
    Writer,
    load_index,
    read_chunk_headers,
    scan,
)
from chunkmaster.recordio.scanner import load_chunk


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.rio"
    os.mkfifo(path)
    return path


READERS = {
    "load_index": load_index,
    "read_chunk_headers": read_chunk_headers,
    "scan": lambda p: list(scan(p)),
    "scan one chunk": lambda p: list(scan(p, Index([0], [1]))),
    "load_chunk": lambda p: load_chunk(p, 0, 1),
}


@pytest.mark.timeout(20)  # a blocking open() of the FIFO would hang here
@pytest.mark.parametrize("reader", sorted(READERS))
def test_fifo_without_writer_is_refused(tmp_path: Path, reader: str) -> None:
    path = _fifo(tmp_path)
    with pytest.raises(NotRegularFileError) as info:
        READERS[reader](str(path))
    assert str(info.value) == f"{path}: is a FIFO, not a regular file"
    assert info.value.filename == str(path)


@pytest.mark.timeout(20)
def test_writer_to_a_fifo_is_refused(tmp_path: Path) -> None:
    path = _fifo(tmp_path)
    with pytest.raises(NotRegularFileError, match="is a FIFO, not a regular file"):
        Writer(path)


@pytest.mark.timeout(20)
def test_character_device_is_refused() -> None:
    """/dev/zero would otherwise read as an endless run of zero bytes."""
    with pytest.raises(NotRegularFileError) as info:
        load_index("/dev/zero")
    assert str(info.value) == "/dev/zero: is a character device, not a regular file"
    with pytest.raises(NotRegularFileError):
        list(scan("/dev/zero"))


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotRegularFileError) as info:
        load_index(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, not a regular file"
    assert isinstance(info.value, OSError)  # an I/O condition, not a RecordIOError


def test_symlink_to_a_regular_file_still_reads(tmp_path: Path) -> None:
    real = tmp_path / "real.rio"
    with Writer(real) as w:
        w.write(b"record")
    link = tmp_path / "link.rio"
    link.symlink_to(real)
    assert list(scan(link)) == [b"record"]
    assert load_index(link).num_records == 1


def test_error_survives_pickling(tmp_path: Path) -> None:
    err = NotRegularFileError(str(tmp_path / "x"), "FIFO")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is NotRegularFileError and str(back) == str(err)

"""Choosing a dataset's format (file names, --format), refusing mixed or mismatched files at
set_dataset with the file named, the format in the dataset, its tasks and its fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.datasets import write_records
from helpers.formats import write_jsonl, write_parquet, write_text

from chunkmaster.core import checkpoint
from chunkmaster.core.errors import DatasetError
from chunkmaster.core.events import SetDataset
from chunkmaster.core.state import MasterState, apply
from chunkmaster.formats import format_for, get_format
from chunkmaster.master.indexing import load_dataset


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.rio", "recordio"),
        ("a.RecordIO", "recordio"),
        ("a", "recordio"),
        ("train-00001-of-00010", "recordio"),
        ("a.parquet", "parquet"),
        ("a.jsonl", "jsonl"),
        ("a.jsonl.gz", "jsonl"),
        ("a.txt", "text"),
        ("a.txt.zst", "text"),
        ("s3://bucket/x.y/a.jsonl", "jsonl"),
    ],
)
def test_the_format_comes_from_the_name(name: str, fmt: str) -> None:
    assert format_for(name).name == fmt


def test_an_unknown_format_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown dataset format 'csv' \(known: .*parquet"):
        get_format("csv")


def test_each_format_gives_its_name_chunk_lengths_and_tasks_carry_it(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"i": i} for i in range(10)])
    ds = load_dataset([str(tmp_path / "*.jsonl")], 1)
    assert ds.format == "jsonl"
    size = (tmp_path / "a.jsonl").stat().st_size
    assert ds.chunk_length is not None and list(ds.chunk_length) == [size]
    st = MasterState()
    apply(st, SetDataset(ds))
    task = st.task(0)
    assert task.format == "jsonl" and task.chunks[0].length == ds.chunk_length[0]


def test_mixed_formats_are_refused_naming_two_files(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [1, 2])
    b = write_text(tmp_path / "b.txt", ["x"])
    with pytest.raises(DatasetError) as err:
        load_dataset([str(tmp_path / "*")], 1)
    text = str(err.value)
    assert f"{a} is jsonl while {b} is text" in text and "--format" in text


def test_an_explicit_format_reads_every_file_as_it(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", ["x", "y"])
    write_text(tmp_path / "b.txt", ["z"])
    ds = load_dataset([str(tmp_path / "*")], 1, fmt="text")
    assert ds.format == "text" and ds.num_records == 3
    with pytest.raises(DatasetError, match="unknown dataset format 'csv'"):
        load_dataset([str(tmp_path / "*")], 1, fmt="csv")


@pytest.mark.parametrize("name", ["fake.parquet", "fake.rio", "fake"])
def test_content_not_matching_its_name_is_refused_naming_the_file(
    tmp_path: Path, name: str
) -> None:
    path = write_jsonl(tmp_path / name, [{"password": "hunter2"}] * 5)
    with pytest.raises(DatasetError) as err:
        load_dataset([str(path)], 1)
    text = str(err.value)
    assert str(path) in text and "hunter2" not in text
    if name == "fake":
        assert "no known format ending, so it was read as RecordIO" in text


def test_line_formats_index_any_bytes(tmp_path: Path) -> None:
    """Any bytes are lines: a RecordIO file read as JSON Lines is indexed, and the trainer's
    parse fails naming the chunk and line (tests/formats/test_lines.py)."""
    write_records(tmp_path / "a.rio", [b"x" * 10] * 3, max_chunk_size=100)
    ds = load_dataset([str(tmp_path / "a.rio")], 1, fmt="jsonl")
    assert ds.format == "jsonl"


def test_the_fingerprint_holds_the_format(tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", [{"i": i} for i in range(30)], row_group_size=10)
    ds = load_dataset([str(tmp_path / "a.parquet")], 2)
    fp = checkpoint.fingerprint(ds)
    assert fp.format == "parquet"
    cp = checkpoint.DataCheckpoint("job", 0.0, fp, ds.num_tasks, 0, ())
    assert checkpoint.decode(checkpoint.encode(cp)).dataset.format == "parquet"
    other = checkpoint.DatasetFingerprint(fp.globs, fp.chunks_per_task, fp.files, "jsonl")
    assert checkpoint.differences(fp, other) == ["format changed: parquet -> jsonl"]

"""A trainer's client on non-RecordIO datasets, against a real in-process master: Parquet rows
and record batches with column selection, commits counting a batch's rows, and a damaged chunk
reported to the master naming the file, the chunk and the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.formats import write_jsonl, write_parquet
from helpers.inproc import InProcessMaster

from chunkmaster.client import Client, EndOfPass, TaskReadError
from chunkmaster.core.checkpoint import decode
from chunkmaster.digest import Digest, canonical


def rows(n: int) -> list[dict[str, Any]]:
    return [{"i": i, "s": f"r{i}", "f": i / 3} for i in range(n)]


def test_parquet_rows_batches_and_columns(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    data = rows(100)
    for f in range(2):
        write_parquet(tmp_path / f"p{f}.parquet", data[f * 50 : f * 50 + 50], row_group_size=10)
    with InProcessMaster(chunks_per_task=2) as m, Client(m.addr) as c:
        c.set_dataset([str(tmp_path / "*.parquet")])
        assert sorted(list(c.records(0)), key=lambda r: r["i"]) == data
        got = sorted(c.records(1, columns=["i"]), key=lambda r: r["i"])
        assert got == [{"i": i} for i in range(100)]
        batches = list(c.batches(2, columns=["s", "i"]))
        assert all(b.schema.names == ["s", "i"] and b.num_rows == 10 for b in batches)
        assert sorted(r["i"] for b in batches for r in b.to_pylist()) == list(range(100))
        c.start_get_records(3, columns=["f"])
        assert set(c.next_record(timeout=30)) == {"f"}


def test_a_batch_taken_counts_its_rows_for_commits(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    write_parquet(tmp_path / "p.parquet", rows(50), row_group_size=10)
    # One task of 5 row groups.
    with InProcessMaster(chunks_per_task=5, timeout_dur=600.0) as m, Client(m.addr) as c:
        c.set_dataset([str(tmp_path / "p.parquet")])
        it = c.batches(0)
        assert next(it).num_rows == 10
        assert next(it).num_rows == 10
        c.commit()
        assert decode(c.data_checkpoint()).passes[0].partial == {0: 20}
        assert sum(b.num_rows for b in it) == 30  # the rest; the last batch finishes it
        c.commit()
        assert m.status_view().ledger[0].committed == 50


def test_batches_of_a_row_dataset_are_refused(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [1, 2, 3])
    with InProcessMaster() as m, Client(m.addr) as c:
        c.set_dataset([str(tmp_path / "a.jsonl")])
        with pytest.raises(TypeError, match="need a columnar dataset"):
            list(c.batches(0))


def test_a_bad_line_fails_its_task_naming_file_chunk_and_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"1\n2\n3\n{oops\n5\n")
    with InProcessMaster(failure_max=0) as m, Client(m.addr) as c:
        c.set_dataset([str(path)])
        c.start_get_records(0)
        with pytest.raises(TaskReadError) as err:
            while True:
                c.next_record(timeout=30)
        assert f"{path}, chunk 0 at offset 0: line 4 of the chunk is not JSON" in str(err.value)
        with pytest.raises(EndOfPass):
            c.next_record(timeout=30)
        reasons = [r["reason"] for f in m.status()["failed_tasks"] for r in f["reasons"]]
        assert any("line 4 of the chunk" in r and str(path) in r for r in reasons), reasons


def test_canonical_encoding_is_fixed() -> None:
    """These bytes are the documented encoding (docs/formats.md): they must never change."""
    import datetime
    import decimal

    assert canonical(b"\x00raw") == b"\x00raw"
    assert canonical("é") == '"é"'.encode()
    value = {
        "z": [1, 2.5, -0.0, None, True, False],
        "a": {"b": b"\xff", "n": float("nan"), "i": float("-inf")},
        "d": decimal.Decimal("1.10"),
        "t": datetime.datetime(2024, 1, 2, 3, 4, 5, 6),
        "day": datetime.date(2024, 1, 2),
        "dur": datetime.timedelta(days=1, seconds=2, microseconds=3),
        "big": 2**70,
        "e": 1e20,
    }
    assert canonical(value) == (
        b'{"a":{"b":{"$b64":"/w=="},"i":{"$float":"-inf"},"n":{"$float":"nan"}},'
        b'"big":1180591620717411303424,"d":{"$decimal":"1.10"},"day":{"$date":"2024-01-02"},'
        b'"dur":{"$timedelta":[1,2,3]},"e":1e+20,"t":{"$datetime":"2024-01-02T03:04:05.000006"},'
        b'"z":[1,2.5,-0.0,null,true,false]}'
    )
    d = Digest()
    d.add({"b": 1, "a": 2})
    e = Digest()
    e.add({"a": 2, "b": 1})
    assert d == e
    with pytest.raises(TypeError, match="has no canonical encoding"):
        canonical({"x": object()})


def test_paddle_and_torch_readers_yield_non_bytes_records_as_they_are(tmp_path: Path) -> None:
    from helpers.formats import write_text

    from chunkmaster.paddle import cloud_reader

    lines = [f"line {i}" for i in range(40)]
    write_text(tmp_path / "a.txt", lines)
    with InProcessMaster(chunks_per_task=1) as m:
        reader = cloud_reader([str(tmp_path / "a.txt")], None, addr=m.addr)
        try:
            assert sorted(reader()) == sorted(lines)
        finally:
            reader.close()  # type: ignore[attr-defined]
        pytest.importorskip("torch")
        from chunkmaster.torch import Loader

        with Loader(m.addr, transform=str.upper, batch_size=None) as loader:
            loader.set_pass(1)
            assert sorted(loader) == sorted(x.upper() for x in lines)

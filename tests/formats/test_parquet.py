"""Parquet: the footer index, rows and record batches read back, column selection, and damaged
files (broken footer, truncated, not Parquet at all) failing with the file (and chunk) named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.formats import write_parquet

from chunkmaster.core.model import Chunk
from chunkmaster.formats import FormatError, format_for
from chunkmaster.formats.parquet import FORMAT as PARQUET
from chunkmaster.formats.storage import LOCAL

pa = pytest.importorskip("pyarrow")


def rows(n: int) -> list[dict[str, Any]]:
    return [{"i": i, "s": f"r{i}", "f": i / 3, "b": bytes([i % 256])} for i in range(n)]


def chunks(path: Path) -> list[Chunk]:
    ix = PARQUET.index(str(path), LOCAL)
    return [
        Chunk(str(path), o, n, ln)
        for o, n, ln in zip(ix.offsets, ix.records, ix.lengths, strict=True)
    ]


def test_index_is_the_row_groups(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", rows(95), row_group_size=20)
    assert format_for(str(path)).name == "parquet"
    ix = PARQUET.index(str(path), LOCAL)
    assert list(ix.offsets) == [0, 1, 2, 3, 4]
    assert list(ix.records) == [20, 20, 20, 20, 15]
    assert all(ln > 0 for ln in ix.lengths) and ix.size == path.stat().st_size


def test_rows_and_batches_read_back(tmp_path: Path) -> None:
    data = rows(95)
    path = write_parquet(tmp_path / "a.parquet", data, row_group_size=20)
    loader = PARQUET.loader()
    got: list[Any] = []
    for c in chunks(path):
        loaded = loader.load(c, LOCAL)
        it, left = loaded.cut(0, loaded.count)
        got.extend(it)
        assert left.__length_hint__() == 0
    assert got == data
    loaded = loader.load(chunks(path)[1], LOCAL)
    batches, left = loaded.batch(5, 20)
    assert left.__length_hint__() == 15  # not taken yet
    (batch,) = list(batches)
    assert left.__length_hint__() == 0  # taken whole
    assert batch.num_rows == 15 and batch.to_pylist() == data[25:40]


def test_column_selection(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", rows(30), row_group_size=10)
    loader = PARQUET.loader(columns=["s", "i"])
    loaded = loader.load(chunks(path)[2], LOCAL)
    it, _ = loaded.cut(0, 2)
    assert list(it) == [{"s": "r20", "i": 20}, {"s": "r21", "i": 21}]
    with pytest.raises(KeyError, match=r"\['nope'\] are not in"):
        PARQUET.loader(columns=["nope"]).load(chunks(path)[0], LOCAL)


def test_an_empty_table_has_no_chunks(tmp_path: Path) -> None:
    path = tmp_path / "e.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"i": pa.array([], pa.int64())}), path)
    assert sum(PARQUET.index(str(path), LOCAL).records) == 0


def test_one_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "one.parquet", rows(1), row_group_size=10)
    (c,) = chunks(path)
    it, _ = PARQUET.loader().load(c, LOCAL).cut(0, 1)
    assert list(it) == rows(1)


@pytest.mark.parametrize(
    "damage",
    ["not parquet", "broken footer", "truncated", "empty"],
)
def test_damaged_files_are_refused_at_indexing(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "d.parquet"
    good = write_parquet(tmp_path / "g.parquet", rows(50), row_group_size=10).read_bytes()
    content = {
        "not parquet": b'{"json": "named .parquet"}\n' * 10,
        "broken footer": good[:-12] + b"\xff" * 4 + good[-8:],
        "truncated": good[: len(good) // 2],
        "empty": b"",
    }[damage]
    path.write_bytes(content)
    with pytest.raises(FormatError) as err:
        PARQUET.index(str(path), LOCAL)
    assert str(err.value).startswith(f"{path}: is not a readable Parquet file")
    assert "json" not in str(err.value)


def test_a_row_group_damaged_after_indexing_fails_naming_the_chunk(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", rows(50), row_group_size=10)
    cs = chunks(path)
    data = bytearray(path.read_bytes())
    data[4:400] = b"\x00" * 396  # the first row groups' pages, footer intact
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError) as err:
        loader = PARQUET.loader()
        for c in cs:
            loader.load(c, LOCAL).cut(0, c.num_records)
    assert f"{path}, chunk " in str(err.value) and "cannot read row group" in str(err.value)


def test_a_file_replaced_by_a_smaller_one_fails_on_its_row_count(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", rows(50), row_group_size=10)
    cs = chunks(path)
    write_parquet(path, rows(45), row_group_size=9)
    with pytest.raises(FormatError, match="has 9 rows, the index says 10"):
        PARQUET.loader().load(cs[0], LOCAL)
    with pytest.raises(FormatError, match="has 5 row groups, the index names group 5"):
        PARQUET.loader().load(Chunk(str(path), 5, 10, 1), LOCAL)

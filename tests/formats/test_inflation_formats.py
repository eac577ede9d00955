"""Decompression bombs in the other formats: a `.txt.gz`/`.jsonl.gz`/`.txt.zst` or
`.tfrecord.gz` file that inflates past the limit is refused by the master's indexing (counted as
it is inflated, never held whole) and by a trainer's loader, naming the file; a Parquet row
group whose footer declares more uncompressed bytes than the limit is refused before it is read
(docs/formats.md, "Compressed files and the inflation limit")."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import cramjam
import pytest
from helpers.formats import write_parquet

from chunkmaster.core.model import Chunk
from chunkmaster.formats import FormatError
from chunkmaster.formats.lines import JSONL, TEXT
from chunkmaster.formats.parquet import FORMAT as PARQUET
from chunkmaster.formats.storage import LOCAL
from chunkmaster.formats.tfrecord import TFRecordFormat, write_frames

LIMIT = 1 << 20


def _gzip_of_zero_lines(path: Path, inflated: int) -> Path:
    """Lines of zero bytes (`inflated` bytes in all), as concatenated gzip members: a file of
    a few KB for any size, made without ever holding it inflated."""
    member = gzip.compress((bytes(1023) + b"\n") * 1024, 9)  # 1 MiB: 1024 lines
    path.write_bytes(member * (inflated >> 20))
    return path


def test_the_master_refuses_a_gzip_text_bomb_naming_it_and_holds_little(tmp_path: Path) -> None:
    path = _gzip_of_zero_lines(tmp_path / "bomb.txt.gz", 64 << 20)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(FormatError) as err:
        TEXT.index(str(path), LOCAL, max_inflated=LIMIT)
    text = str(err.value)
    assert text.startswith(f"{path}: refused: it inflates to more than {LIMIT} bytes"), text
    assert f"from {path.stat().st_size} stored bytes" in text and "--max-inflated-bytes" in text
    # Under the limit it is counted a block at a time: 64 MiB of lines, a few MiB held.
    tracemalloc.start()
    try:
        ix = TEXT.index(str(path), LOCAL, max_inflated=1 << 30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert list(ix.records) == [64 << 10]
    assert peak < 16 << 20, peak


def test_a_trainer_refuses_a_compressed_lines_chunk_past_its_limit(tmp_path: Path) -> None:
    path = _gzip_of_zero_lines(tmp_path / "bomb.jsonl.gz", 8 << 20)
    size = path.stat().st_size
    chunk = Chunk(str(path), 0, 8 << 10, size)
    with pytest.raises(FormatError) as err:
        JSONL.loader(max_inflated=LIMIT).load(chunk, LOCAL)
    text = str(err.value)
    assert text.startswith(f"{path}, chunk 0 at offset 0: refused: it inflates to more than")
    assert f"from {size} stored bytes" in text and "max_inflated_bytes" in text, text


def test_a_zstd_bomb_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    path = tmp_path / "bomb.txt.zst"
    path.write_bytes(cramjam.zstd.compress(b"x\n" * (32 << 20)))  # 64 MiB of lines
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="refused: it inflates to more than 1048576"):
            TEXT.index(str(path), LOCAL, max_inflated=LIMIT)
        with pytest.raises(FormatError, match="chunk 0 at offset 0: refused"):
            TEXT.loader(max_inflated=LIMIT).load(Chunk(str(path), 0, 1, 0), LOCAL)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_tfrecord_gz_bomb_is_refused_by_the_master_and_the_trainer(tmp_path: Path) -> None:
    path = tmp_path / "bomb.tfrecord.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        write_frames(f, [bytes(1 << 20)] * 16)  # 16 MiB of zero records
    size = path.stat().st_size
    fmt = TFRecordFormat()
    with pytest.raises(FormatError, match=f"{path}: refused: it inflates to more than {LIMIT}"):
        fmt.index(str(path), LOCAL, max_inflated=LIMIT)
    ix = fmt.index(str(path), LOCAL, max_inflated=32 << 20)  # streamed, frames counted
    assert list(ix.records) == [16]
    with pytest.raises(FormatError) as err:
        fmt.loader(max_inflated=LIMIT).load(Chunk(str(path), 0, 16, size), LOCAL)
    assert f"chunk 0 at offset 0: refused: it inflates to more than {LIMIT} bytes" in str(err.value)
    loaded = fmt.loader(max_inflated=32 << 20).load(Chunk(str(path), 0, 16, size), LOCAL)
    assert loaded.count == 16


def test_a_parquet_row_group_declaring_more_than_the_limit_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    path = write_parquet(
        tmp_path / "big.parquet", [{"i": i, "s": f"{i:05d}" * 200} for i in range(2000)], 1000
    )
    chunk = Chunk(str(path), 1, 1000, 0)
    with pytest.raises(FormatError) as err:
        PARQUET.loader(max_inflated=100_000).load(chunk, LOCAL)
    text = str(err.value)
    assert "chunk 1 at offset 1: refused: row group 1 declares" in text, text
    assert "over the limit of 100000" in text, text
    # Only the columns read count: the small one fits.
    assert PARQUET.loader(columns=["i"], max_inflated=100_000).load(chunk, LOCAL).count == 1000

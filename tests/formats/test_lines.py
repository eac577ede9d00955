"""JSON Lines and text: the index pass (cuts at line boundaries, counts), reading chunks back,
and damaged or changed files failing with the file, the chunk and the line named."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest
from helpers.formats import write_jsonl, write_text

from chunkmaster.core.model import Chunk
from chunkmaster.formats import FormatError, format_for
from chunkmaster.formats.lines import JSONL, TEXT, LinesFormat, index_lines, parse_jsonl
from chunkmaster.formats.storage import LOCAL


def read_all(fmt: LinesFormat, path: Path) -> list[Any]:
    ix = fmt.index(str(path), LOCAL)
    loader = fmt.loader()
    out: list[Any] = []
    for o, n, ln in zip(ix.offsets, ix.records, ix.lengths, strict=True):
        chunk = loader.load(Chunk(str(path), o, n, ln), LOCAL)
        assert chunk.count == n
        records, _ = chunk.cut(0, n)
        out.extend(records)
    return out


def small(fmt: LinesFormat, bound: int) -> LinesFormat:
    return LinesFormat(fmt.name, fmt.suffixes, fmt.parse, chunk_size=bound)


@pytest.mark.parametrize("bound", [1, 7, 64, 1000, 1 << 20])
@pytest.mark.parametrize("final_newline", [True, False])
def test_chunks_are_whole_lines_within_the_bound(bound: int, final_newline: bool) -> None:
    lines = [b"x" * (i % 23) for i in range(299)] + [b"end"]
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    offsets, records, lengths = index_lines(io.BytesIO(data), bound)
    assert sum(records) == 300 and sum(lengths) == len(data)
    pos = 0
    for o, n, ln in zip(offsets, records, lengths, strict=True):
        assert o == pos
        piece = data[o : o + ln]
        assert piece.endswith(b"\n") or o + ln == len(data)
        body = piece[:-1] if piece.endswith(b"\n") else piece
        assert len(body.split(b"\n")) == n
        assert ln <= bound or piece.count(b"\n") <= 1  # only one overlong line exceeds it
        pos += ln


def test_jsonl_multi_chunk_round_trip(tmp_path: Path) -> None:
    values = [{"i": i, "s": "é" * (i % 9), "l": [i, None, True]} for i in range(500)]
    values[7] = "a string"
    values[8] = 3.25
    path = write_jsonl(tmp_path / "a.jsonl", values, final_newline=False)
    fmt = small(JSONL, 200)
    assert len(fmt.index(str(path), LOCAL).offsets) > 10
    assert read_all(fmt, path) == values


def test_text_lines_keep_empty_lines_and_drop_cr_lf(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"one\r\n\ntwo\rstill two\nlast")
    assert read_all(TEXT, path) == ["one", "", "two\rstill two", "last"]
    assert read_all(small(TEXT, 3), path) == ["one", "", "two\rstill two", "last"]


@pytest.mark.parametrize("content", [b"", b"\n", b"only"])
def test_empty_file_one_line_and_a_lone_newline(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(content)
    expected = {b"": [], b"\n": [""], b"only": ["only"]}[content]
    ix = TEXT.index(str(path), LOCAL)
    assert sum(ix.records) == len(expected)
    assert read_all(TEXT, path) == expected


def test_a_line_that_is_not_json_names_file_chunk_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"secret": tru\n{"a": 4}\n')
    with pytest.raises(FormatError) as err:
        read_all(JSONL, path)
    text = str(err.value)
    assert str(path) in text and "chunk 0 at offset 0" in text and "line 3 of the chunk" in text
    assert "secret" not in text  # never the file's contents


def test_an_empty_line_in_jsonl_is_an_error() -> None:
    with pytest.raises(FormatError, match="line 2 of the chunk is not JSON"):
        parse_jsonl(["1", "", "3"], False, {"path": "p", "chunk": 0, "offset": 0})


def test_text_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = write_text(tmp_path / "a.txt", ["fine", "also fine"])
    with path.open("ab") as f:
        f.write(b"bad \xff\xfe here\n")
    with pytest.raises(FormatError, match=r"a\.txt, chunk 0 at offset 0: line 3 of the chunk"):
        read_all(TEXT, path)


def test_a_file_truncated_after_indexing_fails_its_chunk(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"i": i} for i in range(100)])
    fmt = small(JSONL, 100)
    ix = fmt.index(str(path), LOCAL)
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size - 30)
    last = len(ix.offsets) - 1
    chunk = Chunk(str(path), ix.offsets[last], ix.records[last], ix.lengths[last])
    with pytest.raises(FormatError, match="truncated") as err:
        fmt.loader().load(chunk, LOCAL)
    assert f"chunk 0 at offset {ix.offsets[last]}" in str(err.value)


def test_a_file_changed_after_indexing_fails_on_its_line_count(tmp_path: Path) -> None:
    path = write_text(tmp_path / "a.txt", ["aaaa", "bbbb", "cccc"])
    ix = TEXT.index(str(path), LOCAL)
    path.write_bytes(b"aa\nbb\ncc\ndd\nee\n")  # as long as before
    chunk = Chunk(str(path), 0, ix.records[0], ix.lengths[0])
    with pytest.raises(FormatError, match="holds 5 lines but the index says 3"):
        TEXT.loader().load(chunk, LOCAL)


def test_compressed_files_are_one_chunk(tmp_path: Path) -> None:
    values = [{"i": i} for i in range(50)]
    raw = b"".join(json.dumps(v).encode() + b"\n" for v in values)
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(raw))
    fmt = format_for(str(gz))
    assert fmt.name == "jsonl"
    ix = fmt.index(str(gz), LOCAL)
    assert list(ix.offsets) == [0] and list(ix.records) == [50]
    assert list(ix.lengths) == [gz.stat().st_size]
    assert read_all(fmt, gz) == values  # type: ignore[arg-type]
    import cramjam

    zst = tmp_path / "a.txt.zst"
    zst.write_bytes(bytes(cramjam.zstd.compress(b"x\ny\n")))
    assert read_all(TEXT, zst) == ["x", "y"]


def test_a_gz_file_that_is_not_gzip_is_refused_at_indexing(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(b'{"plain": "json"}\n')
    with pytest.raises(FormatError, match=r"a\.jsonl\.gz: cannot decompress it as gzip"):
        JSONL.index(str(path), LOCAL)

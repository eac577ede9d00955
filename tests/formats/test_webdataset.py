"""WebDataset tar shards: samples from tar headers, chunks of whole samples, damage named."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import FileIndex, FormatError
from chunkmaster.formats.storage import LOCAL as STORAGE
from chunkmaster.formats.webdataset import WebDatasetFormat

Sample = dict[str, Any]


def make_samples(n: int, *, long_every: int = 0, size: int = 3000) -> list[Sample]:
    """Samples with 3 members each; every `long_every`th key is over tar's 100-byte name field."""
    out = []
    for i in range(n):
        stem = "k" * 150 if long_every and i % long_every == 0 else "s"
        key = f"shard/{stem}{i:06d}"
        out.append(
            {
                "__key__": key,
                "jpg": os.urandom((i * 131) % size),
                "cls": b"%d" % (i % 10),
                "seg.png": b"p" * (i % 7),
            }
        )
    return out


def write_tar(
    path: Path, samples: Sequence[Sample], *, fmt: int = tarfile.GNU_FORMAT, dirs: bool = False
) -> str:
    with tarfile.open(path, "w", format=fmt) as tar:
        if dirs:
            info = tarfile.TarInfo("shard")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for sample in samples:
            for ext, data in sample.items():
                if ext == "__key__":
                    continue
                info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def read_all(path: str, index: FileIndex, fmt: WebDatasetFormat) -> list[Sample]:
    loader = fmt.loader()
    out: list[Sample] = []
    for offset, count, length in zip(index.offsets, index.records, index.lengths, strict=True):
        loaded = loader.load(Chunk(path, offset, count, length), STORAGE)
        assert loaded.count == count
        out.extend(loaded.cut(0, count)[0])
    return out


@pytest.mark.parametrize(
    "tar_format", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT]
)
def test_round_trip_over_many_chunks(tmp_path: Path, tar_format: int) -> None:
    long_every = 0 if tar_format == tarfile.USTAR_FORMAT else 7  # ustar has no long names
    samples = make_samples(400, long_every=long_every)
    path = write_tar(tmp_path / "a.tar", samples, fmt=tar_format, dirs=True)
    fmt = WebDatasetFormat(max_bytes=64 << 10)
    index = fmt.index(path, STORAGE)
    assert len(index.offsets) > 10
    assert sum(index.records) == len(samples)
    assert max(index.lengths) <= 64 << 10
    assert read_all(path, index, fmt) == samples


def test_chunks_are_bounded_in_samples_too(tmp_path: Path) -> None:
    samples = make_samples(100, size=10)
    path = write_tar(tmp_path / "a.tar", samples)
    fmt = WebDatasetFormat(max_samples=30)
    index = fmt.index(path, STORAGE)
    assert list(index.records) == [30, 30, 30, 10]
    assert read_all(path, index, fmt) == samples


def test_empty_shards(tmp_path: Path) -> None:
    empty_tar = write_tar(tmp_path / "empty.tar", [])
    assert WebDatasetFormat().index(empty_tar, STORAGE).records == []
    (tmp_path / "zero.tar").write_bytes(b"")
    assert WebDatasetFormat().index(str(tmp_path / "zero.tar"), STORAGE) == FileIndex([], [], [], 0)


def test_one_sample_and_a_big_sample(tmp_path: Path) -> None:
    big = {"__key__": "big", "bin": os.urandom(6 << 20), "txt": b"caption"}
    for samples in ([{"__key__": "one", "txt": b""}], [*make_samples(3), big, *make_samples(2)]):
        path = write_tar(tmp_path / "a.tar", samples)
        fmt = WebDatasetFormat()
        index = fmt.index(path, STORAGE)
        assert read_all(path, index, fmt) == samples
    assert list(index.records) == [3, 1, 2]


def test_key_is_up_to_the_first_dot_of_the_basename(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        for name in ("d.x/a.b.c", "d.x/a.json", "d.x/b.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"z"))
    fmt = WebDatasetFormat()
    index = fmt.index(str(path), STORAGE)
    assert read_all(str(path), index, fmt) == [
        {"__key__": "d.x/a", "b.c": b"z", "json": b"z"},
        {"__key__": "d.x/b", "txt": b"z"},
    ]


# ---- damaged input -----------------------------------------------------------------------

SECRET = "do-not-quote-me"


def secret_tar(tmp_path: Path, pad: int = 0) -> tuple[str, bytes, list[tarfile.TarInfo]]:
    samples = [
        {"__key__": f"{SECRET}{i:04d}", "txt": SECRET.encode() * (i % 40) + bytes(pad)}
        for i in range(300)
    ]
    path = write_tar(tmp_path / "d.tar", samples)
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    return path, Path(path).read_bytes(), members


def refused(path: str, fmt: WebDatasetFormat | None = None) -> str:
    with pytest.raises(FormatError) as info:
        (fmt or WebDatasetFormat()).index(path, STORAGE)
    message = str(info.value)
    assert SECRET not in message
    assert message.startswith(f"{path}: ")
    return message


def test_truncated_tar_is_refused(tmp_path: Path) -> None:
    path, data, members = secret_tar(tmp_path)
    last = members[-1]
    cuts = {
        last.offset_data + 1: "member data runs",  # inside the last member's data
        last.offset + 100: "the file ends inside a tar header",
        last.offset_data + 512: "no end-of-archive block",  # at a member boundary
        last.offset_data + 512 + 100: "ends inside the end-of-archive block",
    }
    for cut, what in cuts.items():
        Path(path).write_bytes(data[:cut])
        assert what in refused(path), cut


def test_bad_header_checksum_is_refused(tmp_path: Path) -> None:
    path, data, members = secret_tar(tmp_path)
    bad = bytearray(data)
    at = members[100].offset
    bad[at + 120] ^= 0x01  # a byte of the header's mtime field
    Path(path).write_bytes(bytes(bad))
    assert f"bad tar header (checksum or fields) (at byte {at})" in refused(path)


@pytest.mark.parametrize("pad", [0, 40 << 10], ids=["small", "large"])
def test_damaged_header_in_a_chunk_fails_the_chunk(tmp_path: Path, pad: int) -> None:
    # Chunks of small samples are fetched whole; of large ones, read member by member.
    path, data, members = secret_tar(tmp_path, pad)
    fmt = WebDatasetFormat(max_bytes=1 << 40, max_samples=100)
    index = fmt.index(path, STORAGE)
    bad = bytearray(data)
    at = members[150].offset
    bad[at + 120] ^= 0x01
    Path(path).write_bytes(bytes(bad))
    chunk = Chunk(path, index.offsets[1], index.records[1], index.lengths[1])
    with pytest.raises(FormatError) as info:
        fmt.loader().load(chunk, STORAGE)
    message = str(info.value)
    assert message.startswith(f"{path}, chunk 0 at offset {index.offsets[1]}: bad tar header")
    assert f"(at byte {at})" in message
    assert SECRET not in message
    Path(path).write_bytes(data[: index.offsets[1] + 1000])
    truncated = "truncated since the dataset was set|the file ends inside"
    with pytest.raises(FormatError, match=truncated):
        fmt.loader().load(chunk, STORAGE)


def test_count_mismatch_fails_the_chunk(tmp_path: Path) -> None:
    path, _, _ = secret_tar(tmp_path)
    fmt = WebDatasetFormat()
    index = fmt.index(path, STORAGE)
    chunk = Chunk(path, index.offsets[0], index.records[0] + 1, index.lengths[0])
    with pytest.raises(FormatError, match="300 samples where the dataset's index has 301"):
        fmt.loader().load(chunk, STORAGE)


@pytest.mark.parametrize(
    "content",
    [b'{"a": 1}\n' * 100, b"\x1f\x8b\x08" + bytes(2000), b"short"],
    ids=["jsonl", "gzip", "short"],
)
def test_content_that_is_not_tar_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.tar"
    path.write_bytes(content)
    assert "not a tar file" in refused(str(path))


def test_concatenated_tars_are_refused(tmp_path: Path) -> None:
    one = Path(write_tar(tmp_path / "a.tar", make_samples(3))).read_bytes()
    (tmp_path / "b.tar").write_bytes(one + one)
    assert "data after the end-of-archive block" in refused(str(tmp_path / "b.tar"))


def add(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    if kind == tarfile.SYMTYPE:
        info.linkname = "elsewhere.txt"
    info.size = 1 if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(b"z") if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize(
    ("names", "what"),
    [
        ([("a.txt", tarfile.REGTYPE), ("README", tarfile.REGTYPE)], "without an extension"),
        ([("a.txt", tarfile.REGTYPE), ("dir/a.", tarfile.REGTYPE)], "without an extension"),
        ([("a.txt", tarfile.REGTYPE), ("a.txt", tarfile.REGTYPE)], "same key and extension"),
        ([("a.txt", tarfile.REGTYPE), ("a.lnk", tarfile.SYMTYPE)], "not a regular file"),
        ([("a.fifo", tarfile.FIFOTYPE)], "not a regular file"),
    ],
)
def test_members_that_fit_no_sample_are_refused(
    tmp_path: Path, names: list[tuple[str, bytes]], what: str
) -> None:
    path = tmp_path / "m.tar"
    with tarfile.open(path, "w") as tar:
        for name, kind in names:
            add(tar, name, kind)
    assert what in refused(str(path))


def test_pax_global_header_is_refused_unless_only_a_comment(tmp_path: Path) -> None:
    for headers, ok in (({"comment": "made by a test"}, True), ({"path": "x"}, False)):
        path = tmp_path / "g.tar"
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers=headers) as tar:
            add(tar, "a.txt")
        if ok:
            assert WebDatasetFormat().index(str(path), STORAGE).records == [1]
        else:
            assert "pax global header" in refused(str(path))


# ---- the dataset: format by name, digests ------------------------------------------------


def test_master_indexes_shards_by_name_and_refuses_a_mismatch(tmp_path: Path) -> None:
    from chunkmaster.core.errors import DatasetError
    from chunkmaster.master.indexing import load_dataset

    for i in range(3):
        write_tar(tmp_path / f"shard-{i}.tar", make_samples(50))
    dataset = load_dataset([str(tmp_path / "*.tar")], 1)
    assert dataset.format == "webdataset"
    assert sum(dataset.chunk_records) == 150
    (tmp_path / "shard-3.tar").write_bytes(b"PAR1" + bytes(600))
    with pytest.raises(DatasetError) as info:
        load_dataset([str(tmp_path / "*.tar")], 1)
    assert f"{tmp_path / 'shard-3.tar'}: not a tar file" in str(info.value)


def test_sample_digest_is_that_of_its_canonical_json(tmp_path: Path) -> None:
    import hashlib

    from chunkmaster.digest import Digest, canonical, record_digest

    sample = {"__key__": "s/000001", "jpg": b"\xff\xd8", "cls": b"7"}
    assert canonical(sample) == (
        b'{"__key__":"s/000001","cls":{"$b64":"Nw=="},"jpg":{"$b64":"/9g="}}'
    )
    expected = int.from_bytes(hashlib.sha256(canonical(sample)).digest()[:8], "big")
    assert record_digest(sample) == expected

    samples = make_samples(300)
    path = write_tar(tmp_path / "a.tar", samples)
    fmt = WebDatasetFormat(max_bytes=32 << 10)
    written, loaded = Digest(), Digest()
    for s in samples:
        written.add(s)
    for s in read_all(path, fmt.index(path, STORAGE), fmt):
        loaded.add(s)
    assert loaded == written


def test_torch_dataset_yields_the_samples(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from helpers.inproc import InProcessMaster

    from chunkmaster.digest import Digest
    from chunkmaster.torch import Loader

    samples = make_samples(120)
    for i in range(2):
        write_tar(tmp_path / f"shard-{i}.tar", samples[i * 60 : (i + 1) * 60])
    expected = Digest()
    for s in samples:
        expected.add(s)
    with InProcessMaster(chunks_per_task=1) as m:
        got = Digest()
        with Loader(m.addr, dataset=str(tmp_path / "shard-*.tar"), batch_size=None) as loader:
            for s in loader:
                assert set(s) == {"__key__", "jpg", "cls", "seg.png"}
                got.add(s)
        assert got == expected


@pytest.mark.parametrize(
    "tar_format", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT]
)
def test_header_walk_agrees_with_tarfile(tmp_path: Path, tar_format: int) -> None:
    from chunkmaster.formats.tarheaders import entries

    names = [
        "top.txt",
        "d/",
        "d/e/" + "n" * 90 + ".bin",
        "d/" + "x" * 120 + ".json",
        "d/caf\u00e9-\u00fc.txt",
        "d/" + "p" * 140 + "/q.cls",
    ]
    if tar_format == tarfile.USTAR_FORMAT:  # no long names, ASCII only: a 155-byte prefix
        names = [n for n in names if len(n.rsplit("/", 1)[-1]) <= 100 and n.isascii()]
    path = tmp_path / "h.tar"
    with tarfile.open(path, "w", format=tar_format) as tar:
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = i * 300
                tar.addfile(info, io.BytesIO(bytes(info.size)))
    with tarfile.open(path) as tar:
        expected = [(m.offset, m.offset_data, m.size, m.name, m.isdir()) for m in tar]

    def error(what: str, at: int) -> FormatError:
        return FormatError(what, path=str(path))

    with open(path, "rb") as f:
        size = path.stat().st_size
        got = [
            (e.start, e.data, e.size, e.name.rstrip("/"), e.is_dir)
            for e in entries(f, 0, size, True, error)
        ]
    assert got == expected

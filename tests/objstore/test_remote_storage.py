"""FsspecStorage against a real S3 server (moto, over HTTP): listing, sizes, ranged reads,
coalescing, errors that name the URL and never the secret."""

from __future__ import annotations

import pytest
from helpers.s3_server import SECRET_KEY, S3Server

from chunkmaster.remote import FsspecStorage, coalesce, scrub


def test_coalesce_folds_neighbours_within_the_gap_and_limit() -> None:
    ranges = [(0, 10), (12, 10), (100, 5), (105, 5), (1000, 50)]
    assert coalesce(ranges, gap=2, limit=1000) == [
        (0, 22, [0, 1]),
        (100, 110, [2, 3]),
        (1000, 1050, [4]),
    ]
    assert coalesce(ranges, gap=0, limit=1000) == [
        (0, 10, [0]),
        (12, 22, [1]),
        (100, 110, [2, 3]),
        (1000, 1050, [4]),
    ]
    # the limit splits a run; an out-of-order request keeps its index
    assert coalesce([(20, 10), (0, 10), (10, 10)], gap=0, limit=20) == [
        (0, 20, [1, 2]),
        (20, 30, [0]),
    ]


def test_scrub_removes_every_option_value() -> None:
    options = {"key": "AKIA-something", "client_kwargs": {"token": "tok-123456"}, "anon": False}
    text = "bad AKIA-something and tok-123456, anon False"
    assert scrub(text, options) == "bad *** and ***, anon False"


def _put(s3: S3Server, name: str, data: bytes) -> str:
    s3.fs().pipe(f"data/{name}", data)
    return f"s3://data/{name}"


def test_expand_lists_objects_with_their_sizes(s3: S3Server) -> None:
    for i in range(5):
        _put(s3, f"train/part-{i}.rio", bytes(10 + i))
    _put(s3, "other/x.rio", b"x")
    storage = FsspecStorage(s3.storage_options())
    urls = storage.expand("s3://data/train/part-*.rio")
    assert urls == [f"s3://data/train/part-{i}.rio" for i in range(5)]
    assert [storage.size(u) for u in urls] == [10, 11, 12, 13, 14]
    assert storage.expand("s3://data/train/part-3.rio") == ["s3://data/train/part-3.rio"]
    assert storage.expand("s3://data/nothing-*.rio") == []


def test_read_ranges_returns_each_range_coalesced_or_not(s3: S3Server) -> None:
    blob = bytes(range(256)) * 400  # 102400 bytes
    url = _put(s3, "blob", blob)
    ranges = [(0, 100), (100, 50), (5000, 10), (60000, 40000), (102300, 500), (200000, 5)]
    for gap in (0, 64 * 1024):
        storage = FsspecStorage(s3.storage_options(), gap=gap, concurrency=3)
        got = storage.read_ranges(url, ranges)
        assert got == [blob[o : o + n] for o, n in ranges]  # past the end: short, then empty
    with storage.open(url) as f:
        f.seek(60000)
        assert f.read(10) == blob[60000:60010]
    assert storage.size(url) == len(blob)


def test_errors_name_the_url_and_never_the_secret(s3: S3Server) -> None:
    storage = FsspecStorage(s3.storage_options())
    with pytest.raises(FileNotFoundError, match="s3://data/missing"):
        storage.read_ranges("s3://data/missing", [(0, 10)])
    with pytest.raises(OSError, match="s3://no-such-bucket/x") as info:
        storage.size("s3://no-such-bucket/x")
    assert SECRET_KEY not in str(info.value)
    wrong = FsspecStorage(s3.storage_options(secret="wrong-" + SECRET_KEY))
    _put(s3, "x", b"abc")
    try:
        wrong.read_ranges("s3://data/x", [(0, 3)])
    except OSError as exc:  # moto may accept any secret; if it refuses, the text is clean
        assert SECRET_KEY not in str(exc) and "s3://data/x" in str(exc)

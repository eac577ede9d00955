"""A `chunkmaster master` process setting its dataset from s3:// URLs on a real S3 server
(moto over HTTP): the credentials come from its storage options only, and never show in its
log, its errors, its status or its store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.datasets import write_records
from helpers.master_process import MasterProcess
from helpers.s3_server import ACCESS_KEY, SECRET_KEY, S3Server
from helpers.status_view import status_view

from chunkmaster.client import Client
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import DatasetError, DatasetMismatchError, PermissionDeniedError


def upload_dataset(s3: S3Server, tmp: Path, files: int, records: int, prefix: str) -> list[str]:
    """`files` RecordIO objects of `records` records each, several chunks per file."""
    urls = []
    for i in range(files):
        local = write_records(
            tmp / f"part-{i}.rio",
            [f"{prefix}{i}-{j}".encode() * (j % 7 + 1) for j in range(records)],
            max_chunk_size=200,
        )
        key = f"data/{prefix}/part-{i:03d}.rio"
        s3.fs().put_file(str(local), key)
        urls.append(f"s3://{key}")
    return urls


def master_with_options(tmp: Path, s3: S3Server, *extra: str) -> MasterProcess:
    """A master reading s3://data/ with its credentials in a storage options file."""
    creds = tmp / "s3.json"
    creds.write_text(json.dumps({"key": ACCESS_KEY, "secret": SECRET_KEY}))
    return MasterProcess(
        [
            "--store",
            str(tmp / "state.db"),
            "--data-root",
            "s3://data/train/",
            "--data-root",
            "s3://missing-bucket/",
            "--storage-options-file",
            str(creds),
            "--storage-option",
            f"endpoint_url={s3.endpoint}",
            "--storage-option",
            "client_kwargs.region_name=eu-west-1",
            "--log-level",
            "debug",
            *extra,
        ]
    ).start()


def test_set_dataset_from_s3_urls_and_the_secret_never_shows(s3: S3Server, tmp_path: Path) -> None:
    upload_dataset(s3, tmp_path, files=4, records=50, prefix="train")
    m = master_with_options(tmp_path, s3)
    try:
        with Client(m.addr) as c:
            with pytest.raises(PermissionDeniedError, match="outside the master's URL data"):
                c.set_dataset(["s3://data/other/*.rio"])
            with pytest.raises(DatasetError, match=r"s3://data/train/nothing-\*\.rio"):
                c.set_dataset(["s3://data/train/nothing-*.rio"])
            c.set_dataset(["s3://data/train/part-*.rio"])
        with MasterConnection(m.addr) as conn:
            status = conn.status()
        assert status["ready"] is True
        assert "storage options for URL datasets: client_kwargs, endpoint_url, key, secret" in (
            m.log()
        )
    finally:
        m.terminate()
    assert SECRET_KEY not in m.log()
    assert SECRET_KEY not in json.dumps(status)
    for f in tmp_path.glob("state.db*"):
        assert SECRET_KEY.encode() not in f.read_bytes()


def test_a_missing_bucket_is_a_clear_error_naming_the_url(s3: S3Server, tmp_path: Path) -> None:
    m = master_with_options(tmp_path, s3)
    try:
        with Client(m.addr) as c, pytest.raises(DatasetError) as err:
            c.set_dataset(["s3://missing-bucket/part-*.rio"])
        assert "s3://missing-bucket/part-*.rio: the bucket 'missing-bucket' does not exist" in (
            str(err.value)
        )
        with Client(m.addr) as c, pytest.raises(DatasetError) as err:
            c.set_dataset(["s3://missing-bucket/part-0.rio"])
        assert "s3://missing-bucket/part-0.rio" in str(err.value)
    finally:
        m.terminate()
    assert SECRET_KEY not in m.log()


def test_wrong_credentials_fail_set_dataset_naming_the_url(tmp_path: Path) -> None:
    locked = S3Server(auth=True)  # refuses every request: no credentials are right
    try:
        m = master_with_options(tmp_path, locked)
        try:
            with Client(m.addr) as c, pytest.raises(DatasetError) as err:
                c.set_dataset(["s3://data/train/part-*.rio"], timeout=60)
            text = str(err.value)
            assert "s3://data/train/part-*.rio" in text
            assert SECRET_KEY not in text
        finally:
            m.terminate()
        assert SECRET_KEY not in m.log()
    finally:
        locked.stop()


def test_no_spelling_of_a_url_leaves_the_data_root(s3: S3Server, tmp_path: Path) -> None:
    """Under --data-root s3://data/train/, objects whose keys lie outside train/ stay unread,
    however the URL is spelled: S3 keys are literal, so `x/../train/s.rio` and `/train/s.rio`
    (`data//train`) are objects outside the prefix, and percent-encoded dots mean `..` to any
    reader that decodes them."""
    upload_dataset(s3, tmp_path, files=1, records=20, prefix="train")
    secret = write_records(tmp_path / "secret.rio", [b"secret"] * 5)
    for key in ("x/../train/s.rio", "/train/s.rio", "train/%2e%2e/s.rio", "secret.rio"):
        s3.fs().put_file(str(secret), f"data/{key}")
    m = master_with_options(tmp_path, s3)
    try:
        for url in (
            "s3://data/x/../train/s.rio",
            "S3://data/x/../train/s.rio",
            "s3://data//train/s.rio",
            "s3://data/train/%2e%2e/s.rio",
            "s3://data/train/%2E%2E/secret.rio",
            "s3://data/train/.%2e/secret.rio",
            "s3://data/train/..%2fsecret.rio",
            "s3://data/train/./../secret.rio",
            "s3://data/train\\..\\secret.rio",
        ):
            with Client(m.addr) as c, pytest.raises(PermissionDeniedError) as err:
                c.set_dataset([url])
            assert repr(url) in str(err.value), url
        with MasterConnection(m.addr) as conn:
            assert status_view(conn.status()).ready is False
        with Client(m.addr) as c:
            c.set_dataset(["S3://data/train/part-*.rio"])  # a scheme's case is no spelling
        with MasterConnection(m.addr) as conn:
            assert status_view(conn.status()).dataset.records == 20
    finally:
        m.terminate()


def test_a_trainer_naming_the_url_datasets_objects_one_by_one_is_served(
    s3: S3Server, tmp_path: Path
) -> None:
    """A URL dataset set once; a trainer naming its objects one by one names the same
    dataset, and one naming fewer is refused as another (the objects its patterns list are
    held to the data roots, as any dataset's, not refused as URLs of a master with none)."""
    urls = upload_dataset(s3, tmp_path, files=2, records=20, prefix="train")
    m = master_with_options(tmp_path, s3)
    try:
        with Client(m.addr) as c:
            c.set_dataset(["s3://data/train/part-*.rio"])
        with Client(m.addr) as c:
            c.set_dataset(list(reversed(urls)))
        with Client(m.addr) as c, pytest.raises(DatasetMismatchError) as err:
            c.set_dataset(urls[:1])
        assert "1 file(s), 1 of them in the master's" in str(err.value)
    finally:
        m.terminate()

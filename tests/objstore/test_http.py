"""Datasets over plain HTTP(S): a master process under `--data-root http://HOST:PORT/data/`
indexes files a local HTTP server serves, `chunkmaster read` trainers read them with ranged
requests; no spelling of a URL reaches outside the root, HTTP patterns name files (HTTP has no
listing), and a server that ignores byte ranges is an error, never wrong bytes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.datasets import numbered_records, write_records
from helpers.http_server import HttpServer
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import DatasetError, PermissionDeniedError
from chunkmaster.remote import FsspecStorage

RECORDS = 60


@pytest.fixture
def site(tmp_path: Path) -> Iterator[HttpServer]:
    """data/a.rio, data/b.rio (several chunks each) and, outside data/, secret.rio."""
    (tmp_path / "www" / "data").mkdir(parents=True)
    for name in ("a", "b"):
        records = [b"%s-%04d" % (name.encode(), i) for i in range(RECORDS // 2)]
        write_records(tmp_path / "www" / "data" / f"{name}.rio", records, max_chunk_size=100)
    numbered_records(tmp_path / "www" / "secret.rio", 5)
    with HttpServer(tmp_path / "www") as server:
        yield server


def rooted_master(site: HttpServer) -> MasterProcess:
    return MasterProcess(["--store", ":memory:", "--data-root", f"{site.url}/data/"]).start()


def test_an_http_dataset_is_indexed_and_read_by_trainers(site: HttpServer) -> None:
    m = rooted_master(site)
    try:
        files = [f"{site.url}/data/a.rio", f"{site.url}/data/b.rio"]
        cmd = [sys.executable, "-m", "chunkmaster", "read", "--addr", str(m.addr), "--passes", "2"]
        done = subprocess.run(
            [*cmd, "--dataset", *files], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert f"pass 0: {RECORDS} records" in done.stdout
        assert f"pass 1: {RECORDS} records" in done.stdout
        with MasterConnection(str(m.addr)) as conn:
            status = conn.status()
        assert status["dataset"]["files"] == 2
        assert f"{site.url}/data/a.rio" in status["dataset"]["globs"]
    finally:
        m.kill()


def test_no_spelling_of_an_http_url_leaves_the_root(site: HttpServer) -> None:
    m = rooted_master(site)
    try:
        with MasterConnection(str(m.addr)) as conn:
            for url in (
                f"{site.url}/data/%2e%2e/secret.rio",  # aiohttp decodes and folds it: /secret.rio
                f"{site.url}/data/%2E%2E/secret.rio",
                f"{site.url}/data/.%2e/secret.rio",
                f"{site.url}/data/%252e%252e/secret.rio",
                f"{site.url}/data/../secret.rio",
                f"{site.url}/data/..%2fsecret.rio",
                f"{site.url}/data\\..\\secret.rio",
                f"{site.url}//data/../secret.rio",
                f"{site.url}@127.0.0.2/data/a.rio",
                f"{site.url.upper()}/data/../secret.rio",
            ):
                with pytest.raises(PermissionDeniedError) as err:
                    conn.set_dataset([url])
                assert repr(url) in str(err.value), url
            with pytest.raises(DatasetError, match="HTTP has no listing"):
                conn.set_dataset([f"{site.url}/data/*.rio"])
            assert status_view(conn.status()).ready is False
    finally:
        m.kill()
    assert not [r for r in site.requests if "secret" in r]


def test_a_server_that_ignores_byte_ranges_is_an_error(tmp_path: Path) -> None:
    path = write_records(tmp_path / "d.rio", [b"%04d" % i for i in range(200)], max_chunk_size=100)
    size = Path(path).stat().st_size
    with HttpServer(tmp_path, ranges=False) as server:
        url = f"{server.url}/d.rio"
        with pytest.raises(OSError, match="byte range") as err:
            FsspecStorage().read_ranges(url, [(100, 40), (size - 10, 10)])
        assert url in str(err.value)

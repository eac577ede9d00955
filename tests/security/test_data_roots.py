"""--data-root: datasets outside every root, or with a URL scheme no root names, are refused
with PERMISSION_DENIED naming the pattern, and the master's state is unchanged."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RECORDS
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import PermissionDeniedError
from chunkmaster.master.patterns import expand_globs
from chunkmaster.master.roots import DataRoots


def check_data_roots(globs: list[str], roots: list[str]) -> None:
    """What a master with `roots` does before it opens anything: check the patterns, list the
    local ones and check every file they match (URL patterns are only checked: no server)."""
    allowed = DataRoots(roots)
    allowed.check_all(globs)
    local = [g for g in globs if "://" not in g]
    if local:
        expand_globs(local, roots=allowed)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ holding a.rio and a symlink out; outside/ holding secret.rio."""
    (tmp_path / "root" / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    numbered_records(tmp_path / "root" / "a.rio", 5)
    numbered_records(tmp_path / "root" / "sub" / "b.rio", 5)
    numbered_records(tmp_path / "outside" / "secret.rio", 5)
    os.symlink(tmp_path / "outside" / "secret.rio", tmp_path / "root" / "link.rio")
    os.symlink(tmp_path / "outside", tmp_path / "root" / "door")
    return tmp_path


def _refused(globs: list[str], roots: list[str]) -> str:
    with pytest.raises(PermissionDeniedError) as info:
        check_data_roots(globs, roots)
    return str(info.value)


def test_files_inside_a_root_are_accepted(tree: Path) -> None:
    root = str(tree / "root")
    check_data_roots([f"{root}/a.rio", f"{root}/sub/*.rio", f"{root}/sub/../a.rio"], [root])
    check_data_roots([f"{root}/a.rio"], [root + "/"])


def test_dotdot_symlinks_and_relative_paths_cannot_escape(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tree / "root")
    for pattern in (
        f"{root}/../outside/secret.rio",
        f"{root}/sub/../../outside/*.rio",
        f"{root}/*/../../outside/secret.rio",
        f"{root}/link.rio",  # a symlink to a file outside
        f"{root}/door/secret.rio",  # through a symlinked directory
        f"{root}/*.rio",  # matches link.rio among others
        f"{root}/door/does-not-exist-*.rio",
        f"{root}2/a.rio",  # a sibling whose name starts like the root
        "/etc/passwd",
    ):
        assert repr(pattern) in _refused([pattern], [root]), pattern
    monkeypatch.chdir(tree / "root")
    check_data_roots(["a.rio", "sub/b.rio"], [root])
    assert "'../outside/secret.rio'" in _refused(["../outside/secret.rio"], [root])


def test_url_schemes_only_those_of_the_roots(tree: Path) -> None:
    root = str(tree / "root")
    for url in ("ftp://evil.example:21/x.rio", "http://10.0.0.1/x", "s3://bucket/data/x.rio"):
        message = _refused([url], [])
        assert repr(url) in message and "--data-root" in message
        _refused([url], [root])
    roots = ["s3://bucket/data/"]
    check_data_roots(["s3://bucket/data/train-*.rio", "S3://bucket/data/x/y.rio"], roots)
    for url in (
        "s3://bucket/data/../private/x.rio",
        "s3://bucket/database/x.rio",
        "s3://other/data/x.rio",
        "gs://bucket/data/x.rio",
        "ftp://bucket/data/x.rio",
        "s3://bucket/data/x.rio::ftp://evil/x",
        "simplecache::s3://bucket/data/x.rio",
    ):
        _refused([url], roots)
    assert "data roots are all URLs" in _refused([f"{root}/a.rio"], roots)


@pytest.fixture
def rooted_master(tree: Path) -> Iterator[InProcessMaster]:
    with InProcessMaster(chunks_per_task=2, data_roots=[str(tree / "root")]) as m:
        yield m


def test_a_master_refuses_outside_its_roots_and_keeps_its_state(
    rooted_master: InProcessMaster, tree: Path
) -> None:
    with MasterConnection(rooted_master.addr) as conn:
        with pytest.raises(PermissionDeniedError) as info:
            conn.set_dataset([str(tree / "root" / "a.rio"), str(tree / "root" / "link.rio")])
        assert "link.rio" in str(info.value)
        assert status_view(rooted_master.status()).ready is False
        conn.set_dataset([str(tree / "root" / "sub" / "*.rio")])
    assert status_view(rooted_master.status()).dataset.records == 5


def test_an_ftp_dataset_makes_no_connection(tmp_path: Path) -> None:
    with socket.socket() as listener, InProcessMaster() as master:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)  # bounds only the final check that nobody came
        port = listener.getsockname()[1]
        with MasterConnection(master.addr) as conn, pytest.raises(PermissionDeniedError):
            conn.set_dataset([f"ftp://user:pw@127.0.0.1:{port}/x.rio"])
        with pytest.raises(TimeoutError):
            listener.accept()
        assert status_view(master.status()).ready is False


def test_without_roots_local_paths_work_as_before(tmp_path: Path) -> None:
    path = numbered_records(tmp_path / "d.rio", RECORDS)
    with InProcessMaster() as master, MasterConnection(master.addr) as conn:
        conn.set_dataset([path])
        assert status_view(master.status()).dataset.records == RECORDS


def test_the_master_command_takes_repeated_data_roots(tree: Path) -> None:
    m = MasterProcess(
        ["--store", ":memory:", "--data-root", str(tree / "root"), "--data-root", "s3://b/d/"]
    )
    try:
        m.start()
        assert f"datasets must lie under: {tree / 'root'}, s3://b/d/" in m.log()
        read = [sys.executable, "-m", "chunkmaster", "read", "--addr", str(m.addr), "--passes", "1"]
        outside = str(tree / "outside" / "*.rio")
        done = subprocess.run([*read, "--dataset", outside], capture_output=True, text=True)
        assert done.returncode == 1
        assert f"PermissionDeniedError: permission denied: dataset pattern {outside!r}" in (
            done.stderr
        )
        inside = str(tree / "root" / "sub" / "*.rio")
        done = subprocess.run([*read, "--dataset", inside], capture_output=True, text=True)
        assert done.returncode == 0 and "pass 0: 5 records" in done.stdout, done.stderr
    finally:
        m.kill()


# --- every spelling, every way in: real master processes -----------------------------------------


def read_cmd(addr: str | None, dataset: str) -> subprocess.CompletedProcess[str]:
    """One pass of `chunkmaster read` over `dataset`."""
    cmd = [sys.executable, "-m", "chunkmaster", "read", "--addr", str(addr), "--passes", "1"]
    return subprocess.run([*cmd, "--dataset", dataset], capture_output=True, text=True, timeout=120)


def denied(done: subprocess.CompletedProcess[str], pattern: str) -> bool:
    return done.returncode == 1 and (
        f"PermissionDeniedError: permission denied: dataset pattern {pattern!r}" in done.stderr
    )


@pytest.mark.parametrize("spelling", ["file://{root}/", "{root}"])
def test_file_urls_are_local_paths_held_to_the_roots(tree: Path, spelling: str) -> None:
    root = str(tree / "root")
    m = MasterProcess(["--store", ":memory:", "--data-root", spelling.format(root=root)]).start()
    try:
        for pattern in (
            f"file://{root}/link.rio",  # a symlink inside the root to a file outside
            f"FILE://{root}/link.rio",
            f"file://{root}/door/secret.rio",  # through a symlinked directory
            f"file://{root}/*.rio",  # matches link.rio among others
            f"file://{root}//sub/../../outside/secret.rio",
            f"file://localhost{root}/../outside/secret.rio",
        ):
            done = read_cmd(m.addr, pattern)
            assert denied(done, pattern), (pattern, done.stdout, done.stderr)
        done = read_cmd(m.addr, f"file://{root}/sub/*.rio")
        assert done.returncode == 0 and "pass 0: 5 records" in done.stdout, done.stderr
    finally:
        m.kill()


def save_checkpoint(tmp_path: Path, dataset: str, *args: str) -> Path:
    """A data checkpoint of a job on `dataset`, saved by a master with `args`."""
    m = MasterProcess(["--store", ":memory:", *args]).start()
    try:
        with MasterConnection(str(m.addr)) as conn:
            conn.set_dataset([dataset])
        ckpt = tmp_path / "job.ckpt"
        cmd = [sys.executable, "-m", "chunkmaster", "checkpoint", "save", "--addr", str(m.addr)]
        done = subprocess.run([*cmd, str(ckpt)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return ckpt
    finally:
        m.kill()


def refused_restore(ckpt: Path, *args: str) -> str:
    """Start a master with --restore `ckpt`; it must exit without serving. Its log."""
    m = MasterProcess(["--store", ":memory:", "--restore", str(ckpt), *args]).start(wait=False)
    try:
        assert not m.wait_serving(120), f"the master restored {ckpt}:\n{m.log()}"
        return m.log()
    finally:
        m.kill()


def test_a_restored_checkpoint_is_held_to_the_data_roots(tree: Path, tmp_path: Path) -> None:
    secret = str(tree / "outside" / "secret.rio")
    ckpt = save_checkpoint(tmp_path, secret)  # a master without roots may read it
    log = refused_restore(ckpt, "--data-root", str(tree / "root"))
    assert f"permission denied: dataset pattern {secret!r}" in log
    assert "Traceback" not in log


def test_a_restored_checkpoint_of_urls_makes_no_connection(tmp_path: Path) -> None:
    """A master without roots reads no URL, whether a trainer or a checkpoint names it."""
    from chunkmaster.core.checkpoint import DataCheckpoint, encode, fingerprint
    from chunkmaster.core.dataset import Dataset

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/x.rio"
        ds = Dataset.build([url], [url], [([0], [5])], 1)
        ckpt = tmp_path / "urls.ckpt"
        ckpt.write_bytes(encode(DataCheckpoint("default", 0.0, fingerprint(ds), 1, 0, ())))
        log = refused_restore(ckpt)
        assert f"permission denied: dataset pattern {url!r} is a URL" in log
        listener.setblocking(False)  # the master has exited: a connection would be queued
        with pytest.raises(BlockingIOError):
            listener.accept()

"""Trainers (`chunkmaster read` processes) reading an s3:// dataset from a real S3 server
(moto over HTTP), a master process dispatching it: passes, a trainer killed mid-pass, a
corrupted object. The trainers find their credentials in the standard AWS_* variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.formats import MAKERS, SMALL_CHUNKS, digest_of
from helpers.master_process import MasterProcess
from helpers.s3_server import SECRET_KEY, S3Server
from helpers.trainers import completed_tasks, covered, wait_until_holding
from test_master_s3 import master_with_options, upload_dataset

from chunkmaster.client.connection import MasterConnection
from chunkmaster.digest import Digest


@pytest.fixture(params=sorted(MAKERS))
def dataset_format(request: pytest.FixtureRequest) -> str:
    """Each format of helpers.formats.MAKERS in turn."""
    return str(request.param)


def upload_format(s3: S3Server, tmp: Path, fmt: str, files: int, n: int) -> tuple[str, Any]:
    """A dataset of format `fmt` in s3://data/train/FMT/; its URL pattern and its records."""
    local = tmp / fmt
    local.mkdir()
    pattern, records = MAKERS[fmt](local, files, n)
    for f in sorted(local.iterdir()):
        s3.fs().put_file(str(f), f"data/train/{fmt}/{f.name}")
    return f"s3://data/train/{fmt}/{Path(pattern).name}", records


def test_three_trainers_two_passes_one_killed_mid_pass(
    dataset_format: str,
    s3: S3Server,
    tmp_path: Path,
    trainers: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "CHUNKMASTER_CHUNK_SIZE", SMALL_CHUNKS[dataset_format]
    )  # several chunks a file
    pattern, records = upload_format(s3, tmp_path, dataset_format, files=3, n=90)
    expected = digest_of(records)
    # The victim's tasks come back when its session lapses (5 s); the survivors' never time
    # out, however slow the S3 server is (a task read twice would count its records twice).
    # A survivor's session lapses only if none of its keep-alives is heard for
    # the whole lease: 2 s was seen to lapse on a machine loaded 4 processes a core.
    m = master_with_options(
        tmp_path, s3, "--chunk-per-task", "1", "--task-timeout-dur", "5m", "--trainer-ttl", "5s"
    )
    for name, value in s3.env().items():  # the trainers' credentials: their environment
        monkeypatch.setenv(name, value)
    try:
        with MasterConnection(m.addr, timeout=60) as c:
            c.set_dataset([pattern])
            st = c.status()
        assert st["num_tasks"] >= 6, st  # several chunks a file: the kill lands mid-pass
        args = ["--addr", m.addr, "--passes", "2"]
        (victim,) = trainers(1, [*args, "--step-time", "0.02"], prefix="victim")
        line = victim.next_line()
        assert line is not None and "task" in line  # it finished a task, reads the next
        wait_until_holding(m.addr, victim.proc.pid, 2)
        victim.kill()
        survivors = trainers(2, [*args, "--step-time", "0.001"])
        for t in survivors:
            assert t.drain() == 0, t.log()
        # The killed pass: every task completed by someone, each record at least once...
        tasks = completed_tasks([victim, *survivors], 0)
        assert len(tasks) == st["num_tasks"]
        assert covered(tasks, records) == expected
        # ...and the next exactly once.
        total = Digest()
        for t in survivors:
            total.merge(Digest(int(t.passes[1]["digest"], 16), int(t.passes[1]["records"])))
        assert total == expected
    finally:
        m.terminate()
    assert SECRET_KEY not in m.log()


def test_a_corrupted_object_fails_its_task_naming_the_url_and_chunk(
    s3: S3Server, tmp_path: Path, trainers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = upload_dataset(s3, tmp_path, files=2, records=60, prefix="train")
    bad = bytearray(Path(tmp_path / "part-1.rio").read_bytes())
    bad[-3] ^= 0xFF  # in the last chunk's payload: its CRC no longer matches
    s3.fs().pipe(urls[1].removeprefix("s3://"), bytes(bad))
    m = master_with_options(tmp_path, s3, "--chunk-per-task", "1", "--task-timeout-max", "0")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    try:
        (t,) = trainers(
            1, ["--addr", m.addr, "--dataset", "s3://data/train/part-*.rio", "--passes", "1"]
        )
        t.drain()
        with MasterConnection(m.addr) as conn:
            st = conn.status()
        reasons = [r["reason"] for f in st["failed_tasks"] for r in f["reasons"]]
        assert any(urls[1] in r and "chunk at offset" in r and "hecksum" in r for r in reasons), (
            reasons
        )
    finally:
        m.terminate()
    assert isinstance(m, MasterProcess)


def test_an_object_gone_after_set_dataset_fails_its_tasks_naming_it(
    s3: S3Server, tmp_path: Path, trainers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-ahead's fetch fails: the task it belongs to fails, naming the URL and chunk."""
    urls = upload_dataset(s3, tmp_path, files=2, records=60, prefix="train")
    m = master_with_options(tmp_path, s3, "--chunk-per-task", "1", "--task-timeout-max", "0")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    try:
        with MasterConnection(m.addr, timeout=60) as c:
            c.set_dataset(["s3://data/train/part-*.rio"])
        s3.fs().rm(urls[0].removeprefix("s3://"))
        (t,) = trainers(1, ["--addr", m.addr, "--passes", "1"])
        t.drain()
        with MasterConnection(m.addr) as conn:
            st = conn.status()
        reasons = [r["reason"] for f in st["failed_tasks"] for r in f["reasons"]]
        assert reasons and all(urls[0] in r and "chunk at offset" in r for r in reasons), reasons
        assert any("not found" in r for r in reasons), reasons
    finally:
        m.terminate()

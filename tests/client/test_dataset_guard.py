"""A trainer whose dataset is not the master's is refused, naming both (issue 18, item 5).

Before, `set_dataset` with other patterns on a master that had a dataset answered OK and the
trainer read the old dataset: two jobs started one after the other on the default store, the
second job's trainers read the first job's data. Real master processes on a default-like store
(`XDG_STATE_HOME`, no --store), real `chunkmaster read` processes and `Client`s.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.formats import digest_of, write_jsonl
from helpers.master_process import MasterProcess

from chunkmaster.client import Client
from chunkmaster.core.errors import DatasetMismatchError
from chunkmaster.master.service import Service
from chunkmaster.store.memory import InMemStore


def make_job_data(root: Path, name: str, n: int) -> tuple[Path, list[Any]]:
    """`root/name/` with two JSON Lines files of n records each; (the folder, the records)."""
    d = root / name
    d.mkdir()
    records: list[Any] = []
    for f in range(2):
        values = [{"job": name, "file": f, "i": i} for i in range(n)]
        write_jsonl(d / f"part-{f}.jsonl", values)
        records += values
    return d, records


def read(addr: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`chunkmaster read --json` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "chunkmaster", "read", "--addr", addr, "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )


@pytest.fixture
def default_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Masters started without --store use the default store under this state folder."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state / "chunkmaster" / "default.db"


def test_a_second_job_on_the_default_store_refuses_another_dataset_and_reads_nothing(
    tmp_path: Path, default_store: Path
) -> None:
    first, first_records = make_job_data(tmp_path, "first", 50)
    second, _ = make_job_data(tmp_path, "second", 70)
    first_glob, second_glob = str(first / "*.jsonl"), str(second / "*.jsonl")

    job1 = MasterProcess([], log_path=tmp_path / "job1.log").start()
    try:
        assert job1.addr is not None
        done = read(job1.addr, "--dataset", first_glob, "--passes", "1")
        assert done.returncode == 0, done.stderr
        assert '"records": 100' in done.stdout
        assert job1.terminate() == 0
    finally:
        job1.kill()
    # An empty store says so in its one line.
    (fresh,) = [line for line in job1.log().splitlines() if "job 'default'" in line]
    assert str(default_store) in fresh and "no dataset yet" in fresh and "a new job" in fresh

    job2 = MasterProcess([], log_path=tmp_path / "job2.log").start()
    try:
        assert job2.addr is not None
        # One line says what the store holds: job, store, dataset, pass, queues, sessions.
        (line,) = [ln for ln in job2.log().splitlines() if "recovered job 'default'" in ln]
        for part in (str(default_store), repr(first_glob), "2 jsonl files", "100 records"):
            assert part in line, (part, line)
        assert "pass 1: " in line and "todo" in line and "trainer session(s)" in line

        # The second job's trainer is refused, names both datasets, and reads nothing.
        done = read(job2.addr, "--dataset", second_glob, "--passes", "1")
        assert done.returncode != 0
        assert done.stdout == ""  # no pass line: not one record
        (error,) = [ln for ln in done.stderr.splitlines() if "DatasetMismatchError" in ln]
        assert first_glob in error and second_glob in error, error
        assert "differs from the master's" in error
        with Client(job2.addr) as c, pytest.raises(DatasetMismatchError) as refused:
            c.set_dataset([second_glob])
        assert first_glob in str(refused.value) and second_glob in str(refused.value)
        assert job2.wait_log("set_dataset refused: .*" + re.escape(second_glob)), job2.log()

        # The same dataset, spelled otherwise (relative, with ./ and .., repeated, the files
        # listed in another order), is the master's: accepted, and read whole.
        done = read(
            job2.addr,
            "--dataset",
            "./first/../first/*.jsonl",
            "first/*.jsonl",
            "--passes",
            "1",
            "--first-pass",
            "1",
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert f'"digest": "{digest_of(first_records).hex()}"' in done.stdout, done.stdout
        with Client(job2.addr) as c:
            c.set_dataset([str(first / "part-1.jsonl"), str(first / "part-0.jsonl")])
    finally:
        job2.kill()


def test_a_restored_checkpoints_dataset_is_the_masters(tmp_path: Path) -> None:
    first, _ = make_job_data(tmp_path, "first", 30)
    second, _ = make_job_data(tmp_path, "second", 30)
    job1 = MasterProcess(["--store", str(tmp_path / "one.db")]).start()
    try:
        assert job1.addr is not None
        with Client(job1.addr) as c:
            c.set_dataset([str(first / "*.jsonl")])
            blob = c.data_checkpoint()
    finally:
        job1.kill()
    ckpt = tmp_path / "job.ckpt"
    ckpt.write_bytes(blob)
    job2 = MasterProcess(["--store", str(tmp_path / "two.db"), "--restore", str(ckpt)]).start()
    try:
        assert job2.addr is not None
        with Client(job2.addr) as c:
            with pytest.raises(DatasetMismatchError, match="differs from the master's") as err:
                c.set_dataset([str(second / "*.jsonl")])
            assert str(first / "*.jsonl") in str(err.value)
            c.set_dataset([str(first / "*.jsonl")])
            assert len(list(c.records(0))) == 60
    finally:
        job2.kill()


def test_spellings_of_one_dataset_and_relative_patterns_named_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What "the same dataset" means, without a process: patterns compared once absolute,
    in any order and repetition; else the files they match (symlinks resolved)."""
    from chunkmaster.master.indexing import load_dataset
    from chunkmaster.master.patterns import dataset_mismatch, same_patterns

    first, _ = make_job_data(tmp_path, "first", 5)
    make_job_data(tmp_path, "second", 5)
    (tmp_path / "link").symlink_to(first)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING", logger="chunkmaster.datasets"):
        ds = load_dataset(["first/*.jsonl"], 10, None)
    # The master keeps the absolute form, and says how it read the relative one.
    assert ds.globs == (str(first / "*.jsonl"),)
    assert all(os.path.isabs(f) for f in ds.files)
    assert f"'first/*.jsonl' as '{first}/*.jsonl'" in caplog.text
    assert str(tmp_path) in caplog.text  # the working directory it was read in

    assert same_patterns(ds.globs, ["./first/*.jsonl", "first//*.jsonl", str(first / "*.jsonl")])
    assert not same_patterns(ds.globs, ["second/*.jsonl"])
    for same in (
        [str(first / "part-1.jsonl"), str(first / "part-0.jsonl")],  # its files, reordered
        ["link/*.jsonl"],  # through a symlink
        ["first/part-*.jsonl", "first/part-0.jsonl"],  # overlapping patterns
    ):
        assert dataset_mismatch(ds, same) is None, same
    why = dataset_mismatch(ds, ["second/*.jsonl"])
    assert why is not None
    assert f"['{tmp_path}/second/*.jsonl'] (2 file(s), 0 of them in the master's" in why
    assert f"'second/*.jsonl' as '{tmp_path}/second/*.jsonl'" in why
    assert "\n" not in why
    partial = dataset_mismatch(ds, ["first/part-0.jsonl"])
    assert partial is not None and "1 file(s), 1 of them in the master's" in partial
    nothing = dataset_mismatch(ds, ["nowhere/*.jsonl"])
    assert nothing is not None and "matches no dataset: nothing matches" in nothing


def test_a_trainer_racing_the_first_load_with_another_dataset_is_refused(
    tmp_path: Path,
) -> None:
    """Two trainers set two datasets at once: the first load wins, the other call is refused
    once it is done (before, it waited for the first load and answered OK)."""
    import asyncio

    first, _ = make_job_data(tmp_path, "first", 5)
    second, _ = make_job_data(tmp_path, "second", 5)

    async def main() -> None:
        svc = Service(InMemStore(), timeout_dur=60)
        await svc.start()
        try:
            one = asyncio.ensure_future(svc.set_dataset([str(first / "*.jsonl")]))
            two = asyncio.ensure_future(svc.set_dataset([str(second / "*.jsonl")]))
            results = await asyncio.gather(one, two, return_exceptions=True)
            assert results[0] is None
            assert isinstance(results[1], DatasetMismatchError), results
            ds = svc.ledger.state.dataset
            assert ds is not None and ds.globs == (str(first / "*.jsonl"),)
        finally:
            await svc.close()

    asyncio.run(main())

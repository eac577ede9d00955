"""Chunks per task when the user gives none: the master's choice (core/task_size.py), made once
when the dataset is indexed and journaled with it; `--chunk-per-task` honoured when given."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import pytest
from helpers.aio import run
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.service import started_service

from chunkmaster.cli.master_cmd import config_from, register
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.dataset import count_tasks
from chunkmaster.core.task_size import MAX_CHUNKS_PER_TASK, MIN_TASKS, chosen_chunks_per_task
from chunkmaster.master.job_dataset import SourceSpec
from chunkmaster.recordio import Writer


@pytest.mark.parametrize(
    ("chunks", "cpt"),
    [
        (0, 1),
        (1, 1),
        (10, 1),
        (63, 1),
        (64, 1),
        (65, 1),
        (126, 1),
        (127, 2),  # ceil(127 / 2) = 64
        (128, 2),
        (200, 3),
        (630, 9),
        (631, 10),  # ceil(631 / 10) = 64
        (639, 10),
        (640, 10),
        (641, 10),
        (10_000, 10),
    ],
)
def test_the_rule_takes_the_most_chunks_a_task_that_make_64_tasks(chunks: int, cpt: int) -> None:
    assert chosen_chunks_per_task(chunks) == cpt


def test_the_rule_is_the_largest_such_count_and_grows_with_the_chunks() -> None:
    last = 1
    for n in range(3000):
        c = chosen_chunks_per_task(n)
        assert 1 <= c <= MAX_CHUNKS_PER_TASK and c >= last
        if c > 1:
            assert count_tasks(n, c) >= MIN_TASKS
        if c < MAX_CHUNKS_PER_TASK:
            assert count_tasks(n, c + 1) < MIN_TASKS
        last = c


@pytest.mark.parametrize(
    ("flags", "env", "cpt"),
    [
        ([], {}, None),
        ([], {"CHUNKMASTER_CHUNK_PER_TASK": "4"}, 4),
        ([], {"CHUNK_PER_TASK": "10"}, 10),
        (["--chunk-per-task", "0"], {"CHUNK_PER_TASK": "10"}, 0),  # the flag wins; 0 means 1
    ],
)
def test_chunks_per_task_is_the_masters_choice_only_when_given_nowhere(
    flags: list[str], env: dict[str, str], cpt: int | None
) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    config, _ = config_from(parser.parse_args(["master", *flags]), env)
    assert config.settings().chunks_per_task == cpt


def _cpt(svc: Any) -> int:
    ds = svc.ledger.state.dataset
    assert ds is not None
    return int(ds.chunks_per_task)


def test_a_mixture_is_cut_for_its_smallest_source_and_added_sources_at_the_jobs(
    tmp_path: Path,
) -> None:
    """A mixture has one chunks per task: the rule's for its smallest source (200 chunks: 3
    a task, 67 tasks), so no source has fewer tasks than the rule gives it; a source added
    later is cut at the job's."""
    big = numbered_records(tmp_path / "big.rio", 1000)
    small = numbered_records(tmp_path / "small.rio", 200)
    added = numbered_records(tmp_path / "added.rio", 10)

    async def main() -> None:
        async with started_service() as svc:
            await svc.set_dataset([], [SourceSpec("big", (big,)), SourceSpec("small", (small,))])
            assert _cpt(svc) == 3
            assert svc.status_view().num_tasks == count_tasks(1000, 3) + count_tasks(200, 3)
            await svc.set_weights([], add=[SourceSpec("added", (added,))])
            assert _cpt(svc) == 3
            ds = svc.ledger.state.dataset
            assert ds is not None and len(ds.source_tasks(2)) == count_tasks(10, 3)

    run(main())


def test_a_given_chunks_per_task_is_honoured(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", 10)

    async def main() -> None:
        async with started_service(data=[data], chunks_per_task=10) as svc:
            assert _cpt(svc) == 10 and svc.status_view().num_tasks == 1
        async with started_service(data=[data]) as svc:
            assert _cpt(svc) == 1 and svc.status_view().num_tasks == 10

    run(main())


def _writer_default_files(folder: Path, files: int = 10) -> str:
    """`files` RecordIO files written with the writer's defaults (32 MiB chunks, snappy), each
    32 records of 64 KiB (2 MiB: one chunk a file)."""
    folder.mkdir()
    rng = random.Random(7)
    for i in range(files):
        with Writer(str(folder / f"part-{i:02d}.rio")) as w:
            for _ in range(32):
                w.write(rng.randbytes(64 << 10))
    return str(folder / "*.rio")


def _tasks(master: MasterProcess, data: str) -> tuple[int, int]:
    """The pass's tasks and the dataset's chunks per task, after a trainer's set_dataset."""
    with MasterConnection(master.addr) as c:
        c.set_dataset([data])
        st = c.status()
    return int(st["num_tasks"]), int(st["dataset"]["chunks_per_task"])


def test_a_master_with_its_defaults_cuts_ten_writer_default_files_into_ten_tasks(
    tmp_path: Path,
) -> None:
    """The issue's dataset, small: 10 files of one writer-default chunk each. No flag: 10
    tasks a pass (2 trainers x 4 workers all busy), and a restart without the flag keeps the
    choice journaled with the dataset; with `--chunk-per-task 10`: one task, as before. A
    restart with another --chunk-per-task keeps the job's tasks too (they are cut once) and
    says so."""
    data = _writer_default_files(tmp_path / "data")
    db = str(tmp_path / "state.db")
    master = MasterProcess(["--store", db]).start()
    try:
        assert _tasks(master, data) == (10, 1)
        assert "chosen: 1 chunk(s) a task" in master.log()
        master.restart()
        assert _tasks(master, data) == (10, 1)
        master.kill()
        master.args += ["--chunk-per-task", "10"]
        master.start()
        assert _tasks(master, data) == (10, 1)
        assert "--chunk-per-task 10 does not recut it" in master.log()
    finally:
        master.kill()
    given = MasterProcess(["--store", ":memory:", "--chunk-per-task", "10"]).start()
    try:
        assert _tasks(given, data) == (1, 10)
        assert "chosen:" not in given.log()
    finally:
        given.kill()

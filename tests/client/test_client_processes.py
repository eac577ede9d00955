"""End to end with real processes: a `chunkmaster master` and `chunkmaster read` trainers,
killed with SIGKILL where the scenario says so."""

from __future__ import annotations

import glob
from typing import Any

import pytest
from helpers.status_view import status_view
from helpers.trainers import (
    completed_tasks,
    covered,
    dataset_digest,
    sample_records,
    sum_lines,
    wait_until_holding,
)

from chunkmaster.cli.main import main
from chunkmaster.client import Client, Reading
from chunkmaster.client.connection import MasterConnection
from chunkmaster.digest import Digest


def _dataset(rio: Any, files: int = 3, records: int = 200) -> tuple[str, list[str]]:
    paths = [
        rio(f"part-{i:05d}.rio", sample_records(records, f"f{i}-"), max_chunk_size=400)
        for i in range(files)
    ]
    pattern = paths[0].replace("part-00000", "part-*")
    assert sorted(glob.glob(pattern)) == paths
    return pattern, paths


def test_four_trainers_ten_passes_digests_add_up(
    rio: Any, master_process: Any, trainers: Any
) -> None:
    pattern, paths = _dataset(rio)
    expected = dataset_digest(paths)
    m = master_process("--chunk-per-task", "2", "--task-timeout-dur", "30s")
    args = ["--addr", m.addr, "--dataset", pattern, "--passes", "10"]
    # Two of them take their tasks several to a request (NextTask batches).
    ts = trainers(2, args) + trainers(2, [*args, "--prefetch-tasks", "5"])
    for t in ts:
        assert t.drain() == 0, t.log()
    for p in range(10):
        total = Digest()
        for t in ts:
            line = t.passes[p]
            total.merge(Digest(int(line["digest"], 16), int(line["records"])))
        assert total == expected, f"pass {p}"
    with MasterConnection(m.addr) as c:
        st = c.status()
    assert st["cur_pass"] == 10 and st["tasks_with_failures"] == 0


def test_trainer_killed_mid_task_its_task_is_redone(
    rio: Any, master_process: Any, trainers: Any
) -> None:
    pattern, paths = _dataset(rio)
    expected = dataset_digest(paths)
    m = master_process("--chunk-per-task", "1", "--task-timeout-dur", "1s")
    args = ["--addr", m.addr, "--dataset", pattern, "--passes", "2", "--step-time", "0.002"]
    (victim,) = trainers(1, [*args[:-1], "0.02"], prefix="victim")
    line = victim.next_line()
    assert line is not None and "task" in line  # it completed a task and reads the next one
    wait_until_holding(m.addr, victim.proc.pid, 2)  # reading one task, holding the next
    victim.kill()
    survivors = trainers(2, args)
    for t in survivors:
        assert t.drain() == 0, t.log()
    # Pass 0: the tasks completed by anyone, the victim included, cover the dataset...
    tasks = completed_tasks([victim, *survivors], 0)
    records = [r for i in range(3) for r in sample_records(200, f"f{i}-")]
    assert covered(tasks, records) == expected
    # ...and so do the survivors' pass-0 reads plus what the victim completed (at least once).
    # Pass 1, survivors only: exactly once.
    total = Digest()
    for t in survivors:
        total.merge(Digest(int(t.passes[1]["digest"], 16), int(t.passes[1]["records"])))
    assert total == expected
    with MasterConnection(m.addr) as c:
        st = c.status()
    reasons = [r["reason"] for f in st["failed_tasks"] for r in f["reasons"]]
    assert "timeout" in reasons  # the victim's task came back through the timeout


def test_master_killed_and_restarted_at_the_same_address(
    rio: Any, master_process: Any, trainers: Any
) -> None:
    """D4/D5: trainers reconnect by themselves to a master that returns at the same address."""
    pattern, paths = _dataset(rio)
    expected = dataset_digest(paths)
    m = master_process("--chunk-per-task", "1", "--task-timeout-dur", "2s")
    addr = m.addr
    args = ["--addr", addr, "--dataset", pattern, "--passes", "3", "--step-time", "0.002"]
    ts = trainers(2, args)
    line = ts[0].next_line()
    assert line is not None and line["pass"] == 0  # mid-pass 0
    m.restart()  # SIGKILL, then the same port and the same embedded store
    assert m.addr == addr
    for t in ts:
        assert t.drain() == 0, t.log()
    # Every pass completed; the one with the crash at least once per task, the others exactly.
    tasks = completed_tasks(ts, 0)
    assert sum_lines(list(tasks.values())) == expected
    for p in (1, 2):
        total = Digest()
        for t in ts:
            total.merge(Digest(int(t.passes[p]["digest"], 16), int(t.passes[p]["records"])))
        assert total == expected, f"pass {p}"
    assert any("answers again" in t.log() for t in ts)  # they noticed, and said so
    with MasterConnection(m.addr) as c:
        assert status_view(c.status()).cur_pass == 3


def test_a_negative_prefetch_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["read", "--addr", "127.0.0.1:1", "--passes", "1", "--prefetch-tasks", "-1"]) != 0
    err = capsys.readouterr().err
    assert "--prefetch-tasks must be 0 or more, not -1" in err
    with pytest.raises(ValueError, match="prefetch_tasks must be 0 or more"):
        Client("127.0.0.1:1", reading=Reading(prefetch_tasks=-1))

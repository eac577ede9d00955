"""Every format end to end: a `chunkmaster master` process, three `chunkmaster read` trainers,
two passes, one trainer SIGKILLed in the middle of the first. Every record comes at least once
in that pass (the tasks completed by anyone cover the dataset) and exactly once in the next
(the digests add up to the writer's own digest of the records).

Formats come from `helpers.formats.MAKERS`: a new format adds its maker there and is tested
here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.formats import MAKERS, SMALL_CHUNKS, digest_of
from helpers.trainers import completed_tasks, covered, wait_until_holding

from chunkmaster.client.connection import MasterConnection
from chunkmaster.digest import Digest


@pytest.fixture(params=sorted(MAKERS))
def dataset_format(request: pytest.FixtureRequest) -> str:
    """Each format of helpers.formats.MAKERS in turn."""
    return str(request.param)


def test_three_trainers_two_passes_one_killed(
    dataset_format: str,
    tmp_path: Path,
    master_process: Any,
    trainers: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHUNKMASTER_CHUNK_SIZE", SMALL_CHUNKS[dataset_format])  # several a file
    data = tmp_path / "data"
    data.mkdir()
    pattern, records = MAKERS[dataset_format](data, 3, 120)
    expected = digest_of(records)
    m = master_process("--chunk-per-task", "1", "--task-timeout-dur", "1s")
    with MasterConnection(m.addr, timeout=60) as c:
        c.set_dataset([pattern])
        st = c.status()
    assert st["num_tasks"] >= 6, st  # several chunks a file: the kill lands mid-pass
    # Info logs: a trainer that fails the test shows what it was doing.
    args = ["--addr", m.addr, "--log-level", "info", "--passes", "2", "--step-time", "0.002"]
    (victim,) = trainers(1, [*args[:-1], "0.02"], prefix="victim")
    line = victim.next_line()
    assert line is not None and "task" in line  # it completed a task and reads the next one
    wait_until_holding(m.addr, victim.proc.pid, 2)  # reading one task, holding the next
    victim.kill()
    survivors = trainers(2, args)
    for t in survivors:
        assert t.drain() == 0, t.log()
    # Pass 0: the tasks completed by anyone, the victim's included: at least once.
    tasks = completed_tasks([victim, *survivors], 0)
    assert len(tasks) == st["num_tasks"]
    assert covered(tasks, records) == expected
    # Pass 1, the survivors only: exactly once.
    total = Digest()
    for t in survivors:
        total.merge(Digest(int(t.passes[1]["digest"], 16), int(t.passes[1]["records"])))
    assert total == expected
    with MasterConnection(m.addr) as c:
        st = c.status()
    assert st["cur_pass"] == 2

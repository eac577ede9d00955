"""A restart key used twice (issue 27, 1): a restore is applied or refused, never skipped.

A key names one restore of one checkpoint. Every rank of one restart asks with it, and the
master goes back once; a rank asking again is a new restart that reused the key (torchrun's run
ID and restart count are the same at every launch of one command: `none` and 0 without
`--rdzv-id`), which restores. A trainer without a rank cannot be told apart: its repeat, once
the job moved on, is refused naming the key. Another checkpoint under the same key restores.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers.datasets import numbered_records, write_records
from helpers.inproc import InProcessMaster
from helpers.loader_state import saved_after
from helpers.torch_parts import ids_of, record_id
from helpers.torchrun import run_example

from chunkmaster.client import Session
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import CheckpointRefusedError
from chunkmaster.torch import Loader

N = 300


def numbered(tmp_path: Path) -> str:
    return numbered_records(tmp_path / "d.rio", N, max_chunk_size=120)


def rank_loader(m: InProcessMaster, rank: int) -> Loader:
    """Rank `rank` of two, restarted under the restore key "r"."""
    session = Session(world_size=2, rank=rank)
    return Loader(m.addr, transform=record_id, batch_size=10, restore_key="r", session=session)


def restart(
    m: InProcessMaster, state: dict[str, Any], key: str, steps: int | None, **kw: Any
) -> list[int]:
    """A restart that loads `state` under `key`, takes `steps` batches (None: the rest of the
    pass) committing each, and dies without saving."""
    with Loader(m.addr, transform=record_id, batch_size=10, restore_key=key, **kw) as loader:
        loader.load_state_dict(state)
        taken: list[int] = []
        for batch in loader:
            taken += ids_of(batch)
            loader.commit()
            if steps is not None and len(taken) >= 10 * steps:
                break
        return taken


def test_a_key_used_again_by_a_rank_restores_again(tmp_path: Path) -> None:
    """The second restart under the same key and checkpoint: the same rank asks again, so it is
    another restart; the master goes back, and the records after the checkpoint come again."""
    data = numbered(tmp_path)
    ranked = {"session": Session(world_size=1, rank=0)}
    with InProcessMaster(chunks_per_task=1) as m:
        before, state = saved_after(m.addr, data, 3)
        restart(m, state, "run-1", 5, **ranked)  # trains 50 records, never saved
        again = restart(m, state, "run-1", None, **ranked)  # from the same checkpoint
    assert Counter(before + again) == Counter(range(N))


def test_a_key_used_again_without_a_rank_is_refused_naming_it(tmp_path: Path) -> None:
    data = numbered(tmp_path)
    with InProcessMaster(chunks_per_task=1) as m:
        before, state = saved_after(m.addr, data, 3)
        restart(m, state, "by-hand", 5)
        ledger = m.status()["ledger"]
        with pytest.raises(CheckpointRefusedError, match=r"restart key 'by-hand' took the job"):
            restart(m, state, "by-hand", None)
        assert m.status()["ledger"] == ledger  # refused: nothing changed
        again = restart(m, state, "by-hand-2", None)  # a key of its own restores
    assert Counter(before + again) == Counter(range(N))


def test_another_checkpoint_under_the_same_key_is_another_restore(tmp_path: Path) -> None:
    data = numbered(tmp_path)
    with InProcessMaster(chunks_per_task=1) as m:
        _, early = saved_after(m.addr, data, 2)
        with Loader(m.addr, transform=record_id, batch_size=10, restore_key="k") as loader:
            loader.load_state_dict(early)
            it = iter(loader)
            taken = [i for _ in range(4) for i in ids_of(next(it))]
            later = loader.state_dict()
        before = set(range(20)) | set(taken)  # the first run's 2 batches, then these
        again = restart(m, later, "k", None)
    assert Counter(list(before) + again) == Counter(range(N))


def test_every_rank_of_one_restart_asks_and_the_master_goes_back_once(tmp_path: Path) -> None:
    """Rank 0 restores and reads before rank 1 asks: rank 1's ask repeats the restore (it is
    of the same restart), so rank 0's tasks are not taken from it. Without equal steps, so that
    rank 0 may read the whole pass alone."""
    data = numbered(tmp_path)
    with InProcessMaster(chunks_per_task=1, equal_steps="off") as m:
        before, state = saved_after(m.addr, data, 3)
        r0 = rank_loader(m, 0)
        r1 = rank_loader(m, 1)
        with r0, r1:
            r0.load_state_dict(state)
            it0 = iter(r0)
            got = ids_of(next(it0))
            r0.commit()
            r1.load_state_dict(state)  # a repeat: nothing goes back
            got += [i for batch in it0 for i in ids_of(batch)]  # rank 0 reads the rest
            assert m.status_view().cur_pass == 1
    assert Counter(before + got) == Counter(range(N))  # a restore would have brought some back


RECORD = struct.Struct("<q5f")
RECORDS = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One launch of the same torchrun command: no --rdzv-id, so its run ID is the same at
    every launch, as is its restart count."""
    launch = ["--nproc-per-node", "2", "--master-port", str(free_port())]
    return run_example(tmp_path, name, launch, args)


def test_a_torchrun_command_launched_again_from_the_same_checkpoint_loses_nothing(
    tmp_path: Path, master_process: Any
) -> None:
    """Launch 1 saves a checkpoint at step 5 and stops; launch 2 resumes from it, trains three
    steps (committed) and is stopped before its next save; launch 3, the same command, resumes
    from the same checkpoint under the same restart key. Every record is trained on once in
    the model launch 3 ends with (before: the steps of launch 2 were skipped, never trained)."""
    records = [RECORD.pack(i, *(0.5,) * 5) for i in range(RECORDS)]
    write_records(tmp_path / "data.rio", records, max_chunk_size=400)
    m = master_process("--equal-steps", "drop", "--chunk-per-task", "1")
    common = ["--addr", m.addr, "--dataset", str(tmp_path / "data.rio")]
    common += ["--records", str(RECORDS), "--passes", "1", "--checkpoint", str(tmp_path / "c.pt")]
    common += ["--report", str(tmp_path / "report.json"), "--save-every", "5"]
    for name, stop in (("first", "5"), ("second", "8")):
        run = launch(tmp_path, name, *common, "--stop-after", stop)
        assert run.returncode == 0, run.stdout[-6000:]
    third = launch(tmp_path, "third", *common)
    assert third.returncode == 0, third.stdout[-6000:]
    (counts,) = json.loads((tmp_path / "report.json").read_text())["seen"]
    with MasterConnection(m.addr) as c:
        (ledger,) = [led for led in c.status()["ledger"] if led["pass"] == 0]
    assert max(counts) == 1, "a record trained on twice"
    assert counts.count(0) == ledger["dropped"] < 2, f"{counts.count(0)} never trained on"

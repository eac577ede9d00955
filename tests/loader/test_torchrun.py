"""examples/train_ddp.py under a real torchrun (CPU, gloo): the promise where people train.

Ranks, each a Loader with two persistent DataLoader workers, against a master with equal
steps. The job keeps, beside its model, how many times it trained on each record in each pass
(summed over ranks at every step, saved in the model checkpoint). Rank 1 SIGKILLs itself in
the first pass; torchrun restarts the group, every rank loads the model and the loader's state,
and the master goes back to that checkpoint. The job then stops mid-way through the second pass
(preempted) and is resumed by a second torchrun with another number of ranks (in the shuffled
case the master is SIGKILLed under it and restarted on its store). At the end every
record was trained on exactly once in each pass, but for the records equal steps dropped (the
master's ledger counts them: fewer than the ranks). Once in file order (4 ranks, then 3, with
--equal-steps drop), once with the job's record shuffle (2 ranks, then 3, with no equal-steps
flag: auto, the default, gives ranks equal steps).
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers.datasets import write_records
from helpers.torchrun import run_example

from chunkmaster.client.connection import MasterConnection

RECORD = struct.Struct("<q5f")
RECORDS = 1200


def torchrun(tmp_path: Path, name: str, ranks: int, *args: str) -> subprocess.CompletedProcess[str]:
    launch = ["--standalone", "--nproc-per-node", str(ranks), "--max-restarts", "1"]
    return run_example(tmp_path, name, launch, args)


def committed(addr: str) -> int:
    """Records the job's ranks committed, over its passes (the master's ledger)."""
    with MasterConnection(addr) as c:
        return sum(int(led["committed"]) for led in c.status()["ledger"])


def kill_master_once_more_is_committed(m: Any, more: int) -> threading.Event:
    """In a thread, SIGKILL the master once the ranks committed `more` records beyond what
    they have now, and start it again on the same store and port; the event is set then."""
    start = committed(m.addr)
    restarted = threading.Event()

    def run() -> None:
        end = time.monotonic() + 300
        while committed(m.addr) < start + more and time.monotonic() < end:
            time.sleep(0.05)
        if time.monotonic() < end:
            m.restart()
            restarted.set()

    threading.Thread(target=run, daemon=True).start()
    return restarted


def kill_and_resume(
    tmp_path: Path,
    master_process: Any,
    ranks: tuple[int, int],
    *flags: str,
    kill_master: bool = False,
) -> dict[str, Any]:
    """`ranks[0]` ranks with rank 1 killed at step 12, stopped for good mid-way through the
    second pass, resumed by `ranks[1]` ranks (with `kill_master`, the master SIGKILLed under
    them once they committed 160 more records, and restarted); the report, checked for every
    record trained on once a pass but those equal steps dropped."""
    rng = random.Random(0)
    records = [RECORD.pack(i, *(rng.random() for _ in range(5))) for i in range(RECORDS)]
    write_records(tmp_path / "data.rio", records, max_chunk_size=400)
    m = master_process("--trainer-ttl", "5", *flags)
    common = ["--addr", m.addr, "--dataset", str(tmp_path / "data.rio")]
    common += ["--records", str(RECORDS), "--passes", "2", "--checkpoint", str(tmp_path / "c.pt")]
    common += ["--report", str(tmp_path / "report.json"), "--save-every", "5"]
    # Batches of 16: RECORDS / 16 / ranks steps a pass. Rank 1 dies at step 12 (the checkpoint
    # of step 10 is the last); the group stops for good in the second pass.
    stop = RECORDS // 16 // ranks[0] + 10
    first = torchrun(
        tmp_path, "first", ranks[0], *common, "--die", "1:12", "--stop-after", str(stop)
    )
    assert first.returncode == 0, first.stdout[-6000:]
    assert "restored the running job to the data checkpoint" in m.log()
    assert not (tmp_path / "report.json").exists()
    killer = kill_master_once_more_is_committed(m, 160) if kill_master else None
    second = torchrun(tmp_path, "second", ranks[1], *common)
    assert second.returncode == 0, second.stdout[-6000:]
    if killer is not None:
        assert killer.wait(30), "the master was SIGKILLed under the ranks and restarted"
    report: dict[str, Any] = json.loads((tmp_path / "report.json").read_text())
    assert report["world"] == ranks[1]
    with MasterConnection(m.addr) as c:
        status = c.status()
    assert status["equal_steps"]["mode"] == "drop"  # given, or auto's for ranks
    ledger = {led["pass"]: led for led in status["ledger"]}
    for p, counts in enumerate(report["seen"]):
        dropped = ledger[p]["dropped"]
        assert sorted(set(counts)) in ([1], [0, 1]), f"pass {p}: a record trained on twice"
        assert counts.count(0) == dropped < max(ranks), f"pass {p}: {counts.count(0)} lost"
    return report


def test_ddp_ranks_train_on_every_record_once_through_a_rank_kill_and_a_smaller_restart(
    tmp_path: Path, master_process: Any
) -> None:
    flags = ("--equal-steps", "drop", "--chunk-per-task", "1")
    report = kill_and_resume(tmp_path, master_process, (4, 3), *flags)
    for consecutive, neighbours in report["adjacent"]:  # file order: runs of each chunk
        assert consecutive > 0.8 * neighbours


def test_shuffled_batches_hold_few_neighbours_and_every_record_once_through_kill_and_resume(
    tmp_path: Path, master_process: Any
) -> None:
    """The job's record shuffle (--shuffle-window) under the same kill, a resume at another
    world size and a master SIGKILLed under the resumed ranks: batches of records from all
    over their tasks, each record once. The
    master has no --equal-steps flag: the ranks get equal steps by default (issue 32), so no
    rank waits at a last all-reduce the others never reach."""
    flags = ("--shuffle-seed", "7", "--shuffle-window", "2000", "--chunk-per-task", "10")
    report = kill_and_resume(tmp_path, master_process, (2, 3), *flags, kill_master=True)
    for consecutive, neighbours in report["adjacent"]:
        assert neighbours > RECORDS / 2
        assert consecutive < 0.05 * neighbours, (consecutive, neighbours)

"""examples/train_ddp.py under a real torchrun (CPU, gloo): the promise where people train.

Four ranks, each a Loader with two persistent DataLoader workers, against a master with equal
steps. The job keeps, beside its model, how many times it trained on each record in each pass
(summed over ranks at every step, saved in the model checkpoint). Rank 2 SIGKILLs itself in
the first pass; torchrun restarts the group, every rank loads the model and the loader's state,
and the master goes back to that checkpoint. The job then stops mid-way through the second pass
(preempted) and is resumed by a second torchrun with three ranks. At the end every record was
trained on exactly once in each pass, but for the records equal steps dropped (the master's
ledger counts them: fewer than the ranks).
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
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


def test_ddp_ranks_train_on_every_record_once_through_a_rank_kill_and_a_smaller_restart(
    tmp_path: Path, master_process: Any
) -> None:
    rng = random.Random(0)
    records = [RECORD.pack(i, *(rng.random() for _ in range(5))) for i in range(RECORDS)]
    write_records(tmp_path / "data.rio", records, max_chunk_size=400)
    m = master_process("--equal-steps", "drop", "--chunk-per-task", "1", "--trainer-ttl", "5")
    common = ["--addr", m.addr, "--dataset", str(tmp_path / "data.rio")]
    common += ["--records", str(RECORDS), "--passes", "2", "--checkpoint", str(tmp_path / "c.pt")]
    common += ["--report", str(tmp_path / "report.json"), "--save-every", "5"]
    # 4 ranks of 300 records, batches of 16: 19 steps a pass. Rank 2 dies at step 12 (the
    # checkpoint of step 10 is the last), the group stops for good after step 30 (pass 1).
    first = torchrun(tmp_path, "four", 4, *common, "--die", "2:12", "--stop-after", "30")
    assert first.returncode == 0, first.stdout[-6000:]
    assert "restored the running job to the data checkpoint" in m.log()
    assert not (tmp_path / "report.json").exists()
    second = torchrun(tmp_path, "three", 3, *common)
    assert second.returncode == 0, second.stdout[-6000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["world"] == 3
    with MasterConnection(m.addr) as c:
        ledger = {led["pass"]: led for led in c.status()["ledger"]}
    for p, counts in enumerate(report["seen"]):
        dropped = ledger[p]["dropped"]
        assert sorted(set(counts)) in ([1], [0, 1]), f"pass {p}: a record trained on twice"
        assert counts.count(0) == dropped < 4, f"pass {p}: {counts.count(0)} never trained on"

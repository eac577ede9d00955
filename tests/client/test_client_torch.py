"""PyTorch: two trainer processes, each a DataLoader with 4 workers pulling their own tasks."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

TRAINER = """
import json, pickle, sys
from chunkmaster.torch import MasterDataset, make_loader

addr, pattern, passes = sys.argv[1], sys.argv[2], int(sys.argv[3])
ds = MasterDataset(addr, dataset=[pattern], transform=pickle.loads, buffer_size=64)
loader = make_loader(ds, batch_size=None, num_workers=4)
for p in range(passes):
    ds.set_pass(p)
    got = [int(x) for x in loader]
    print(json.dumps({"pass": p, "values": got}), flush=True)
"""


def test_dataloader_workers_in_two_trainers_see_each_record_once(
    rio: Any, master_process: Any, tmp_path: Path
) -> None:
    n = 600
    values = [pickle.dumps(i, protocol=pickle.HIGHEST_PROTOCOL) for i in range(n)]
    rio("a.rio", values[:300], max_chunk_size=100)
    rio("b.rio", values[300:], max_chunk_size=100)
    m = master_process("--chunk-per-task", "2", "--task-timeout-dur", "60s")
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), m.addr, str(tmp_path / "*.rio"), "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outputs.append([json.loads(line) for line in out.splitlines()])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for p in range(2):
        seen: Counter[int] = Counter()
        for lines in outputs:
            seen.update(lines[p]["values"])
        assert seen == Counter(range(n)), f"pass {p}"


def test_dataset_in_process_follows_the_masters_pass(rio: Any) -> None:
    from helpers.inproc import InProcessMaster

    from chunkmaster.torch import MasterDataset

    path = rio("c.rio", [b"a", b"", b"\x00"], max_chunk_size=1)
    with InProcessMaster(chunks_per_task=1) as m:
        ds = MasterDataset(m.addr, dataset=path)
        assert sorted(ds) == [b"", b"\x00", b"a"]  # no set_pass: the master's current pass
        assert sorted(ds) == [b"", b"\x00", b"a"]
        assert m.status()["cur_pass"] == 2

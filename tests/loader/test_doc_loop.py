"""The training loop of docs/torch.md, run as written under a real torchrun (2 ranks, gloo, 4
persistent workers each) against a master started with no --equal-steps flag, through one
elastic restart.

The block is taken from the doc (the ```python block after its marker comment) and run as it
is; only what the doc leaves to the user is defined above it: `decode`, `Model`, `train_step`,
the master's address, the file patterns, the checkpoint's file and two numbers. The model
holds, beside its weights, a buffer that counts how many times the job trained on each record
in each pass (summed over the ranks at every step), so the count is saved and restored with
the model as the doc's loop does it. `train_step` of rank 1 SIGKILLs its process once, in the
second pass, after a checkpoint taken mid-pass: torchrun restarts both ranks, the loop loads
the file, and the master goes back to the same point. Nothing in the doc's block knows about
the kill.

The job's two sources are tasks of 8 records each (one chunk a task), so every pass holds an
even number of records and equal steps drop nothing for 2 ranks: every record of each source
is trained on exactly once per source epoch, which the counts show.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from helpers.datasets import write_records
from helpers.torchrun import run_torchrun

from chunkmaster.client.connection import MasterConnection
from chunkmaster.recordio import load_index

DOC = Path(__file__).resolve().parents[2] / "docs" / "torch.md"
MARKER = "<!-- test_doc_loop: the block below runs as written -->"
RECORD = struct.Struct("<q5f")  # record ID over the job, 4 features, a target
PER_TASK = 8  # records a chunk, one chunk a task
SOURCES = {"web": (0, 800), "books": (800, 400)}  # name: (first ID, records)
TOTAL = sum(n for _, n in SOURCES.values())
EPOCHS = 2

#: What the doc's block leaves to the user, defined above it. `loader` is the block's own
#: (a global of the script, as the block runs at the top level of `__main__`).
PRELUDE = f"""\
import os
import signal
import struct
from pathlib import Path

import torch
import torch.distributed as dist

ADDR = os.environ["DOC_LOOP_MASTER"]
WEB, BOOKS = "data/web-*.rio", "data/books-*.rio"  # relative: the trainer's working directory
CHECKPOINT = "ckpt.pt"
EPOCHS = {EPOCHS}
SAVE_EVERY = 4
TOTAL = {TOTAL}
RECORD = struct.Struct("<q5f")


def decode(record):
    return torch.tensor(RECORD.unpack(record), dtype=torch.float64)  # [ID, x1..x4, y]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1).double()
        self.register_buffer("seen", torch.zeros(EPOCHS, TOTAL, dtype=torch.int64))

    def forward(self, x):
        return self.linear(x)


STEPS = {{}}  # pass -> steps this process took in it


def train_step(model, optimizer, batch):
    pass_id, rank = loader.pass_id, dist.get_rank()
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    Path(f"trained-restart{{restart}}-rank{{rank}}").touch()
    STEPS[pass_id] = STEPS.get(pass_id, 0) + 1
    if (
        pass_id == 1
        and STEPS[pass_id] == 7  # after the checkpoint of the pass's 6th step
        and rank == 1
        and restart == "0"
    ):
        Path("killed").write_text(f"rank 1 killed at step 7 of pass 1\\n")
        os.kill(os.getpid(), signal.SIGKILL)
    ids, x, y = batch[:, 0].long(), batch[:, 1:5], batch[:, 5:6]
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    counts = torch.bincount(ids, minlength=TOTAL)
    dist.all_reduce(counts)  # what every rank trained on at this step
    model.module.seen[pass_id] += counts


# ---- docs/torch.md, "The training loop", as written ----
"""


def doc_block() -> str:
    """The ```python block right after the marker in docs/torch.md."""
    text = DOC.read_text()
    assert text.count(MARKER) == 1, (
        f"docs/torch.md should hold the marker {MARKER!r} once, before the training loop's "
        "python block: the doc changed shape"
    )
    after = text[text.index(MARKER) + len(MARKER) :]
    m = re.match(r"\s*```python\n(.*?)\n```\n", after, re.S)
    assert m is not None, (
        "docs/torch.md: the marker is not followed by a ```python block: the doc changed shape"
    )
    block = m.group(1)
    for needed in (
        "init_process_group(",
        "Source(",
        "set_weights(",
        "load_state_dict(",
        "commit()",
    ):
        assert needed in block, f"the doc's training loop no longer calls {needed}"
    return block


def write_sources(data: Path) -> None:
    data.mkdir()
    for name, (first, n) in SOURCES.items():
        records = [
            RECORD.pack(i, *(float(i % 7), 1.0, -1.0, 0.5), float(i % 3))
            for i in range(first, first + n)
        ]
        path = write_records(data / f"{name}-0.rio", records, max_chunk_size=PER_TASK * RECORD.size)
        index = load_index(str(path))
        assert [index.first_record(k) for k in range(len(index.chunk_offsets))] == list(
            range(0, n, PER_TASK)
        )


def test_the_docs_training_loop_runs_under_torchrun_through_an_elastic_restart(
    tmp_path: Path, master_process: Any
) -> None:
    write_sources(tmp_path / "data")
    script = tmp_path / "train.py"
    script.write_text(PRELUDE + doc_block() + "\n")
    # No --equal-steps: auto, the default, gives the ranks equal steps.
    m = master_process("--trainer-ttl", "5", "--chunk-per-task", "1")
    launch = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    run = run_torchrun(
        tmp_path / "torchrun.log",
        launch,
        script,
        cwd=tmp_path,
        env={"DOC_LOOP_MASTER": m.addr},
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:]

    # The restart happened: the rank killed itself, torchrun started the group again, and
    # the master went back to the checkpoint.
    assert (tmp_path / "killed").exists(), run.stdout[-6000:]
    assert "failed (exitcode: -9) local_rank: 1" in run.stdout, run.stdout[-6000:]
    for rank in (0, 1):
        assert (tmp_path / f"trained-restart1-rank{rank}").exists(), f"rank {rank} not restarted"
    assert "restored the running job to the data checkpoint" in m.log()

    with MasterConnection(m.addr) as c:
        status = c.status()
    assert status["equal_steps"]["mode"] == "drop"  # auto's, for ranks
    ledger = {led["pass"]: led for led in status["ledger"]}
    seen = torch.load(tmp_path / "ckpt.pt", weights_only=False)["model"]["seen"].tolist()
    assert len(seen) == EPOCHS

    totals = {name: [0] * n for name, (_, n) in SOURCES.items()}
    for p, counts in enumerate(seen):
        assert ledger[p]["dropped"] == 0, ledger[p]  # even passes: nothing to drop
        for name, (first, n) in SOURCES.items():
            mine = counts[first : first + n]
            # What the job trained on, as checkpointed with the model, is what the master
            # says the pass's trainers committed of that source.
            committed = ledger[p]["sources"][name]["committed"]
            assert sum(mine) == committed, (p, name, sum(mine), ledger[p]["sources"][name])
            totals[name] = [a + b for a, b in zip(totals[name], mine, strict=True)]
    assert sum(sum(t) for t in totals.values()) == EPOCHS * TOTAL  # every record of each pass

    # Exactly once per source epoch: a source read for E whole epochs and part of the next
    # has each record E times, and E + 1 times for whole tasks of it.
    for name, counts in totals.items():
        n = len(counts)
        epochs, rest = divmod(sum(counts), n)
        assert set(counts) <= {epochs, epochs + 1}, (name, sorted(set(counts)))
        assert counts.count(epochs + 1) == rest, name
        for t in range(0, n, PER_TASK):
            assert len(set(counts[t : t + PER_TASK])) == 1, (name, t, counts[t : t + PER_TASK])
    # The mixture's weights hold, to a task: 0.7/0.3 in the first pass, and in the second
    # the 0.5/0.5 the loop set between them.
    for p, weights in enumerate(({"web": 0.7, "books": 0.3}, {"web": 0.5, "books": 0.5})):
        got = {name: ledger[p]["sources"][name]["committed"] for name in SOURCES}
        for name, w in weights.items():
            assert abs(got[name] - w * TOTAL) <= PER_TASK, (p, got, weights)

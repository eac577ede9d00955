"""DataLoader workers never start as a fork of a process whose gRPC threads run (hostile
review, 11): a worker once died of a segmentation fault about once in 20 runs, forked from a
trainer whose session's gRPC threads were live (gRPC says "Other threads are currently calling
into gRPC, skipping fork() handlers" at each such fork). By default the Loader's workers start
by forkserver, whose server is started fresh before the loader connects; fork is the user's
explicit choice only, and warned about.

Each run is a trainer process (tests/helpers/torch_trainer.py) with two workers, persistent or
not, against its own master; records are numbered and counted per pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers.datasets import write_records
from helpers.inproc import InProcessMaster

from chunkmaster.torch import Loader

TRAINER = str(Path(__file__).resolve().parents[1] / "helpers" / "torch_trainer.py")
FORKED_LIVE = "skipping fork() handlers"  # gRPC, at a fork while its threads are in calls
DIED = ("Unexpected segmentation fault", "Fatal Python error", "exited unexpectedly")
RECORDS = 120


def run(tmp_path: Path, name: str, data: Path, *args: str) -> tuple[int, str, Any]:
    """One trainer against its own master, two passes: (exit code, its stderr, its counts)."""
    out = tmp_path / f"{name}.json"
    with InProcessMaster(chunks_per_task=1) as m:
        cmd = [sys.executable, TRAINER, "--addr", m.addr, "--dataset", str(data)]
        cmd += ["--records", str(RECORDS), "--passes", "2", "--out", str(out), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    counts = json.loads(out.read_text())["counts"] if out.exists() else None
    return proc.returncode, proc.stderr, counts


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    yield write_records(
        tmp_path / "d.rio", [b"%06d" % i for i in range(RECORDS)], max_chunk_size=30
    )


def runs(tmp_path: Path, data: Path, settings: list[list[str]]) -> list[tuple[int, str, Any]]:
    with ThreadPoolExecutor(2) as pool:
        return list(
            pool.map(
                lambda i_args: run(tmp_path, f"t{i_args[0]}", data, *i_args[1]),
                enumerate(settings),
            )
        )


def test_workers_are_not_forked_from_a_trainer_with_live_grpc_threads(
    tmp_path: Path, data: Path
) -> None:
    """Persistent workers and workers started again at every round, with the Loader's default
    start method: no fork of the trainer while gRPC's threads run, every record of both passes
    read exactly once, exit 0 (before: the line at every run, workers forked by fork)."""
    settings = [[], ["--not-persistent"]] * 2
    for code, err, counts in runs(tmp_path, data, settings):
        assert code == 0, err[-4000:]
        assert FORKED_LIVE not in err, err[-4000:]
        assert counts == [[1] * RECORDS] * 2


def test_many_short_loader_runs_lose_no_worker(tmp_path: Path, data: Path) -> None:
    """Many short trainers, two at a time (more processes than cores): no worker dies, every
    pass is read exactly once."""
    settings = [[], ["--not-persistent"]] * 5
    for code, err, counts in runs(tmp_path, data, settings):
        assert not any(d in err for d in DIED), err[-4000:]
        assert code == 0, err[-4000:]
        assert counts == [[1] * RECORDS] * 2


def test_fork_is_honoured_when_asked_for_and_warned_about(
    tmp_path: Path, data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """multiprocessing_context='fork' is the user's: it is used, with a warning naming the risk;
    a transform a worker could not unpickle (a lambda) makes the default fall back to fork,
    saying which and why."""
    with InProcessMaster() as m:
        with caplog.at_level("WARNING", "chunkmaster.torch"):
            forked = Loader(m.addr, num_workers=2, multiprocessing_context="fork")
        assert forked._loader.multiprocessing_context.get_start_method() == "fork"
        assert "gRPC does not support fork() with live threads" in caplog.text
        caplog.clear()
        default = Loader(m.addr, num_workers=2)
        assert default._loader.multiprocessing_context.get_start_method() == "forkserver"
        assert caplog.text == ""
        with caplog.at_level("WARNING", "chunkmaster.torch"):
            fallback = Loader(m.addr, num_workers=2, transform=lambda r: r)
        assert fallback._loader.multiprocessing_context.get_start_method() == "fork"
        assert "transform <function" in caplog.text and "cannot be pickled" in caplog.text
        for loader in (forked, default, fallback):
            loader.close()


UNGUARDED = """
import sys
from chunkmaster.torch import Loader
loader = Loader(sys.argv[1], dataset=[sys.argv[2]], batch_size=4, num_workers=2)
print(sum(1 for _ in loader))
"""


def test_a_script_without_a_main_guard_is_told_what_to_do(tmp_path: Path, data: Path) -> None:
    """Workers start by forkserver, which imports the training script again: one without
    `if __name__ == "__main__":` fails at once with Python's word of what to do (the idiom),
    not with a worker dying silently or a loop run twice."""
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    with InProcessMaster(chunks_per_task=1) as m:
        proc = subprocess.run(
            [sys.executable, str(script), m.addr, str(data)],
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert proc.returncode != 0
    assert "if __name__ == '__main__':" in proc.stderr, proc.stderr[-3000:]

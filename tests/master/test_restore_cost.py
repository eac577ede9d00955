"""What a restore of a data checkpoint cost, in the status ledger: for each pass from the
checkpoint's floor on, the records the trainers had reached beyond the checkpoint's commits,
which the pass delivers again (`rolled_back`), and the commits it went on from (`restored`).

The core's figures (events applied one at a time, through a snapshot), then real processes: a
master, trainers reading and committing through `chunkmaster.Client`, `chunkmaster checkpoint
save`, a restore onto the running job, `chunkmaster status` (JSON and text).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.datasets import chunk_dataset, numbered_records
from helpers.master_process import MasterProcess

import chunkmaster
from chunkmaster.core.codec import decode_snapshot, encode_snapshot
from chunkmaster.core.commits import committed_position
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import Commit, Dispatch, Finish, Progress, Restore, SetDataset
from chunkmaster.core.master_state import MasterState
from chunkmaster.core.mixture_events import mixture_position
from chunkmaster.core.model import Position
from chunkmaster.core.state import apply
from chunkmaster.master.readiness import read_ready_file


def job(tasks: int = 4, records: int = 10) -> MasterState:
    st = MasterState()
    apply(st, SetDataset(chunk_dataset([records] * tasks, 1)))
    return st


def read(st: MasterState, upto: int, *, commit: bool = True, finish: bool = True) -> None:
    """A trainer takes the next task and reads it to record `upto` (and finishes it if that
    is its end), committing what it read."""
    task = apply(st, Dispatch(1e12, "w"))
    assert task is not None and not isinstance(task, bool | int)
    pos = Position(task.meta.id, task.meta.epoch, task.pass_id, upto)
    apply(st, Progress((pos,)))
    if commit:
        apply(st, Commit((pos,)))
    if finish and upto == task.num_records:
        apply(st, Finish(task.meta.id, task.meta.epoch, task.pass_id))


RESTARTS = itertools.count()


def back_to(st: MasterState, checkpoint: tuple[int, tuple[tuple[int, int, int], ...]]) -> None:
    """A restart of the training job restores `checkpoint` onto the running job."""
    floor, commits = checkpoint
    assert apply(st, Restore(floor, commits, "ckpt", f"restart-{next(RESTARTS)}")) is True


def test_a_restore_counts_the_records_reached_beyond_the_checkpoint() -> None:
    st = job()
    read(st, 10)
    read(st, 4)  # task 1: 4 of 10, committed
    saved = committed_position(st)  # 14 records committed
    read(st, 10)  # task 2 whole: 10 more
    apply(st, Progress((Position(1, 1, 0, 7),)))  # task 1 read on to 7, not committed
    back_to(st, saved)
    led = st.ledger[0]
    assert (led.restored, led.rolled_back) == (14, 10 + 3)
    assert led.consumed == 0 and led.committed == 14
    # Read on from there: 6 more of task 1, all of task 2; then back to the same checkpoint.
    read(st, 10)
    read(st, 10)
    assert st.ledger[0].consumed == 16
    back_to(st, saved)
    assert (st.ledger[0].restored, st.ledger[0].rolled_back) == (14, 13 + 16)
    # The figures survive a snapshot.
    again = decode_snapshot(encode_snapshot(st)).ledger[0]
    assert (again.restored, again.rolled_back) == (14, 29)


def test_records_reached_not_committed_and_in_later_passes_count_in_the_pass_gone_back_to() -> None:
    st = job(tasks=2)
    read(st, 10)
    saved = committed_position(st)  # pass 0: task 0
    read(st, 10, commit=False)  # the pass ends; task 1 read, not committed
    assert st.cur_pass == 1
    read(st, 3)  # pass 1: task 0 (or 1) to record 3, committed
    back_to(st, saved)
    assert st.cur_pass == 0
    # Pass 0's 10 records read beyond the checkpoint and pass 1's 3: the pass the job went
    # back to counts them all; pass 1 has no ledger until it starts again.
    assert (st.ledger[0].restored, st.ledger[0].rolled_back) == (10, 10 + 3)
    assert 1 not in st.ledger


def test_a_mixture_counts_each_source_s_part_of_the_rollback() -> None:
    halves = []
    for name in "ab":
        index = [(list(range(0, 400, 100)), [10, 10, 10, 10])]  # 4 tasks of 10 records
        halves.append((name, Dataset.build([f"/{name}/*"], [f"/{name}/0"], index, 1), 1.0))
    st = MasterState()
    apply(st, SetDataset(Dataset.mix(halves)))
    for upto in (10, 10, 5):
        read(st, upto)
    floor, commits = committed_position(st)
    saved = Restore(floor, commits, "ckpt", "restart-a", mixture_position(st))
    apply(st, Progress((Position(2, 1, 0, 10),)))  # the third unit read on, not committed
    for _ in range(4):  # four more units, of both sources
        read(st, 10)
    led = st.ledger[0]
    reached = {s: c.consumed for s, c in led.sources.items()}
    assert apply(st, saved) is True
    led = st.ledger[0]
    assert (led.restored, led.rolled_back) == (25, 5 + 40)
    committed = {s: c.committed for s, c in led.sources.items()}
    assert {s: c.rolled_back for s, c in led.sources.items()} == {
        s: reached[s] - committed.get(s, 0) for s in reached
    }
    assert len(reached) == 2 and all(c.rolled_back for c in led.sources.values())
    assert sum(c.rolled_back for c in led.sources.values()) == led.rolled_back
    assert sum(c.restored for c in led.sources.values()) == led.restored


def test_a_job_started_from_a_checkpoint_rolled_nothing_back() -> None:
    st = job()
    back_to(st, (0, ((0, 0, 10), (0, 1, 4))))
    assert (st.ledger[0].restored, st.ledger[0].rolled_back) == (14, 0)


def status(addr: str, *flags: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "status", "--addr", addr, *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def dashboard(m: MasterProcess, profile: Path) -> str:
    """The master's dashboard as headless chromium renders it (its DOM once its first fetches
    ran; `make test` installs chromium: scripts/ensure-chromium.sh)."""
    info = read_ready_file(m.ready_file)
    assert info is not None
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: run scripts/ensure-chromium.sh (make test does)")
    out = subprocess.run(
        [
            chromium,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=3000",
            "--dump-dom",
            f"http://{info['metrics_addr']}/",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def take(addr: str, data: str, n: int) -> list[bytes]:
    """`n` records of pass 0 read and committed by a trainer of its own, which then leaves."""
    got: list[bytes] = []
    with chunkmaster.Client(addr, name="reader") as client:
        client.set_dataset([data])
        for record in client.records(0):
            got.append(bytes(record))
            if len(got) == n:
                break
        client.commit()
    return got


def test_the_status_shows_what_a_restore_onto_the_running_job_rolled_back(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", 200, max_chunk_size=40)  # chunks of 5 records
    m = MasterProcess(
        ["--store", str(tmp_path / "s.db"), "--chunk-per-task", "2", "--metrics-port", "0"]
    ).start()
    try:
        assert m.addr is not None
        first = take(m.addr, data, 37)  # ends mid-task
        ckpt = tmp_path / "job.ckpt"
        save = ["checkpoint", "save", "--addr", m.addr, str(ckpt)]
        saved = subprocess.run(
            [sys.executable, "-m", "chunkmaster", *save],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert saved.returncode == 0, saved.stderr
        more = take(m.addr, data, 52)
        with chunkmaster.Client(m.addr, name="restarted") as client:
            assert client.restore(ckpt.read_bytes(), "restart-1") is True
        (row,) = json.loads(status(m.addr, "--json").stdout)["ledger"]
        assert (row["pass"], row["committed"], row["consumed"]) == (0, 37, 0)
        assert (row["restored"], row["rolled_back"]) == (37, 52)
        text = status(m.addr).stdout
        assert (
            "records  pass 0: 0 handed out, 0 consumed, 37 committed; handed out again: none; "
            "rolled back by a restore: 52 (delivered again; the checkpoint held 37 committed)"
        ) in text
        assert "rolled back by a restore: 52" in dashboard(m, tmp_path / "profile")
        rest = take(m.addr, data, 200 - 37)
        assert sorted(first + rest) == [b"%06d" % i for i in range(200)]
        assert set(more) <= set(rest)  # the 52 rolled back are delivered again, once
    finally:
        m.kill()

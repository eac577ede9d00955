"""Equal steps at the process level: a real `chunkmaster master --equal-steps`, trainers as
real processes with sessions (tests/helpers/session_trainer.py), one SIGKILLed mid-pass.

The dataset has RECORDS numbered records, which 3 does not divide; every trainer of a pass
must log the same number of records in it, and the master's ledger must account for the
remainder (dropped, or padded with repeated records).
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.datasets import write_records
from helpers.master_process import MasterProcess
from helpers.session_trainer_process import SessionTrainerProcess
from helpers.status_view import master_status, master_status_view
from helpers.waits import wait_for

from chunkmaster.client.connection import MasterConnection

RECORDS = 1000  # 1000 = 3 * 333 + 1
PASSES = 2


class Trainer(SessionTrainerProcess):
    def __init__(self, addr: str, out: Path, *args: str) -> None:
        super().__init__(out, "--addr", addr, "--report-every", "5", "--passes", str(PASSES), *args)


def start(tmp_path: Path, mode: str, *extra: str) -> tuple[MasterProcess, str]:
    data = tmp_path / "data.rio"
    write_records(data, [b"%06d" % i for i in range(RECORDS)], max_chunk_size=50)
    args = ["--equal-steps", mode, "--chunk-per-task", "2", "--store", str(tmp_path / "s.db")]
    return MasterProcess([*args, *extra]).start(), str(data)


def trainers_then_dataset(
    master: MasterProcess, data: str, tmp_path: Path, step: str
) -> list[Trainer]:
    """The trainers open their sessions first: a pass's trainers are the live sessions when
    its first task is handed out."""
    assert master.addr is not None
    trainers = [Trainer(master.addr, tmp_path / f"t{i}.out", "--step-time", step) for i in range(3)]
    try:
        wait_for(lambda: master_status_view(master.addr or "").sessions == 3, "three sessions", 120)
    except Exception as exc:
        raise AssertionError(f"{exc}; the master's log:\n{master.log()[-3000:]}") from None
    with MasterConnection(master.addr, timeout=60) as c:
        c.set_dataset([data])
    return trainers


@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_three_trainers_get_the_same_records_every_pass(mode: str, tmp_path: Path) -> None:
    master, data = start(tmp_path, mode)
    try:
        trainers = trainers_then_dataset(master, data, tmp_path, "0")
        for t in trainers:
            t.wait()
        assert master.addr is not None
        ledger = {p["pass"]: p for p in master_status(master.addr)["ledger"]}
        shown = subprocess.run(
            [sys.executable, "-m", "chunkmaster", "status", "--addr", master.addr],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        master.kill()
    assert shown.returncode == 0, shown.stderr
    assert f"; {'dropped 1' if mode == 'drop' else 'padded 2'}" in shown.stdout, shown.stdout
    assert f"steps    equal ({mode})" in shown.stdout, shown.stdout
    per = RECORDS // 3 if mode == "drop" else -(-RECORDS // 3)
    for p in range(PASSES):
        counts = [len(t.records(p)) for t in trainers]
        assert counts == [per] * 3, (p, counts)
        seen = Counter(r for t in trainers for r in t.records(p))
        if mode == "drop":
            assert all(n == 1 for n in seen.values())
            assert len(seen) == RECORDS - 1
            assert (ledger[p]["dropped"], ledger[p]["padded"]) == (1, 0)
        else:
            assert set(seen) == set(range(RECORDS))
            repeated = sorted(r for r, n in seen.items() if n > 1)
            assert repeated == [0, 1] and all(seen[r] == 2 for r in repeated)  # the first
            assert (ledger[p]["dropped"], ledger[p]["padded"]) == (0, 2)


@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_survivors_of_a_killed_trainer_end_each_pass_equal(mode: str, tmp_path: Path) -> None:
    master, data = start(tmp_path, mode, "--trainer-ttl", "2", "--task-timeout-dur", "10m")
    try:
        trainers = trainers_then_dataset(master, data, tmp_path, "0.003")
        victim, survivors = trainers[0], trainers[1:]
        wait_for(lambda: len(victim.records(0)) >= 60, "the victim to read", 120)
        victim.kill()
        for t in survivors:
            t.wait()
        assert master.addr is not None
        st = master_status(master.addr)
    finally:
        master.kill()
    ledger = {p["pass"]: p for p in st["ledger"]}
    for p in range(PASSES):
        counts = [len(t.records(p)) for t in survivors]
        assert counts[0] == counts[1] > 0, (p, counts)
        seen = set(r for t in trainers for r in t.records(p))
        if mode == "drop":
            assert RECORDS - ledger[p]["dropped"] <= len(seen), p
            assert ledger[p]["padded"] == 0
        else:
            assert seen == set(range(RECORDS)), p
            assert ledger[p]["dropped"] == 0
    assert sum(len(t.records(1)) for t in survivors) == (
        RECORDS if RECORDS % 2 == 0 else RECORDS - (mode == "drop") + (mode == "pad")
    )
    assert st["sessions"] == 0 and st["cur_pass"] == PASSES


@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_a_master_killed_mid_pass_comes_back_with_the_same_quotas(
    mode: str, tmp_path: Path
) -> None:
    """The pass's trainers, quotas and pieces are journaled state: a master SIGKILLed in the
    middle of a pass and started again on its store goes on with them."""
    master, data = start(tmp_path, mode)
    try:
        trainers = trainers_then_dataset(master, data, tmp_path, "0.003")
        wait_for(lambda: len(trainers[0].records(0)) >= 150, "the trainers to read", 120)
        master.restart()
        for t in trainers:
            t.wait()
        assert master.addr is not None
        ledger = {p["pass"]: p for p in master_status(master.addr)["ledger"]}
    finally:
        master.kill()
    per = RECORDS // 3 if mode == "drop" else -(-RECORDS // 3)
    for p in range(PASSES):
        counts = [len(t.records(p)) for t in trainers]
        assert counts == [per] * 3, (p, counts)
        assert ledger[p]["dropped" if mode == "drop" else "padded"] == abs(3 * per - RECORDS)

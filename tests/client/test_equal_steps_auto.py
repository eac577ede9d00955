"""`--equal-steps auto`, the default (issue 32): ranks get equal steps without a flag.

A master started with no equal-steps flag used to serve trainers that declare a world size
(torchrun's WORLD_SIZE and RANK) with dynamic dispatch and no word: ranks got different
numbers of records, and a DDP job hung at the all-reduce of a pass's last step, far from its
cause. Now the first of a job's live trainers sets its mode: equal steps (drop) for ranks,
none for trainers without a rank; a trainer of the other kind is refused naming both, and an
explicit `--equal-steps off` with ranked trainers is a warning in the log and the status.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import write_records
from helpers.status_view import master_status

from chunkmaster import Client, Session
from chunkmaster.core.errors import WorldMismatchError

RECORDS = 1001  # 3 * 333 + 2


def data(tmp_path: Path, n: int = RECORDS) -> tuple[Path, list[bytes]]:
    path = tmp_path / "data.rio"
    records = [b"%06d" % i for i in range(n)]
    write_records(path, records, max_chunk_size=50)
    return path, records


def test_ranks_get_equal_steps_from_a_master_started_without_a_flag(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    path, _ = data(tmp_path)
    m = master_process("--chunk-per-task", "2")
    common = ["--addr", m.addr, "--dataset", str(path), "--passes", "2", "--world-size", "3"]
    ts = [trainers(1, [*common, "--rank", str(r)], prefix=f"rank{r}-")[0] for r in range(3)]
    for t in ts:
        assert t.drain(timeout=120) == 0, t.log()
    for p in range(2):
        assert [t.passes[p]["records"] for t in ts] == [333, 333, 333], f"pass {p}"
    status = master_status(m.addr)
    assert status["equal_steps"]["mode"] == "drop"
    assert {led["pass"]: led["dropped"] for led in status["ledger"]} == {0: 2, 1: 2}
    assert "equal steps drop for this job (--equal-steps auto)" in m.log()


def test_trainers_without_a_rank_get_what_they_ask_for(tmp_path: Path, master_process: Any) -> None:
    path, records = data(tmp_path, 60)
    m = master_process("--chunk-per-task", "2")
    with Client(m.addr, session=Session(world_size=0)) as c:
        c.set_dataset([str(path)])
        assert list(c.records(0)) == records  # all of it: nothing dropped, nobody waited for
    assert master_status(m.addr)["equal_steps"]["mode"] == "off"


def test_a_trainer_without_a_rank_beside_ranked_ones_is_refused_naming_both(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    path, _ = data(tmp_path, 40)
    m = master_process("--chunk-per-task", "2", "--trainer-ttl", "3", "--rank-wait", "10m")
    rank0 = trainers(
        1,
        [
            "--addr",
            m.addr,
            "--dataset",
            str(path),
            "--passes",
            "1",
            "--world-size",
            "2",
            "--rank",
            "0",
        ],
    )[0]
    assert m.wait_log(r"rank 0 of 2\) opened session")
    plain = trainers(1, ["--addr", m.addr, "--passes", "1"], prefix="plain-")[0]
    assert plain.drain(timeout=60) == 1
    assert re.search(
        r"WorldMismatchError: this trainer declares no world size; the job's live trainers "
        r"declare a world of 2 \(\w+ of trainer \S+ \(\S+, pid \d+\)\): under --equal-steps "
        r"auto a job's trainers are all ranked \(equal steps\) or all not",
        plain.log(),
    ), plain.log()
    assert rank0.proc.poll() is None  # the first kind stands: it waits for its rank 1


def test_a_ranked_trainer_beside_one_without_a_rank_is_refused_naming_both(
    tmp_path: Path, master_process: Any
) -> None:
    path, records = data(tmp_path, 40)
    m = master_process("--chunk-per-task", "2", "--trainer-ttl", "3")
    with Client(m.addr, session=Session(world_size=0)) as plain:
        plain.set_dataset([str(path)])
        assert len(list(plain.records(0))) == len(records)
        with (
            Client(m.addr, session=Session(world_size=2, rank=1)) as rank1,
            pytest.raises(WorldMismatchError) as refused,
        ):
            list(rank1.records(1))
        assert re.search(
            r"this trainer declares rank 1 of world 2; the job's live trainers declare no "
            r"world size",
            str(refused.value),
        ), refused.value
        assert list(plain.records(1)) == records  # the first kind reads on, all of it


def test_equal_steps_off_with_ranked_trainers_is_a_warning_in_the_log_and_the_status(
    tmp_path: Path, master_process: Any
) -> None:
    path, records = data(tmp_path, 40)
    m = master_process("--equal-steps", "off")
    assert m.wait_log(r"--equal-steps off: trainers that declare a world size")
    with Client(m.addr, session=Session(world_size=2, rank=0)) as c:
        c.set_dataset([str(path)])
        assert list(c.records(0)) == records  # off: rank 0 alone reads it all
        warnings = master_status(m.addr)["warnings"]
        assert any(
            "equal steps are off (--equal-steps off) and trainers declare a world of 2" in w
            and "DDP hangs" in w
            for w in warnings
        ), warnings
    assert m.wait_log(r"WARNING .*equal steps are off \(--equal-steps off\) and trainers")

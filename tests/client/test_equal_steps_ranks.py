"""Equal steps with declared ranks (issue 18, 8): trainers started together share each pass.

Without a world size, a pass's trainers are the sessions alive at its first dispatch: three
trainers started together raced the start, and the first one to ask got the whole pass. With
`--world-size 3` (or WORLD_SIZE and RANK, as torchrun sets them) the pass waits until all three
ranks have a session, and each gets the same number of records. A rank that never comes is
named in the error after the master's --rank-wait.

A trainer whose declaration contradicts the live world (another WORLD_SIZE, or a RANK that a
live session holds) is refused at its first task request, naming both declarations, and the
live world reads on (hostile review, item 7): before, the newest declaration won, so a stray
WORLD_SIZE=4 stopped a live world of 2, and a second RANK=0 took the rank from the first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from helpers.datasets import write_records
from helpers.status_view import master_status

from chunkmaster import Client, Session

RECORDS = 1001  # 3 * 333 + 2


def test_three_ranks_started_together_get_equal_shares(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    data = tmp_path / "data.rio"
    write_records(data, [b"%06d" % i for i in range(RECORDS)], max_chunk_size=50)
    m = master_process("--equal-steps", "drop", "--chunk-per-task", "2")
    common = ["--addr", m.addr, "--dataset", str(data), "--passes", "2", "--world-size", "3"]
    ts = [trainers(1, [*common, "--rank", str(r)], prefix=f"rank{r}-")[0] for r in range(3)]
    for t in ts:
        assert t.drain(timeout=120) == 0, t.log()
    for p in range(2):
        assert [t.passes[p]["records"] for t in ts] == [333, 333, 333], f"pass {p}"
    ledger = {led["pass"]: led for led in master_status(m.addr)["ledger"]}
    assert ledger[0]["dropped"] == ledger[1]["dropped"] == 2


def test_a_rank_that_never_comes_is_named(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    data = tmp_path / "data.rio"
    write_records(data, [b"%06d" % i for i in range(30)], max_chunk_size=50)
    m = master_process("--equal-steps", "drop", "--rank-wait", "6s")
    common = ["--addr", m.addr, "--dataset", str(data), "--passes", "1", "--world-size", "3"]
    ts = [trainers(1, [*common, "--rank", str(r)], prefix=f"rank{r}-")[0] for r in (0, 1)]
    for t in ts:
        assert t.drain(timeout=120) == 1
        # The first to give up names rank 2; the other may find its partner gone too.
        assert re.search(
            r"RanksMissingError: pass 0 cannot start: rank\(s\) ([01], )?2 of world", t.log()
        )
    assert "pass 0 waits for rank(s)" in m.log()


def read_pass(clients: Sequence[Client], p: int) -> list[list[bytes]]:
    """Every client's records of pass `p`, read at the same time (the ranks of one step)."""
    with ThreadPoolExecutor(len(clients)) as pool:
        return list(pool.map(lambda c: list(c.records(p)), clients))


def ranked(addr: str, world: int, rank: int) -> Client:
    return Client(addr, session=Session(world_size=world, rank=rank))


def test_a_stray_world_size_beside_a_live_world_fails_and_the_world_reads_on(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    data = tmp_path / "data.rio"
    records = [b"%06d" % i for i in range(40)]
    write_records(data, records, max_chunk_size=50)
    m = master_process("--equal-steps", "drop", "--rank-wait", "20s", "--trainer-ttl", "3")
    world = [ranked(m.addr, 2, r) for r in (0, 1)]
    try:
        world[0].set_dataset([str(data)])
        first = read_pass(world, 0)
        assert sorted(first[0] + first[1]) == records
        args = ["--addr", m.addr, "--first-pass", "1", "--passes", "1"]
        stray = trainers(1, [*args, "--world-size", "4", "--rank", "0"], prefix="stray-")[0]
        assert stray.drain(timeout=60) == 1
        log = stray.log()
        assert "RanksMissingError" not in log, log
        assert re.search(
            r"WorldMismatchError: this trainer declares rank 0 of world 4; the job's live "
            r"world is 2 \(ranks 0, 1",
            log,
        ), log
        second = read_pass(world, 1)  # exactly once, 20 each: the stray took no part
        assert [len(r) for r in second] == [20, 20]
        assert sorted(second[0] + second[1]) == records
    finally:
        for c in world:
            c.close()


def test_a_second_trainer_of_a_live_rank_fails_and_the_first_reads_on(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    data = tmp_path / "data.rio"
    records = [b"%06d" % i for i in range(30)]
    write_records(data, records, max_chunk_size=50)
    m = master_process("--equal-steps", "drop", "--rank-wait", "20s", "--trainer-ttl", "3")
    first = ranked(m.addr, 1, 0)
    try:
        first.set_dataset([str(data)])
        assert read_pass([first], 0) == [records]
        args = ["--addr", m.addr, "--first-pass", "1", "--passes", "1"]
        second = trainers(1, [*args, "--world-size", "1", "--rank", "0"], prefix="again-")[0]
        assert second.drain(timeout=60) == 1
        log = second.log()
        assert re.search(
            r"WorldMismatchError: this trainer declares rank 0 of world 1; rank 0 is held by "
            r"the live session \w+ of trainer \S+ \(\S+, pid \d+\)",
            log,
        ), log
        assert read_pass([first], 1) == [records]
    finally:
        first.close()


def test_ranks_that_disagree_on_the_world_size_fail_at_once_at_the_later_one(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    data = tmp_path / "data.rio"
    write_records(data, [b"%06d" % i for i in range(30)], max_chunk_size=50)
    # A --rank-wait far longer than the test's patience: a refusal must not wait for it.
    m = master_process("--equal-steps", "drop", "--rank-wait", "10m", "--trainer-ttl", "3")
    common = ["--addr", m.addr, "--dataset", str(data), "--passes", "1"]
    rank0 = trainers(1, [*common, "--world-size", "2", "--rank", "0"], prefix="rank0-")[0]
    assert m.wait_log(r"rank 0 of 2\) opened session")
    wrong = trainers(1, [*common, "--world-size", "3", "--rank", "1"], prefix="wrong-")[0]
    assert wrong.drain(timeout=60) == 1
    assert re.search(
        r"WorldMismatchError: this trainer declares rank 1 of world 3; the job's live world "
        r"is 2 \(ranks 0 open",
        wrong.log(),
    ), wrong.log()
    assert rank0.proc.poll() is None  # the first declaration stands: it waits for its rank 1
    rank1 = trainers(1, [*common, "--world-size", "2", "--rank", "1"], prefix="rank1-")[0]
    for t in (rank0, rank1):
        assert t.drain(timeout=120) == 0, t.log()
    assert [t.passes[0]["records"] for t in (rank0, rank1)] == [15, 15]

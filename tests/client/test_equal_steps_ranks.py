"""Equal steps with declared ranks (issue 18, 8): trainers started together share each pass.

Without a world size, a pass's trainers are the sessions alive at its first dispatch: three
trainers started together raced the start, and the first one to ask got the whole pass. With
`--world-size 3` (or WORLD_SIZE and RANK, as torchrun sets them) the pass waits until all three
ranks have a session, and each gets the same number of records. A rank that never comes is
named in the error after the master's --rank-wait.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from helpers.datasets import write_records

from chunkmaster.client.connection import MasterConnection

RECORDS = 1001  # 3 * 333 + 2


def status(addr: str) -> dict[str, Any]:
    with MasterConnection(addr) as c:
        return c.status()


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
    ledger = {led["pass"]: led for led in status(m.addr)["ledger"]}
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

"""Which pass a Loader reads, told to its user (hostile review, item 16): a Loader whose pass
was never set starts at the master's current pass and logs which and why; one asked for a pass
that was over before it took part gets a PassOverError that says what to call on the Loader."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster
from helpers.torch_parts import ids_of, record_id

from chunkmaster.core.errors import PassOverError
from chunkmaster.torch import Loader

N = 40


def numbered(tmp_path: Path) -> str:
    return numbered_records(tmp_path / "d.rio", N, max_chunk_size=64)


def test_a_new_loader_logs_the_pass_it_starts_at_and_a_pass_over_says_set_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = numbered(tmp_path)
    with InProcessMaster(chunks_per_task=2) as m:
        with Loader(m.addr, dataset=[data], transform=record_id, batch_size=8) as first:
            with caplog.at_level(logging.INFO, logger="chunkmaster.torch"):
                assert Counter(i for b in first for i in ids_of(b)) == Counter(range(N))
            assert "iteration reads pass 0 (the master's current pass)" in caplog.text
        assert m.status_view().cur_pass == 1
        caplog.clear()
        with Loader(m.addr, dataset=[data], transform=record_id, batch_size=8) as late:
            with caplog.at_level(logging.INFO, logger="chunkmaster.torch"):
                assert Counter(i for b in late for i in ids_of(b)) == Counter(range(N))
            text = caplog.text
            assert "iteration reads pass 1 (the master's current pass; pass 0 is over." in text
            assert "loader.set_pass(p) before iterating chooses another" in text
        with Loader(m.addr, dataset=[data], transform=record_id, batch_size=8) as behind:
            behind.set_pass(1)
            with pytest.raises(PassOverError) as info:
                list(behind)
            msg = str(info.value)
            assert "pass 1 was over before this trainer read any of it" in msg, msg
            assert "the master is in pass 2" in msg, msg
            assert "With the Loader: call loader.set_pass(2) to read pass 2" in msg, msg
            behind.set_pass(2)  # as told: it reads the master's pass
            assert Counter(i for b in behind for i in ids_of(b)) == Counter(range(N))

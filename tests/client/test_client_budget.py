"""The error budget as a trainer's Client sees it, with a session and with the unary calls: a
chunk with a bad checksum within the budget is an ordinary end of pass without its records;
over the budget next_record() and records() raise JobStoppedError naming the file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.inproc import InProcessMaster

from chunkmaster.client import Client, EndOfPass, TaskReadError
from chunkmaster.core.errors import JobStoppedError
from chunkmaster.core.quarantine import ErrorBudget
from chunkmaster.recordio import Compressor, load_index


def _poisoned(rio: Any) -> tuple[str, list[bytes], set[bytes], int]:
    records = [f"rec{i:03d}".encode() * 5 for i in range(60)]
    path = rio("bad.rio", records, max_chunk_size=150, compressor=Compressor.NONE)
    index = load_index(path)
    bad_offset = index.chunk_offsets[2]
    raw = bytearray(Path(path).read_bytes())
    raw[bad_offset + 30] ^= 0xFF  # a payload byte of chunk 2: its checksum no longer matches
    Path(path).write_bytes(bytes(raw))
    return path, records, set(records[index.first_record(2) : index.first_record(3)]), bad_offset


def _read_pass(c: Client) -> tuple[list[bytes], list[TaskReadError], BaseException]:
    got: list[bytes] = []
    errors: list[TaskReadError] = []
    c.start_get_records(0)
    while True:
        try:
            got.append(c.next_record(timeout=30))
        except TaskReadError as exc:
            errors.append(exc)
        except (EndOfPass, JobStoppedError) as exc:
            return got, errors, exc


@pytest.mark.parametrize("session", [True, False])
def test_within_budget_the_pass_ends_without_the_bad_chunk(rio: Any, session: bool) -> None:
    path, records, bad, _ = _poisoned(rio)
    with (
        InProcessMaster(
            chunks_per_task=1, timeout_dur=30.0, failure_max=0, error_budget=ErrorBudget(10)
        ) as m,
        Client(m.addr, session=session) as c,
    ):
        c.set_dataset([path])
        got, errors, end = _read_pass(c)
        assert isinstance(end, EndOfPass) and len(errors) == 1
        assert Counter(got) == Counter(r for r in records if r not in bad)
        st = m.status()
        assert st["job_stopped"] is None
        assert {e["pass"]: e["quarantined"] for e in st["ledger"]}[0] == len(bad)


@pytest.mark.parametrize("session", [True, False])
def test_over_budget_next_record_and_records_raise_job_stopped(rio: Any, session: bool) -> None:
    path, _, _, bad_offset = _poisoned(rio)
    with (
        InProcessMaster(
            chunks_per_task=1, timeout_dur=30.0, failure_max=0, error_budget=ErrorBudget(0)
        ) as m,
        Client(m.addr, session=session) as c,
    ):
        c.set_dataset([path])
        _, errors, end = _read_pass(c)
        assert len(errors) == 1
        assert isinstance(end, JobStoppedError)
        assert path in str(end) and f"offset(s) {bad_offset}" in str(end)
        assert "ChecksumError" in str(end)
        with pytest.raises(JobStoppedError) as info:
            for _ in c.records(0):
                pass
        assert str(info.value) == str(end)
        with pytest.raises(JobStoppedError):
            for _ in c.records(1):  # any pass: the job stopped
                pass

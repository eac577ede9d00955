"""A poison file, end to end: a real `chunkmaster master` and `chunkmaster read` trainers over
a dataset with a chunk whose checksum is wrong. Within the error budget the pass goes on
without it and every part of the system says so; over it the job stops, the trainers exit
naming the file, and a master SIGKILLed and restarted on the same store still says so."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.trainers import digest_of, sample_records
from helpers.waits import wait_for

from chunkmaster.client.connection import MasterConnection
from chunkmaster.digest import Digest
from chunkmaster.recordio import Compressor, load_index


@dataclass
class Poisoned:
    pattern: str
    bad_path: str
    bad_offset: int
    bad_records: int
    good: Digest  # every record but those of the bad chunk


def _poisoned_dataset(rio: Any) -> Poisoned:
    """3 files of 200 records; chunk 2 of part-00001 has a payload byte flipped, so its
    checksum no longer matches (uncompressed, so the checksum is what fails)."""
    records = {i: sample_records(200, f"f{i}-") for i in range(3)}
    paths = [
        rio(f"part-{i:05d}.rio", records[i], max_chunk_size=400, compressor=Compressor.NONE)
        for i in range(3)
    ]
    bad_path = paths[1]
    index = load_index(bad_path)
    bad_offset = index.chunk_offsets[2]
    bad = records[1][index.first_record(2) : index.first_record(3)]
    raw = bytearray(Path(bad_path).read_bytes())
    raw[bad_offset + 30] ^= 0xFF
    Path(bad_path).write_bytes(bytes(raw))
    good = [r for i in range(3) for r in records[i] if not (i == 1 and r in bad)]
    assert len(good) == 600 - len(bad) and bad
    return Poisoned(
        paths[0].replace("part-00000", "part-*"), bad_path, bad_offset, len(bad), digest_of(good)
    )


def _status(addr: str) -> dict[str, Any]:
    with MasterConnection(addr) as c:
        return c.status()


def _status_text(addr: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "status", "--addr", addr],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def test_within_budget_the_pass_goes_on_without_the_poison_and_says_so(
    rio: Any, master_process: Any, trainers: Any
) -> None:
    ds = _poisoned_dataset(rio)
    m = master_process(
        "--chunk-per-task", "1", "--task-timeout-max", "1", "--failed-policy", "keep",
        "--max-failed-records", "10%", "--task-timeout-dur", "30s",
    )  # fmt: skip
    args = ["--addr", m.addr, "--passes", "2", "--continue-on-read-error"]
    # Both trainers are in from the first task: their sessions are open before the dataset is
    # set (else one could start only once the other had read both passes).
    ts = trainers(2, args)
    wait_for(
        lambda: _status(m.addr)["sessions"] == 2,
        "both trainers' sessions",
        120,
        explain=lambda: ": " + "".join(t.log() for t in ts),
    )
    with MasterConnection(m.addr, timeout=60) as c:
        c.set_dataset([ds.pattern])
    for t in ts:
        assert t.drain() == 0, t.log()
    for p in (0, 1):  # every pass completes without the poison chunk's records, and says so
        total = Digest()
        for t in ts:
            line = t.passes[p]
            total.merge(Digest(int(line["digest"], 16), int(line["records"])))
        assert total == ds.good, f"pass {p}"
        # Status shows the last two passes: a trainer that printed pass 0 only once pass 1 was
        # over cannot see its count, and says so (null), never a made-up 0. The first to start
        # pass 1 printed pass 0 while pass 1 was on.
        said = [t.passes[p]["quarantined"] for t in ts]
        assert ds.bad_records in said and set(said) <= {ds.bad_records, None}, said
    (late,) = trainers(1, args, prefix="late")  # both passes are over: it reads nothing
    assert late.drain() == 0, late.log()
    assert [late.passes[p]["records"] for p in (0, 1)] == [0, 0], late.passes
    assert late.passes[0]["quarantined"] is None, late.passes  # pass 0 is no longer shown
    assert late.passes[1]["quarantined"] == ds.bad_records, late.passes
    # Pass 0: read twice (the limit is 1 failure), then quarantined; pass 1: kept out.
    errors = [e for t in ts for e in t.read_errors.get(0, [])]
    assert len(errors) == 2, errors
    for e in errors:
        assert ds.bad_path in e["read_error"] and f"offset {ds.bad_offset}" in e["read_error"]
        assert "ChecksumError" in e["read_error"]
    assert not any(t.read_errors.get(1) for t in ts)

    st = _status(m.addr)
    assert st["job_stopped"] is None
    (q,) = st["quarantined_tasks"]
    assert q["files"] == [ds.bad_path] and q["records"] == ds.bad_records
    assert q["chunks"] == [
        {"path": ds.bad_path, "offset": ds.bad_offset, "records": ds.bad_records}
    ]
    assert "ChecksumError" in q["reasons"][-1]["reason"]
    assert st["error_budget"]["max_failed_records"] == "10%"
    assert st["error_budget"]["limit"] == 60  # 10% of 600 records
    ledger = {e["pass"]: e for e in st["ledger"]}
    assert ledger[1]["quarantined"] == ds.bad_records  # the kept-out task, in every pass
    text = _status_text(m.addr)
    assert "quarantine 1 task " in text and ds.bad_path in text, text
    assert f"offset {ds.bad_offset}" in text and "STOPPED" not in text, text
    assert f"quarantined {ds.bad_records}" in text, text


def test_over_budget_the_job_stops_naming_the_file_and_a_restart_remembers(
    rio: Any, master_process: Any, trainers: Any
) -> None:
    ds = _poisoned_dataset(rio)
    m = master_process(
        "--chunk-per-task", "1", "--task-timeout-max", "0", "--max-failed-records", "0",
        "--task-timeout-dur", "30s",
    )  # fmt: skip
    addr = m.addr
    args = ["--addr", addr, "--dataset", ds.pattern, "--passes", "2"]
    ts = trainers(2, [*args, "--continue-on-read-error"])
    for t in ts:
        assert t.drain() == 1, t.log()
        log = t.log()
        assert "JobStoppedError: job stopped" in log, log
        assert ds.bad_path in log and "ChecksumError" in log, log
        assert t.passes == {}  # the error, never an ordinary end of pass
    st = _status(addr)
    stop = st["job_stopped"]
    assert stop is not None and stop["records"] == ds.bad_records and stop["limit"] == 0
    assert ds.bad_path in stop["message"] and f"offset(s) {ds.bad_offset}" in stop["message"]
    assert "STOPPED  job stopped" in _status_text(addr)

    m.restart()  # SIGKILL, then the same port and the same embedded store
    assert m.addr == addr
    assert _status(addr)["job_stopped"] == stop
    (late,) = trainers(1, ["--addr", addr, "--passes", "1"], prefix="late")
    assert late.drain() == 1
    assert "JobStoppedError" in late.log() and ds.bad_path in late.log(), late.log()

    # A larger budget decides again: the job goes on, without the poison.
    budget = m.args.index("--max-failed-records") + 1
    m.args[budget] = "100"
    m.restart()
    st = _status(addr)
    assert st["job_stopped"] is None, st
    first = str(st["cur_pass"])
    (after,) = trainers(
        1,
        ["--addr", addr, "--passes", "1", "--first-pass", first, "--continue-on-read-error"],
        prefix="after",
    )
    assert after.drain() == 0, after.log()
    assert after.passes[int(first)]["quarantined"] == ds.bad_records

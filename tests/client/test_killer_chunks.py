"""Chunks that kill their readers, end to end with real processes (issue 19, item 2):

- an inflation bomb (a RecordIO chunk of a few KB that inflates to 32 MiB, far beyond the
  trainers' limit) is reported failed by each trainer that meets it, naming the file, the chunk
  and the sizes; after the failure limit it is quarantined and the trainers finish the pass;
- a task whose readers all die while reading it (trainers SIGKILLed, restarted) is charged for
  each lost holder and quarantined after the limit, and the pass ends;
- a gzip text file that inflates past the master's limit is refused at set_dataset with one line
  naming it, the master holding little memory, and the master serves on.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import bomb_records, one_chunk
from helpers.trainers import digest_of, sample_records

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import DatasetError
from chunkmaster.digest import Digest
from chunkmaster.recordio import Compressor, load_index

TESTS = Path(__file__).resolve().parents[1]


def _status(addr: str) -> dict[str, Any]:
    with MasterConnection(addr) as c:
        return c.status()


def test_an_inflation_bomb_fails_its_readers_naming_it_and_is_quarantined(
    rio: Any, master_process: Any, trainers: Any
) -> None:
    records = {i: sample_records(150, f"f{i}-") for i in range(3)}
    paths = [
        rio(f"part-{i:05d}.rio", records[i], max_chunk_size=400, compressor=Compressor.GZIP)
        for i in range(3)
    ]
    bad = Path(paths[1])
    bomb_offset = bad.stat().st_size
    bomb = one_chunk(bomb_records(32 << 20), Compressor.GZIP)  # 32 MiB of zeros
    with open(bad, "ab") as f:
        f.write(bomb)
    stored = len(bomb) - 20
    assert stored < 128 << 10 and load_index(str(bad)).chunk_offsets[-1] == bomb_offset
    m = master_process(
        "--chunk-per-task", "1", "--task-timeout-max", "2", "--task-timeout-dur", "60s",
        "--failed-policy", "keep",
    )  # fmt: skip
    pattern = paths[0].replace("part-00000", "part-*")
    args = ["--addr", m.addr, "--dataset", pattern, "--passes", "1"]
    ts = trainers(2, [*args, "--continue-on-read-error", "--max-inflated-bytes", "1MiB"])
    for t in ts:
        assert t.drain() == 0, t.log()
    total = Digest()
    for t in ts:
        total.merge(Digest(int(t.passes[0]["digest"], 16), int(t.passes[0]["records"])))
    assert total == digest_of([r for i in range(3) for r in records[i]])  # all but the bomb's
    errors = [e for t in ts for e in t.read_errors.get(0, [])]
    assert len(errors) == 3, errors  # read, failed, 3 times (the limit is 2): quarantined
    for e in errors:
        text = e["read_error"]
        assert f"{bad} chunk at offset {bomb_offset} (32 records)" in text, text
        why = (
            f"InflatedTooLargeError: refused: it inflates to more than 1048576 bytes from {stored}"
        )
        assert why in text, text
    st = _status(m.addr)
    (q,) = st["quarantined_tasks"]
    assert q["chunks"] == [{"path": str(bad), "offset": bomb_offset, "records": 32}]
    assert "InflatedTooLargeError" in q["reasons"][-1]["reason"]
    assert st["cur_pass"] == 1 and st["job_stopped"] is None
    assert {e["pass"]: e for e in st["ledger"]}[0]["quarantined"] == 32


class _Restarted:
    """Dying trainers, each restarted when it dies, until they end the pass themselves."""

    def __init__(self, args: list[str], log_dir: Path) -> None:
        self.args = args
        self.log_dir = log_dir
        self.exits: queue.Queue[tuple[subprocess.Popen[str], int]] = queue.Queue()
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        n = len(self.procs)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]))
        with open(self.log_dir / f"dying{n}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "helpers.dying_trainer", *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                cwd=TESTS,
            )
        self.procs.append(proc)
        threading.Thread(target=lambda: self.exits.put((proc, proc.wait())), daemon=True).start()

    def logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.log_dir.glob("dying*.log")))

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def test_a_task_whose_holders_keep_dying_is_quarantined_and_the_pass_ends(
    rio: Any, master_process: Any, tmp_path: Path
) -> None:
    records = {i: sample_records(60, f"f{i}-") for i in range(3)}
    poison = b"POISON" + bytes(500)  # larger than the chunk bound: a chunk, a task, of its own
    records[1] = [*records[1][:30], poison, *records[1][30:]]
    paths = [
        rio(f"part-{i:05d}.rio", records[i], max_chunk_size=400, compressor=Compressor.NONE)
        for i in range(3)
    ]
    index = load_index(paths[1])
    (k,) = [k for k in range(index.num_chunks) if index.first_record(k) == 30]
    assert index.chunk_records[k] == 1
    m = master_process(
        "--chunk-per-task", "1", "--task-timeout-max", "2", "--trainer-ttl", "1s",
        "--task-timeout-dur", "120s", "--failed-policy", "keep",
    )  # fmt: skip
    pattern = paths[0].replace("part-00000", "part-*")
    fleet = _Restarted([m.addr, pattern, "POISON"], tmp_path)
    deaths = 0
    finished: list[dict[str, Any]] = []
    try:
        for _ in range(2):
            fleet.start()
        while len(finished) < 2:
            try:
                proc, rc = fleet.exits.get(timeout=120)
            except queue.Empty:
                pytest.fail(f"no trainer ended for 120s\n{fleet.logs()}\n{m.log()[-3000:]}")
            if rc == -9:  # it met the poison: it is restarted, as a job's scheduler would
                deaths += 1
                assert deaths <= 8, f"the poison was never quarantined\n{m.log()[-3000:]}"
                fleet.start()
                continue
            assert rc == 0, fleet.logs()
            assert proc.stdout is not None
            finished.append(json.loads(proc.stdout.read()))
    finally:
        fleet.kill()
    assert 3 <= deaths <= 4, deaths  # 3 holders lost while reading it (one more at most:
    # the first death may charge the task finished a moment before, which then finishes)
    st = _status(m.addr)
    assert st["cur_pass"] == 1, st  # the pass ended, without the poison
    (q,) = st["quarantined_tasks"]
    assert q["chunks"] == [{"path": paths[1], "offset": index.chunk_offsets[k], "records": 1}]
    lost = [r["reason"] for r in q["reasons"] if "trainer lost while reading it" in r["reason"]]
    assert len(lost) >= 3 and q["reasons"][-1]["reason"] in lost, q
    led = {e["pass"]: e for e in st["ledger"]}[0]
    assert led["quarantined"] == 1


def test_a_gzip_text_bomb_is_refused_at_set_dataset_and_the_master_serves_on(
    master_process: Any, trainers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUNKMASTER_MAX_INFLATED_BYTES", "1MiB")
    m = master_process()
    bomb = tmp_path / "bomb.txt.gz"
    member = gzip.compress((bytes(1023) + b"\n") * 1024, 9)  # 1 MiB of lines
    bomb.write_bytes(member * 256)  # 256 MiB of lines in ~300 KB
    good = tmp_path / "good.txt"
    good.write_text("".join(f"line {i}\n" for i in range(500)))
    assert m.proc is not None
    before = _peak_rss(m.proc.pid)
    with MasterConnection(m.addr) as c, pytest.raises(DatasetError) as err:
        c.set_dataset([str(bomb)])
    text = str(err.value)
    assert "\n" not in text and str(bomb) in text, text
    assert "refused: it inflates to more than 1048576 bytes" in text, text
    assert m.running
    assert _peak_rss(m.proc.pid) - before < 64 << 20  # it never held the 256 MiB
    assert _status(m.addr)["dataset"] is None  # nothing was set: the next call may set one
    (t,) = trainers(1, ["--addr", m.addr, "--dataset", str(good), "--passes", "1"])
    assert t.drain() == 0, t.log()
    assert t.passes[0]["records"] == 500


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_quarantine_that_ends_the_pass_is_logged_as_a_quarantine(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    """docs/failures.md promises a warning when a task is quarantined. Under the default retry
    policy, the last task of a pass going over the limit ends the pass, and the failed queue
    goes with it: the master logged "dispatching it again" for the task it had quarantined."""
    bad = tmp_path / "bomb.rio"
    bad.write_bytes(one_chunk(bomb_records(4 << 20), Compressor.GZIP))
    m = master_process("--chunk-per-task", "1", "--task-timeout-max", "2")
    args = ["--addr", m.addr, "--dataset", str(bad), "--passes", "1"]
    (t,) = trainers(1, [*args, "--continue-on-read-error", "--max-inflated-bytes", "1MiB"])
    assert t.drain() == 0, t.log()
    assert len(t.read_errors.get(0, [])) == 3, t.log()
    assert _status(m.addr)["cur_pass"] == 1  # the pass ended without it
    lines = [line for line in m.log().splitlines() if "task 0 failed" in line]
    assert len(lines) == 3, m.log()[-3000:]
    assert all("dispatching it again" in line for line in lines[:2]), lines
    last = lines[-1]
    assert "dispatching it again" not in last, last
    assert "over the limit of 2; quarantined: left out of pass 0" in last, last
    assert f"{bad} chunks at offset(s) 0" in last and "InflatedTooLargeError" in last, last
    assert "handed out again in the next pass (--failed-policy retry)" in last, last

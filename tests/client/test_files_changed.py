"""Dataset files regenerated under their names after the master indexed them (hostile review,
item 15), end to end with a real master process and real `chunkmaster read` trainers:

- with another layout (other record sizes), a trainer's read gave RecordOverrunError, charged
  to the task as a bad chunk and quarantined in the end: now it names the file and what changed
  (its size), nothing is charged, and the job stops with that reason;
- a master restarted on its store after a file changed stops the job at start, naming the file
  (the same layout, new records: only its mtime tells), instead of serving the new records.

The same layout read mid-pass by a trainer: tests/client/test_open_files.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import numbered_records

from chunkmaster.client import Client
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import JobStoppedError

DO = "restore the files, or start a new job (another --job or --store) to index them again"


def _status(addr: str) -> dict[str, Any]:
    with MasterConnection(addr) as c:
        return c.status()


def _dataset(tmp_path: Path) -> list[str]:
    """Three files of 20 records, written an hour ago (before the job, as datasets are)."""
    paths = [numbered_records(tmp_path / f"part-{i}.rio", 20, b"f%d-%%03d" % i) for i in range(3)]
    hour_ago = time.time_ns() - 3600 * 10**9
    for p in paths:
        os.utime(p, ns=(hour_ago, hour_ago))
    return paths


def _index(addr: str, pattern: str) -> None:
    with Client(addr) as c:
        c.set_dataset([pattern])  # the master indexes the files; nothing is read


def test_a_file_rewritten_with_another_layout_stops_the_job_naming_it_not_a_bad_chunk(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    paths = _dataset(tmp_path)
    m = master_process("--chunk-per-task", "2", "--task-timeout-max", "1")
    pattern = str(tmp_path / "part-*.rio")
    _index(m.addr, pattern)
    size = os.stat(paths[1]).st_size
    numbered_records(Path(paths[1]), 20, b"regenerated-%05d")  # longer records
    new_size = os.stat(paths[1]).st_size
    args = ["--addr", m.addr, "--dataset", pattern, "--passes", "1"]
    (t,) = trainers(1, [*args, "--continue-on-read-error"])
    assert t.drain() != 0  # the job stopped
    log = t.log()
    changed = f"dataset file changed after the master indexed it: {paths[1]}: size {size} -> "
    assert changed + f"{new_size} bytes" in log, log
    assert DO in log and "RecordOverrunError" not in log, log
    st = _status(m.addr)
    stop = st["job_stopped"]
    assert stop is not None and changed in stop["message"] and DO in stop["message"], stop
    assert stop["tasks"] == [] and st["quarantined_tasks"] == [], st
    assert "RecordOverrunError" not in m.log() and "dispatching it again" not in m.log()
    with Client(m.addr) as late, pytest.raises(JobStoppedError, match=changed):
        list(late.records(0))


def test_a_master_restarted_after_a_file_changed_stops_the_job_naming_it(
    tmp_path: Path, master_process: Any
) -> None:
    paths = _dataset(tmp_path)
    m = master_process("--chunk-per-task", "2")
    pattern = str(tmp_path / "part-*.rio")
    _index(m.addr, pattern)
    m.kill()
    size = os.stat(paths[2]).st_size
    numbered_records(Path(paths[2]), 20, b"g2-%03d")  # the same layout, other records
    assert os.stat(paths[2]).st_size == size
    m.start()
    stop = _status(m.addr)["job_stopped"]
    assert stop is not None, m.log()[-3000:]
    message = stop["message"]
    assert "1 dataset file(s) changed after the master indexed them (found when the master " in (
        message
    )
    assert f"{paths[2]}: modified at" in message and DO in message, message
    assert paths[0] not in message and paths[1] not in message, message
    assert f"{paths[2]}: modified at" in m.log(), m.log()[-3000:]
    with Client(m.addr) as c, pytest.raises(JobStoppedError, match=f"{paths[2]}: modified at"):
        list(c.records(0))

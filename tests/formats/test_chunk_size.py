"""Enough tasks by default, a chunk size a data checkpoint keeps, and a warning when trainers
outnumber the tasks (issue 18, item 6).

Before, a 1 MB JSON Lines file was one 4 MiB-bounded chunk, so 20,000 rows were one task: one
trainer read everything, the other nothing, and nothing said why.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import write_records
from helpers.formats import digest_of, write_jsonl
from helpers.status_view import status_view
from helpers.trainers import wait_until_holding

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core import checkpoint
from chunkmaster.digest import Digest
from chunkmaster.master.service import Service
from chunkmaster.store.memory import InMemStore


def one_mb_of_json_lines(path: Path) -> list[Any]:
    """20,000 rows of ~50 bytes: the issue's file."""
    rows = [{"i": i, "text": f"row {i:06d} of it", "ok": i % 2 == 0} for i in range(20000)]
    write_jsonl(path, rows)
    assert 900_000 < path.stat().st_size < 1_100_000
    return rows


def test_a_1mb_json_lines_file_makes_several_tasks_and_two_trainers_both_read(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    rows = one_mb_of_json_lines(tmp_path / "rows.jsonl")
    m = master_process("--trainer-ttl", "60s")  # the stopped trainer keeps its session
    with MasterConnection(m.addr, timeout=60) as c:
        c.set_dataset([str(tmp_path / "rows.jsonl")])
        st = c.status()
    assert st["num_tasks"] >= 3, st["dataset"]  # default flags: several tasks
    assert st["dataset"]["chunk_size"] == 32 << 10
    args = ["--addr", m.addr, "--passes", "1"]
    (first,) = trainers(1, [*args, "--step-time", "0.0002"], prefix="first")
    wait_until_holding(m.addr, first.proc.pid, 1)
    # Stopped while it holds at most 2 tasks: the others are left for the second trainer,
    # however fast or slow either starts.
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        (second,) = trainers(1, args, prefix="second")
        line = second.next_line()  # it completed a task of its own
        assert line is not None and line["records"] > 0, line
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    assert first.drain() == 0, first.log()
    assert second.drain() == 0, second.log()
    got = [t.passes[0] for t in (first, second)]
    assert all(p["records"] > 0 for p in got), got  # both trainers read
    total = Digest()
    for p in got:
        total.merge(Digest(int(p["digest"], 16), int(p["records"])))
    assert total == digest_of(rows)  # every row once


def wait_sessions(addr: str, n: int, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with MasterConnection(addr) as c:
        while time.monotonic() < deadline:
            st = c.status()
            if st["sessions"] >= n:
                return st
            time.sleep(0.02)
    pytest.fail(f"never {n} sessions: {st}")


def test_status_warns_when_three_trainers_share_a_two_task_pass(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    path = write_records(tmp_path / "a.rio", [b"x" * 40] * 200, max_chunk_size=400)
    m = master_process("--chunk-per-task", "10")  # the master would choose a chunk a task
    with MasterConnection(m.addr, timeout=60) as c:
        c.set_dataset([str(path)])
        assert status_view(c.status()).num_tasks == 2
    # Slow trainers: the pass is not over while the status is read.
    trainers(3, ["--addr", m.addr, "--passes", "1", "--step-time", "1"])
    st = wait_sessions(m.addr, 3)
    (warning,) = st["warnings"]
    assert "pass 0 has 2 tasks for 3 trainers (sessions)" in warning
    assert "1 of them get nothing to read" in warning
    assert "--chunk-per-task (now 10)" in warning and "--max-chunk-size" in warning
    text = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "status", "--addr", m.addr],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"WARNING  {warning}" in text.stdout.splitlines(), text.stdout
    js = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "status", "--addr", m.addr, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(js.stdout)["warnings"] == [warning]
    assert m.wait_log("WARNING chunkmaster.service: pass 0 has 2 tasks for 3 trainers")
    assert m.log().count("tasks for 3 trainers") == 1  # once, not at every message


def test_the_warning_names_the_chunk_size_of_the_formats_the_master_cuts(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"i": i} for i in range(100)])

    async def main() -> None:
        svc = Service(InMemStore(), chunks_per_task=1, timeout_dur=60, chunk_size=1 << 20)
        await svc.start()
        try:
            await svc.set_dataset([str(tmp_path / "a.jsonl")])
            assert svc.few_tasks() is None
            for i in range(2):
                await svc.open_session("", f"t{i}", "h", i, 0)
            warning = svc.few_tasks()
            assert warning is not None and "1 task for 2 trainers" in warning
            assert "a smaller --chunk-size (now 1MiB)" in warning
            assert "--chunk-per-task" not in warning  # it is 1 already
            assert svc.status()["warnings"] == [warning]
        finally:
            await svc.close()

    asyncio.run(main())


def test_a_data_checkpoint_cut_at_another_chunk_size_is_refused_clearly(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"i": i, "s": "x" * (i % 50)} for i in range(400)])
    pattern = str(tmp_path / "a.jsonl")

    async def checkpoint_at(chunk_size: int) -> bytes:
        svc = Service(InMemStore(), chunks_per_task=1, timeout_dur=60, chunk_size=chunk_size)
        await svc.start()
        try:
            await svc.set_dataset([pattern])
            return await svc.data_checkpoint()
        finally:
            await svc.close()

    async def restore(blob: bytes, chunk_size: int | None) -> bool:
        svc = Service(InMemStore(), chunks_per_task=1, timeout_dur=60, chunk_size=chunk_size)
        await svc.start()
        try:
            return await svc.restore(blob)
        finally:
            await svc.close()

    blob = asyncio.run(checkpoint_at(1024))
    assert checkpoint.decode(blob).dataset.chunk_size == 1024
    (tmp_path / "job.ckpt").write_bytes(blob)
    shown = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "checkpoint", "show", str(tmp_path / "job.ckpt")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "1 jsonl file, " in shown.stdout and " chunks of up to 1KiB, " in shown.stdout
    with pytest.raises(checkpoint.CheckpointError) as err:
        asyncio.run(restore(blob, 2048))
    assert str(err.value) == (
        "chunk size changed: the data checkpoint's jsonl chunks were cut at 1KiB, this master "
        "cuts them at 2KiB, which makes other chunks and tasks. Start the master with "
        "--chunk-size 1KiB to restore it"
    )
    assert asyncio.run(restore(blob, 1024))

    # A checkpoint from before chunk sizes were recorded was cut at 4 MiB: a master at the
    # new default says to start it at 4 MiB, and one started so restores it.
    cp = checkpoint.decode(asyncio.run(checkpoint_at(4 << 20)))
    legacy = checkpoint.encode(replace(cp, dataset=replace(cp.dataset, chunk_size=None)))
    assert b"chunk_size" not in legacy
    with pytest.raises(checkpoint.CheckpointError, match="it records none") as err:
        asyncio.run(restore(legacy, None))
    assert "cut at 4MiB" in str(err.value) and "--chunk-size 4MiB" in str(err.value)
    assert asyncio.run(restore(legacy, 4 << 20))

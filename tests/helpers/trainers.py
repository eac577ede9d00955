"""Shared by the client tests: datasets, digests, trainer processes."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from chunkmaster.digest import Digest, file_digest


def sample_records(n: int, tag: str = "") -> list[bytes]:
    """Binary records with NUL bytes, of varying length; record 0 is empty."""
    out = [b""]
    for i in range(1, n):
        out.append(f"{tag}{i}".encode() + b"\x00" * (i % 5) + bytes(range(i % 50)))
    return out


def digest_of(records: Sequence[bytes]) -> Digest:
    d = Digest()
    for r in records:
        d.add(r)
    return d


class Trainer:
    """A `chunkmaster read --json --task-lines` process; its lines arrive on a queue."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.tasks: dict[int, list[dict[str, Any]]] = {}
        self.passes: dict[int, dict[str, Any]] = {}
        self.read_errors: dict[int, list[dict[str, Any]]] = {}  # --continue-on-read-error
        self.log_path = log_dir / f"{name}.log"
        # faulthandler: a trainer that hangs is stopped with SIGABRT, its threads' stacks in its log
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chunkmaster", "read", "--json", "--task-lines", *args],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(json.loads(raw))
        self.lines.put(None)

    def next_line(self, timeout: float = 60.0) -> dict[str, Any] | None:
        """The next output line (recorded), None at exit; fails the test after `timeout`."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.dump_stacks()
            pytest.fail(f"{self.name}: no output for {timeout}s; log:\n{self.log()}")
        if line is not None:
            p = int(line["pass"])
            if "read_error" in line:
                self.read_errors.setdefault(p, []).append(line)
            elif "task" in line:
                self.tasks.setdefault(p, []).append(line)
            else:
                self.passes[p] = line
        return line

    def drain(self, timeout: float = 90.0) -> int:
        """Read every line until the process exits; returns its exit status."""
        while self.next_line(timeout) is not None:
            pass
        return self.proc.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text()

    def dump_stacks(self) -> None:
        """A hung trainer: SIGABRT makes faulthandler write every thread's stack to its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def completed_tasks(trainers: Sequence[Trainer], p: int) -> dict[int, dict[str, Any]]:
    """Task id -> task line, over every trainer's completed tasks of pass p."""
    out: dict[int, dict[str, Any]] = {}
    for t in trainers:
        for line in t.tasks.get(p, []):
            out[int(line["task"])] = line
    return out


def covered(tasks: dict[int, dict[str, Any]], records: Sequence[Any]) -> Digest:
    """The digest of a pass's records covered by its completed tasks (`completed_tasks`),
    the dataset's `records` in task order (no shuffle): each task line's records, and the
    records before its `start` (a task handed out again starts where the previous holder's
    last progress report said it got: that holder consumed those)."""
    d = Digest()
    first = 0
    for task_id in sorted(tasks):
        line = tasks[task_id]
        start = int(line.get("start", 0))
        d.merge(Digest(int(line["digest"], 16), int(line["records"])))
        for r in records[first : first + start]:
            d.add(r)
        first += start + int(line["records"])
    return d


def sum_lines(lines: Sequence[dict[str, Any]]) -> Digest:
    d = Digest()
    for line in lines:
        d.merge(Digest(int(line["digest"], 16), int(line["records"])))
    return d


def dataset_digest(paths: Sequence[str]) -> Digest:
    d = Digest()
    for p in paths:
        d.merge(file_digest(p))
    return d


def wait_until_holding(addr: str, pid: int, n: int, timeout: float = 30.0) -> None:
    """Wait until the trainer process `pid` holds `n` durable pending tasks on the master.

    A trainer holding its current task and its prefetched one has no GetTask in flight, so a
    SIGKILL then cannot hit the master between applying a dispatch and arming its timer.
    """
    from chunkmaster.client.connection import MasterConnection

    deadline = time.monotonic() + timeout
    with MasterConnection(addr) as c:
        while time.monotonic() < deadline:
            st = c.status()
            mine = [p for p in st["pending_tasks"] if f":{pid}:" in p["worker"]]
            if len(mine) >= n and st["store"]["durable_seq"] == st["store"]["seq"]:
                c.status()  # one more round trip: the dispatch's timer is armed by now
                return
            threading.Event().wait(0.005)
    pytest.fail(f"trainer {pid} never held {n} tasks: {st}")

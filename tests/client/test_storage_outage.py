"""A storage outage in the middle of a pass, under trainer processes with sessions (issue 19,
item 3): the finishes they send while the master refuses writes are sent again, with backoff,
until the master applies them, so no task times out and no record is delivered twice.

The master is a real process whose store lives on a real 4 MiB tmpfs, filled up mid-pass and
freed again; the trainers are real processes (tests/helpers/session_trainer.py) logging every
record they take, so every check is on exact sets.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import write_records
from helpers.full_disk import fill
from helpers.master_process import MasterProcess
from helpers.session_trainer_process import SessionTrainerProcess
from helpers.status_view import status_view
from helpers.waits import wait_for

from chunkmaster.client.connection import MasterConnection

RECORDS = 600
CHUNKS_PER_TASK = 10  # one record a chunk: task k is records 10k .. 10k+9


class SessionTrainer(SessionTrainerProcess):
    """A session_trainer.py process named `name`, its files in `tmp`."""

    def __init__(self, name: str, addr: str, tmp: Path, *args: str) -> None:
        super().__init__(tmp / f"{name}.out", "--addr", addr, "--name", name, *args)
        self.name = name

    def tasks(self) -> tuple[set[int], set[int]]:
        """The tasks this trainer started reading, and those it read whole."""
        got = Counter(r // CHUNKS_PER_TASK for r in self.records())
        return set(got), {k for k, n in got.items() if n == CHUNKS_PER_TASK}

    def committing(self, commit_every: int) -> bool:
        """Whether it waits for a commit (--commit-every)."""
        lines = self.lines()
        taken = sum(ln[0] == "r" for ln in lines)
        commits = sum(ln[0] == "c" for ln in lines)
        return commit_every > 0 and commits < taken // commit_every

    def stuck(self, commit_every: int) -> bool:
        """Whether it can read no further while the master takes no change: it read every
        task it started to the end (it gets no more), or it waits for a commit."""
        started, whole = self.tasks()
        return started <= whole or self.committing(commit_every)


def held_by(status: dict[str, Any], name: str) -> set[int]:
    return {p["id"] for p in status["pending_tasks"] if p["worker"] == name}


@pytest.mark.parametrize("commit_every", [0, 25], ids=["no-commits", "commits"])
def test_finishes_sent_while_the_disk_is_full_are_applied_once_it_is_not(
    tmp_path: Path, small_fs: Path, commit_every: int
) -> None:
    data = write_records(
        tmp_path / "data.rio", [b"%06d" % i for i in range(RECORDS)], max_chunk_size=1
    )
    args = ["--store", str(small_fs / "state.db"), "--task-timeout-dur", "5s"]
    args += ["--chunk-per-task", str(CHUNKS_PER_TASK)]
    master = MasterProcess(args, log_path=tmp_path / "master.log").start()
    read_args = ["--passes", "1", "--step-time", "0.01", "--report-every", "5"]
    read_args += ["--commit-every", str(commit_every)]
    trainers: list[SessionTrainer] = []
    try:
        assert master.addr is not None
        trainers.append(
            SessionTrainer("t0", master.addr, tmp_path, *read_args, "--dataset", str(data))
        )
        trainers += [SessionTrainer(f"t{i}", master.addr, tmp_path, *read_args) for i in (1, 2)]
        with MasterConnection(master.addr) as c:
            wait_for(lambda: sum(len(t.records()) for t in trainers) >= 100, "100 records read")
            filler = fill(small_fs)
            wait_for(lambda: not status_view(c.status()).store.healthy, "the store to fail a write")
            # The trainers read on to the end of the tasks they hold (they get no more while
            # the master refuses writes) or to their next commit: the finishes (and commits)
            # they send go to a master that refuses them. (A task the store holds as theirs
            # may not have reached them: a batch whose last dispatch's write failed is
            # refused whole.)
            st = c.status()
            held = set().union(*(held_by(st, t.name) for t in trainers))
            before = set().union(*(t.tasks()[1] for t in trainers))

            def stuck() -> bool:
                whole = set().union(*(t.tasks()[1] for t in trainers))
                sent = bool((held & whole) - before)  # a finish, at least, went meanwhile
                sent = sent or any(t.committing(commit_every) for t in trainers)  # or a commit
                return sent and all(t.stuck(commit_every) for t in trainers)

            wait_for(stuck, "the trainers to read what they can")
            since = time.monotonic()

            def heard_since() -> bool:  # every trainer said something after its last finish
                for t in trainers:
                    assert t.proc.poll() is None, f"{t.name} exited:\n{t.log.read_text()}"
                s = c.status()
                assert not s["store"]["healthy"], "the store must still refuse writes here"
                gone = time.monotonic() - since
                return all(tr["last_heard_s"] < gone for tr in s["trainers"])

            wait_for(heard_since, "every trainer to talk to the master again")
            filler.unlink()
            for t in trainers:
                t.wait(120.0)
            st = c.status()
        taken = Counter(r for t in trainers for r in t.records())
        twice = sorted(r for r, n in taken.items() if n > 1)
        assert not twice, f"{len(twice)} records delivered twice: {twice[:20]}..."
        assert set(taken) == set(range(RECORDS))
        (pass0,) = [led for led in st["ledger"] if led["pass"] == 0]
        assert pass0["redispatched"].get("timeout", 0) == 0, pass0
        assert st["cur_pass"] == 1 and st["tasks_with_failures"] == 0, st
    finally:
        for t in trainers:
            t.kill()
        master.kill()

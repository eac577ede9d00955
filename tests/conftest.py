"""Shared fixtures: puts tests/ on the path for `helpers`; the real etcd server, master
processes on the embedded store, `chunkmaster read` trainer processes, and a small filesystem to
fill up (`small_fs`)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from collections.abc import Iterator, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from helpers.etcd_server import etcd_server  # noqa: E402, F401
from helpers.full_disk import small_fs  # noqa: E402, F401
from helpers.master_process import MasterProcess  # noqa: E402
from helpers.trainers import Trainer  # noqa: E402


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[Any]:
    """trainers(n, args) -> [Trainer] (`chunkmaster read` processes); SIGKILLed at teardown."""
    made: list[Trainer] = []

    def start(n: int, args: Sequence[str], prefix: str = "trainer") -> list[Trainer]:
        new = [Trainer(f"{prefix}{len(made) + i}", args, tmp_path) for i in range(n)]
        made.extend(new)
        return new

    yield start
    for t in made:
        t.kill()


@pytest.fixture
def master_process(tmp_path: Path) -> Iterator[Any]:
    """master_process(*args) -> a started MasterProcess on the embedded store; killed after."""
    made: list[MasterProcess] = []

    def start(*args: str) -> MasterProcess:
        m = MasterProcess(
            ["--store", str(tmp_path / f"state{len(made)}.db"), *args],
            log_path=tmp_path / f"master{len(made)}.log",
        ).start()
        made.append(m)
        return m

    yield start
    for m in made:
        m.kill()

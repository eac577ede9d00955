"""Fixtures for the format tests: real master processes and `chunkmaster read` trainers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.master_process import MasterProcess
from helpers.trainers import Trainer


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[Any]:
    """trainers(n, args) -> [Trainer]; every process is SIGKILLed at teardown."""
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

"""Fixtures for the object store tests: one moto S3 server per session (a real HTTP server on
loopback, in its own process), emptied before each test."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.s3_server import S3Server
from helpers.trainers import Trainer


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: S3Server) -> Iterator[S3Server]:
    """The server, empty, with a bucket `data`."""
    s3_server.reset()
    s3_server.fs().mkdir("data")
    yield s3_server


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[Any]:
    """trainers(n, args, env) -> [Trainer] (`chunkmaster read` processes); SIGKILLed after."""
    made: list[Trainer] = []

    def start(n: int, args: Sequence[str], prefix: str = "trainer") -> list[Trainer]:
        new = [Trainer(f"{prefix}{len(made) + i}", args, tmp_path) for i in range(n)]
        made.extend(new)
        return new

    yield start
    for t in made:
        t.kill()

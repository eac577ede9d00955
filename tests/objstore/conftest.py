"""Fixtures for the object store tests: one moto S3 server per session (a real HTTP server on
loopback, in its own process), emptied before each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.s3_server import S3Server


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

"""Fixtures for the client tests: real RecordIO files (masters and trainer processes come from
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import write_records

from chunkmaster.recordio import Compressor


@pytest.fixture
def rio(tmp_path: Path) -> Any:
    """rio(name, records, max_chunk_size=..., compressor=...) -> path string."""

    def make(
        name: str,
        records: Sequence[bytes],
        max_chunk_size: int = 300,
        compressor: Compressor = Compressor.SNAPPY,
    ) -> str:
        path = tmp_path / name
        return str(
            write_records(path, records, max_chunk_size=max_chunk_size, compressor=compressor)
        )

    return make

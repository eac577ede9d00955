"""A small real filesystem to fill up: a store whose disk is full (tests/store, tests/client)."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, to be filled up for real; skipped where mounting is not permitted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot run mount here ({exc}): a full-disk test needs a small filesystem")
    if done.returncode != 0:
        pytest.skip(
            f"mounting a small tmpfs is not permitted here ({done.stderr.strip()}): a "
            "full-disk test needs a small filesystem"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem is full."""
    filler = directory / "filler"
    block = b"\0" * 65536
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    # fill the last partial block too
    with open(filler, "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler

"""A small real filesystem to fill up: a store whose disk is full (tests/store, tests/client)."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class SmallDisk:
    """A tmpfs of `size` mounted on `mnt`, to be filled up for real (`fill`, `empty`). Mounting
    needs root: where it is not permitted, `ok` is False and `why` says what mount answered."""

    def __init__(self, mnt: Path, size: str) -> None:
        self.mnt = mnt
        mnt.mkdir(mode=0o700, exist_ok=True)
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.ok, self.why = False, f"cannot run mount here: {exc}"
        else:
            self.ok, self.why = done.returncode == 0, done.stderr.strip()

    def fill(self) -> Path:
        return fill(self.mnt)

    def empty(self) -> None:
        (self.mnt / "filler").unlink(missing_ok=True)

    def unmount(self) -> None:
        if self.ok:
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, timeout=30)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, to be filled up for real; skipped where mounting is not permitted."""
    disk = SmallDisk(tmp_path / "small", "4m")
    if not disk.ok:
        pytest.skip(
            f"mounting a small tmpfs is not permitted here ({disk.why}): a full-disk test "
            "needs a small filesystem"
        )
    try:
        yield disk.mnt
    finally:
        disk.unmount()


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

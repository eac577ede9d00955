"""Reading a data checkpoint file (`--restore FILE`, `chunkmaster checkpoint show FILE`).

A file is read in steps, each bounded by what the one before it proved: the fixed header (its
size must be the file's), the JSON header (at most `checkpoint.MAX_HEAD_SIZE`, and its fields
in range), then the sections, which by then cannot exceed what the header's tasks allow. So a
file a gigabyte too long, or whose header claims a body its tasks could not fill, is refused
after a few bytes, never read whole; a FIFO or a device is refused before it is opened.
"""

from __future__ import annotations

import os
from typing import IO

from chunkmaster.core import checkpoint
from chunkmaster.core.checkpoint import CheckpointError
from chunkmaster.recordio.errors import NotRegularFileError
from chunkmaster.recordio.source import open_regular


def read_checkpoint(path: str) -> bytes:
    """The bytes of the data checkpoint at `path`, to `checkpoint.decode`; CheckpointError
    (the caller names the file) if it cannot be read or its first bytes already refuse it."""
    try:
        with open_regular(path, "rb") as f:
            return load(f, os.fstat(f.fileno()).st_size)
    except NotRegularFileError as exc:
        raise CheckpointError(
            f"it is a {exc.kind}, not a regular file: give the data checkpoint's file"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read it: {exc.strerror or exc}") from None


def load(f: IO[bytes], size: int) -> bytes:
    """Read a checkpoint of `size` bytes from `f`, refusing it as soon as what is read shows
    it cannot be one (`checkpoint.check_prefix`, `checkpoint.check_head`)."""
    prefix = _read(f, min(size, checkpoint.PREFIX_SIZE))
    head = _read(f, checkpoint.check_prefix(prefix, size))
    checkpoint.check_head(prefix, head)
    blob = bytearray(size)
    blob[: len(prefix)] = prefix
    blob[len(prefix) : len(prefix) + len(head)] = head
    view = memoryview(blob)[len(prefix) + len(head) :]
    while view:
        n = f.readinto(view)  # type: ignore[attr-defined]
        if not n:
            raise CheckpointError("the file shrank while it was read; read it again")
        view = view[n:]
    if f.read(1):
        raise CheckpointError("the file grew while it was read; read it again")
    return bytes(blob)


def _read(f: IO[bytes], n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError("the file shrank while it was read; read it again")
    return data

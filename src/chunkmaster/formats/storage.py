"""Where dataset files are read from: local paths here, URLs through fsspec (remote.py).

Formats never open files themselves; they ask the `Storage` that `storage_for(path)` gives, so
one format reads local files and object-store objects alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import IO, Any

from chunkmaster.formats.base import Storage
from chunkmaster.recordio.source import open_regular
from chunkmaster.remote import is_remote, local_path


class LocalStorage:
    """Local regular files: opened with `open_regular` (never blocks on a FIFO or a device),
    ranges read with `os.pread` on one descriptor (no seek, so threads may share it)."""

    def open(self, path: str) -> IO[bytes]:
        return open_regular(local_path(path), "rb")

    def size(self, path: str) -> int:
        return os.stat(local_path(path)).st_size

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        with self.open(path) as f:
            return pread_ranges(f.fileno(), ranges)


def pread_ranges(fd: int, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of each (offset, length) of the open file `fd`, short at its end."""
    out: list[bytes] = []
    for offset, length in ranges:
        data = os.pread(fd, length, offset)
        if len(data) < length:  # pread may return short before the end: go on
            parts = [data]
            got = len(data)
            while got < length:
                more = os.pread(fd, length - got, offset + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        out.append(data)
    return out


LOCAL = LocalStorage()


def storage_for(
    path: str, storage_options: Mapping[str, Any] | None = None, local: Storage = LOCAL
) -> Storage:
    """The storage that reads `path`: `local` for local files (a trainer's keeps them open,
    client/files.py), or an fsspec filesystem for a URL (`storage_options` go to it:
    credentials, endpoint; never logged)."""
    if not is_remote(path):
        return local
    from chunkmaster.remote import shared

    return shared(storage_options)  # one per options: listings' sizes, connection pools

"""Local dataset files kept open across a pass's chunks, a bounded number at a time.

Opening a file per chunk (stat, open, fstat, close: ~70 us in Python) cost a trainer of
one-chunk tasks more than reading the chunk. `OpenFiles` is the trainer's `Storage` for local
paths: a chunk of a file it holds open is read through the same descriptor.

- **Bounded**: at most `limit` descriptors; the least recently used is closed to open another.
- **A clear lifetime**: the client closes them all when a pass ends or is abandoned, and on
  close(); a pass that follows reopens what it needs.
- **Never stale**: every `open` stats the path and reopens it when it names another file than
  the descriptor (another device or inode: the file was replaced, as a rename over it does),
  and the descriptor is unbuffered, so every read goes to the file itself: a file rewritten in
  place reads as a fresh open would. A path that is gone raises FileNotFoundError, as a fresh
  open would, and its descriptor is closed. Whether the file is still the one the master
  indexed (its size and mtime) is checked before each chunk is read (formats/changed.py).

One reader at a time: the client's pass buffer reads chunks under the client's lock (its own
lock guards only the table of descriptors).
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import IO, cast

from chunkmaster.closing import Closing
from chunkmaster.formats.storage import LocalStorage, pread_ranges
from chunkmaster.recordio.source import open_regular
from chunkmaster.remote import local_path

DEFAULT_OPEN_FILES = 16
"""Descriptors a client keeps open at most (a task's chunks usually lie in one file)."""


class _Borrowed(Closing):
    """The cached descriptor as a file the caller may `close()` (a no-op: the cache owns it)."""

    __slots__ = ("fileno", "name", "read", "readinto", "seek", "seekable", "tell")

    def __init__(self, raw: io.FileIO, name: str) -> None:
        self.name = name
        self.read = raw.read
        self.readinto = raw.readinto
        self.seek = raw.seek
        self.tell = raw.tell
        self.seekable = raw.seekable
        self.fileno = raw.fileno

    def close(self) -> None:
        pass


class _Open:
    __slots__ = ("borrowed", "identity", "raw")

    def __init__(self, raw: io.FileIO, identity: tuple[int, int], name: str) -> None:
        self.raw = raw
        self.identity = identity
        self.borrowed = _Borrowed(raw, name)


class OpenFiles(LocalStorage):
    """Local files held open for a trainer's chunks (see the module's text)."""

    def __init__(self, limit: int = DEFAULT_OPEN_FILES) -> None:
        if limit < 1:
            raise ValueError(f"open files limit must be 1 or more, not {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _Open] = OrderedDict()
        self.opened = 0  # files opened so far (reopens included): what the tests count

    def open(self, path: str) -> IO[bytes]:
        """The open file of `path`, at its start; closing it leaves it open here."""
        entry = self._entry(path)
        entry.raw.seek(0)
        return cast(IO[bytes], entry.borrowed)

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The ranges of `path`, one pread each on its open descriptor."""
        return pread_ranges(self._entry(path).raw.fileno(), ranges)

    def _entry(self, path: str) -> _Open:
        """`path`'s open file, (re)opened unless the one held is the file there now."""
        local = local_path(path)
        try:
            st = os.stat(local)
        except OSError:
            self._forget(path)
            raise
        with self._lock:
            entry = self._files.get(path)
            if entry is not None and entry.identity == (st.st_dev, st.st_ino):
                self._files.move_to_end(path)
                return entry
        self._forget(path)  # replaced on disk: the old descriptor reads the old file
        raw = _open_raw(local)
        fst = os.fstat(raw.fileno())
        entry = _Open(raw, (fst.st_dev, fst.st_ino), path)
        with self._lock:
            self.opened += 1
            self._files[path] = entry
            while len(self._files) > self.limit:
                _, old = self._files.popitem(last=False)
                old.raw.close()
        return entry

    @property
    def held(self) -> int:
        """Descriptors open now."""
        with self._lock:
            return len(self._files)

    def close(self) -> None:
        """Close every descriptor (the pass ended, or the client closes); usable again after."""
        with self._lock:
            files = list(self._files.values())
            self._files.clear()
        for entry in files:
            entry.raw.close()

    def _forget(self, path: str) -> None:
        with self._lock:
            entry = self._files.pop(path, None)
        if entry is not None:
            entry.raw.close()


def _open_raw(path: str) -> io.FileIO:
    """`open_regular`'s checks (never a FIFO or a device), unbuffered."""
    f = open_regular(path, "rb")
    if not isinstance(f, io.BufferedReader):  # pragma: no cover - open_regular's "rb" is one
        f.close()
        raise TypeError(f"{path}: expected a buffered reader from open_regular")
    raw = f.detach()
    assert isinstance(raw, io.FileIO)
    return raw

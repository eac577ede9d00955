"""Opening what callers hand us: a local path, an fsspec URL, or an already open binary file."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Union

from chunkmaster.recordio.errors import NotRegularFileError
from chunkmaster.remote import is_remote, local_path, shared

Source = Union[str, "os.PathLike[str]", IO[bytes], Any]
"""A path (str/PathLike), a URL with a scheme (fsspec), or a binary file object."""


@dataclass
class Opened:
    """An open binary file plus what error messages and offset arithmetic need."""

    file: Any  # IO[bytes]-like; fsspec files are not typed
    name: str
    base: int  # position of the first chunk header (offsets in an Index are relative to it)


def describe(source: Source) -> str:
    """The name used in error messages: the path/URL, else repr of the file object's name."""
    if isinstance(source, str | os.PathLike):
        return os.fsdecode(source)
    name = getattr(source, "name", None)
    return repr(name) if name is not None else repr(source)


@contextmanager
def open_source(source: Source, mode: str = "rb") -> Iterator[Opened]:
    """Open `source` for binary reading or writing; close it afterwards only if we opened it.

    A URL is read as every dataset URL is, through `chunkmaster.remote` (`file://` is a local
    path). A missing local file raises FileNotFoundError unchanged (an I/O problem, not
    corruption); a local path that is not a regular file raises NotRegularFileError (see
    `open_regular`).
    """
    name = describe(source)
    if isinstance(source, str | os.PathLike):
        path = os.fsdecode(source)
        f: Any
        if not is_remote(path):
            # Large reads bypass the buffer; the buffer only serves 20-byte header reads.
            f = open_regular(local_path(path), mode)
        elif mode == "rb":
            f = shared().open(path)
        else:
            import fsspec  # lazy: importing fsspec costs ~50 ms and most callers use paths

            f = fsspec.open(path, mode).open()
        try:
            yield Opened(f, name, 0)
        finally:
            f.close()
        return
    if not (hasattr(source, "read") or hasattr(source, "write")):
        raise TypeError(f"expected a path, URL or binary file object, got {type(source).__name__}")
    base = 0
    try:
        if source.seekable():
            base = source.tell()
    except (AttributeError, OSError, ValueError):
        base = 0
    yield Opened(source, name, base)


_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def _require_regular(path: str, st_mode: int) -> None:
    if not stat.S_ISREG(st_mode):
        kind = next((name for test, name in _KINDS if test(st_mode)), "special file")
        raise NotRegularFileError(path, kind)


def open_regular(path: str, mode: str) -> IO[bytes]:
    """Open a local regular file ("rb" or "wb"); refuse anything else before it can block.

    `open()` of a FIFO with no writer blocks for ever and a device can be read for ever, so
    the path is stat-ed first, then opened non-blocking and checked again on the open file
    (in case it was replaced in between) before blocking mode is restored.
    A missing file raises FileNotFoundError unchanged when reading; writing creates it.
    """
    try:
        _require_regular(path, os.stat(path).st_mode)
    except FileNotFoundError:
        if mode != "wb":
            raise
    flags = os.O_RDONLY if mode == "rb" else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        _require_regular(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        return open(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def file_size(f: Any) -> int | None:
    """Total size of `f` in bytes, or None when it cannot be known (a pipe)."""
    try:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode):
            return st.st_size
        return None  # a pipe or a device: st_size means nothing
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    try:
        if not f.seekable():
            return None
        here = f.tell()
        end = int(f.seek(0, os.SEEK_END))
        f.seek(here)
        return end
    except (AttributeError, OSError, ValueError):
        return None


def read_exact(f: Any, n: int) -> bytes:
    """Read n bytes (fewer only at end of file) with one call in the normal case.

    Loops only on short reads, which raw streams and pipes may return before the end.
    """
    data = f.read(n)
    if data is None:
        data = b""
    if len(data) == n or not data:
        return data if type(data) is bytes else bytes(data)
    parts = [bytes(data)]
    got = len(data)
    while got < n:
        more = f.read(n - got)
        if not more:
            break
        parts.append(bytes(more))
        got += len(more)
    return b"".join(parts)

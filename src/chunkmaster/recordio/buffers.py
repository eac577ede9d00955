"""Chunk read buffers: page-aligned, kept between chunks and between scans.

Two costs are avoided. A fresh 32 MiB buffer costs ~8,000 page faults before the first byte
lands in it, about as much time as reading three chunks from the page cache; so an uncompressed
chunk is read into a buffer taken from here, given back once the chunk's records are all handed
out (up to `MAX_IDLE` buffers of at most `MAX_IDLE_BYTES` each are kept per process). And the
kernel's copy out of the page cache runs up to 4x slower on some CPUs (measured on AMD EPYC)
when the destination sits a few bytes past the source's position within a 4 KiB page, which is
where a `bytearray`'s data starts (16 bytes into a page); so the buffers are anonymous mmaps
(page-aligned) and `place` puts a payload at the same offset within a page as it has in the file.

A buffer is never reused while anything still looks at it: a caller may keep the memoryviews of
a `scan(..., copy=False)`, and `take` then picks or allocates another buffer. Two are kept
because a plain `for view in scan(...)` loop still holds the previous chunk's last view while
the next chunk is read.
"""

from __future__ import annotations

import mmap
import threading
from typing import Final

PAGE: Final = mmap.PAGESIZE
MAX_IDLE: Final = 2
MAX_IDLE_BYTES: Final = 64 << 20
"""Largest buffer kept idle (twice the default chunk size); larger ones are unmapped."""

_idle: list[mmap.mmap] = []
_lock = threading.Lock()


def is_shared(buf: mmap.mmap) -> bool:
    """Whether a memoryview (or any other buffer export) of `buf` is still alive.

    An mmap with exports refuses to be resized; resizing to its own size is otherwise a no-op.
    Any other failure counts as shared, which only costs a new buffer.
    """
    try:
        buf.resize(len(buf))
    except Exception:  # BufferError when exported; anything else: do not risk reusing it
        return True
    return False


def take(size: int) -> mmap.mmap:
    """A page-aligned buffer with room for `size` bytes at any offset within a page."""
    need = size + PAGE
    with _lock:
        for i, buf in enumerate(_idle):
            if len(buf) >= need and not is_shared(buf):
                del _idle[i]
                return buf
    return mmap.mmap(-1, need, flags=mmap.MAP_PRIVATE)


def place(buf: mmap.mmap, size: int, file_position: int) -> memoryview:
    """A `size`-byte view of `buf` at the same offset within a page as `file_position`."""
    start = file_position % PAGE
    return memoryview(buf)[start : start + size]


def give_back(buf: mmap.mmap) -> None:
    """Keep `buf` for a later chunk (its content means nothing any more).

    Over `MAX_IDLE`, a buffer that is still viewed is dropped first, else the oldest.
    """
    if len(buf) > MAX_IDLE_BYTES:
        return
    with _lock:
        _idle.append(buf)
        while len(_idle) > MAX_IDLE:
            shared = [i for i, b in enumerate(_idle) if is_shared(b)]
            del _idle[shared[0] if shared else 0]

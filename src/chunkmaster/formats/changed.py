"""Dataset files written again after the master indexed them.

The master keeps each file's size and, for local files, its modification time (ns) when it
indexed it (`Dataset.file_sizes`, `Dataset.file_mtimes`); every chunk a trainer gets carries
its file's (`Chunk.file_size`, `Chunk.file_mtime_ns`, 0: not known). A file regenerated under
the same name is not the file whose chunks the master counted: read with the same layout it
would give other records silently, with another one a RecordOverrunError charged to the task.
So a trainer checks the file before it reads a chunk of it (a stat of a local file; an
object's size, which its ranged reads need anyway), and a master started on a store that holds
a dataset checks every local file's (a stat each). A changed file stops the job
(docs/failures.md): every task of it is affected, so no quarantine would help.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

from chunkmaster.core.errors import FILE_CHANGED
from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import Storage
from chunkmaster.remote import is_remote, local_path

WHAT_TO_DO = (
    "the dataset's files changed after the master indexed them: restore the files, or start "
    "a new job (another --job or --store) to index them again"
)


class FileChangedError(Exception):
    """A dataset file is not the one the master indexed (its size or mtime differ). Not a
    bad chunk: the task is not charged; the trainer tells the master, which stops the job."""

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.reason = f"{FILE_CHANGED}: {path}: {what}; {WHAT_TO_DO}"
        super().__init__(self.reason)


def _when(ns: int) -> str:
    t = datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC)
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


def changed(size: int, mtime_ns: int, now_size: int, now_mtime_ns: int) -> str | None:
    """What changed between the indexed (size, mtime) and the file's now (0: not known)."""
    parts = []
    if size and now_size != size:
        parts.append(f"size {size} -> {now_size} bytes")
    if mtime_ns and now_mtime_ns and now_mtime_ns != mtime_ns:
        parts.append(
            f"modified at {_when(now_mtime_ns)}, after it was indexed (modified at "
            f"{_when(mtime_ns)} then)"
        )
    return ", ".join(parts) or None


def stop_message(found: Sequence[str], when: str) -> str:
    """The stop's message for changed files `found` ("path: what" each), found `when`."""
    named = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
    return (
        f"job stopped: {len(found)} dataset file(s) changed after the master indexed them "
        f"({when}): {named}; {WHAT_TO_DO}"
    )


def check_chunk_file(chunk: Chunk, storage: Storage) -> None:
    """Raise FileChangedError if `chunk`'s file is not the one the master indexed: a local
    file's size and mtime (one stat), an object's size (known from its reads)."""
    if not chunk.file_size and not chunk.file_mtime_ns:
        return  # neither is known: nothing to compare
    if is_remote(chunk.path):
        what = changed(chunk.file_size, 0, storage.size(chunk.path), 0)
    else:
        try:
            st = os.stat(local_path(chunk.path))
        except OSError:
            return  # reading it names the error
        what = changed(chunk.file_size, chunk.file_mtime_ns, st.st_size, st.st_mtime_ns)
    if what is not None:
        raise FileChangedError(chunk.path, what)


def changed_files(
    files: Sequence[str], sizes: Sequence[int] | None, mtimes: Sequence[int] | None
) -> list[str]:
    """Each local file of `files` whose size or mtime is not the indexed one: "path: what".
    Object-store files are not checked (a request each), nor files this process cannot stat
    (a master on a host without the data: the trainers' reads name such a file)."""
    out = []
    for i, path in enumerate(files):
        if is_remote(path):
            continue
        size = sizes[i] if sizes is not None else 0
        mtime = mtimes[i] if mtimes is not None else 0
        if not size and not mtime:
            continue
        try:
            st = os.stat(local_path(path))
        except OSError:
            continue
        what = changed(size, mtime, st.st_size, st.st_mtime_ns)
        if what is not None:
            out.append(f"{path}: {what}")
    return out

"""Reading a task's records: which chunks, from which record, through which format's loader.

Shared by the client's pass buffer (buffer.py, the trainer's thread) and by readers outside it
(`TaskReader`: the DataLoader workers of chunkmaster.torch, each in a process of its own). A
task handed out again starts at `task.start`: the chunks before it are skipped unread and the
first records of the chunk it starts in are dropped; a piece of a task (`task.end`) stops there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from chunkmaster.client.errors import TaskReadError
from chunkmaster.core.model import Task
from chunkmaster.formats import ChunkLoader, FormatError, Storage, get_format
from chunkmaster.formats.changed import FileChangedError, check_chunk_file
from chunkmaster.formats.storage import storage_for
from chunkmaster.inflate import DEFAULT_MAX_INFLATED
from chunkmaster.recordio.errors import RecordIOError

#: What a chunk that cannot be read raises: the task is reported failed, the pass goes on (a
#: changed file's report stops the job instead: formats/changed.py).
READ_ERRORS = (RecordIOError, FormatError, OSError, FileChangedError)


def start_point(task: Task) -> tuple[int, int, int]:
    """Where reading `task` begins: (the chunk, that chunk's first record counted from the
    task's first, the records of that chunk to drop)."""
    skip = task.start
    i = first = 0
    chunks = task.chunks
    while i < len(chunks) and skip >= chunks[i].num_records:
        skip -= chunks[i].num_records
        first += chunks[i].num_records
        i += 1
    return i, first, skip if i < len(chunks) else 0


def chunk_loader(
    name: str,
    path: str,
    columns: Sequence[str] | None = None,
    batches: bool = False,
    max_inflated: int = DEFAULT_MAX_INFLATED,
) -> ChunkLoader:
    """A loader of format `name` (first needed for the chunk in `path`) whose chunks inflate
    to `max_inflated` bytes at most. Raises FormatError when this trainer cannot read the
    format, TypeError for columns or record batches of a format that is not columnar (the
    trainer's mistake, not the task's failure)."""
    try:
        fmt = get_format(name)
    except (ValueError, ImportError) as exc:
        raise FormatError(f"this trainer cannot read the format: {exc}", path=path) from None
    columnar = getattr(fmt, "columnar", False)
    if (columns is not None or batches) and not columnar:
        raise TypeError(
            f"columns and record batches need a columnar dataset (Parquet); this one is {name}"
        )
    if columnar:
        cols = None if columns is None else list(columns)
        return fmt.loader(columns=cols, max_inflated=max_inflated)  # type: ignore[call-arg]
    return fmt.loader(max_inflated=max_inflated)


class TaskReader:
    """Reads whole tasks, one after the other (one reader's loaders are reused across them)."""

    def __init__(
        self,
        storage: Callable[[str], Storage] = storage_for,
        columns: Sequence[str] | None = None,
        max_inflated: int = DEFAULT_MAX_INFLATED,
    ) -> None:
        self._storage = storage
        self._columns = columns
        self._max_inflated = max_inflated
        self._loaders: dict[str, ChunkLoader] = {}

    def runs(self, task: Task) -> Iterator[tuple[int, Iterator[Any], int]]:
        """(first, records, count) for each chunk of `task` from its start to its end: the
        chunk's records first.. first+count-1 (counted from the task's first record). A chunk
        that cannot be read raises TaskReadError, after the runs before it."""
        index, first, skip = start_point(task)
        chunks = task.chunks
        while index < len(chunks):
            chunk = chunks[index]
            try:
                loader = self._loaders.get(task.format)
                if loader is None:
                    loader = self._loaders[task.format] = chunk_loader(
                        task.format, chunk.path, self._columns, max_inflated=self._max_inflated
                    )
                storage = self._storage(chunk.path)
                check_chunk_file(chunk, storage)
                loaded = loader.load(chunk, storage)
            except READ_ERRORS as exc:
                raise TaskReadError(task, chunk, exc) from None
            stop = loaded.count
            if task.end:
                stop = max(0, min(stop, task.end - first))
            if skip < stop:
                records, _ = loaded.cut(skip, stop)
                yield first + skip, records, stop - skip
            skip = 0
            first += chunk.num_records
            index += 1
            if task.end and first >= task.end:
                return

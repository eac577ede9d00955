"""Reading a task's records: which chunks, from which record, through which format's loader.

One walker (`TaskReader.walk`) for every reader: the client's pass buffer (buffer.py, the
trainer's thread), which cuts its chunks into runs, and the DataLoader workers of
chunkmaster.torch (`TaskReader.runs`), each in a process of its own. A
task handed out again starts at `task.start`: the chunks before it are skipped unread and the
first records of the chunk it starts in are dropped; a piece of a task (`task.end`) stops there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

from chunkmaster.client.errors import TaskReadError
from chunkmaster.core.model import Task
from chunkmaster.core.record_order import window_permutation
from chunkmaster.formats import ChunkLoader, FormatError, Loaded, Storage, get_format
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


class Span(NamedTuple):
    """One chunk of a task, loaded: its records `start`..`stop`-1 are the task's to read.
    `first`: the chunk's first record, counted from the task's first; `last`: the task's last
    chunk."""

    loaded: Loaded
    first: int
    start: int
    stop: int
    last: bool


class TaskReader:
    """Reads tasks chunk by chunk through one walker (`walk`); one reader's loaders are reused
    across its tasks. `batches`: loaders give whole Arrow record batches (columnar formats).
    `fetched(task, index)`: the bytes of a chunk fetched ahead (None: read it from storage)."""

    def __init__(
        self,
        storage: Callable[[str], Storage] = storage_for,
        columns: Sequence[str] | None = None,
        max_inflated: int = DEFAULT_MAX_INFLATED,
        *,
        batches: bool = False,
        fetched: Callable[[Task, int], bytes | None] | None = None,
    ) -> None:
        self._storage = storage
        self._columns = None if columns is None else list(columns)
        self._max_inflated = max_inflated
        self._batches = batches
        self._fetched = fetched
        self._loaders: dict[str, ChunkLoader] = {}

    def walk(self, task: Task) -> Walk:
        """The walker of `task`: its chunks in file order, or its shuffle windows."""
        if not task.shuffle_window:
            return TaskWalk(self, task)
        if self._batches:
            raise TypeError(
                "record batches are read in file order, and this job reads each task in "
                f"shuffled windows of {task.shuffle_window} records (the master's "
                "--shuffle-window): read records instead"
            )
        return WindowWalk(self, task)

    def load(self, task: Task, index: int) -> Loaded:
        """Chunk `index` of `task`, read and checked; TaskReadError if it cannot be."""
        chunk = task.chunks[index]
        try:
            loader = self._loaders.get(task.format)
            if loader is None:
                loader = self._loaders[task.format] = chunk_loader(
                    task.format, chunk.path, self._columns, self._batches, self._max_inflated
                )
            data = None if self._fetched is None else self._fetched(task, index)
            storage = self._storage(chunk.path)
            check_chunk_file(chunk, storage)
            return loader.load(chunk, storage, data)
        except READ_ERRORS as exc:
            raise TaskReadError(task, chunk, exc) from None

    def runs(self, task: Task) -> Iterator[tuple[int, Iterator[Any], int]]:
        """(first, records, count) for each chunk of `task` from its start to its end: the
        chunk's records first.. first+count-1 (counted from the task's first record). A chunk
        that cannot be read raises TaskReadError, after the runs before it."""
        for span in self.walk(task):
            if span.start < span.stop:
                records, _ = span.loaded.cut(span.start, span.stop)
                yield span.first + span.start, records, span.stop - span.start


class TaskWalk:
    """The chunks of one task from `task.start` to its end (a piece's `task.end`), each loaded
    when reached: an iterator of `Span`s. `index` is the next chunk to load."""

    def __init__(self, reader: TaskReader, task: Task) -> None:
        self.task = task
        self._reader = reader
        self.index, self._first, self._skip = start_point(task)

    @property
    def done(self) -> bool:
        end = self.task.end
        return self.index >= len(self.task.chunks) or (bool(end) and self._first >= end)

    def __iter__(self) -> TaskWalk:
        return self

    def __next__(self) -> Span:
        if self.done:
            raise StopIteration
        task = self.task
        loaded = self._reader.load(task, self.index)
        first = self._first
        stop = loaded.count
        if task.end:  # a piece stops at its end
            stop = max(0, min(stop, task.end - first))
        start = min(self._skip, loaded.count)
        self._skip = 0
        self._first += task.chunks[self.index].num_records
        self.index += 1
        return Span(loaded, first, start, stop, self.done)


class Window:
    """The records of one shuffle window in the order they are read (a `Loaded` of a window,
    as the buffer consumes a chunk's)."""

    __slots__ = ("_records", "count")

    def __init__(self, records: list[Any]) -> None:
        self._records = records
        self.count = len(records)

    def cut(self, a: int, b: int) -> tuple[Iterator[Any], Iterator[Any]]:
        it = iter(self._records[a:b])
        return it, it


class WindowWalk:
    """The shuffle windows of one task (core/record_order.py) from the one holding
    `task.start` to the one holding its end, each read whole and permuted when reached: an
    iterator of `Span`s whose `first` is the window's first position. `index` is the next
    chunk to load; a chunk longer than a window is loaded once and held across windows."""

    def __init__(self, reader: TaskReader, task: Task) -> None:
        self.task = task
        self._reader = reader
        self._size = task.shuffle_window
        self._total = sum(c.num_records for c in task.chunks)
        self._end = min(task.end or self._total, self._total)
        self._window = task.start // self._size  # the next window to read
        skip, self.index, self._first = self._window * self._size, 0, 0
        chunks = task.chunks
        while self.index < len(chunks) and self._first + chunks[self.index].num_records <= skip:
            self._first += chunks[self.index].num_records  # chunks before it: never loaded
            self.index += 1
        self._chunk: list[Any] = []  # the chunk loaded last, from record `_first` of the task

    @property
    def done(self) -> bool:
        return self._window * self._size >= self._end

    def __iter__(self) -> WindowWalk:
        return self

    def __next__(self) -> Span:
        if self.done:
            raise StopIteration
        task, lo = self.task, self._window * self._size
        records = self._records(lo, min(lo + self._size, self._total))
        if len(records) > 1:
            order = window_permutation(task.order_key, self._window, len(records))
            records = list(itemgetter(*order)(records))
        self._window += 1
        if self.done:
            self._chunk = []
        start = max(0, task.start - lo)
        stop = max(start, min(len(records), self._end - lo))
        return Span(Window(records), lo, start, stop, self.done)

    def _records(self, lo: int, hi: int) -> list[Any]:
        """The task's records lo..hi-1 in file order, loading the chunks that hold them."""
        out: list[Any] = []
        at = lo
        while at < hi:
            if at >= self._first + len(self._chunk):
                if self.index >= len(self.task.chunks):
                    break  # the chunks hold fewer records than the index said
                self._first += len(self._chunk)
                loaded = self._reader.load(self.task, self.index)
                self.index += 1
                self._chunk = list(loaded.cut(0, loaded.count)[0])
                continue
            a = at - self._first
            b = min(hi - self._first, len(self._chunk))
            out.extend(self._chunk[a:b])
            at = self._first + b
        return out


Walk = TaskWalk | WindowWalk
"""A task's walker: its chunks in file order, or its shuffle windows."""

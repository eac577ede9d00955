"""What a dataset file format is to chunkmaster: how the master finds a file's chunks, and how a
trainer reads one.

Everything above the chunk (tasks, passes, timeouts, failures, progress, commits, checkpoints)
is the same for every format. A format only answers two questions:

- *master, once per file, in a worker thread*: where are this file's chunks and how many records
  does each hold (`Format.index`, reading headers/footers only where the format allows it);
- *trainer, once per chunk, in the trainer's thread*: the records of this chunk, checked
  (`ChunkLoader.load`), or an error naming the file and the chunk (`FormatError`).

Both sides bound what they decompress by `max_inflated` (chunkmaster.inflate): a file or chunk
that would inflate past it is refused while it is being decoded, naming it, never read whole
into memory first (a decompression bomb would otherwise kill the process).

A chunk's place in its file is `(offset, length)`. For byte-framed formats (RecordIO, TFRecord,
JSON Lines, text, WebDataset tar) it is a byte range, which a trainer can fetch with one ranged
read, several in flight, neighbours coalesced (`Storage.read_ranges`). For Parquet the offset is
the row group's number and the length its bytes; it reads through its own file object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from chunkmaster.core.model import Chunk
from chunkmaster.inflate import DEFAULT_MAX_INFLATED


class FormatError(Exception):
    """Damaged or mismatched input: names the file, and the chunk when there is one.

    Raised by `Format.index` (the master refuses the dataset, naming the file) and by
    `ChunkLoader.load` (the trainer reports the task failed with this text). Never quotes the
    file's contents.
    """

    def __init__(
        self, message: str, *, path: str, chunk: int | None = None, offset: int | None = None
    ) -> None:
        where = path if chunk is None else f"{path}, chunk {chunk} at offset {offset}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.chunk = chunk
        self.offset = offset


@dataclass(frozen=True, slots=True)
class FileIndex:
    """One file's chunks, in file order."""

    offsets: Sequence[int]  # where each chunk starts (a byte offset, or a Parquet row group)
    records: Sequence[int]  # records in each chunk
    lengths: Sequence[int]  # bytes each chunk spans in the file (for ranged reads)
    size: int  # the file's bytes


class Storage(Protocol):
    """Where dataset files live: local paths, or URLs through fsspec. Thread-safe."""

    def open(self, path: str) -> IO[bytes]:
        """A seekable binary file for reading (the caller closes it)."""
        ...

    def size(self, path: str) -> int: ...

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each (offset, length), fetched concurrently where that helps; a short
        range (the file ended early) comes back short, for the format to name."""
        ...


class Loaded(Protocol):
    """A checked chunk, as the trainer's buffer consumes it."""

    @property
    def count(self) -> int: ...

    def cut(self, a: int, b: int) -> tuple[Iterator[Any], Iterator[Any]]:
        """Records a..b-1, and an iterator whose `operator.length_hint` is, at any moment,
        how many of them are not taken yet (the progress reporter reads it from another
        thread). Both may be the same list iterator."""
        ...


class ChunkLoader(Protocol):
    """Loads one consumer's chunks one after the other; may reuse buffers between chunks (a
    chunk's records must all be taken before the next is loaded)."""

    def load(self, chunk: Chunk, storage: Storage, data: bytes | None = None) -> Loaded:
        """The chunk's records. `data`, when given, is the chunk's bytes already fetched
        (its `length` bytes from `offset`, maybe fewer if the file ended)."""
        ...


class Format(Protocol):
    name: str  # "recordio", "parquet", "jsonl", "text", "webdataset", "tfrecord"
    suffixes: tuple[str, ...]  # file name endings that select it: (".parquet",)
    ranged: bool  # chunks are byte ranges a trainer may fetch ahead (not Parquet)

    @property
    def chunk_size(self) -> int | None:
        """The default bound on a chunk's bytes when the master cuts the chunks itself (JSON
        Lines, text, TFRecord, WebDataset), which the master's --chunk-size replaces; None when
        the chunks are the file's own (RecordIO chunks, Parquet row groups)."""
        ...

    def index(
        self,
        path: str,
        storage: Storage,
        chunk_size: int | None = None,
        *,
        max_inflated: int = ...,
    ) -> FileIndex:
        """Read the file's chunk index, cutting chunks of at most `chunk_size` bytes where the
        format cuts them (None: its own `chunk_size`); FormatError when its content does not
        match, or when a compressed file would inflate past `max_inflated` bytes."""
        ...

    def loader(self, *, max_inflated: int = ...) -> ChunkLoader:
        """A loader whose chunks may inflate to `max_inflated` bytes at most."""
        ...


class Indexed:
    """`Format.index` with its public signature and defaults written once; a format reads its
    chunks in `read_index`, which receives every argument explicitly."""

    def index(
        self,
        path: str,
        storage: Storage,
        chunk_size: int | None = None,
        *,
        max_inflated: int = DEFAULT_MAX_INFLATED,
    ) -> FileIndex:
        """Read the file's chunk index (see `Format.index`)."""
        return self.read_index(path, storage, chunk_size, max_inflated)

    def read_index(
        self, path: str, storage: Storage, chunk_size: int | None, max_inflated: int
    ) -> FileIndex:
        """The format's own reading of the chunk index."""
        raise NotImplementedError


class ByteBounded(Indexed):
    """A format that cuts its own chunks: at most `max_bytes` bytes (its default `chunk_size`)
    and at most `max_count` records, the count's parameter named `count_name` in errors."""

    def __init__(self, max_bytes: int, max_count: int, count_name: str) -> None:
        if max_bytes < 1 or max_count < 1:
            raise ValueError(f"max_bytes and {count_name} must be at least 1")
        self.max_bytes = max_bytes

    @property
    def chunk_size(self) -> int | None:
        return self.max_bytes

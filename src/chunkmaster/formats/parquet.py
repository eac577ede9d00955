"""Parquet (through pyarrow): a chunk is a row group, a record is a row.

The master reads each file's footer only: a chunk's offset is its row group's number, its
records the group's rows, its length the group's compressed bytes. A trainer reads a row group
with pyarrow (only the columns asked for), checks its row count against the index, and hands out
rows as dicts (`Table.to_pylist`, one run at a time) or, for `Client.batches()`, the group as
one Arrow record batch sliced without a copy.

pyarrow is imported when a Parquet file is first met: `pip install 'chunkmaster[parquet]'`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from typing import Any

from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import FileIndex, FormatError, Indexed, Storage
from chunkmaster.formats.storage import LocalStorage
from chunkmaster.inflate import DEFAULT_MAX_INFLATED, TRAINER_SETTING, check_limit


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(
            f"reading Parquet needs pyarrow: pip install 'chunkmaster[parquet]' ({exc})"
        ) from None
    return pq


def _why(exc: BaseException) -> str:
    """pyarrow's message says what is wrong with the file's structure (sizes, magic bytes);
    it never holds the file's data."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def open_parquet(path: str, storage: Storage) -> Any:
    """A `pyarrow.parquet.ParquetFile` of `path` (its footer read). Local files go to pyarrow
    by path (its own reads, no Python in the loop), after checking they are regular files."""
    pq = _pq()
    if isinstance(storage, LocalStorage):
        local = path[len("file://") :] if path.startswith("file://") else path
        if not stat.S_ISREG(os.stat(local).st_mode):
            raise FormatError("is not a regular file", path=path)
        return pq.ParquetFile(local)
    f = storage.open(path)
    try:
        return pq.ParquetFile(f)
    except BaseException:
        f.close()
        raise


def _errors() -> tuple[type[BaseException], ...]:
    import pyarrow as pa

    return (pa.ArrowException, OSError, ValueError, EOFError)


class ParquetChunk:
    """A row group read and checked: one record batch."""

    __slots__ = ("_batch",)

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    @property
    def count(self) -> int:
        return int(self._batch.num_rows)

    def cut(self, a: int, b: int) -> tuple[Iterator[Any], Iterator[Any]]:
        """Rows a..b-1 as dicts, converted when the run is cut (not per row)."""
        it = iter(self._batch.slice(a, b - a).to_pylist())
        return it, it

    def batch(self, a: int, b: int) -> tuple[Iterator[Any], Iterator[Any]]:
        """Rows a..b-1 as one record batch (no copy); its rows count as taken, for progress,
        when the batch is."""
        run = OneBatch(self._batch.slice(a, b - a), b - a)
        return run, run.rows


class RowsLeft:
    """An empty iterator whose `length_hint` is the rows of a batch not taken yet."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def __iter__(self) -> RowsLeft:
        return self

    def __next__(self) -> Any:
        raise StopIteration

    def __length_hint__(self) -> int:
        return self.left


class OneBatch:
    """Yields its batch once; taking it takes all its rows at once (`rows.left` drops to 0),
    with no work per row."""

    __slots__ = ("_batch", "rows")

    def __init__(self, batch: Any, rows: int) -> None:
        self._batch = batch
        self.rows = RowsLeft(rows)

    def __iter__(self) -> OneBatch:
        return self

    def __next__(self) -> Any:
        batch, self._batch = self._batch, None
        if batch is None:
            raise StopIteration
        self.rows.left = 0
        return batch


class ParquetLoader:
    """Reads row groups with the columns asked for; keeps the last file open, since a task's
    chunks are mostly row groups of one file. A row group whose columns (those read) the
    footer says take more than `max_inflated` bytes uncompressed is refused before it is read.
    """

    def __init__(
        self, columns: Sequence[str] | None = None, max_inflated: int = DEFAULT_MAX_INFLATED
    ) -> None:
        self.columns = None if columns is None else list(columns)
        self.max_inflated = check_limit(max_inflated)
        self._path: str | None = None
        self._file: Any = None

    def _open(self, path: str, storage: Storage) -> Any:
        if self._path != path:
            self.close()
            self._file = open_parquet(path, storage)
            self._path = path
            if self.columns is not None:
                names = set(self._file.schema_arrow.names)
                missing = [c for c in self.columns if c not in names]
                if missing:  # the trainer's request, not the data, is wrong: raised as is
                    raise KeyError(f"columns {missing} are not in {path} (it has {sorted(names)})")
        return self._file

    def close(self) -> None:
        f, self._file, self._path = self._file, None, None
        if f is not None:
            f.close()

    def load(self, chunk: Chunk, storage: Storage, data: bytes | None = None) -> ParquetChunk:
        where: dict[str, Any] = {"path": chunk.path, "chunk": chunk.offset, "offset": chunk.offset}
        try:
            pf = self._open(chunk.path, storage)
            groups = pf.metadata.num_row_groups
            if chunk.offset >= groups:
                raise FormatError(
                    f"has {groups} row groups, the index names group {chunk.offset} "
                    "(the file changed since the dataset was set)",
                    **where,
                )
            self._check_size(pf, chunk, where)
            table = pf.read_row_group(chunk.offset, columns=self.columns)
        except FormatError:
            self.close()
            raise
        except _errors() as exc:
            self.close()
            raise FormatError(
                f"cannot read row group {chunk.offset}: {_why(exc)}", **where
            ) from None
        if table.num_rows != chunk.num_records:
            self.close()
            raise FormatError(
                f"row group {chunk.offset} has {table.num_rows} rows, the index says "
                f"{chunk.num_records} (the file changed since the dataset was set)",
                **where,
            )
        batches = table.to_batches()
        if len(batches) != 1:
            batches = table.combine_chunks().to_batches() or [_empty_batch(table)]
        return ParquetChunk(batches[0])

    def _check_size(self, pf: Any, chunk: Chunk, where: dict[str, Any]) -> None:
        """Refuse a row group whose read columns declare more uncompressed bytes than the
        limit. pyarrow decompresses each page into the size its header declares; what decoding
        makes of the pages (dictionaries, run lengths) is not bounded here (docs/formats.md)."""
        rg = pf.metadata.row_group(chunk.offset)
        wanted = None if self.columns is None else set(self.columns)
        declared = 0
        for c in range(rg.num_columns):
            col = rg.column(c)
            if wanted is None or col.path_in_schema.split(".", 1)[0] in wanted:
                declared += col.total_uncompressed_size
        if declared > self.max_inflated:
            raise FormatError(
                f"refused: row group {chunk.offset} declares {declared} uncompressed bytes "
                f"({chunk.length} stored), over the limit of {self.max_inflated} on what one "
                f"chunk may inflate to ({TRAINER_SETTING})",
                **where,
            )


def _empty_batch(table: Any) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([], schema=table.schema)


class ParquetFormat(Indexed):
    name = "parquet"
    suffixes = (".parquet",)
    ranged = False
    columnar = True  # Client.batches() and column selection
    chunk_size: int | None = None  # a chunk is a row group: the writer chose them

    def read_index(
        self, path: str, storage: Storage, chunk_size: int | None, max_inflated: int
    ) -> FileIndex:
        """The footer only: no page is read, so nothing is inflated here."""
        try:
            pf = open_parquet(path, storage)
        except FormatError:
            raise
        except FileNotFoundError:
            raise
        except _errors() as exc:
            raise FormatError(
                f"is not a readable Parquet file (its footer: {_why(exc)})", path=path
            ) from None
        try:
            md = pf.metadata
            offsets = list(range(md.num_row_groups))
            records: list[int] = []
            lengths: list[int] = []
            for i in offsets:
                rg = md.row_group(i)
                records.append(rg.num_rows)
                columns = (rg.column(c) for c in range(rg.num_columns))
                lengths.append(sum(c.total_compressed_size for c in columns))
            size = storage.size(path)
        finally:
            pf.close()
        return FileIndex(offsets, records, lengths, size)

    def loader(
        self, columns: Sequence[str] | None = None, *, max_inflated: int = DEFAULT_MAX_INFLATED
    ) -> ParquetLoader:
        return ParquetLoader(columns, max_inflated)


FORMAT = ParquetFormat()

"""Indexing a dataset: the trainers' patterns expanded (patterns.py), the files' one format
chosen (chunkmaster.formats), every file's chunk index read in parallel on daemon threads
(daemon_threads.py), so reading ten thousand indexes off a network filesystem stalls no
other call and a hung file system never holds a stopping master.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import DatasetError
from chunkmaster.core.sizes import size_text
from chunkmaster.core.task_size import chosen_chunks_per_task, chosen_text
from chunkmaster.inflate import DEFAULT_MAX_INFLATED
from chunkmaster.master.daemon_threads import ItemTimeout, map_in_daemon_threads
from chunkmaster.master.patterns import (
    NO_ROOTS,
    absolute_path,
    expand_globs,
    relative_note,
)
from chunkmaster.master.roots import DataRoots, is_url
from chunkmaster.remote import FsspecStorage
from chunkmaster.remote import shared as shared_storage

if TYPE_CHECKING:
    from chunkmaster.formats.base import FileIndex, Format, Storage

log = logging.getLogger("chunkmaster.datasets")

MAX_INDEX_THREADS = 32
INDEX_TIMEOUT = 120.0  # seconds one file's chunk index may take to read


def chunk_size_for(fmt: str, chunk_size: int | None) -> int | None:
    """The bound the master cuts `fmt`'s chunks at: `chunk_size` (its --chunk-size) or the
    format's default; None for a format whose chunks are the files' own (RecordIO, Parquet)."""
    from chunkmaster.formats import get_format

    default = get_format(fmt).chunk_size
    return None if default is None else chunk_size or default


def chunk_size_hint(fmt: str, chunk_size: int | None) -> str:
    """What makes more, smaller chunks of `fmt`'s files (the chunks are cut at `chunk_size`)."""
    if chunk_size is not None:
        return f"a smaller --chunk-size (now {size_text(chunk_size)})"
    if fmt == "parquet":
        return "smaller row groups (row_group_size when the files are written)"
    return "smaller chunks (`chunkmaster recordio write --max-chunk-size`)"


def choose_format(files: Sequence[str], explicit: str | None = None) -> str:
    """The one format of `files`: `explicit`, or the one their names' endings say (no known
    ending: RecordIO). Files of two formats are refused, naming one file of each."""
    from chunkmaster.formats import get_format, suffix_format

    if explicit:
        try:
            return get_format(explicit).name
        except ValueError as exc:
            raise DatasetError(f"no valid dataset specified: {exc}") from None
    first: dict[str, str] = {}
    for path in files:
        first.setdefault(suffix_format(path) or "recordio", path)
    if len(first) > 1:
        (a, pa), (b, pb) = list(first.items())[:2]
        raise DatasetError(
            f"no valid dataset specified: a dataset holds files of one format, and {pa} is "
            f"{a} while {pb} is {b} (by their names; set the master's --format to read "
            "every file as one format)"
        )
    name = next(iter(first))
    try:
        return get_format(name).name
    except (ValueError, ImportError) as exc:
        raise DatasetError(f"no valid dataset specified: {name} files: {exc}") from None


@dataclass(frozen=True)
class IndexSettings:
    """How a master indexes a dataset's files: `file_timeout` seconds for one file's chunk
    index (None: no bound; past it, a hung file system, the file is an error naming it); the
    fsspec `storage_options` for URLs (remote.py); `chunk_size`, the bytes the formats whose
    chunks the master cuts cut them at (None: the format's default); `max_inflated`, the bytes
    a compressed file may inflate to (its records are counted as it is inflated, never held
    whole where the format allows); `roots`, where patterns and the files they match must lie
    (default: none, so local paths only)."""

    file_timeout: float | None = INDEX_TIMEOUT
    storage_options: Mapping[str, Any] | None = None
    chunk_size: int | None = None
    max_inflated: int = DEFAULT_MAX_INFLATED
    roots: DataRoots = NO_ROOTS


def load_dataset(
    globs: Sequence[str],
    chunks_per_task: int | None,
    settings: IndexSettings | None = None,
    fmt: str | None = None,
) -> Dataset:
    """Expand `globs` and read every file's chunk index (headers or footers only), in
    parallel, as `settings` say (None: the defaults). `fmt` names the files' format (default:
    by their names). Local patterns are kept absolute (absolute_pattern), so the dataset's
    files are too, whatever the trainers' working directories. `chunks_per_task` None: the
    master's choice for the dataset's chunks (core/task_size.py)."""
    from chunkmaster.formats import get_format

    s = settings or IndexSettings()
    note = relative_note(globs)
    if note:
        log.warning("dataset: %s", note)
    globs = [absolute_path(g) if isinstance(g, str) and g else g for g in globs]
    remote = shared_storage(s.storage_options)
    files = expand_globs(globs, remote, s.roots)
    fmt = choose_format(files, fmt)
    bound = chunk_size_for(fmt, s.chunk_size)
    indexed = _index_files(files, get_format(fmt), bound, s, remote)
    indexes = [ix for ix, _ in indexed]
    chosen = chunks_per_task is None
    if chunks_per_task is None:
        chunks_per_task = chosen_chunks_per_task(sum(len(ix.offsets) for ix in indexes))
    dataset = Dataset.build(
        globs,
        files,
        ((ix.offsets, ix.records) for ix in indexes),
        chunks_per_task,
        [ix.size for ix in indexes],
        lengths=(ix.lengths for ix in indexes),
        fmt=fmt,
        chunk_size=bound,
        mtimes=[mtime for _, mtime in indexed],
    )
    if dataset.num_chunks == 0:
        raise DatasetError(
            f"no valid dataset specified: the {len(files)} matched file(s) hold no records"
        )
    log.info(
        "dataset: %d %s files, %d chunks%s, %d records, %d tasks of up to %d chunks%s",
        len(files),
        fmt,
        dataset.num_chunks,
        "" if bound is None else f" of up to {size_text(bound)}",
        dataset.num_records,
        dataset.num_tasks,
        dataset.chunks_per_task,
        f" ({chosen_text(dataset.chunks_per_task)})" if chosen else "",
    )
    return dataset


def _index_files(
    files: Sequence[str],
    form: Format,
    bound: int | None,
    settings: IndexSettings,
    remote: FsspecStorage,
) -> list[tuple[FileIndex, int]]:
    """Each file's chunk index and its mtime (ns) taken before it was read (0: an object),
    on up to MAX_INDEX_THREADS daemon threads."""
    from chunkmaster.formats.storage import storage_for

    def index_of(path: str) -> tuple[FileIndex, int]:
        mtime = file_mtime_ns(path)
        storage = storage_for(path, settings.storage_options)
        return _index_file(form, path, storage, bound, settings.max_inflated, remote), mtime

    try:
        return map_in_daemon_threads(index_of, files, MAX_INDEX_THREADS, settings.file_timeout)
    except ItemTimeout as exc:
        raise DatasetError(
            f"no valid dataset specified: reading the chunk index of {exc.item} took longer "
            f"than {exc.seconds:g}s (is its file system hung?)"
        ) from None


def file_mtime_ns(path: str) -> int:
    """A local file's modification time in ns (0 for an object-store URL: not kept)."""
    from chunkmaster.remote import is_remote, local_path

    if is_remote(path):
        return 0
    try:
        return os.stat(local_path(path)).st_mtime_ns
    except OSError:
        return 0  # indexing it names the error


def _index_file(
    form: Format,
    path: str,
    storage: Storage,
    bound: int | None,
    max_inflated: int,
    remote: FsspecStorage,
) -> FileIndex:
    """One file's chunk index; any failure a DatasetError naming the file (credentials in
    an object store's message scrubbed)."""
    from chunkmaster.formats import FormatError, suffix_format
    from chunkmaster.recordio import RecordIOError

    try:
        return form.index(path, storage, bound, max_inflated=max_inflated)
    except (RecordIOError, FormatError) as exc:
        guessed = (
            " (its name has no known format ending, so it was read as RecordIO; set the "
            "master's --format to name its format)"
            if form.name == "recordio" and suffix_format(path) is None
            else ""
        )
        raise DatasetError(f"no valid dataset specified: {exc}{guessed}") from exc
    except OSError as exc:
        why = remote.scrub(str(exc)) if is_url(path) else str(exc)
        raise DatasetError(f"no valid dataset specified: cannot read {path}: {why}") from None
    except ValueError as exc:
        raise DatasetError(f"no valid dataset specified: {exc}") from exc
    except Exception as exc:  # an object store client's own error
        if not is_url(path):
            raise
        why = remote.scrub(str(exc)) or type(exc).__name__
        raise DatasetError(f"no valid dataset specified: cannot read {path}: {why}") from None

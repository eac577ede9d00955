"""Turning the trainers' glob patterns into a Dataset: expand, dedupe, choose the files' one
format (chunkmaster.formats), index them in parallel; and telling whether a trainer's patterns
name the dataset the master already serves.

Local patterns are read as absolute paths: a relative one is relative to the master's working
directory, which the master says in its log (the client sends its patterns absolute, resolved
in the trainer's own working directory).

Runs in worker threads, never on the event loop, so reading ten thousand indexes off a
network filesystem does not stall any other call (defect D18). The threads are daemon threads
that nothing joins at exit: a file system that never answers holds one of them, never the
master's shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from chunkmaster.core.dataset import Dataset, size_text
from chunkmaster.core.errors import DatasetError, NoDatasetError
from chunkmaster.inflate import DEFAULT_MAX_INFLATED
from chunkmaster.master.roots import DataRoots, is_url
from chunkmaster.remote import FsspecStorage
from chunkmaster.remote import shared as shared_storage

if TYPE_CHECKING:
    from chunkmaster.formats.base import FileIndex, Format, Storage

log = logging.getLogger("chunkmaster.datasets")

MAX_INDEX_THREADS = 32
INDEX_TIMEOUT = 120.0  # seconds one file's chunk index may take to read
T = TypeVar("T")
R = TypeVar("R")
NO_ROOTS = DataRoots()  # local paths only, anywhere; no URLs


async def in_daemon_thread(fn: Callable[..., R], *args: Any) -> R:
    """`fn(*args)` in a daemon thread (asyncio.to_thread's executor is joined when the loop
    closes, so a hung call there would keep a stopping master alive)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[R] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            if ok:
                done.set_result(value)
            else:
                done.set_exception(value)

    def work() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:
            outcome = (False, exc)
        # RuntimeError: the loop closed meanwhile, and nobody waits for the answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name=getattr(fn, "__name__", "worker"), daemon=True).start()
    return await done


class ItemTimeout(Exception):
    """One item of map_in_daemon_threads took longer than its deadline."""

    def __init__(self, item: object, seconds: float) -> None:
        super().__init__(f"{item} took longer than {seconds:g}s")
        self.item = item
        self.seconds = seconds


def map_in_daemon_threads(
    fn: Callable[[T], R], items: Iterable[T], workers: int, item_timeout: float | None = None
) -> list[R]:
    """[fn(x) for x in items] on up to `workers` daemon threads; the first error (in item
    order among those that failed) is raised once the threads have stopped taking items.

    An item still running `item_timeout` seconds after it started raises ItemTimeout at once:
    its thread is abandoned (a daemon: it never holds the process), the others stop taking
    items."""
    todo = list(enumerate(items))
    results: list[Any] = [None] * len(todo)
    errors: list[tuple[int, BaseException]] = []
    cond = threading.Condition()
    started: dict[int, float] = {}  # item index -> time.monotonic() it started
    pending = iter(todo)
    stopped = 0

    def worker() -> None:
        nonlocal stopped
        while True:
            with cond:
                item = None if errors else next(pending, None)
                if item is None:
                    stopped += 1
                    cond.notify_all()
                    return
                started[item[0]] = time.monotonic()
            i, x = item
            try:
                result = fn(x)
            except BaseException as exc:
                with cond:
                    errors.append((i, exc))
                    started.pop(i, None)
                    stopped += 1
                    cond.notify_all()
                return
            with cond:
                results[i] = result
                started.pop(i, None)
                cond.notify_all()

    threads = [
        threading.Thread(target=worker, name="load-index", daemon=True)
        for _ in range(max(1, min(workers, len(todo))))
    ]
    for t in threads:
        t.start()
    with cond:
        while stopped < len(threads):
            if item_timeout is None or not started:
                cond.wait()
                continue
            oldest, since = min(started.items(), key=lambda kv: kv[1])
            left = since + item_timeout - time.monotonic()
            if left <= 0:
                errors.append((oldest, ItemTimeout(todo[oldest][1], item_timeout)))
                break
            cond.wait(left)
        failed = list(errors)
    if failed:
        raise min(failed, key=lambda e: e[0])[1]
    return results


def _expand_one(pattern: str, remote: FsspecStorage | None) -> list[str]:
    if is_url(pattern):
        assert remote is not None
        return remote.expand(pattern)
    return sorted(m for m in glob.glob(pattern) if not os.path.isdir(m))


def expand_globs(
    globs: Sequence[str], remote: FsspecStorage | None = None, roots: DataRoots = NO_ROOTS
) -> list[str]:
    """Matches in pattern order, sorted within a pattern, each path once. URL patterns are
    listed through `remote` (which keeps the listed sizes). Every pattern is held to `roots`
    before it is listed, and every file it matched after (a symlink, an object key, a link in
    an HTTP page may lead elsewhere), before any is opened."""
    if not globs:
        raise NoDatasetError()
    roots.check_all(globs)
    seen: dict[str, None] = {}
    for pattern in globs:
        if not isinstance(pattern, str) or not pattern:
            raise DatasetError(f"no valid dataset specified: bad pattern {pattern!r}")
        if remote is None and is_url(pattern):
            remote = shared_storage()
        try:
            matches = _expand_one(pattern, remote)
        except OSError as exc:
            raise DatasetError(f"no valid dataset specified: cannot list {exc}") from None
        for path in matches:
            roots.check(path, pattern)
            seen.setdefault(path, None)
    if not seen:
        raise DatasetError(f"no valid dataset specified: nothing matches {list(globs)}")
    return list(seen)


def absolute_path(path: str) -> str:
    """A local path or pattern made absolute in the master's working directory; URLs as they
    are. What the master indexes and keeps."""
    return path if is_url(path) else os.path.abspath(path)


def absolute_pattern(pattern: str) -> str:
    """A pattern as the master reads it: a URL with its scheme in lower case (nothing else:
    an object store reads `.`, `..` and doubled slashes as part of a key, and the data roots
    refuse them, master/roots.py); a local path absolute (a relative one in the master's
    working directory), `.`, `..` and doubled slashes folded. Two spellings of one pattern
    give the same text."""
    if is_url(pattern):
        scheme, _, rest = pattern.partition("://")
        return f"{scheme.lower()}://{rest}"
    return os.path.abspath(pattern)


def relative_note(globs: Sequence[str]) -> str:
    """What the master made of the relative patterns among `globs`: "" if there are none."""
    rel = [g for g in globs if isinstance(g, str) and g and not is_url(g) and not os.path.isabs(g)]
    if not rel:
        return ""
    shown = ", ".join(f"{g!r} as {absolute_pattern(g)!r}" for g in rel[:3])
    more = f" and {len(rel) - 3} more" if len(rel) > 3 else ""
    return (
        f"relative patterns are read in the master's working directory {os.getcwd()}: {shown}{more}"
    )


def same_patterns(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two lists of patterns are the same once spelled alike (absolute_pattern),
    whatever their order and repetitions. No file system access."""
    return {absolute_pattern(g) for g in a} == {absolute_pattern(g) for g in b}


def _file_key(path: str) -> str:
    """One text per file however it was reached: symlinks and relative paths resolved."""
    return absolute_pattern(path) if is_url(path) else os.path.realpath(path)


def file_keys(paths: Iterable[str]) -> set[str]:
    """One text per file however each was reached (symlinks and relative paths resolved)."""
    return {_file_key(p) for p in paths}


def _patterns_text(globs: Sequence[str]) -> str:
    shown = [absolute_pattern(g) for g in globs[:4]]
    more = f" and {len(globs) - 4} more" if len(globs) > 4 else ""
    return f"{shown}{more}"


def dataset_mismatch(
    dataset: Dataset,
    globs: Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    roots: DataRoots = NO_ROOTS,
) -> str | None:
    """None if `globs` name `dataset`: the same patterns (same_patterns), or patterns that
    match exactly its files (symlinks resolved); else why not, naming both, in one line.
    Lists the patterns' files when they differ from the dataset's (a file system access),
    held to `roots` as any dataset's (PermissionDeniedError)."""
    if same_patterns(dataset.globs, globs):
        return None
    try:
        files = expand_globs(
            [absolute_path(g) for g in globs], shared_storage(storage_options), roots
        )
    except DatasetError as exc:
        theirs = f"matches no dataset: {str(exc).removeprefix('no valid dataset specified: ')}"
    else:
        mine = {_file_key(f) for f in dataset.files}
        keys = {_file_key(f) for f in files}
        if keys == mine:
            return None
        common = len(keys & mine)
        theirs = f"{len(keys)} file(s), {common} of them in the master's dataset"
    note = relative_note([*globs, *dataset.globs])
    return (
        f"the dataset differs from the master's: this trainer's {_patterns_text(globs)} "
        f"({theirs}) is not the master's {_patterns_text(dataset.globs)} ({len(dataset.files)} "
        f"{dataset.format} file(s), {dataset.num_records} records)"
        + (f"; {note}" if note else "")
        + ". A master serves one dataset: give this trainer the master's patterns, or run "
        "another job for this dataset (another --store or --job, or an empty store)"
    )


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


def load_dataset(
    globs: Sequence[str],
    chunks_per_task: int,
    file_timeout: float | None = INDEX_TIMEOUT,
    fmt: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    chunk_size: int | None = None,
    max_inflated: int = DEFAULT_MAX_INFLATED,
    roots: DataRoots = NO_ROOTS,
) -> Dataset:
    """Expand `globs` and read every file's chunk index (headers or footers only), in
    parallel; a file whose index takes longer than `file_timeout` seconds (a hung file system)
    is an error naming it. `fmt` names the files' format (default: by their names). URLs are
    listed and read through fsspec with `storage_options` (remote.py). The formats
    whose chunks the master cuts get chunks of at most `chunk_size` bytes (None: the format's
    default). A compressed file that would inflate to more than `max_inflated` bytes is
    refused, naming it (its records are counted as it is inflated, never held whole where the
    format allows). Local patterns are kept absolute (absolute_pattern), so the dataset's files
    are too, whatever the trainers' working directories. Patterns and the files they match
    must lie under `roots` (default: none, so local paths only)."""
    from chunkmaster.formats import get_format
    from chunkmaster.formats.storage import storage_for

    note = relative_note(globs)
    if note:
        log.warning("dataset: %s", note)
    globs = [absolute_path(g) if isinstance(g, str) and g else g for g in globs]
    remote = shared_storage(storage_options)
    files = expand_globs(globs, remote, roots)
    fmt = choose_format(files, fmt)
    form = get_format(fmt)
    bound = chunk_size_for(fmt, chunk_size)

    def index_of(path: str) -> tuple[FileIndex, int]:
        """The file's index, and its mtime (ns) taken before it was read (0: an object)."""
        mtime = file_mtime_ns(path)
        storage = storage_for(path, storage_options)
        return _index_file(form, path, storage, bound, max_inflated, remote), mtime

    try:
        indexed = map_in_daemon_threads(index_of, files, MAX_INDEX_THREADS, file_timeout)
    except ItemTimeout as exc:
        raise DatasetError(
            f"no valid dataset specified: reading the chunk index of {exc.item} took longer "
            f"than {exc.seconds:g}s (is its file system hung?)"
        ) from None
    indexes = [ix for ix, _ in indexed]
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
        "dataset: %d %s files, %d chunks%s, %d records, %d tasks of up to %d chunks",
        len(files),
        fmt,
        dataset.num_chunks,
        "" if bound is None else f" of up to {size_text(bound)}",
        dataset.num_records,
        dataset.num_tasks,
        dataset.chunks_per_task,
    )
    return dataset


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

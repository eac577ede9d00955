"""Turning the trainers' glob patterns into a Dataset: expand, dedupe, choose the files' one
format (chunkmaster.formats), index them in parallel.

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

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import DatasetError, NoDatasetError
from chunkmaster.formats.remote import FsspecStorage
from chunkmaster.formats.remote import shared as shared_storage
from chunkmaster.master.roots import DataRoots, is_url

if TYPE_CHECKING:
    from chunkmaster.formats.base import FileIndex

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
    roots: DataRoots = NO_ROOTS,
) -> Dataset:
    """Expand `globs` and read every file's chunk index (headers or footers only), in
    parallel; a file whose index takes longer than `file_timeout` seconds (a hung file system)
    is an error naming it. `fmt` names the files' format (default: by their names). URLs are
    listed and read through fsspec with `storage_options` (formats/remote.py). Patterns and
    the files they match must lie under `roots` (default: none, so local paths only)."""
    from chunkmaster.formats import FormatError, get_format, suffix_format
    from chunkmaster.formats.storage import storage_for
    from chunkmaster.recordio import RecordIOError

    remote = shared_storage(storage_options)
    files = expand_globs(globs, remote, roots)
    fmt = choose_format(files, fmt)
    form = get_format(fmt)

    def index_of(path: str) -> FileIndex:
        try:
            return form.index(path, storage_for(path, storage_options))
        except (RecordIOError, FormatError) as exc:
            guessed = (
                " (its name has no known format ending, so it was read as RecordIO; set the "
                "master's --format to name its format)"
                if fmt == "recordio" and suffix_format(path) is None
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

    try:
        indexes = map_in_daemon_threads(index_of, files, MAX_INDEX_THREADS, file_timeout)
    except ItemTimeout as exc:
        raise DatasetError(
            f"no valid dataset specified: reading the chunk index of {exc.item} took longer "
            f"than {exc.seconds:g}s (is its file system hung?)"
        ) from None
    dataset = Dataset.build(
        globs,
        files,
        ((ix.offsets, ix.records) for ix in indexes),
        chunks_per_task,
        [ix.size for ix in indexes],
        lengths=(ix.lengths for ix in indexes),
        fmt=fmt,
    )
    if dataset.num_chunks == 0:
        raise DatasetError(
            f"no valid dataset specified: the {len(files)} matched file(s) hold no records"
        )
    log.info(
        "dataset: %d %s files, %d chunks, %d records, %d tasks of up to %d chunks",
        len(files),
        fmt,
        dataset.num_chunks,
        dataset.num_records,
        dataset.num_tasks,
        dataset.chunks_per_task,
    )
    return dataset

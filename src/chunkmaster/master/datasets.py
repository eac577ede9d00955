"""Turning the trainers' glob patterns into a Dataset: expand, dedupe, index in parallel.

Runs in worker threads, never on the event loop, so reading ten thousand indexes off a
network filesystem does not stall any other call (defect D18).
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import DatasetError, NoDatasetError

log = logging.getLogger("chunkmaster.datasets")

MAX_INDEX_THREADS = 32


def _expand_one(pattern: str) -> list[str]:
    if "://" in pattern:
        import fsspec

        fs, _, paths = fsspec.get_fs_token_paths(pattern)
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if protocol in ("file", "local"):
            return sorted(paths)
        return sorted(f"{protocol}://{p}" for p in paths)
    return sorted(m for m in glob.glob(pattern) if not os.path.isdir(m))


def expand_globs(globs: Sequence[str]) -> list[str]:
    """Matches in pattern order, sorted within a pattern, each path once."""
    if not globs:
        raise NoDatasetError()
    seen: dict[str, None] = {}
    for pattern in globs:
        if not isinstance(pattern, str) or not pattern:
            raise DatasetError(f"no valid dataset specified: bad pattern {pattern!r}")
        for path in _expand_one(pattern):
            seen.setdefault(path, None)
    if not seen:
        raise DatasetError(f"no valid dataset specified: nothing matches {list(globs)}")
    return list(seen)


def load_dataset(globs: Sequence[str], chunks_per_task: int) -> Dataset:
    """Expand `globs` and read every file's chunk index (headers only), in parallel."""
    from chunkmaster.recordio import RecordIOError, load_index

    files = expand_globs(globs)

    def index_of(path: str) -> tuple[list[int], list[int]]:
        try:
            idx = load_index(path)
        except RecordIOError as exc:
            raise DatasetError(f"no valid dataset specified: {exc}") from exc
        except OSError as exc:
            raise DatasetError(f"no valid dataset specified: cannot read {path}: {exc}") from exc
        return list(idx.chunk_offsets), list(idx.chunk_records)

    workers = max(1, min(MAX_INDEX_THREADS, len(files)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="load-index") as pool:
        indexes = list(pool.map(index_of, files))
    dataset = Dataset.build(globs, files, indexes, chunks_per_task)
    if dataset.num_chunks == 0:
        raise DatasetError(
            f"no valid dataset specified: the {len(files)} matched file(s) hold no records"
        )
    log.info(
        "dataset: %d files, %d chunks, %d records, %d tasks of up to %d chunks",
        len(files),
        dataset.num_chunks,
        dataset.num_records,
        dataset.num_tasks,
        dataset.chunks_per_task,
    )
    return dataset

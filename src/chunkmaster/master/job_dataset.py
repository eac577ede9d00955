"""The job's one dataset: the first trainer's set_dataset indexes and journals it; a later one
naming the same dataset (the same patterns however spelled, or patterns matching exactly its
files) succeeds and changes nothing; one naming another is refused naming both
(`DatasetMismatchError`). Every pattern is held to the data roots first (docs/security.md).
The indexing itself is master/datasets.py's, on daemon threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import DatasetMismatchError, MasterError, NoDatasetError
from chunkmaster.core.events import SetDataset
from chunkmaster.master.datasets import (
    dataset_mismatch,
    in_daemon_thread,
    load_dataset,
    same_patterns,
)
from chunkmaster.master.ledger import Ledger
from chunkmaster.master.roots import DataRoots
from chunkmaster.master.settings import Settings
from chunkmaster.master.status import TaskShare

log = logging.getLogger("chunkmaster.service")


class JobDataset:
    def __init__(
        self, ledger: Ledger, settings: Settings, roots: DataRoots, share: TaskShare
    ) -> None:
        self._ledger = ledger
        self._settings = settings
        self.roots = roots
        self._share = share
        self._loading: asyncio.Task[None] | None = None
        self._loading_globs: list[str] = []

    async def index(
        self, globs: Sequence[str], chunks_per_task: int, dataset_format: str | None
    ) -> Dataset:
        """Index the files of `globs` with this master's settings (its storage options, chunk
        size, inflation bound and data roots), seeded with its shuffle seed."""
        s = self._settings
        dataset = await in_daemon_thread(
            load_dataset,
            list(globs),
            chunks_per_task,
            s.index_timeout,
            dataset_format,
            s.storage_options,
            s.chunk_size,
            s.max_inflated,
            self.roots,
        )
        return dataset.with_shuffle(s.shuffle_seed)

    async def set(self, globs: Sequence[str]) -> None:
        """The first dataset wins (see the module's text); a restored data checkpoint's
        dataset is the master's like any other."""
        globs = list(globs)
        if not globs:  # checked before "already set", as the original does
            raise NoDatasetError()
        await in_daemon_thread(self.roots.check_all, globs)  # realpath may touch the disk
        while self._ledger.state.dataset is None:
            loading = self._loading
            if loading is None or loading.done():
                self._loading_globs = globs
                loading = self._loading = asyncio.create_task(self._load(globs), name="set-dataset")
            try:
                await asyncio.shield(loading)
            except MasterError:
                if same_patterns(globs, self._loading_globs):
                    raise
                # Another trainer's dataset could not be set: this one may be.
        ds = self._ledger.state.dataset
        assert ds is not None
        if same_patterns(ds.globs, globs):
            return
        why = await in_daemon_thread(
            dataset_mismatch, ds, globs, self._settings.storage_options, self.roots
        )
        if why is not None:
            log.warning("set_dataset refused: %s", why)
            raise DatasetMismatchError(why)
        log.info("set_dataset(%s): other patterns for the same files as the dataset's", globs)

    async def _load(self, globs: list[str]) -> None:
        s = self._settings
        dataset = await self.index(globs, s.chunks_per_task, s.dataset_format)
        if self._ledger.state.dataset is None:
            await self._ledger.commit(SetDataset(dataset))
            self._share.check()

    def close(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()

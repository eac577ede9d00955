"""The dataset each DataLoader worker iterates: it asks the main process for tasks, reads them
(client/reading.py: the format's loader; client/files.py: the local files it reads, held open
across the chunks of a round and closed when the round ends) and yields batches that
say where they leave their tasks (batches.py).

Picklable (settings and the channel's queues only), so it works with every multiprocessing
start method. An iteration reads tasks until the main process says none is coming now, then
sends what is left of its last batch: it never waits for the end of the pass, so an in-order
DataLoader keeps taking every worker's batches. A worker asks for its next task near the end of
the one it reads (`ASK_AHEAD`), so that it does not wait for the answer.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from chunkmaster.client.errors import TaskReadError
from chunkmaster.client.files import OpenFiles
from chunkmaster.client.options import Reading
from chunkmaster.client.reading import TaskReader
from chunkmaster.formats.storage import storage_for
from chunkmaster.torch.batches import Batch, Batcher, Loose, ReadFailure
from chunkmaster.torch.channel import LocalEnd, QueueEnd, WorkerEnds, key_of

Item = Batch | Loose | ReadFailure

ASK_AHEAD = 2
"""A worker asks for its next task when this many batches of its task are left to read: the
answer (a master's round trip when the main process's stock is empty) comes while it reads
them, and a rank holds one task more per worker only for that long."""


class Readers(IterableDataset[Item]):
    """Batches of the tasks the main process hands this worker (see the module's text)."""

    def __init__(
        self,
        *,
        transform: Callable[[Any], Any] | None,
        batch_size: int | None,
        collate: Callable[[list[Any]], Any],
        columns: Sequence[str] | None,
        reading: Reading,
    ) -> None:
        self.transform = transform
        self.batch_size = batch_size
        self.collate = collate
        self.columns = None if columns is None else list(columns)
        self.storage_options = dict(reading.storage_options or {})
        self.max_inflated = reading.max_inflated_bytes
        self.ends: WorkerEnds | None = None  # with workers: the channel's queues
        self.trainer_pid = os.getpid()  # the process whose death ends the workers
        self.local: LocalEnd | None = None  # without: the main process's own end (not pickled)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["local"] = None
        return state

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        end: LocalEnd | QueueEnd | None = self.local
        if info is not None:
            end = None if self.ends is None else QueueEnd(self.ends, info.id)
            _exit_with(self.trainer_pid)
        if end is None:
            raise TypeError(
                "chunkmaster.torch.Readers is iterated by chunkmaster.torch.Loader only"
            )
        files = OpenFiles()
        try:
            yield from self._read(end, files)
        finally:
            files.close()

    def _read(self, end: LocalEnd | QueueEnd, files: OpenFiles) -> Iterator[Item]:
        options = self.storage_options
        reader = TaskReader(
            lambda path: storage_for(path, options, local=files), self.columns, self.max_inflated
        )
        batcher = Batcher(self.batch_size, self.collate)
        lead = ASK_AHEAD * (self.batch_size or 1)
        transform = self.transform
        end.open()
        end.ask()
        while (task := end.receive()) is not None:
            key = key_of(task)
            at = task.start
            ask_at = task.num_records - lead  # the position whose reading asks for the next
            asked = False
            try:
                for first, records, count in reader.runs(task):
                    if not asked and first + count > ask_at:
                        # The next task comes while this one's end is read, also where one
                        # run (a chunk) holds the whole task.
                        run = iter(records)
                        before = max(0, ask_at - first)
                        yield from batcher.add(key, first, islice(run, before), transform)
                        end.ask()
                        asked = True
                        yield from batcher.add(key, first + before, run, transform)
                    else:
                        yield from batcher.add(key, first, records, transform)
                    at = first + count
            except TaskReadError as exc:
                rest = batcher.rest()
                if rest is not None:
                    yield rest
                yield ReadFailure(key, at, exc.reason)
            if not asked:
                end.ask()
        rest = batcher.rest()
        if rest is not None:
            yield rest


_watched: set[int] = set()


def _exit_with(pid: int) -> None:
    """End this worker when the trainer `pid` dies, however it died.

    torch's workers watch their parent, which under the forkserver is the forkserver, not the
    trainer; and the forkserver lives while any worker holds its liveness pipe, as each does. A
    SIGKILLed trainer would leave both, with their memory, for ever. A daemon thread of each
    worker waits on the trainer's pidfd (or looks every second where there is none)."""
    if pid in _watched or pid == os.getpid():
        return
    _watched.add(pid)
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass

    def watch() -> None:
        if fd >= 0:
            select.select([fd], [], [])
        else:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                threading.Event().wait(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="chunkmaster-trainer-watch", daemon=True).start()

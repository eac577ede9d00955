"""Fetching the byte ranges of a trainer's next chunks before it reaches them
(docs/object-stores.md): an object store costs a round trip per request, so `want` queues a
task's chunks when the buffer takes it, up to `chunks` requests in flight and `budget` bytes
fetched, neighbours of one file folded into one `Storage.read_ranges` call. Only ranged
formats' chunks of URL files with a known length are fetched ahead; local files keep their
direct reads (`take` answers None).

The trainer's thread takes a chunk's bytes with `take`; while they are on the way (`ready`
false) it waits on the client's condition, which `on_ready` wakes, so the client's lock is free
meanwhile for the task fetcher. A failed fetch is raised by `take` for its chunk, so the task
is reported failed naming the file and the chunk. `cancel` (the pass abandoned) forgets what
was queued or fetched. The workers are daemon threads that the client's close() joins (`close`,
`join`) up to its deadline: a request that never returns holds one, never the trainer's exit.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from chunkmaster.client.connection import join_all
from chunkmaster.core.model import Chunk, Task
from chunkmaster.formats.base import Storage
from chunkmaster.remote import is_remote


def ranged_format(name: str) -> bool:
    """Whether the chunks of format `name` are byte ranges (False for unknown formats: their
    loader reports them)."""
    from chunkmaster.formats import get_format

    try:
        return bool(get_format(name).ranged)
    except (ValueError, ImportError):
        return False


log = logging.getLogger("chunkmaster.client")

DEFAULT_CHUNKS = 8  # requests in flight
DEFAULT_BUDGET = 64 * 1024 * 1024  # bytes fetched ahead and not yet taken
GROUP_LIMIT = 4 * 1024 * 1024  # neighbouring chunks are fetched in one request up to this size
GROUP_GAP = 64 * 1024  # ... when no further apart than this

Key = tuple[int, int, int, int]  # (pass, task id, task epoch, chunk index in the task)


def key_of(task: Task, index: int) -> Key:
    return (task.pass_id, task.meta.id, task.meta.epoch, index)


@dataclass(eq=False)
class _Entry:
    key: Key
    chunk: Chunk
    done: threading.Event = field(default_factory=threading.Event)
    data: bytes | None = None
    error: BaseException | None = None
    started: bool = False


class ReadAhead:
    """Chunks fetched ahead for one trainer; thread-safe (its own lock, never the client's)."""

    def __init__(
        self,
        storage_for: Callable[[str], Storage],
        ranged: Callable[[str], bool] = ranged_format,
        *,
        chunks: int = DEFAULT_CHUNKS,
        budget: int = DEFAULT_BUDGET,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        if chunks < 1 or budget < 1:
            raise ValueError(f"read-ahead needs at least 1 chunk and 1 byte, not {chunks}/{budget}")
        self._storage_for = storage_for
        self._ranged = ranged  # format name -> whether its chunks are byte ranges
        self._on_ready = on_ready  # told (without this object's lock) when a fetch ends
        self.chunks = chunks
        self.budget = budget
        self._lock = threading.Lock()
        self._queue: deque[_Entry] = deque()  # wanted, not started, in want order
        self._entries: dict[Key, _Entry] = {}  # wanted and not taken or dropped
        self._held = 0  # bytes of started entries not taken or dropped
        self._running = 0  # fetch jobs started and not done
        self._jobs: queue.SimpleQueue[list[_Entry] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._closed = False

    # ---- the buffer's side -------------------------------------------------------------------

    def want(self, task: Task) -> None:
        """Queue the task's chunks that a ranged read can fetch, from the one holding record
        `task.start` on (the buffer skips those before it unread)."""
        if not self._ranged(task.format):
            return
        chunks = task.chunks
        first, skip = 0, task.start
        while first < len(chunks) and skip >= chunks[first].num_records:
            skip -= chunks[first].num_records
            first += 1
        with self._lock:
            if self._closed:
                return
            for i in range(first, len(chunks)):
                chunk = chunks[i]
                if chunk.length <= 0 or not is_remote(chunk.path):
                    continue
                key = key_of(task, i)
                if key not in self._entries:
                    entry = _Entry(key, chunk)
                    self._entries[key] = entry
                    self._queue.append(entry)
            self._pump()

    def ready(self, task: Task, index: int) -> bool:
        """Whether `take(task, index)` would answer without waiting for a fetch in flight."""
        with self._lock:
            entry = self._entries.get(key_of(task, index))
            return entry is None or not entry.started or entry.done.is_set()

    def take(self, task: Task, index: int) -> bytes | None:
        """The bytes of chunk `index` of `task`, waiting for them; None if they were never
        wanted (read the chunk directly). Raises the error its fetch met."""
        with self._lock:
            entry = self._entries.pop(key_of(task, index), None)
            if entry is None:
                return None
            if not entry.started:  # budget full of later chunks: fetch it here, now
                self._queue.remove(entry)
            else:
                self._held -= entry.chunk.length
            self._pump()
        if not entry.started:
            _fetch(self._storage_for, [entry])
        entry.done.wait()
        if entry.error is not None:
            raise entry.error
        assert entry.data is not None
        return entry.data

    def drop(self, task: Task) -> None:
        """Forget the task's chunks (it failed, or was read without them)."""
        with self._lock:
            for i in range(len(task.chunks)):
                entry = self._entries.pop(key_of(task, i), None)
                if entry is not None:
                    self._forget(entry)
            self._pump()

    def cancel(self) -> None:
        """Forget everything (the pass was abandoned); fetches in flight finish unheard."""
        with self._lock:
            self._queue.clear()
            self._entries.clear()
            self._held = 0

    def close(self) -> None:
        """Forget everything and tell the workers to end (`join()` waits for them)."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._entries.clear()
            self._held = 0
            for _ in self._workers:
                self._jobs.put(None)

    def join(self, deadline: float) -> list[str]:
        """After close(): wait until `deadline` (time.monotonic()) for the workers to end (each
        does once its fetch in flight returns); the names of those still alive."""
        with self._lock:
            workers = list(self._workers)
        return join_all(workers, deadline)

    @property
    def held(self) -> int:
        """Bytes fetched or on their way and not taken yet."""
        with self._lock:
            return self._held

    # ---- scheduling (lock held) --------------------------------------------------------------

    def _forget(self, entry: _Entry) -> None:
        if entry.started:
            self._held -= entry.chunk.length
        else:
            self._queue.remove(entry)

    def _pump(self) -> None:
        """Start fetches while there are free slots and room in the budget (one fetch always
        goes when nothing is held, however large its chunk)."""
        while self._queue and self._running < self.chunks:
            head = self._queue[0]
            if self._held and self._held + head.chunk.length > self.budget:
                return
            group = [self._queue.popleft()]
            size = head.chunk.length
            while self._queue:
                nxt, last = self._queue[0].chunk, group[-1].chunk
                if (
                    nxt.path != last.path
                    or not 0 <= nxt.offset - (last.offset + last.length) <= GROUP_GAP
                    or size + nxt.length > GROUP_LIMIT
                    or self._held + size + nxt.length > self.budget
                ):
                    break
                group.append(self._queue.popleft())
                size += nxt.length
            for entry in group:
                entry.started = True
            self._held += size
            self._running += 1
            if len(self._workers) < self.chunks and len(self._workers) < self._running:
                t = threading.Thread(target=self._work, name="read-ahead", daemon=True)
                self._workers.append(t)
                t.start()
            self._jobs.put(group)

    def _work(self) -> None:
        while True:
            group = self._jobs.get()
            if group is None:
                return
            _fetch(self._storage_for, group)
            with self._lock:
                self._running -= 1
                if not self._closed:
                    self._pump()
            if self._on_ready is not None:
                self._on_ready()


def _fetch(storage_for: Callable[[str], Storage], group: list[_Entry]) -> None:
    """Fetch a group of one file's chunks; each entry gets its bytes or the error."""
    path = group[0].chunk.path
    try:
        blobs = storage_for(path).read_ranges(
            path, [(e.chunk.offset, e.chunk.length) for e in group]
        )
    except Exception as exc:
        error = exc if isinstance(exc, OSError) else OSError(f"{path}: {exc}")
        log.debug("read-ahead of %s failed: %s", path, error)
        for entry in group:
            entry.error = error
            entry.done.set()
        return
    for entry, blob in zip(group, blobs, strict=True):
        entry.data = blob
        entry.done.set()

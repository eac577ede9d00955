"""Blocking work (file listings, chunk indexes) on daemon threads that nothing joins at exit:
a file system that never answers holds one of them, never the master's shutdown.
(asyncio.to_thread's executor is joined when the loop closes.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def in_daemon_thread(fn: Callable[..., R], *args: Any) -> R:
    """`fn(*args)` in a daemon thread, awaited on the running loop."""
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


class _Map(Generic[T, R]):
    """The shared state of one map_in_daemon_threads call: the items not yet taken, the
    results and errors so far, and when each running item started."""

    def __init__(self, fn: Callable[[T], R], items: Iterable[T]) -> None:
        self.fn = fn
        self.todo = list(enumerate(items))
        self.results: list[Any] = [None] * len(self.todo)
        self.errors: list[tuple[int, BaseException]] = []
        self.cond = threading.Condition()
        self.started: dict[int, float] = {}  # item index -> time.monotonic() it started
        self.pending = iter(self.todo)
        self.stopped = 0  # workers that took their last item

    def worker(self) -> None:
        """Take items until none is left or one has failed."""
        while True:
            with self.cond:
                item = None if self.errors else next(self.pending, None)
                if item is None:
                    self.stopped += 1
                    self.cond.notify_all()
                    return
                self.started[item[0]] = time.monotonic()
            i, x = item
            try:
                result = self.fn(x)
            except BaseException as exc:
                with self.cond:
                    self.errors.append((i, exc))
                    self.started.pop(i, None)
                    self.stopped += 1
                    self.cond.notify_all()
                return
            with self.cond:
                self.results[i] = result
                self.started.pop(i, None)
                self.cond.notify_all()

    def wait(self, workers: int, item_timeout: float | None) -> list[tuple[int, BaseException]]:
        """Until `workers` have stopped, or an item outlives `item_timeout`: the errors."""
        with self.cond:
            while self.stopped < workers:
                if item_timeout is None or not self.started:
                    self.cond.wait()
                    continue
                oldest, since = min(self.started.items(), key=lambda kv: kv[1])
                left = since + item_timeout - time.monotonic()
                if left <= 0:
                    self.errors.append((oldest, ItemTimeout(self.todo[oldest][1], item_timeout)))
                    break
                self.cond.wait(left)
            return list(self.errors)


def map_in_daemon_threads(
    fn: Callable[[T], R], items: Iterable[T], workers: int, item_timeout: float | None = None
) -> list[R]:
    """[fn(x) for x in items] on up to `workers` daemon threads; the first error (in item
    order among those that failed) is raised once the threads have stopped taking items.

    An item still running `item_timeout` seconds after it started raises ItemTimeout at once:
    its thread is abandoned (a daemon: it never holds the process), the others stop taking
    items."""
    run: _Map[T, R] = _Map(fn, items)
    threads = [
        threading.Thread(target=run.worker, name="load-index", daemon=True)
        for _ in range(max(1, min(workers, len(run.todo))))
    ]
    for t in threads:
        t.start()
    failed = run.wait(len(threads), item_timeout)
    if failed:
        raise min(failed, key=lambda e: e[0])[1]
    return run.results

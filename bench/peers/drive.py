"""N client processes, one client each, started together; cycles counted in one fixed window.

Shared by every runner (chunkmaster in the repo's .venv, each peer in its own virtualenv), so
it imports only the standard library: the load has the same shape for everyone, and only the
client function differs.

A client is a module-level function `client(addr, index, wait_start) -> int`: it connects and
does whatever set-up it needs, calls `wait_start()` (which blocks until every client is ready
and returns the window as `(begin, end)` on the monotonic clock, shared by all processes on
Linux), then runs cycles with `count_cycles` and returns how many finished inside the window.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

Window = tuple[float, float]
Client = Callable[[str, int, Callable[[], Window]], int]


def count_cycles(cycle: Callable[[], bool], window: Window) -> int:
    """Runs `cycle` until the window ends; counts those that did a task and ended inside it."""
    begin, end = window
    done = 0
    while True:
        did_task = cycle()
        now = time.monotonic()
        if now >= end:
            return done
        if did_task and now >= begin:
            done += 1


def _child(
    client: Client,
    addr: str,
    index: int,
    ready: Any,
    go: Any,
    start: Any,
    warmup: float,
    seconds: float,
    out: Any,
) -> None:
    def wait_start() -> Window:
        ready.put(index)
        go.wait()
        begin = float(start.value) + warmup
        return begin, begin + seconds

    try:
        out.put((index, client(addr, index, wait_start), ""))
    except BaseException:
        ready.put(index)  # so that the parent does not wait for a client that died in set-up
        out.put((index, 0, traceback.format_exc()))


def run_clients(
    client: Client, addr: str, clients: int, warmup: float, seconds: float, setup_s: float = 180
) -> float:
    """Cycles per second of `clients` processes running `client` against `addr`."""
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    out = ctx.Queue()
    go = ctx.Event()
    start = ctx.Value("d", 0.0)
    procs = [
        ctx.Process(
            target=_child,
            args=(client, addr, i, ready, go, start, warmup, seconds, out),
            daemon=True,
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=setup_s)
        start.value = time.monotonic() + 0.05
        go.set()
        results = [out.get(timeout=warmup + seconds + 120) for _ in procs]
    except queue.Empty:
        raise RuntimeError(
            f"{clients} clients against {addr}: not all were ready within {setup_s:.0f} s "
            "or finished within the window plus 120 s"
        ) from None
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [err for _, _, err in results if err]
    if errors:
        raise RuntimeError(f"a client against {addr} failed:\n{errors[0]}")
    return sum(n for _, n, _ in results) / seconds

"""N client processes, one client each, started together; cycles counted in one fixed window.

Shared by every runner (chunkmaster in the repo's .venv, each peer in its own virtualenv), so
it imports only the standard library: the load has the same shape for everyone, and only the
client function differs.

A client is a module-level function `client(addr, index, wait_start) -> int`: it connects and
does whatever set-up it needs, calls `wait_start()` (which blocks until every client is ready
and returns the window as `(begin, end)` on the monotonic clock, shared by all processes on
Linux), then runs cycles with `count_cycles` and returns how many finished inside the window.

Besides cycles/s, `run_clients` reads the server processes' CPU time (all threads, from
/proc/PID/stat) at the window's start and end: server CPU per cycle is the figure that the
clients' and the other tenants' share of this shared 2-core machine disturbs least.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

Window = tuple[float, float]
Client = Callable[[str, int, Callable[[], Window]], int]


def count_cycles(cycle: Callable[[], int], window: Window) -> int:
    """Runs `cycle` until the window ends; counts the tasks done by those that ended inside
    it (`cycle` returns how many it did: 0 or 1, or more for a client that asks for several)."""
    begin, end = window
    done = 0
    while True:
        did_tasks = cycle()
        now = time.monotonic()
        if now >= end:
            return done
        if now >= begin:
            done += did_tasks


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU of these processes, all their threads, so far."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


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
    client: Client,
    addr: str,
    clients: int,
    warmup: float,
    seconds: float,
    server_pids: Sequence[int],
    setup_s: float = 180,
) -> dict[str, float]:
    """Cycles/s of `clients` processes running `client` against `addr`, and server CPU."""
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
        _sleep_until(start.value + warmup)
        cpu_before = cpu_seconds(server_pids)
        _sleep_until(start.value + warmup + seconds)
        cpu = cpu_seconds(server_pids) - cpu_before
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
    cycles = sum(n for _, n, _ in results)
    return {
        "cycles_per_s": cycles / seconds,
        "server_cpu": cpu / seconds,  # cores busy serving, on average
        "server_cpu_us_per_cycle": 1e6 * cpu / cycles if cycles else float("nan"),
    }

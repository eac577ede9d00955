"""tf.data service with dynamic sharding: one split handed out by the dispatcher and consumed.

Runs in bench/peers/.envs/tfdata (`sh bench/peers/install.sh tfdata`: tensorflow-cpu 2.21),
never in the repo's .venv. This process hosts, in-process, a `DispatchServer`
(`fault_tolerant_mode=True`, its journal in a temporary `work_dir`) and one `WorkerServer`,
both on loopback ports of their choosing. Each client process iterates

    tf.data.Dataset.range(tasks).apply(tf.data.experimental.service.distribute(
        processing_mode=ShardingPolicy.DYNAMIC, service=..., job_name="peers-bench"))

All clients share one job (same `job_name`), so each element goes to exactly one client, as each
of our tasks goes to one trainer. Under DYNAMIC sharding a `range` dataset's split provider
hands out one index per split, so `tasks` splits of one tiny element each: the worker asks the
dispatcher for the next split (`GetSplit`, journaled in fault-tolerant mode), produces the
element, and a client fetches it from the worker (`GetElement`). One consumed element is one
cycle. Unlike ours, a split is never reported finished: the worker asks for the next split when
it wants one, so the dispatcher sees one RPC per split, not two; the client-to-worker hop is
what the trainer sees.

    .envs/tfdata/bin/python bench/peers/tfdata_peer.py --clients 8 --seconds 5
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from drive import Window, count_cycles, run_clients

JOB = "peers-bench"


def tfdata_client(tasks: int, addr: str, index: int, wait_start: Callable[[], Window]) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    service = tf.data.experimental.service
    ds = tf.data.Dataset.range(tasks).apply(
        service.distribute(
            processing_mode=service.ShardingPolicy.DYNAMIC, service=addr, job_name=JOB
        )
    )
    elements = iter(ds)

    def cycle() -> bool:
        try:
            next(elements)
        except StopIteration:
            raise RuntimeError(
                f"client {index}: all {tasks} splits consumed inside the window; raise --tasks"
            ) from None
        return True

    return count_cycles(cycle, wait_start())


def journal_bytes(work_dir: Path) -> int:
    return sum(p.stat().st_size for p in work_dir.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--tasks", type=int, default=1_000_000)
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    service = tf.data.experimental.service
    work_dir = Path(tempfile.mkdtemp(prefix="peers-tfdata-"))
    dispatcher = service.DispatchServer(
        service.DispatcherConfig(port=0, work_dir=str(work_dir), fault_tolerant_mode=True)
    )
    dispatcher_addr = dispatcher.target.split("://")[1]
    worker = service.WorkerServer(
        service.WorkerConfig(
            dispatcher_address=dispatcher_addr, worker_address="localhost:%port%", port=0
        )
    )
    try:
        client = functools.partial(tfdata_client, args.tasks)
        # The dispatcher and the worker both live in this process.
        result = run_clients(
            client, dispatcher.target, args.clients, args.warmup, args.seconds, [os.getpid()]
        )
        journal = journal_bytes(work_dir)
    finally:
        worker.stop()
        dispatcher.stop()
    print(json.dumps({**result, "journal_bytes": journal}), flush=True)


if __name__ == "__main__":
    main()

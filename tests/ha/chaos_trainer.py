"""A trainer for the chaos test: reads passes through `Client(etcd_endpoints=...)` and logs.

Each record taken appends "r PASS ID" and each task reported done (on_task_done) appends
"d PASS TASK EPOCH" to --out, one os.write per line on an O_APPEND descriptor, so a SIGKILL
loses nothing that was logged. Records are ASCII integers (b"%06d"). "e PASS" marks the end of
a pass for this trainer, "x" a clean exit.

    python tests/ha/chaos_trainer.py --endpoints URL --out FILE --passes 5 [--dataset GLOB]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from chunkmaster.client import Connection
from chunkmaster.client.client import Client
from chunkmaster.core.model import Task


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoints", required=True, nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--passes", type=int, required=True)
    ap.add_argument("--dataset", nargs="*", default=[])
    ap.add_argument("--step-time", type=float, default=0.0)
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(line: str) -> None:
        os.write(fd, (line + "\n").encode())  # one syscall: whole lines or nothing

    def on_done(task: Task) -> None:
        emit(f"d {task.pass_id} {task.meta.id} {task.meta.epoch}")

    emit(f"s {os.getpid()}")
    with Client(
        etcd_endpoints=args.endpoints, on_task_done=on_done, connection=Connection(etcd_timeout=5.0)
    ) as client:
        if args.dataset:
            client.set_dataset(args.dataset)
        for p in range(args.passes):
            for record in client.records(p):
                emit(f"r {p} {int(record)}")
                if args.step_time:
                    time.sleep(args.step_time)
            emit(f"e {p}")
    emit("x")
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())

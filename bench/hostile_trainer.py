"""A trainer for bench/hostile_soak.py: a session client that commits, goes on past chunks it
cannot read and past a refused commit (a freeze cost it its tasks), and logs every record.

    python bench/hostile_trainer.py --addr A --dataset PATTERN --out FILE --passes 3
        [--commit-every 25] [--report-every 10] [--name NAME] [--step-time S]

Each record taken appends "r PASS ID" to --out (one write per line on an O_APPEND descriptor,
so a SIGKILL loses no logged line); "f" a read failure, "k" a refused commit, "x" a clean exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from chunkmaster.client import Client, EndOfPass, TaskReadError
from chunkmaster.core.errors import CheckpointRefusedError

MAX_INFLATED = 1 << 20  # the poison chunk inflates to 32 MiB: refused, a read failure


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--passes", type=int, required=True)
    ap.add_argument("--commit-every", type=int, default=25)
    ap.add_argument("--report-every", type=int, default=10)
    ap.add_argument("--name")
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds per record")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    with Client(
        args.addr,
        name=args.name,
        report_every=args.report_every,
        max_inflated_bytes=MAX_INFLATED,
    ) as client:
        client.set_dataset([args.dataset])
        for p in range(args.passes):
            client.start_get_records(p)
            taken = 0
            while True:
                try:
                    record = client.next_record()
                except EndOfPass:
                    break
                except TaskReadError:
                    emit("f")
                    continue
                emit(f"r {p} {int(record)}")
                taken += 1
                if args.step_time:
                    time.sleep(args.step_time)  # the training step
                if taken % args.commit_every == 0:
                    commit(client, emit)
            commit(client, emit)
    emit("x")
    return 0


def commit(client: Client, emit: object) -> None:
    try:
        client.commit(timeout=120)
    except CheckpointRefusedError:
        emit("k")  # type: ignore[operator]


if __name__ == "__main__":
    sys.exit(main())

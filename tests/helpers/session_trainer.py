"""A trainer process with a session, for the exactly-once tests: reads passes and logs.

Each record taken appends "r PASS ID" to --out; each commit() that returned appends "c N"
(N counts the commits); "e PASS" marks the end of a pass for this trainer, "l" leaving
mid-pass (--leave-after), "z" freezing (--freeze-after) and "x" a clean exit. One os.write
per line on an O_APPEND descriptor, so a SIGKILL loses no logged line. Records are ASCII
integers (b"%06d").

    python tests/helpers/session_trainer.py --addr HOST:PORT --out FILE --passes 2 \
        [--first-pass P] [--commit-every N] [--report-every N] [--step-time S] [--name NAME]
        [--shuffle-buffer N] [--wait-for FILE] [--prefetch-tasks N] [--freeze-after N]

--freeze-after N: after the N-th record, once the master knows this trainer consumed them
all, the trainer stops itself (SIGSTOP), as a trainer frozen or cut off past its lease.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from chunkmaster.client import Reading, Session
from chunkmaster.client.client import Client


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--addr")
    where.add_argument("--endpoints", nargs="+")
    ap.add_argument("--job", default=None, help="the etcd job (with --endpoints)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--passes", type=int, required=True)
    ap.add_argument("--first-pass", type=int, default=0)
    ap.add_argument("--dataset", nargs="*", default=[])
    ap.add_argument("--commit-every", type=int, default=0)
    ap.add_argument("--report-every", type=int, default=1000)
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--name", default=None)
    ap.add_argument("--leave-after", type=int, default=0, help="close after N records")
    ap.add_argument("--shuffle-buffer", type=int, default=0)
    ap.add_argument("--wait-for", default=None, help="start once this file exists")
    ap.add_argument("--prefetch-tasks", type=int, default=1)
    ap.add_argument("--freeze-after", type=int, default=0, help="SIGSTOP self after N records")
    args = ap.parse_args(argv)
    while args.wait_for and not os.path.exists(args.wait_for):
        time.sleep(0.005)  # imports done: the trainer joins within milliseconds of the word
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(line: str) -> None:
        os.write(fd, (line + "\n").encode())  # one syscall: whole lines or nothing

    emit(f"s {os.getpid()}")
    where = (
        {"addr": args.addr}
        if args.addr
        else {"etcd_endpoints": args.endpoints, "etcd_job": args.job}
    )
    commits = 0
    with Client(
        **where,  # type: ignore[arg-type]
        name=args.name,
        session=Session(report_every=args.report_every),
        reading=Reading(shuffle_buffer=args.shuffle_buffer, prefetch_tasks=args.prefetch_tasks),
    ) as client:
        if args.dataset:
            client.set_dataset(args.dataset)
        for p in range(args.first_pass, args.first_pass + args.passes):
            taken = 0
            for record in client.records(p):
                emit(f"r {p} {int(record)}")
                taken += 1
                if taken == args.freeze_after:
                    freeze(client, taken)
                    emit("z")
                    os.kill(os.getpid(), signal.SIGSTOP)
                if args.leave_after and taken == args.leave_after:
                    break
                if args.commit_every and taken % args.commit_every == 0:
                    client.commit()
                    commits += 1
                    emit(f"c {commits}")
                if args.step_time:
                    time.sleep(args.step_time)
            if args.leave_after and taken == args.leave_after:
                emit("l")
                break  # leaving mid-pass: close() hands the held tasks back
            if args.commit_every:
                client.commit()
                commits += 1
                emit(f"c {commits}")
            emit(f"e {p}")
    emit("x")
    return 0


def freeze(client: Client, consumed: int) -> None:
    """Wait until the master has this session's position at `consumed` records: what it
    hands out again after the freeze starts there, so any record read twice is one read
    after it."""
    sid = client.session_id
    while True:
        trainers = client.status()["trainers"]
        assert isinstance(trainers, list)
        if any(t["session"] == sid and t["records_consumed"] >= consumed for t in trainers):
            return
        time.sleep(0.01)  # the next keep-alive carries the position


if __name__ == "__main__":
    sys.exit(main())

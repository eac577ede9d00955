"""A trainer process with a session for the metrics and alert tests: reads passes over TLS with
the token (CHUNKMASTER_TOKEN_FILE), one record every --step-time seconds, then closes.

    python tests/helpers/metrics_trainer.py --addr HOST:PORT --ca CA.pem --passes 2 \
        [--name NAME] [--world-size N --rank R] [--step-time S] [--hold-after N]
        [--stop-file FILE]

--hold-after N: after the N-th record, stop reading and keep the session (and the tasks it
holds) alive until killed: a trainer stuck in its training step. --stop-file: once it exists,
stop reading and close (the session ends, "returned"). Each record taken appends
"r PASS" to --out (one write a line), "x" a clean exit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from chunkmaster.client import Connection, Session
from chunkmaster.client.client import Client


def stopped(stop_file: str | None) -> bool:
    return stop_file is not None and os.path.exists(stop_file)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--addr", required=True)
    ap.add_argument("--ca", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--dataset", nargs="*", default=[])
    ap.add_argument("--name", default=None)
    ap.add_argument("--world-size", type=int, default=0)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--hold-after", type=int, default=0)
    ap.add_argument("--stop-file", default=None)
    args = ap.parse_args(argv)
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    with Client(
        args.addr,
        name=args.name,
        connection=Connection(tls_ca=args.ca),
        session=Session(report_every=1, world_size=args.world_size, rank=args.rank),
    ) as client:
        if args.dataset:
            client.set_dataset(args.dataset)
        taken = 0
        for p in range(args.passes):
            if stopped(args.stop_file):
                break
            for _ in client.records(p):
                if stopped(args.stop_file):
                    break
                os.write(fd, f"r {p}\n".encode())
                taken += 1
                if taken == args.hold_after:
                    while True:  # stuck: the session's keep-alives go on, no progress
                        time.sleep(3600)
                if args.step_time:
                    time.sleep(args.step_time)
    os.write(fd, b"x\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

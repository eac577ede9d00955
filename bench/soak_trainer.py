"""Several trainers in one process for the soak (bench/soak.py): one `Client` per thread.

Thread i logs to OUT.i: "r PASS ID" per record taken, "d PASS TASK EPOCH" per task the client
reported done, "e PASS" at the end of a pass and "x" at a clean exit; one os.write per line on an
O_APPEND descriptor, so a SIGKILL loses nothing that was logged. Even threads use a session,
odd ones the unary calls. Each reads pass after pass until the file STOP exists when a pass
begins (so every pass that anybody begins is read to its end).

    python bench/soak_trainer.py --endpoints URL --out PREFIX --threads 4 --stop FILE --dataset GLOB
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from chunkmaster.client import Connection
from chunkmaster.client.client import Client
from chunkmaster.core.model import Task


def trainer(
    endpoints: list[str], dataset: str, out: str, stop: str, session: bool, step: float
) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def on_done(task: Task) -> None:
        emit(f"d {task.pass_id} {task.meta.id} {task.meta.epoch}")

    emit(f"s {os.getpid()} {'session' if session else 'unary'}")
    with Client(
        etcd_endpoints=endpoints,
        on_task_done=on_done,
        session=session,
        name=os.path.basename(out),
        connection=Connection(etcd_timeout=10.0),
    ) as client:
        client.set_dataset([dataset])  # the first trainer's call sets it; later ones agree
        p = 0
        while not os.path.exists(stop):
            for record in client.records(p):
                emit(f"r {p} {int(record)}")
                if step:
                    time.sleep(step)
            emit(f"e {p}")
            p += 1
    emit("x")
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoints", required=True, nargs="+")
    ap.add_argument("--out", required=True, help="log file prefix: thread i writes PREFIX.i")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--step-time", type=float, default=0.0)
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    failed: list[BaseException] = []

    def run(i: int) -> None:
        try:
            trainer(
                args.endpoints,
                args.dataset,
                f"{args.out}.{i}",
                args.stop,
                i % 2 == 0,
                args.step_time,
            )
        except BaseException as exc:  # reported below: the soak fails on a non-zero exit
            logging.exception("trainer %d failed", i)
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"t{i}") for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""DataLoader workers and gRPC: many short `chunkmaster.torch.Loader` runs against one master, a
few at a time, each a trainer process with 2 DataLoader workers reading one small pass. It
counts the runs whose worker died (torch's "Unexpected segmentation fault encountered in
worker", a faulthandler dump, "DataLoader worker ... exited unexpectedly") or that did not exit
0, the passes not read exactly once over the runs that shared them, and the runs whose process
forked while gRPC's threads were live (gRPC says "Other threads are currently calling into
gRPC, skipping fork() handlers").

A worker once died of a segfault about once in 20 runs under torchrun (etcd discovery, 2
persistent workers, fork): a worker forked from a main process whose gRPC threads were
running. Faulthandler is on in the workers (worker_init_fn), so a crash leaves its stack in the
run's log. Run it with the machine busy, more runs at once than cores:

    .venv/bin/python bench/fork_loop.py --runs 100 --parallel 4 --context fork
    .venv/bin/python bench/fork_loop.py --runs 100 --parallel 4 --etcd          # the default start

`--context default` leaves the start method to the Loader; `--persistent` / `--no-persistent`
(default: half the runs each).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

RECORDS = 240
DIED = re.compile(
    r"Unexpected segmentation fault|Fatal Python error|exited unexpectedly|"
    r"Unexpected bus error|killed by signal"
)
FORKED_LIVE = "skipping fork() handlers"


def worker_init(worker: int) -> None:
    """A crash in a worker dumps its Python stacks into the run's log."""
    faulthandler.enable(all_threads=True)


def child(args: argparse.Namespace) -> int:
    """One trainer: a Loader, one pass; prints the pass and the record IDs it read (runs at
    once share a pass: the pass's records are checked over them)."""
    from helpers.torch_parts import ids_of, record_id

    from chunkmaster.core.errors import PassOverError
    from chunkmaster.torch import Loader

    where = {"etcd_endpoints": [args.etcd]} if args.etcd else {"addr": args.addr}
    context = None if args.context == "default" else args.context
    loader = Loader(
        **where,
        dataset=[args.dataset],
        transform=record_id,
        batch_size=8,
        num_workers=2,
        persistent_workers=args.persistent == "yes",
        multiprocessing_context=context,
        worker_init_fn=worker_init,
    )
    seen: list[int] = []
    for _ in range(5):  # runs at once share the master: a pass may end between status and read
        try:
            for batch in loader:
                seen += ids_of(batch)
                loader.commit()
            break
        except PassOverError:
            loader.set_pass(loader.client.status()["cur_pass"])  # type: ignore[arg-type]
    print(json.dumps({"pass": loader.pass_id - 1, "ids": seen}))  # type: ignore[operator]
    loader.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--context", default="fork", help="fork, spawn, forkserver or default")
    ap.add_argument("--persistent", choices=["yes", "no", "both"], default="both")
    ap.add_argument("--etcd", action="store_true", help="find the master through etcd")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds for one run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--dataset", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.etcd = os.environ.get("FORK_LOOP_ETCD")
        return child(args)

    from helpers.datasets import write_records
    from helpers.master_process import MasterProcess

    work = Path(tempfile.mkdtemp(prefix="fork-loop-"))
    data = write_records(work / "d.rio", [b"%06d" % i for i in range(RECORDS)], max_chunk_size=40)
    etcd = None
    margs = ["--chunk-per-task", "1"]
    if args.etcd:
        from helpers.etcd_server import EtcdServer

        etcd = EtcdServer()
        margs += ["--endpoints", etcd.endpoint, "--host", "127.0.0.1"]
    else:
        margs += ["--store", str(work / "state.db")]
    master = MasterProcess(margs).start()
    env = dict(os.environ, PYTHONFAULTHANDLER="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    if etcd is not None:
        env["FORK_LOOP_ETCD"] = etcd.endpoint

    def one(i: int) -> str:
        """How run `i` went: ok, died, exit N or hung; "+live" when it forked with
        live gRPC threads."""
        persistent = args.persistent if args.persistent != "both" else ("yes", "no")[i % 2]
        cmd = [sys.executable, __file__, "--child", "--addr", str(master.addr)]
        cmd += ["--dataset", str(data), "--context", args.context, "--persistent", persistent]
        log = work / f"run{i}.log"
        with open(log, "w") as err, open(work / f"run{i}.out", "w") as out:
            try:
                code = subprocess.run(cmd, stdout=out, stderr=err, env=env, timeout=args.deadline)
                rc: int | None = code.returncode
            except subprocess.TimeoutExpired:
                rc = None
        text = log.read_text()
        verdict = (
            "died" if DIED.search(text)
            else "hung" if rc is None
            else f"exit {rc}" if rc
            else "ok"
        )  # fmt: skip
        return verdict + ("+live" if FORKED_LIVE in text else "")

    start = time.monotonic()
    try:
        with ThreadPoolExecutor(args.parallel) as pool:
            verdicts = list(pool.map(one, range(args.runs)))
    finally:
        master.kill()
        if etcd is not None:
            etcd.cleanup()
    read: dict[int, Counter[int]] = {}
    for i, v in enumerate(verdicts):
        if v.startswith("ok"):
            got = json.loads((work / f"run{i}.out").read_text())
            read.setdefault(got["pass"], Counter()).update(got["ids"])
    wrong = [p for p, seen in read.items() if seen != Counter(range(RECORDS))]
    counts = Counter(verdicts)
    bad = [i for i, v in enumerate(verdicts) if not v.startswith("ok")]
    print(
        f"{args.runs} runs ({args.context}, persistent {args.persistent}"
        f"{', etcd' if args.etcd else ''}), {args.parallel} at a time, "
        f"{time.monotonic() - start:.0f} s: "
        + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        + f"; {len(read)} passes, {len(wrong)} not read exactly once"
        + (f" (logs: {', '.join(str(work / f'run{i}.log') for i in bad[:10])})" if bad else "")
    )
    return 1 if bad or wrong else 0


if __name__ == "__main__":
    sys.exit(main())

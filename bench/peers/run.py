"""Dispatch throughput side by side: chunkmaster's unary path, DLRover's master, tf.data service.

One cycle is one task handed to a trainer and done with: for chunkmaster GetTask + TaskFinished
against a `chunkmaster master` process (`--store :memory:` and the default embedded SQLite
store); for DLRover 0.6.1 `get(TaskRequest)` + `report(TaskResult)` against its standalone
master (dlrover_peer.py); for tf.data service one split handed out by a fault-tolerant
dispatcher and its element consumed by a client (tfdata_peer.py). README.md beside this file
says how each peer is set up and what its cycle costs next to ours.

Every runner gets the same load (drive.py): N client processes, one synchronous client each,
started together, cycles counted in one fixed window after a warm-up, a fresh server per
measurement, the same number of tasks. Repeats go round-robin over the runners, so the
machine's noise falls on all of them alike; the tables quote medians. Two figures: cycles/s,
and the server's CPU time per cycle (its processes' user + system time over the same window),
which the clients' share of the 2 cores disturbs least.

Baseline: chunkmaster-unary-memory, measured in the same run: the fastest plain way this
project hands out a task over gRPC (no durability, the same RPCs a trainer uses), so each
ratio says how a peer's or another path's dispatch compares with ours at its cheapest.

A runner is one entry in RUNNERS: a name and a function (clients, options) -> measurement (a
dict with at least "cycles_per_s" and "server_cpu_us_per_cycle", as drive.run_clients
returns). A chunkmaster path with its own client (the streaming session) is one more entry:
its client function, and `chunkmaster_runner(store, client)`.

    .venv/bin/python bench/peers/run.py                  # all runners, 1 and 8 clients, 5 repeats
    .venv/bin/python bench/peers/run.py --only dlrover,chunkmaster-unary-memory --repeats 3

Then the loader peers (loaders.py, issue 30): MosaicML Streaming, LitData and torchdata's
StatefulDataLoader beside chunkmaster's Loader and a plain DataLoader, reading the same records
at 1 KiB, 64 KiB and 1 MiB, and their exactness under a SIGKILL, 4 ranks resumed as 3 and a
mixture; `--loaders` runs that part alone, `--dispatch` (or `--only`) the dispatch part alone:

    .venv/bin/python bench/peers/run.py --loaders --sizes 1k --mb 8 --rounds 2 --no-exact

The peers' virtualenvs are created on first use by install.sh (~/.cache/chunkmaster/peers/).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # dispatch_bench, a sibling script

import loaders  # noqa: E402
from dispatch_bench import Master, make_dataset  # noqa: E402
from drive import Client, Window, count_cycles, run_clients  # noqa: E402

from chunkmaster.client.connection import MasterConnection  # noqa: E402
from chunkmaster.rpc import master_pb2 as pb  # noqa: E402
from chunkmaster.rpc import master_pb2_grpc as pb_grpc  # noqa: E402

BASELINE = "chunkmaster-unary-memory"
BATCH = 8  # tasks a batch client asks for in one NextTask
Measurement = dict[str, float]


@dataclass(frozen=True)
class Options:
    warmup: float
    seconds: float
    tasks: int
    root: Path


@dataclass(frozen=True)
class Runner:
    name: str
    measure: Callable[[int, Options], Measurement]  # (clients, options)


def unary_client(addr: str, index: int, wait_start: Callable[[], Window]) -> int:
    """A trainer's unary cycle: GetTask (long-poll), then TaskFinished."""
    with grpc.insecure_channel(addr) as channel:
        stub = pb_grpc.MasterStub(channel)
        pass_id = json.loads(stub.Status(pb.StatusRequest(), timeout=10).json)["cur_pass"]

        def cycle() -> bool:
            nonlocal pass_id
            try:
                reply = stub.GetTask(
                    pb.GetTaskRequest(pass_id=pass_id, wait_seconds=2.0), timeout=10
                )
            except grpc.RpcError as exc:
                if "smaller than master" in (exc.details() or ""):
                    pass_id += 1
                    return False
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return False
                raise
            meta = reply.task.meta
            stub.TaskFinished(
                pb.TaskFinishedRequest(
                    task_id=meta.id, epoch=meta.epoch, pass_id=reply.task.pass_id
                ),
                timeout=10,
            )
            return True

        return count_cycles(cycle, wait_start())


def session_client(
    addr: str, index: int, wait_start: Callable[[], Window], window: int = 1, batch: int = 1
) -> int:
    """A trainer's session cycle: NextTask requests that carry the previous tasks' finishes, on
    one stream, `window` of them in flight (1: the unary client's shape; 2: a Client that holds
    a task while it asks for the next, as tf.data's worker prefetches splits), each asking for
    up to `batch` tasks (a Client with prefetch_tasks = 2 * batch - 1 asks for `batch` at a
    time)."""
    requests: queue.SimpleQueue[pb.SessionRequest | None] = queue.SimpleQueue()
    with grpc.insecure_channel(addr) as channel:
        call = channel.stream_stream(
            "/chunkmaster.v1.Master/Session",
            request_serializer=pb.SessionRequest.SerializeToString,
            response_deserializer=pb.SessionResponse.FromString,
        )(iter(requests.get, None))
        seq = 1
        requests.put(pb.SessionRequest(seq=seq, hello=pb.Hello(name=f"bench-{index}")))
        next(call)
        pass_id = 0
        asked: dict[int, int] = {}  # request seq -> the pass it asked for

        def ask(finished: list[pb.TaskPosition]) -> None:
            nonlocal seq
            seq += 1
            asked[seq] = pass_id
            msg = pb.NextTask(
                finished=finished,
                want_task=True,
                pass_id=pass_id,
                wait_seconds=2,
                request_id=f"{index}-{seq}",
                max_tasks=batch if batch > 1 else 0,
            )
            requests.put(pb.SessionRequest(seq=seq, next=msg))

        for _ in range(window - 1):
            ask([])
        finished: list[pb.TaskPosition] = []

        def cycle() -> int:
            nonlocal pass_id, finished
            ask(finished)
            resp = next(call)
            finished = []
            body = resp.WhichOneof("body")
            if body == "error":
                if resp.error.error == "PassBeforeError":
                    pass_id = max(pass_id, asked[resp.seq] + 1)  # two in flight: move once
                elif resp.error.error not in ("NoMoreAvailableError", "PassAfterError"):
                    raise RuntimeError(resp.error.message)
                return 0
            tasks = resp.tasks.tasks if body == "tasks" else [resp.task]
            finished = [
                pb.TaskPosition(
                    task_id=t.meta.id,
                    epoch=t.meta.epoch,
                    pass_id=t.pass_id,
                    records=sum(c.num_records for c in t.chunks),
                )
                for t in tasks
            ]
            return len(tasks)

        try:
            return count_cycles(cycle, wait_start())
        finally:
            requests.put(None)
            call.cancel()


def session2_client(addr: str, index: int, wait_start: Callable[[], Window]) -> int:
    return session_client(addr, index, wait_start, window=2)


def session_batch_client(addr: str, index: int, wait_start: Callable[[], Window]) -> int:
    return session_client(addr, index, wait_start, window=2, batch=BATCH)


def client_client(addr: str, index: int, wait_start: Callable[[], Window]) -> int:
    """The default `chunkmaster.Client`, untuned (it sizes its requests by itself), reading
    the one-record tasks with `records()`: a cycle is a record taken (a task read and, when
    the client reports it, finished). Reads the next pass if one ends inside the window."""
    from chunkmaster.client import Client as ChunkmasterClient

    with ChunkmasterClient(addr, name=f"bench-{index}") as client:
        pass_id = int(client.status()["cur_pass"])  # type: ignore[call-overload]
        window = wait_start()
        records = client.records(pass_id)

        def cycle() -> int:
            nonlocal records, pass_id
            try:
                next(records)
            except StopIteration:
                pass_id += 1
                records = client.records(pass_id)
                return 0
            return 1

        return count_cycles(cycle, window)


def chunkmaster_runner(store: str, client: Client) -> Callable[[int, Options], Measurement]:
    """A fresh `chunkmaster master` per measurement (this .venv), `tasks` one-chunk tasks."""

    def measure(clients: int, opt: Options) -> Measurement:
        data = make_dataset(opt.root, opt.tasks)
        db = opt.root / f"store-{time.time_ns()}.db"
        store_args = ["--store", ":memory:" if store == "memory" else str(db)]
        master = Master([*store_args, "--chunk-per-task", "1", "--task-timeout-dur", "10m"])
        try:
            with MasterConnection(master.addr, timeout=600) as conn:
                conn.set_dataset([data])
            pids = [master.proc.pid]
            return run_clients(client, master.addr, clients, opt.warmup, opt.seconds, pids)
        finally:
            master.stop()
            for p in opt.root.glob(f"{db.name}*"):
                p.unlink()

    return measure


def peer_runner(peer: str) -> Callable[[int, Options], Measurement]:
    """A peer's script in its own virtualenv (installed on first use); one JSON line back."""

    def measure(clients: int, opt: Options) -> Measurement:
        python = loaders.python_of(peer)  # its virtualenv, made on first use
        cmd = [str(python), str(HERE / f"{peer}_peer.py"), "--clients", str(clients)]
        cmd += ["--warmup", str(opt.warmup), "--seconds", str(opt.seconds)]
        cmd += ["--tasks", str(opt.tasks)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{peer} peer failed ({done.returncode}):\n{done.stderr[-3000:]}")
        reply: Measurement = json.loads(done.stdout.strip().splitlines()[-1])
        return reply

    return measure


RUNNERS = [
    Runner("chunkmaster-unary-memory", chunkmaster_runner("memory", unary_client)),
    Runner("chunkmaster-unary-sqlite", chunkmaster_runner("sqlite", unary_client)),
    Runner("chunkmaster-session-memory", chunkmaster_runner("memory", session_client)),
    Runner("chunkmaster-session-sqlite", chunkmaster_runner("sqlite", session_client)),
    Runner("chunkmaster-session2-memory", chunkmaster_runner("memory", session2_client)),
    Runner("chunkmaster-session2-sqlite", chunkmaster_runner("sqlite", session2_client)),
    Runner("chunkmaster-batch-memory", chunkmaster_runner("memory", session_batch_client)),
    Runner("chunkmaster-batch-sqlite", chunkmaster_runner("sqlite", session_batch_client)),
    Runner("chunkmaster-client-memory", chunkmaster_runner("memory", client_client)),
    Runner("chunkmaster-client-sqlite", chunkmaster_runner("sqlite", client_client)),
    Runner("dlrover", peer_runner("dlrover")),
    Runner("tfdata", peer_runner("tfdata")),
]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--only", default="", help="comma-separated runner names")
    ap.add_argument("--dispatch", action="store_true", help="the dispatch runners only")
    ap.add_argument("--loaders", action="store_true", help="the loader peers only")
    loaders.add_arguments(ap)
    args = ap.parse_args()
    if not args.loaders:
        dispatch(ap, args)
    if not (args.dispatch or args.only):
        loaders.main(args)


def dispatch(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    names = [r.name for r in RUNNERS]
    wanted = args.only.split(",") if args.only else names
    unknown = [w for w in wanted if w not in names]
    if unknown:
        ap.error(f"unknown runner(s) {unknown}; known: {names}")
    runners = [r for r in RUNNERS if r.name in wanted]
    clients = [int(c) for c in args.clients.split(",")]
    opt = Options(args.warmup, args.seconds, args.tasks, Path(tempfile.mkdtemp(prefix="peers-")))
    print(
        f"cpus={os.cpu_count()} window={opt.seconds}s warmup={opt.warmup}s tasks={opt.tasks} "
        f"repeats={args.repeats}",
        flush=True,
    )
    results: dict[tuple[str, int], list[Measurement]] = {}
    for repeat in range(args.repeats):
        for n in clients:
            for runner in runners:
                m = runner.measure(n, opt)
                results.setdefault((runner.name, n), []).append(m)
                row: dict[str, object] = {"runner": runner.name, "clients": n, "repeat": repeat}
                row |= {k: round(v, 3) for k, v in m.items()}
                print(json.dumps(row), flush=True)
    print_table(runners, clients, results, "cycles_per_s", "cycles/s", args.repeats)
    print_table(
        runners, clients, results, "server_cpu_us_per_cycle", "server CPU us/cycle", args.repeats
    )


def print_table(
    runners: list[Runner],
    clients: list[int],
    results: dict[tuple[str, int], list[Measurement]],
    key: str,
    label: str,
    repeats: int,
) -> None:
    print()
    print(f"{label}, median of {repeats} (min-max); ratio = median / {BASELINE}'s median")
    print(f"{'runner':26}" + "".join(f" {f'{n} cl {label}':>26} {'ratio':>6}" for n in clients))
    for runner in runners:
        line = f"{runner.name:26}"
        for n in clients:
            xs = [m[key] for m in results[(runner.name, n)]]
            med = statistics.median(xs)
            base = results.get((BASELINE, n))
            ratio = f"{med / statistics.median(m[key] for m in base):.2f}" if base else "-"
            spread = f"{med:.0f} ({min(xs):.0f}-{max(xs):.0f})"
            line += f" {spread:>26} {ratio:>6}"
        print(line)


if __name__ == "__main__":
    main()

"""Trainer sessions: dispatch over the session stream, commit latency, idle sessions' cost.

1. Dispatch: cycles/s (a task handed out and reported finished) over the Session stream, where
   a finish and the next request travel in one message (one request in flight per trainer,
   and two, as a Client that prefetches one task keeps), against today's unary path
   (GetTask + TaskFinished, two calls a cycle), with 1 and 8 clients, on the in-memory and the
   embedded store, and in batches of 8 tasks a message (two in flight). Baseline: the unary
   path of the same master build in the same run, driven by the same asyncio gRPC clients
   (bench/dispatch_bench.py's loop): the fastest way a trainer without a session can cycle.
   The clients do no reading: this measures the master.
1b. A real `Client` (session, in-memory store) reading one-record tasks, as it comes (it sizes
   its requests by its pace), and with `Reading(prefetch_tasks=)` 1 (one task a message, in
   steady state: the default before) and 15 (batches of 8): tasks/s, against the raw
   batch client of (1) on a fresh master in the same run (the master's rate with no reading:
   a ceiling, not a peer).
2. commit() latency, p50 and p99, on the embedded store and on etcd: one trainer holding a task
   commits a new position again and again and waits for each acknowledgement (it is durable
   then: an fsync on the embedded store, a raft round on etcd). Reported as measured (ms);
   the embedded store's baseline is the same master's dispatch cycle latency in the same run.
3. The master's CPU with 256 live sessions keeping alive and no task moving: CPU seconds the
   master process used per wall second over the window (from /proc), keep-alives every
   ttl/3 as the client sends them.
4. From a trainer's SIGKILL to its tasks being handed to another trainer, with
   `--trainer-ttl 3` and a task timeout of an hour: a trainer process holding two tasks and
   keeping its session alive is killed; another trainer long-polls for a task. Target: under
   twice the TTL (the lease runs out at most one TTL after the last keep-alive).

    .venv/bin/python bench/session_bench.py                 # everything
    .venv/bin/python bench/session_bench.py --only dispatch --seconds 4 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from dispatch_bench import Master, _client_loop, make_dataset
from dispatch_bench import measure as dispatch_measure

from chunkmaster.client import Reading
from chunkmaster.client.connection import MasterConnection
from chunkmaster.rpc import master_pb2 as pb

SESSION_METHOD = "/chunkmaster.v1.Master/Session"
BATCH = 8  # tasks a batch asks for (NextTask.max_tasks)


class StreamSession:
    """A minimal session client on grpc.aio: one outstanding request at a time."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._call = channel.stream_stream(
            SESSION_METHOD,
            request_serializer=pb.SessionRequest.SerializeToString,
            response_deserializer=pb.SessionResponse.FromString,
        )()
        self._seq = 0

    async def ask(self, **body: Any) -> Any:
        self._seq += 1
        await self._call.write(pb.SessionRequest(seq=self._seq, **body))
        resp = await self._call.read()
        assert resp.seq == self._seq, resp
        return resp

    async def tell(self, **body: Any) -> None:
        self._seq += 1
        await self._call.write(pb.SessionRequest(seq=self._seq, **body))

    async def hello(self, name: str) -> Any:
        return await self.ask(hello=pb.Hello(name=name, host="bench", pid=os.getpid()))

    async def close(self) -> None:
        await self.ask(goodbye=pb.Goodbye())
        await self._call.done_writing()


def _pos(t: Any, records: int) -> pb.TaskPosition:
    return pb.TaskPosition(
        task_id=t.meta.id, epoch=t.meta.epoch, pass_id=t.pass_id, records=records
    )


async def _session_loop(
    addr: str, stop_at: float, counts: list[int], slot: int, window: int = 1, batch: int = 1
) -> None:
    """Keep `window` NextTask requests in flight, each for up to `batch` tasks; each answer's
    finishes ride on the next one."""
    async with grpc.aio.insecure_channel(addr) as ch:
        call = ch.stream_stream(
            SESSION_METHOD,
            request_serializer=pb.SessionRequest.SerializeToString,
            response_deserializer=pb.SessionResponse.FromString,
        )()
        seq = 1
        await call.write(pb.SessionRequest(seq=seq, hello=pb.Hello(name=f"bench-{slot}")))
        await call.read()
        pass_id = 0
        asked: dict[int, int] = {}  # request seq -> the pass it asked for

        async def ask(finished: list[pb.TaskPosition]) -> None:
            nonlocal seq
            seq += 1
            asked[seq] = pass_id
            msg = pb.NextTask(
                finished=finished,
                want_task=True,
                pass_id=pass_id,
                wait_seconds=2,
                max_tasks=batch if batch > 1 else 0,
            )
            await call.write(pb.SessionRequest(seq=seq, next=msg))

        for _ in range(window):
            await ask([])
        in_flight = window
        while in_flight:
            resp = await call.read()
            in_flight -= 1
            finished: list[pb.TaskPosition] = []
            if resp.WhichOneof("body") == "error":
                if resp.error.error == "PassBeforeError":
                    pass_id = max(pass_id, asked[resp.seq] + 1)  # two in flight: move once
                elif resp.error.error not in ("NoMoreAvailableError", "PassAfterError"):
                    raise RuntimeError(resp.error.message)
            else:
                got = resp.tasks.tasks if resp.WhichOneof("body") == "tasks" else [resp.task]
                finished = [_pos(t, sum(c.num_records for c in t.chunks)) for t in got]
                counts[slot] += len(got)
            if time.monotonic() < stop_at:
                await ask(finished)
                in_flight += 1
        seq += 1
        await call.write(pb.SessionRequest(seq=seq, goodbye=pb.Goodbye()))
        await call.read()
        await call.done_writing()


async def _session2_loop(addr: str, stop_at: float, counts: list[int], slot: int) -> None:
    await _session_loop(addr, stop_at, counts, slot, window=2)


async def _batch_loop(addr: str, stop_at: float, counts: list[int], slot: int) -> None:
    await _session_loop(addr, stop_at, counts, slot, window=2, batch=BATCH)


def _load_process(
    kind: str, addr: str, clients: int, warmup: float, seconds: float, out: mp.Queue
) -> None:
    loop_fn = {
        "session": _session_loop,
        "session2": _session2_loop,
        "batch": _batch_loop,
        "unary": _client_loop,
    }[kind]

    async def main() -> None:
        counts = [0] * clients
        stop_at = time.monotonic() + warmup + seconds
        tasks = [asyncio.create_task(loop_fn(addr, stop_at, counts, i)) for i in range(clients)]
        await asyncio.sleep(warmup)
        before = sum(counts)
        t0 = time.monotonic()
        await asyncio.gather(*tasks)
        out.put((sum(counts) - before, time.monotonic() - t0))

    asyncio.run(main())


def measure(kind: str, addr: str, clients: int, warmup: float, seconds: float) -> float:
    return dispatch_measure(addr, clients, warmup, seconds, _load_process, (kind,))


def store_args(store: str, root: Path) -> list[str]:
    if store == "memory":
        return ["--store", ":memory:"]
    return ["--store", str(root / f"s-{time.time_ns()}.db")]


def bench_dispatch(root: Path, tasks: int, clients: list[int], args: Any) -> list[dict]:
    data = make_dataset(root, tasks)
    rows = []
    for store in ("memory", "sqlite"):
        m = Master([*store_args(store, root), "--chunk-per-task", "1", "--task-timeout-dur", "10m"])
        try:
            with MasterConnection(m.addr, timeout=600) as c:
                c.set_dataset([data])
            for n in clients:
                for rep in range(args.repeat):
                    unary = measure("unary", m.addr, n, args.warmup, args.seconds)
                    session = measure("session", m.addr, n, args.warmup, args.seconds)
                    session2 = measure("session2", m.addr, n, args.warmup, args.seconds)
                    batch = measure("batch", m.addr, n, args.warmup, args.seconds)
                    row = {
                        "bench": "dispatch",
                        "store": store,
                        "clients": n,
                        "repeat": rep,
                        "unary": round(unary),
                        "session": round(session),
                        "ratio": round(session / unary, 2),
                        "session_window2": round(session2),
                        "ratio_window2": round(session2 / unary, 2),
                        "batch": round(batch),
                        "ratio_batch": round(batch / unary, 2),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            m.stop()
    return rows


async def _commit_latencies(addr: str, n: int) -> list[float]:
    async with grpc.aio.insecure_channel(addr) as ch:
        s = StreamSession(ch)
        await s.hello("committer")
        resp = await s.ask(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=5))
        t = resp.task
        total = sum(c.num_records for c in t.chunks)
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            resp = await s.ask(commit=pb.Commit(positions=[_pos(t, 1 + i % (total - 1))]))
            out.append(time.perf_counter() - t0)
            assert resp.WhichOneof("body") == "ack", resp
            if (i + 1) % (total - 2) == 0:  # positions only grow: start over on a new task
                resp = await s.ask(
                    next=pb.NextTask(
                        finished=[_pos(t, total)], want_task=True, pass_id=0, wait_seconds=5
                    )
                )
                t = resp.task
        await s.close()
        return out


def bench_commit(root: Path, etcd_endpoint: str | None, n: int) -> list[dict]:
    path = root / "commit.rio"
    if not path.exists():
        from chunkmaster.recordio import Compressor, Writer

        with Writer(str(path), max_chunk_size=10**9, compressor=Compressor.NONE) as w:
            for i in range(100_000):
                w.write(b"%08d" % i)
    rows = []
    targets: list[tuple[str, list[str]]] = [("sqlite", store_args("sqlite", root))]
    if etcd_endpoint:
        targets.append(("etcd", ["--endpoints", etcd_endpoint, "--host", "127.0.0.1"]))
    for name, extra in targets:
        m = Master([*extra, "--chunk-per-task", "1"])
        try:
            with MasterConnection(m.addr, timeout=600) as c:
                c.set_dataset([str(path)])
            lat = sorted(asyncio.run(_commit_latencies(m.addr, n)))
            row = {
                "bench": "commit",
                "store": name,
                "n": n,
                "p50_ms": round(1000 * lat[len(lat) // 2], 2),
                "p99_ms": round(1000 * lat[int(len(lat) * 0.99)], 2),
                "mean_ms": round(1000 * statistics.fmean(lat), 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        finally:
            m.stop()
    return rows


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_sessions(addr: str, n: int, hold: float, ready: Any, out: mp.Queue) -> None:
    async def main() -> None:
        chans = [grpc.aio.insecure_channel(addr) for _ in range(n)]
        sessions = [StreamSession(ch) for ch in chans]
        welcomes = await asyncio.gather(*(s.hello(f"idle-{i}") for i, s in enumerate(sessions)))
        every = welcomes[0].welcome.keep_alive_seconds
        ready.set()
        stop_at = time.monotonic() + hold
        while time.monotonic() < stop_at:
            await asyncio.sleep(every)
            await asyncio.gather(*(s.tell(keep_alive=pb.KeepAlive()) for s in sessions))
        await asyncio.gather(*(s.close() for s in sessions))
        for ch in chans:
            await ch.close()
        out.put(n)

    asyncio.run(main())


def bench_idle(root: Path, sessions: int, seconds: float) -> dict:
    m = Master(["--store", ":memory:"])
    try:
        ctx = mp.get_context("spawn")
        q: mp.Queue = ctx.Queue()
        ready = ctx.Event()
        per = sessions // 2
        procs = [
            ctx.Process(target=_idle_sessions, args=(m.addr, per, seconds + 10, ready, q))
            for _ in range(2)
        ]
        for p in procs:
            p.start()
        ready.wait(120)
        time.sleep(3)  # both processes' sessions open
        status = MasterConnection(m.addr).status()
        c0, t0 = _cpu_seconds(m.proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = _cpu_seconds(m.proc.pid), time.monotonic()
        for _ in procs:
            q.get(timeout=seconds + 120)
        for p in procs:
            p.join(30)
        row = {
            "bench": "idle",
            "sessions": status["sessions"],
            "cpu_per_s": round((c1 - c0) / (t1 - t0), 4),
            "keep_alive_s": status["trainer_ttl"] / 3,
        }
        print(json.dumps(row), flush=True)
        return row
    finally:
        m.stop()


def _holder(addr: str, ready: Any) -> None:
    """A trainer that takes two tasks and keeps its session alive until it is killed."""

    async def main() -> None:
        async with grpc.aio.insecure_channel(addr) as ch:
            s = StreamSession(ch)
            welcome = await s.hello("victim")
            for _ in range(2):
                await s.ask(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=5))
            ready.set()
            while True:
                await asyncio.sleep(welcome.welcome.keep_alive_seconds)
                await s.tell(keep_alive=pb.KeepAlive())

    asyncio.run(main())


async def _wait_for_task(addr: str, killed_at: Any) -> tuple[float, int]:
    async with grpc.aio.insecure_channel(addr) as ch:
        s = StreamSession(ch)
        await s.hello("survivor")
        while True:
            resp = await s.ask(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=30))
            if resp.WhichOneof("body") == "task":
                return time.monotonic() - killed_at(), resp.task.meta.id


async def _kill_and_wait(addr: str, victim: Any) -> float:
    """SIGKILL the victim while a survivor long-polls; seconds until the survivor has a task."""
    kill_time: list[float] = []
    waiter = asyncio.create_task(_wait_for_task(addr, lambda: kill_time[0]))
    await asyncio.sleep(0.5)  # the survivor is long-polling
    os.kill(victim.pid, 9)
    kill_time.append(time.monotonic())
    took, _ = await waiter
    return took


def bench_takeover(root: Path, ttl: float, repeat: int) -> list[dict]:
    data = make_dataset(root, 2)  # two tasks: the victim holds both
    rows = []
    for rep in range(repeat):
        m = Master(
            [
                *("--store", ":memory:", "--chunk-per-task", "1"),
                *("--trainer-ttl", str(ttl), "--task-timeout-dur", "1h"),
            ]
        )
        try:
            with MasterConnection(m.addr, timeout=600) as c:
                c.set_dataset([data])
            ctx = mp.get_context("spawn")
            ready = ctx.Event()
            victim = ctx.Process(target=_holder, args=(m.addr, ready))
            victim.start()
            ready.wait(60)
            took = asyncio.run(_kill_and_wait(m.addr, victim))
            victim.join(10)
            row = {
                "bench": "takeover",
                "repeat": rep,
                "ttl_s": ttl,
                "seconds": round(took, 2),
                "ratio_to_ttl": round(took / ttl, 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        finally:
            m.stop()
    return rows


#: The raw batch client of (1) (the ceiling), the default Client, and fixed prefetches.
CLIENT_KINDS = ("raw_batch", "default", "prefetch1", "prefetch15")


def _client_rate(addr: str, prefetch: int | None, warmup: float, seconds: float) -> float:
    """Tasks/s of one real Client reading one-record tasks, over a window after a warm-up
    (`prefetch` None: the default client, which sizes its requests by its pace)."""
    from chunkmaster.client import Client

    with Client(addr, name=f"reader-{prefetch}", reading=Reading(prefetch_tasks=prefetch)) as c:
        it = c.records(0)
        start = time.monotonic() + warmup
        while time.monotonic() < start:
            next(it)
        n, t0, stop = 0, time.monotonic(), time.monotonic() + seconds
        while time.monotonic() < stop:
            next(it)
            n += 1
        return n / (time.monotonic() - t0)


def bench_client(root: Path, tasks: int, args: Any) -> list[dict]:
    data = make_dataset(root, tasks)
    master_args = ["--store", ":memory:", "--chunk-per-task", "1", "--task-timeout-dur", "10m"]
    rows = []
    for rep in range(args.repeat):
        row: dict[str, Any] = {"bench": "client", "repeat": rep}
        for what in CLIENT_KINDS:
            m = Master(master_args)
            try:
                with MasterConnection(m.addr, timeout=600) as c:
                    c.set_dataset([data])
                if what == "raw_batch":
                    rate = measure("batch", m.addr, 1, args.warmup, args.seconds)
                else:
                    prefetch = None if what == "default" else int(what.removeprefix("prefetch"))
                    rate = _client_rate(m.addr, prefetch, args.warmup, args.seconds)
            finally:
                m.stop()
            row[what] = round(rate)
        for what in CLIENT_KINDS[1:]:
            row[f"ratio_{what}"] = round(row[what] / row["raw_batch"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\ntasks/s of one real Client reading one-record tasks (medians of the repeats)")
    for key in CLIENT_KINDS:
        med = statistics.median(r[key] for r in rows)
        ratio = med / statistics.median(r["raw_batch"] for r in rows)
        print(f"  {key:10} {med:8.0f}  x{ratio:.2f} of the raw batch client")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only", choices=("dispatch", "client", "commit", "idle", "takeover"), default=None
    )
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument(
        "--no-etcd", action="store_true", help="skip the commit bench on etcd (no etcd server)"
    )
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="session-bench-"))
    print(f"cpus={os.cpu_count()} python={sys.version.split()[0]}", flush=True)
    if args.only in (None, "dispatch"):
        rows = bench_dispatch(root, args.tasks, [int(c) for c in args.clients.split(",")], args)
        print("\ncycles/s, session stream vs unary (medians of the repeats)")
        for store in ("memory", "sqlite"):
            for n in sorted({r["clients"] for r in rows}):
                mine = [r for r in rows if r["store"] == store and r["clients"] == n]
                u = statistics.median(r["unary"] for r in mine)
                s = statistics.median(r["session"] for r in mine)
                ratio = statistics.median(r["ratio"] for r in mine)
                s2 = statistics.median(r["session_window2"] for r in mine)
                r2 = statistics.median(r["ratio_window2"] for r in mine)
                b = statistics.median(r["batch"] for r in mine)
                rb = statistics.median(r["ratio_batch"] for r in mine)
                print(
                    f"  {store:7} {n:2} clients: unary {u:8.0f}  session {s:8.0f} x{ratio:<5}"
                    f"  session, 2 requests in flight {s2:8.0f} x{r2:<5}"
                    f"  batches of {BATCH}, 2 in flight {b:8.0f} x{rb}"
                )
    if args.only in (None, "client"):
        bench_client(root, args.tasks, args)
    if args.only in (None, "commit"):
        if args.no_etcd:
            bench_commit(root, None, args.commits)
        else:
            from helpers.etcd_server import EtcdServer

            with EtcdServer() as etcd:
                bench_commit(root, etcd.endpoint, args.commits)
    if args.only in (None, "idle"):
        bench_idle(root, 256, args.seconds * 2)
    if args.only in (None, "takeover"):
        bench_takeover(root, 3.0, args.repeat)


if __name__ == "__main__":
    main()

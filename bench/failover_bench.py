"""High availability on etcd: failover latency seen by a trainer, dispatch rate and etcd bytes.

(a) SIGKILL of the leader -> the first record a trainer takes from a task of the new leader
    (the lease has to expire: bounded by --ttl). Target with --ttl 5: < 6 s.
(b) the same after SIGTERM (the leader revokes its lease: a standby takes over at once).
    Target: < 1 s.
(c) GetTask+TaskFinished cycles/s over gRPC, 8 clients, with the etcd store at 10k and 1M tasks
    (reuses dispatch_bench's make_dataset, Master and measure). Target: rate(1M) >= 0.7 rate(10k).
(d) what etcd receives and writes per cycle, from etcd's own /metrics, before/after N cycles
    at 10k and 1M tasks: it must not grow with the dataset (the Go master wrote the whole state
    on every operation, D6).

Baselines: (a) is bounded below by the lease TTL itself (no standby may lead before the dead
leader's lease expires), so it is reported against --ttl; (b) has no such floor; (c) compares
1M tasks against 10k tasks in the same run (the cost must not grow with the dataset); (d)
against a constant per cycle.

Every master, etcd and trainer is a real process (the trainer of (a)/(b) is a Client thread in
this process). The original, for comparison: after its leader was killed (ttl 5) its trainers
did not follow the new leader at all; 115 cycles/s at 1k tasks, 32 at 10k with etcd.

    .venv/bin/python bench/failover_bench.py                 # everything (a few minutes)
    .venv/bin/python bench/failover_bench.py --skip-rates    # (a) and (b) only
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "tests")]

from dispatch_bench import Master, make_dataset, measure  # noqa: E402
from helpers.etcd_server import EtcdServer  # noqa: E402
from helpers.master_process import MasterProcess  # noqa: E402

from chunkmaster.client import Reading  # noqa: E402
from chunkmaster.client.client import Client  # noqa: E402
from chunkmaster.client.connection import MasterConnection  # noqa: E402
from chunkmaster.core.errors import PassBeforeError  # noqa: E402

METRICS = (
    "etcd_network_client_grpc_received_bytes_total",
    "etcd_disk_wal_write_bytes_total",
    "etcd_mvcc_put_total",
    "etcd_mvcc_txn_total",
    "etcd_mvcc_db_total_size_in_bytes",
)


# ---- (a) and (b): failover as a trainer sees it ------------------------------------------


class Taker:
    """A trainer that takes records as fast as it can, noting when and from which master.

    prefetch_tasks=0 (one record per task): no task held ahead of the one being read, so
    soon after a kill every record taken comes from a task of the new leader.
    """

    def __init__(self, endpoint: str) -> None:
        self.client = Client(etcd_endpoints=[endpoint], reading=Reading(prefetch_tasks=0))
        self.cond = threading.Condition()
        self.last: tuple[float, str | None] = (0.0, None)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for _ in self.client.records(0):
            t = time.monotonic()
            addr = self.client.address
            with self.cond:
                self.last = (t, addr)
                self.cond.notify_all()

    def first_take_from(self, addr: str, after: float, timeout: float = 60.0) -> float:
        """Time of the first record taken after `after` while `addr` is the master."""
        end = time.monotonic() + timeout
        with self.cond:
            while not (self.last[0] > after and self.last[1] == addr):
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no record from {addr}")
                self.cond.wait(left)
            return self.last[0]

    def close(self) -> None:
        self.client.close()
        self.thread.join(10)


def bench_failover(root: Path, ttl: int, kills: int, terms: int) -> dict[str, list[float]]:
    """Kill (then terminate) the leader repeatedly; a replacement standby keeps two waiting."""
    data = make_dataset(root, 200_000)
    out: dict[str, list[float]] = {"kill": [], "kill_serving": [], "term": [], "term_serving": []}
    with EtcdServer() as etcd:
        args = ["--endpoints", etcd.endpoint, "--host", "127.0.0.1", "--ttl", str(ttl)]
        args += ["--chunk-per-task", "1", "--task-timeout-dur", "10m", "--log-level", "info"]

        def standby() -> MasterProcess:
            m = MasterProcess(args).start(wait=False)
            if not m.wait_log("waiting for the master lock", 30):
                raise RuntimeError("standby did not start:\n" + m.log())
            return m

        masters = [MasterProcess(args).start(), standby(), standby()]
        leader = masters[0]
        with MasterConnection(leader.addr, timeout=120) as conn:
            conn.set_dataset([data])
        taker = Taker(etcd.endpoint)
        try:
            for kind, reps in (("kill", kills), ("term", terms)):
                for _ in range(reps):
                    taker.first_take_from(leader.addr or "", time.monotonic())  # steady state
                    time.sleep(0.5)
                    t0 = time.monotonic()
                    if kind == "kill":
                        leader.kill()
                    else:
                        leader.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                    masters = [m for m in masters if m is not leader]
                    leader = _wait_leader(masters, ttl + 30)
                    serving = time.monotonic() - t0
                    took = taker.first_take_from(leader.addr or "", t0) - t0
                    out[kind].append(took)
                    out[kind + "_serving"].append(serving)
                    print(
                        f"  {kind}: new leader serving after {serving:.3f}s, trainer "
                        f"took a record from it after {took:.3f}s",
                        flush=True,
                    )
                    masters.append(standby())
        finally:
            taker.close()
            for m in masters:
                m.kill()
    return out


def _wait_leader(masters: list[MasterProcess], timeout: float) -> MasterProcess:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for m in masters:
            if m.addr is not None and m.running:
                return m
        time.sleep(0.002)
    raise RuntimeError("no standby took over")


# ---- (c) and (d): dispatch rate and etcd bytes per operation --------------------------------


def etcd_metrics(endpoint: str) -> dict[str, float]:
    with urllib.request.urlopen(endpoint + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRICS:
            values[name] = float(value)
    return values


def run_cycles(addr: str, n: int) -> None:
    """n GetTask+TaskFinished cycles from one connection (continuing into the next pass)."""
    with MasterConnection(addr, timeout=60) as conn:
        pass_id = int(conn.status()["cur_pass"])  # type: ignore[call-overload]
        done = 0
        while done < n:
            try:
                t = conn.get_task(pass_id, wait=2.0)
            except PassBeforeError:
                pass_id += 1
                continue
            conn.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=t.pass_id)
            done += 1


def bench_store(
    root: Path, sizes: list[int], clients: int, warmup: float, secs: float, ops: int
) -> list[dict[str, float]]:
    rows = []
    for size in sizes:
        data = make_dataset(root, size)
        with EtcdServer() as etcd:
            m = Master(
                [
                    *("--endpoints", etcd.endpoint, "--host", "127.0.0.1", "--ttl", "10"),
                    *("--chunk-per-task", "1", "--task-timeout-dur", "10m"),
                ]
            )
            try:
                t0 = time.perf_counter()
                with MasterConnection(m.addr, timeout=600) as c:
                    c.set_dataset([data])
                set_s = time.perf_counter() - t0
                rate = measure(m.addr, clients, warmup, secs)
                before = etcd_metrics(etcd.endpoint)
                t1 = time.perf_counter()
                run_cycles(m.addr, ops)
                seq_s = time.perf_counter() - t1
                after = etcd_metrics(etcd.endpoint)
                per = {k: (after.get(k, 0) - before.get(k, 0)) / ops for k in METRICS}
                row = {"tasks": size, "set_s": set_s, "rate": rate, "seq_rate": ops / seq_s}
                row.update(per)
                row["db_mb"] = after["etcd_mvcc_db_total_size_in_bytes"] / 2**20
                rows.append(row)
                print(
                    f"  {size} tasks: {rate:.0f} cycles/s ({clients} clients), "
                    f"{per[METRICS[0]]:.0f} B/cycle received by etcd",
                    flush=True,
                )
            finally:
                m.stop()
    return rows


def _stats(xs: list[float]) -> str:
    return f"{min(xs):7.3f} {statistics.median(xs):7.3f} {max(xs):7.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ttl", type=int, default=5)
    ap.add_argument("--kills", type=int, default=5, help="SIGKILL repetitions")
    ap.add_argument("--terms", type=int, default=10, help="SIGTERM repetitions")
    ap.add_argument("--sizes", default="10000,1000000")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--ops", type=int, default=6000, help="cycles for the bytes/op window")
    ap.add_argument("--skip-failover", action="store_true")
    ap.add_argument("--skip-rates", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    logging.getLogger("chunkmaster").setLevel(logging.ERROR)  # reconnect chatter: expected
    print(f"cpus={os.cpu_count()} python={sys.version.split()[0]} etcd=3.4 (single member)")
    fo: dict[str, list[float]] = {}
    rows: list[dict[str, float]] = []
    if not args.skip_failover:
        print(f"(a)/(b) failover, ttl {args.ttl}s:", flush=True)
        fo = bench_failover(root, args.ttl, args.kills, args.terms)
    if not args.skip_rates:
        print("(c)/(d) dispatch on the etcd store:", flush=True)
        sizes = [int(s) for s in args.sizes.split(",")]
        rows = bench_store(root, sizes, args.clients, args.warmup, args.seconds, args.ops)

    print()
    if fo:

        def line(what: str, target: str, xs: list[float]) -> str:
            return f"{what:44} {len(xs):>4} {_stats(xs)}   {target}"

        print(
            f"Failover (seconds from the signal), ttl {args.ttl}s      reps     min  median"
            "     max   target"
        )
        print(line("(a) SIGKILL -> trainer's first new-leader task", "< 6", fo["kill"]))
        print(line("    SIGKILL -> new leader serving", "", fo["kill_serving"]))
        print(line("(b) SIGTERM -> trainer's first new-leader task", "< 1", fo["term"]))
        print(line("    SIGTERM -> new leader serving", "", fo["term_serving"]))
        print()
    if rows:
        print(
            f"(c) dispatch cycles/s, etcd store, {args.clients} clients; "
            f"(d) per cycle over {args.ops} sequential cycles, from etcd /metrics"
        )
        print(
            f"{'tasks':>9} {'set_dataset':>11} {'cycles/s':>9} {'seq c/s':>8} "
            f"{'rx B':>7} {'WAL B':>7} {'puts':>5} {'txns':>5} {'db MB':>7}"
        )
        for r in rows:
            print(
                f"{r['tasks']:>9} {r['set_s']:>10.1f}s {r['rate']:>9.0f} {r['seq_rate']:>8.0f} "
                f"{r[METRICS[0]]:>7.0f} {r[METRICS[1]]:>7.0f} {r[METRICS[2]]:>5.2f} "
                f"{r[METRICS[3]]:>5.2f} {r['db_mb']:>7.1f}"
            )
        if len(rows) >= 2:
            lo, hi = rows[0], rows[-1]
            print(
                f"rate at {hi['tasks']:.0f} / rate at {lo['tasks']:.0f} tasks = "
                f"{hi['rate'] / lo['rate']:.2f} (target >= 0.7); bytes received per cycle "
                f"{hi[METRICS[0]] / lo[METRICS[0]]:.2f}x"
            )


if __name__ == "__main__":
    main()

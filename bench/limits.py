"""Published limits (issue 21): how far one master goes, measured on the machine it runs on.

One command per figure; each prints one JSON object per measurement (`--json-out` keeps them).

  sessions  Trainers per master. 1,000 / 5,000 / 10,000 live sessions held by a few load
            processes (asyncio gRPC, one channel and one Session stream per trainer, as real
            trainers have; each stream says Hello, then sends a KeepAlive every ttl/3 as the
            Welcome asks, spread over the period), at the master's default --trainer-ttl and
            default store (the embedded one, fsync on). At each level: the master's CPU (share
            of one core, from /proc/PID/stat: all its threads) and memory (VmRSS) over a window
            with nothing but keep-alives, then the dispatch latency (NextTask carrying the last
            finish -> its task, p50/p99) of one working trainer (its own process) asking at a
            fixed pace. Level 0 (no idle sessions) in the same run is the baseline the others
            are read against: it is what this shared machine gives without the load.
            Goal: 10,000 sessions with the master under one core and dispatch p99 under 50 ms.
            The load processes run at nice 10 while anything is measured, so they never take
            the CPU from the master or the working trainer; their own CPU, the keep-alive
            rate they delivered against the rate due and the longest any session went
            without one are reported (a session lost to a late keep-alive shows as fewer
            sessions at the end). On a machine shared with other work, --boost -10 (as
            root) runs the master and the working trainer ahead of it, as on a host with a
            core for the master: the published figures (docs/limits.md) use it.
  tasks     Tasks per dataset. RecordIO files of one-record chunks (each chunk is a valid
            RecordIO chunk; the file is one chunk's bytes repeated, written at disk speed),
            `--chunk-per-task 1`: 10k (baseline), 1M and 10M tasks, on the embedded store.
            set_dataset time and master memory; the dispatch rate (8 session trainers, one
            request in flight each) at every size, measured in interleaved rounds so that the
            machine's drift hits every size alike (the ratio is the median of the rounds'
            ratios; goal: 10M >= 0.7x 10k); data checkpoint size and time (DataCheckpoint);
            recovery after SIGKILL (restart -> ready file, against an empty master's start in
            the same run); the store's bytes on disk, and the snapshot the master would write
            (encode_snapshot of the recovered state: its size and the time it takes, which the
            master spends on its event loop once every tasks/4 journal entries); then on etcd
            (tests/helpers/etcd_server.py): a leader and a standby, the leader SIGKILLed, time
            to the standby's ready file, against --ttl.
  files     Files per dataset: set_dataset over N one-chunk RecordIO files, locally (100,000)
            and on the S3 test server (moto over HTTP, tests/helpers/s3_server.py; 1,000 and
            5,000 by default: moto stores each object in one Python process, so uploading and
            listing 100,000 is not practical here; the shape of the counts tells whether a
            straight-line extrapolation holds).
  all       The three above with their defaults (~12 minutes on 2 cores: sessions 4,
            tasks 5.5, files 2.5).

    .venv/bin/python bench/limits.py sessions --boost -10     # levels 0,1000,5000,10000
    .venv/bin/python bench/limits.py tasks --sizes 10000,1000000,10000000
    .venv/bin/python bench/limits.py files --local 10000,100000 --s3 1000,5000
    .venv/bin/python bench/limits.py all --json-out limits.json
    .venv/bin/python bench/limits.py sessions --levels 20000 --procs 8   # bigger

`--profile DIR` records the master with py-spy (native frames: gRPC's C core too) in a window
of its own after each measured one, and prints where its busy samples went, so a limit can be
read off where the time goes. `--master-src DIR,DIR` runs the command once per source tree,
its masters importing chunkmaster from that tree (the load and the trainers are the same): a
change to the master measured before and after in one run, e.g. main's tree against a branch's:

    .venv/bin/python bench/limits.py --master-src /work/main/src,src sessions --levels 0,10000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "tests")]

from dispatch_bench import chunk_bytes, make_dataset  # noqa: E402
from helpers.master_process import MasterProcess  # noqa: E402
from session_bench import SESSION_METHOD  # noqa: E402
from session_bench import measure as session_measure  # noqa: E402

from chunkmaster.client.connection import MasterConnection  # noqa: E402
from chunkmaster.rpc import master_pb2 as pb  # noqa: E402

LOAD_NICE = 10  # the load processes yield the CPU to the master and the working trainer
PY_SPY = Path(sys.executable).parent / "py-spy"
ROWS: list[dict[str, Any]] = []


def emit(row: dict[str, Any]) -> dict[str, Any]:
    if MASTER_SRC:
        row["master_src"] = MASTER_SRC
    ROWS.append(row)
    print(json.dumps(row), flush=True)
    return row


# ---- /proc ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every thread of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mem_mb(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU: how busy the whole machine was, others included."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return sum(f) - idle, sum(f)


class Window:
    """CPU used by some processes, and by the whole machine, between start() and stop()."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids

    def start(self) -> Window:
        self.t0 = time.monotonic()
        self.c0 = {k: sum(cpu_seconds(p) for p in ps) for k, ps in self.pids.items()}
        self.m0 = machine_jiffies()
        return self

    def stop(self) -> dict[str, float]:
        dt = time.monotonic() - self.t0
        out = {
            f"{k}_cpu": round((sum(cpu_seconds(p) for p in ps) - self.c0[k]) / dt, 3)
            for k, ps in self.pids.items()
        }
        m1 = machine_jiffies()
        busy = (m1[0] - self.m0[0]) / max(1, m1[1] - self.m0[1])
        out["machine_busy_cores"] = round(busy * (os.cpu_count() or 1), 2)
        out["window_s"] = round(dt, 1)
        return out


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# ---- profiles ------------------------------------------------------------------------------


@contextlib.contextmanager
def profiled(pid: int, out: Path | None, name: str, native: bool = True) -> Iterator[None]:
    """py-spy record `pid` (every thread, native frames too: gRPC's C core) for the body's
    duration; print the hottest functions by own time and by total time. It stops the master
    for every sample (100 a second): figures are never taken in a profiled window."""
    if out is None:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"{name}.txt"
    raw.unlink(missing_ok=True)
    cmd = [str(PY_SPY), "record", "--pid", str(pid), "--format", "raw", "--rate", "100"]
    proc = subprocess.Popen(
        [*cmd, *(["--native"] if native else ["--nonblocking"]), "--output", str(raw)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    if not raw.exists():
        print(f"# py-spy wrote no profile of {name}: {err.strip()[:300]}", flush=True)
        return
    emit({"profile": name, "file": str(raw), **summarize_profile(raw)})


IDLE_LEAVES = (
    "epoll_wait",
    "poll",
    "select",
    "pthread_cond",
    "futex",
    "sem_wait",
    "nanosleep",
    "PyThread_acquire_lock_timed",  # an idle executor thread (the store's)
)


def summarize_profile(raw: Path, top: int = 10) -> dict[str, Any]:
    """Where the master's busy samples went, from py-spy's collapsed stacks: the share of
    samples waiting (idle), own time by library or source file (gRPC's C core and Cython
    layer show as cygrpc), total time by chunkmaster function (what our code costs) and the
    share in Python's cyclic garbage collector."""
    by_place: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    busy = idle = collector = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        frames = stack.split(";")
        leaf = frames[-1]
        if any(w in f for f in frames[-4:] for w in IDLE_LEAVES):
            idle += count
            continue
        busy += count
        collector += count if any("gc_collect" in f for f in frames) else 0
        by_place[_place(leaf)] += count
        for f in {f.split(" (")[0] for f in frames if "chunkmaster/" in f}:
            ours[f] += count
    share = max(1, busy)
    return {
        "busy_samples": busy,
        "idle_share": round(idle / max(1, busy + idle), 3),
        "collector_share": round(collector / share, 3),
        "own_by_place": [[k, round(v / share, 3)] for k, v in by_place.most_common(top)],
        "chunkmaster_total": [[k, round(v / share, 3)] for k, v in ours.most_common(top)],
    }


def _place(frame: str) -> str:
    """A frame's library or source file: `cygrpc`, `libc.so.6`, `stream.py`, ..."""
    inside = frame.rpartition(" (")[2].rstrip(")")
    name = inside.rsplit("/", 1)[-1].split(":")[0]
    return "cygrpc" if name.startswith("cygrpc") else name


# ---- masters -------------------------------------------------------------------------------


LOG_DIR: Path | None = None  # where each master's log is kept (the scratch folder)


def start_master(args: list[str], timeout: float = 600.0, *, pin: int | None = None) -> Any:
    """A real master process, its log kept in LOG_DIR; with `pin`, confined to that CPU."""

    def pin_it() -> None:
        if pin is not None:
            os.sched_setaffinity(0, {pin})

    log = None if LOG_DIR is None else LOG_DIR / f"master-{time.time_ns()}.log"
    with master_src_env():
        return MasterProcess(args, preexec_fn=pin_it, log_path=log).start(timeout)


MASTER_SRC = ""  # --master-src: the source tree the masters started now import chunkmaster from


def src_tag() -> str:
    """A profile's name suffix for the source tree of --master-src now measured ("" without)."""
    return "-" + "-".join(Path(MASTER_SRC).resolve().parts[-2:]) if MASTER_SRC else ""


@contextlib.contextmanager
def master_src_env() -> Iterator[None]:
    """With --master-src, the master started in the body has that tree first on its path."""
    if not MASTER_SRC:
        yield
        return
    saved = dict(os.environ)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(MASTER_SRC).resolve()), *filter(None, [saved.get("PYTHONPATH")])]
    )
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def stop_master(m: Any) -> None:
    with contextlib.suppress(Exception):
        m.terminate(30)
    m.kill()


# ---- sessions ------------------------------------------------------------------------------


def _session_holder(
    addr: str, ctl: Any, out: Any, streams_per_channel: int, cpu: int | None, open_nice: int
) -> None:
    """Hold many idle sessions, each keeping alive every keep_alive_seconds (spread evenly),
    until told to stop. Commands on `ctl`: ("open", n) opens n more, ("stop",)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})

    async def main() -> None:
        channels: list[grpc.aio.Channel] = []
        calls: list[Any] = []
        seqs: list[int] = []
        last: list[float] = []
        # Each session's keep-alive is written by a task of its own, one at a time per
        # session: a stream slow to take its write never holds up the others' keep-alives.
        writing: list[asyncio.Task[None] | None] = []
        every = 0.0
        opener = asyncio.Semaphore(32)

        def channel_for(i: int) -> grpc.aio.Channel:
            while len(channels) * streams_per_channel <= i:
                # A subchannel pool of its own: a connection of its own, as a trainer process
                # has (channels to one address otherwise share one connection).
                channels.append(
                    grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
                )
            return channels[i // streams_per_channel]

        async def open_one(i: int) -> None:
            nonlocal every
            async with opener:
                call = channel_for(i).stream_stream(
                    SESSION_METHOD,
                    request_serializer=pb.SessionRequest.SerializeToString,
                    response_deserializer=pb.SessionResponse.FromString,
                )()
                hello = pb.Hello(name=f"idle-{os.getpid()}-{i}", host="limits", pid=os.getpid())
                await call.write(pb.SessionRequest(seq=1, hello=hello))
                resp = await asyncio.wait_for(call.read(), 120)
                if resp.WhichOneof("body") != "welcome":
                    raise RuntimeError(f"Hello answered {resp}")
                every = resp.welcome.keep_alive_seconds
                calls.append(call)
                seqs.append(1)
                last.append(time.monotonic())
                writing.append(None)

        credit = 0.0
        nxt = 0
        worst = 0.0  # the longest any session went without a message
        sent = 0
        stall = 0.0  # the longest the loop went between two turns
        tick = time.monotonic()
        opening: asyncio.Task[Any] | None = None
        while True:
            while not ctl.empty():
                cmd = ctl.get()
                if cmd[0] == "stop":
                    for c in calls:
                        c.cancel()
                    for ch in channels:
                        await ch.close()
                    out.put(("stopped", os.getpid(), len(calls), round(worst, 2), sent))
                    return
                if cmd[0] == "report":
                    out.put(("report", os.getpid(), len(calls), round(worst, 2), sent, stall))
                    stall = 0.0
                    worst = 0.0
                if cmd[0] == "open":
                    start, n = len(calls), cmd[1]

                    async def open_all(start: int, n: int) -> None:
                        # At the master's priority while opening (nothing is measured
                        # then, and a starved opener leaves its first sessions silent past
                        # the TTL), at LOAD_NICE after.
                        with contextlib.suppress(PermissionError):
                            os.setpriority(os.PRIO_PROCESS, 0, open_nice)
                        t0 = time.monotonic()
                        await asyncio.gather(*(open_one(start + i) for i in range(n)))
                        os.setpriority(os.PRIO_PROCESS, 0, LOAD_NICE)
                        out.put(("opened", os.getpid(), len(calls), time.monotonic() - t0))

                    opening = asyncio.create_task(open_all(start, n))
            if opening is not None and opening.done():
                opening.result()  # raise a failed open here
                opening = None
            now = time.monotonic()
            if calls and every > 0:
                credit += (now - tick) * len(calls) / every
                while credit >= 1:
                    credit -= 1
                    # Round the list in order: a session opened meanwhile joins at the end
                    # (an index modulo a growing length would skip some for many rounds).
                    i = nxt if nxt < len(calls) else 0
                    nxt = i + 1
                    busy = writing[i]
                    if busy is not None and not busy.done():
                        continue  # its last keep-alive is still being written: a gap grows
                    seqs[i] += 1
                    request = pb.SessionRequest(seq=seqs[i], keep_alive=pb.KeepAlive())
                    writing[i] = asyncio.create_task(calls[i].write(request))
                    t = time.monotonic()
                    worst = max(worst, t - last[i])
                    last[i] = t
                    sent += 1
            stall = max(stall, now - tick)
            tick = now
            await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
    except BaseException as exc:
        out.put(("error", os.getpid(), repr(exc)))
        raise


def renice(pid: int, value: int) -> None:
    """Set the nice value of every thread of `pid` (Linux keeps one per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), value)


def _working_trainer(addr: str, samples: int, rate: float, nice: int, out: Any) -> None:
    """One trainer that asks for a task at a fixed pace, each request carrying the finish of
    the task before: the latency of every NextTask -> task, in seconds."""
    os.setpriority(os.PRIO_PROCESS, 0, nice)

    async def main() -> None:
        async with grpc.aio.insecure_channel(addr) as ch:
            call = ch.stream_stream(
                SESSION_METHOD,
                request_serializer=pb.SessionRequest.SerializeToString,
                response_deserializer=pb.SessionResponse.FromString,
            )()
            await call.write(pb.SessionRequest(seq=1, hello=pb.Hello(name="working")))
            await call.read()
            seq, pass_id = 1, 0
            finished: list[pb.TaskPosition] = []
            lat: list[float] = []
            errors = 0
            step = 1.0 / rate
            due = time.monotonic()
            while len(lat) < samples:
                due += step
                seq += 1
                msg = pb.NextTask(
                    finished=finished, want_task=True, pass_id=pass_id, wait_seconds=5
                )
                t0 = time.perf_counter()
                await call.write(pb.SessionRequest(seq=seq, next=msg))
                resp = await call.read()
                dt = time.perf_counter() - t0
                if resp.WhichOneof("body") == "task":
                    t = resp.task
                    finished = [
                        pb.TaskPosition(
                            task_id=t.meta.id,
                            epoch=t.meta.epoch,
                            pass_id=t.pass_id,
                            records=sum(c.num_records for c in t.chunks),
                        )
                    ]
                    lat.append(dt)
                else:
                    errors += 1
                    finished = []
                    if resp.error.error == "PassBeforeError":
                        pass_id += 1
                    elif errors > 10:
                        raise RuntimeError(resp.error.message)
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            seq += 1
            await call.write(pb.SessionRequest(seq=seq, goodbye=pb.Goodbye(progress=finished)))
            await call.read()
            await call.done_writing()
            out.put((lat, errors))

    asyncio.run(main())


def keep_alives_sent(holders: list[tuple[Any, Any]], out: Any) -> tuple[int, float, float]:
    """Keep-alives the load processes have sent so far, the longest any session went without
    one and the longest any load process's loop went between two turns, since the last call
    (which resets both)."""
    for _, ctl in holders:
        ctl.put(("report",))
    replies = [out.get(timeout=60) for _ in holders]
    for r in replies:
        if r[0] != "report":
            raise RuntimeError(f"a load process failed: {r}")
    return sum(r[4] for r in replies), max(r[3] for r in replies), max(r[5] for r in replies)


def dispatch_latency(
    addr: str, samples: int, rate: float, cpu: int | None, nice: int
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_working_trainer, args=(addr, samples, rate, nice, q))
    p.start()
    if cpu is not None:
        os.sched_setaffinity(p.pid, {cpu})  # type: ignore[arg-type]
    lat, errors = q.get(timeout=samples / rate + 300)
    p.join(30)
    ms = [x * 1000 for x in lat]
    return {
        "dispatch_p50_ms": round(pct(ms, 0.5), 2),
        "dispatch_p99_ms": round(pct(ms, 0.99), 2),
        "dispatch_max_ms": round(max(ms), 2),
        "dispatch_samples": len(ms),
        "dispatch_errors": errors,
    }


def bench_sessions(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    data = make_dataset(root, args.session_tasks)
    pin_master, pin_load = (0, 1) if args.pin else (None, None)
    m = start_master(
        ["--store", str(root / f"sessions-{time.time_ns()}.db"), "--chunk-per-task", "1"],
        pin=pin_master,
    )
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    holders: list[tuple[Any, Any]] = []
    rows = []
    try:
        if args.boost:
            renice(m.proc.pid, args.boost)
        with MasterConnection(m.addr, timeout=600) as c:
            c.set_dataset([data])
        ttl = MasterConnection(m.addr).status()["trainer_ttl"]
        for _ in range(args.procs):
            ctl = ctx.Queue()
            proc = ctx.Process(
                target=_session_holder,
                args=(m.addr, ctl, out, args.streams_per_channel, pin_load, args.boost),
                daemon=True,
            )
            proc.start()
            holders.append((proc, ctl))
        held = 0
        for level in args.levels:
            add = level - held
            if add < 0:
                raise SystemExit(f"--levels must grow: {args.levels}")
            t0 = time.monotonic()
            if add:
                per = [add // len(holders) + (i < add % len(holders)) for i in range(len(holders))]
                for (_, ctl), n in zip(holders, per, strict=True):
                    ctl.put(("open", n))
                for _ in holders:
                    msg = out.get(timeout=900)
                    if msg[0] != "opened":
                        raise RuntimeError(f"a load process failed: {msg}")
            open_s = time.monotonic() - t0
            held = level
            with MasterConnection(m.addr) as c:
                before = c.status()["sessions"]
            time.sleep(min(5.0, ttl / 3))  # every new session's first keep-alive goes out
            sent0, opening_gap, _ = keep_alives_sent(holders, out)
            w = Window({"master": [m.proc.pid], "load": [p.pid for p, _ in holders]}).start()
            time.sleep(args.window)
            idle = w.stop()
            sent1, _, stall = keep_alives_sent(holders, out)
            delivered = (sent1 - sent0) / idle["window_s"]
            if args.profile is not None and level == max(args.levels):
                with profiled(m.proc.pid, args.profile, f"sessions-{level}{src_tag()}"):
                    time.sleep(args.window)
            rss = mem_mb(m.proc.pid)
            w = Window({"master": [m.proc.pid]}).start()
            lat = dispatch_latency(m.addr, args.samples, args.rate, pin_load, args.boost)
            busy = w.stop()
            for _, ctl in holders:
                ctl.put(("report",))
            reports = [out.get(timeout=60) for _ in holders]
            with MasterConnection(m.addr) as c:
                after = c.status()["sessions"]
            lost = level - after
            rows.append(
                emit(
                    {
                        "bench": "sessions",
                        "sessions": level,
                        "open_s": round(open_s, 1),
                        "sessions_at_start": before,
                        "sessions_at_end": after,
                        "sessions_lost": lost,
                        "keep_alives_per_s": round(delivered),
                        "keep_alives_per_s_due": round(before / (ttl / 3)),
                        "master_cpu": idle["master_cpu"],
                        "load_cpu": idle["load_cpu"],
                        "machine_busy_cores": idle["machine_busy_cores"],
                        "master_rss_mb": rss,
                        **lat,
                        "master_cpu_dispatching": busy["master_cpu"],
                        "keep_alive_s": round(ttl / 3, 2),
                        "worst_keep_alive_gap_s": max(r[3] for r in reports),
                        "worst_gap_while_opening_s": opening_gap,
                        "load_loop_stall_s": round(stall, 2),
                        "window_s": idle["window_s"],
                    }
                )
            )
    finally:
        for _, ctl in holders:
            ctl.put(("stop",))
        for proc, _ in holders:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        stop_master(m)
    return rows


# ---- tasks ---------------------------------------------------------------------------------


def store_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())


def _snapshot_probe(db: str, out: Any) -> None:
    """Recover a (stopped) master's store here and time what a compaction costs the master."""
    from chunkmaster.core.codec import decode_snapshot, encode_snapshot
    from chunkmaster.master.ledger import Ledger
    from chunkmaster.store.sqlite import SqliteStore

    async def main() -> None:
        store = SqliteStore(Path(db))
        ledger = Ledger(store)
        await ledger.recover()
        await store.shutdown()
        t0 = time.perf_counter()
        snap = encode_snapshot(ledger.state)
        t1 = time.perf_counter()
        decode_snapshot(snap)
        t2 = time.perf_counter()
        out.put((len(snap), t1 - t0, t2 - t1))

    asyncio.run(main())


def snapshot_probe(db: Path) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_snapshot_probe, args=(str(db), q))
    p.start()
    size, enc, dec = q.get(timeout=1800)
    p.join(60)
    return {
        "snapshot_mb": round(size / 2**20, 1),
        "snapshot_encode_s": round(enc, 2),
        "snapshot_decode_s": round(dec, 2),
    }


def bench_tasks(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    sizes = args.sizes
    rows: dict[int, dict[str, Any]] = {n: {"bench": "tasks", "tasks": n} for n in sizes}
    masters: dict[int, Any] = {}
    dbs: dict[int, Path] = {}
    try:
        t0 = time.perf_counter()
        empty = start_master(["--store", str(root / f"empty-{time.time_ns()}.db")])
        cold_start = time.perf_counter() - t0
        stop_master(empty)
        emit({"bench": "tasks", "empty_master_start_s": round(cold_start, 2)})
        for n in sizes:
            t0 = time.perf_counter()
            data = make_dataset(root, n)
            dbs[n] = root / f"tasks-{n}-{time.time_ns()}" / "state.db"
            dbs[n].parent.mkdir()
            masters[n] = m = start_master(
                ["--store", str(dbs[n]), "--chunk-per-task", "1", "--task-timeout-dur", "1h"]
            )
            t1 = time.perf_counter()
            with MasterConnection(m.addr, timeout=3600) as c:
                c.set_dataset([data])
            row = rows[n]
            row["file_mb"] = round(Path(data).stat().st_size / 2**20, 1)
            row["set_dataset_s"] = round(time.perf_counter() - t1, 2)
            row["master_rss_mb"] = mem_mb(m.proc.pid)
            row["master_peak_mb"] = mem_mb(m.proc.pid, "VmHWM")
            print(
                f"# {n} tasks set in {row['set_dataset_s']} s ({time.perf_counter() - t0:.0f} s "
                "with the file)",
                flush=True,
            )
        # Dispatch: rounds over every size in turn, so drift hits them alike.
        rates: dict[int, list[float]] = {n: [] for n in sizes}
        for r in range(args.rounds):
            order = sizes if r % 2 == 0 else list(reversed(sizes))
            for n in order:
                rate = session_measure("session", masters[n].addr, 8, 1.0, args.seconds)
                rates[n].append(rate)
        if args.profile is not None:
            big = masters[max(sizes)]
            with profiled(big.proc.pid, args.profile, f"dispatch-{max(sizes)}{src_tag()}"):
                session_measure("session", big.addr, 8, 1.0, args.seconds)
        base = min(sizes)
        for n in sizes:
            row = rows[n]
            row["dispatch_per_s"] = round(statistics.median(rates[n]))
            row["dispatch_rounds"] = [round(x) for x in rates[n]]
            row["ratio_to_base"] = round(
                statistics.median(a / b for a, b in zip(rates[n], rates[base], strict=True)), 2
            )
        for n in sizes:
            m, row = masters[n], rows[n]
            with MasterConnection(m.addr, timeout=600) as c:
                t0 = time.perf_counter()
                blob = c.data_checkpoint()
                row["checkpoint_s"] = round(time.perf_counter() - t0, 3)
                row["checkpoint_kb"] = round(len(blob) / 1024, 1)
            m.kill()
            t0 = time.perf_counter()
            m.start(3600)
            row["recovery_s"] = round(time.perf_counter() - t0, 2)
            row["recovered_rss_mb"] = mem_mb(m.proc.pid)
            row["recovered_peak_mb"] = mem_mb(m.proc.pid, "VmHWM")
            if args.profile is not None and n == max(sizes):
                m.kill()
                m.start(wait=False)
                with profiled(m.proc.pid, args.profile, f"recovery-{n}{src_tag()}"):
                    m.wait_serving(3600)
            stop_master(m)
            row["store_mb"] = round(store_bytes(dbs[n]) / 2**20, 1)
            row.update(snapshot_probe(dbs[n]))
            print(f"# {n} tasks: recovered in {row['recovery_s']} s", flush=True)
        for n in args.etcd_sizes:
            rows.setdefault(n, {"bench": "tasks", "tasks": n}).update(failover(root, n, args.ttl))
    finally:
        for m in masters.values():
            stop_master(m)
    return [emit(rows[n]) for n in sorted(rows)]


IN_USE = "etcd_mvcc_db_total_size_in_use_in_bytes"


def etcd_metric(endpoint: str, name: str) -> float:
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"etcd has no metric {name}")


def failover(root: Path, n: int, ttl: int) -> dict[str, Any]:
    """A leader and a standby on etcd; SIGKILL the leader; time to the standby's ready file."""
    from helpers.etcd_server import EtcdServer

    data = make_dataset(root, n)
    etcd = EtcdServer(quota_backend_bytes=8 * 2**30)
    common = [
        "--endpoints",
        etcd.endpoint,
        "--host",
        "127.0.0.1",
        "--ttl",
        str(ttl),
        "--job",
        "limits",
    ]
    common += ["--chunk-per-task", "1", "--task-timeout-dur", "1h"]
    leader = standby = None
    try:
        leader = start_master(common)
        t0 = time.perf_counter()
        with MasterConnection(leader.addr, timeout=3600) as c:
            c.set_dataset([data])
        set_s = time.perf_counter() - t0
        standby = MasterProcess(common).start(wait=False)
        time.sleep(3)  # the standby is up and campaigning
        killed = time.perf_counter()
        leader.kill()
        if not standby.wait_serving(3600):
            raise RuntimeError(f"the standby never led:\n{standby.log()}")
        took = time.perf_counter() - killed
        with MasterConnection(standby.addr) as c:
            ok = c.status().get("num_tasks")
        return {
            "etcd_set_dataset_s": round(set_s, 2),
            "failover_s": round(took, 2),
            "failover_ttl_s": ttl,
            "failover_tasks_seen": ok,
            "etcd_db_in_use_mb": round(etcd_metric(etcd.endpoint, IN_USE) / 2**20, 1),
        }
    finally:
        for m in (leader, standby):
            if m is not None:
                m.kill()
        etcd.stop()


# ---- files ---------------------------------------------------------------------------------


def write_files(d: Path, n: int) -> str:
    """`n` one-chunk RecordIO files under `d` (made once); the pattern matching them."""
    d.mkdir(parents=True, exist_ok=True)
    one = chunk_bytes()
    have = len(list(d.iterdir()))
    for i in range(have, n):
        (d / f"part-{i:06d}.rio").write_bytes(one)
    return str(d / "part-*.rio")


def set_dataset_time(
    master_args: list[str],
    globs: list[str],
    server: int | None = None,
    profile: tuple[Path, str, bool] | None = None,
) -> dict[str, Any]:
    """set_dataset's time, the master's memory after it, and the CPU (in cores) the master
    and the storage `server` process used meanwhile: which of them bounds it."""
    m = start_master(master_args)
    try:
        w = Window({"master": [m.proc.pid], **({"server": [server]} if server else {})})
        w.start()
        t0 = time.perf_counter()
        with (
            profiled(m.proc.pid, *profile) if profile else contextlib.nullcontext(),
            MasterConnection(m.addr, timeout=7200) as c,
        ):
            c.set_dataset(globs)
        secs = time.perf_counter() - t0
        cpu = w.stop()
        cpu.pop("window_s")
        return {"index_s": round(secs, 2), "master_rss_mb": mem_mb(m.proc.pid), **cpu}
    finally:
        stop_master(m)


def bench_files(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    rows = []
    for n in args.local:
        pattern = write_files(root / f"files-{n}", n)
        got = set_dataset_time(["--store", str(root / f"f-{time.time_ns()}.db")], [pattern])
        if args.profile is not None and n == max(args.local):  # a second, profiled run
            master_args = ["--store", str(root / f"f-{time.time_ns()}.db")]
            set_dataset_time(master_args, [pattern], None, (args.profile, f"local-{n}", True))
        rows.append(
            emit(
                {
                    "bench": "files",
                    "where": "local",
                    "files": n,
                    "files_per_s": round(n / got["index_s"]),
                    **got,
                }
            )
        )
    if args.s3:
        from helpers.s3_server import S3Server

        s3 = S3Server()
        try:
            fs = s3.fs()
            fs.mkdir("limits")
            one = chunk_bytes()
            for n in sorted(args.s3):
                t0 = time.perf_counter()
                fs.pipe({f"limits/f{n}/part-{i:06d}.rio": one for i in range(n)})
                upload = time.perf_counter() - t0
                opts = s3.storage_options()
                master_args = [
                    "--store",
                    str(root / f"s3-{time.time_ns()}.db"),
                    "--data-root",
                    "s3://limits/",
                    "--storage-option",
                    f"endpoint_url={opts['endpoint_url']}",
                    "--storage-option",
                    f"key={opts['key']}",
                    "--storage-option",
                    f"secret={opts['secret']}",
                    "--storage-option",
                    f"client_kwargs.region_name={opts['client_kwargs']['region_name']}",
                ]
                got = set_dataset_time(master_args, [f"s3://limits/f{n}/part-*.rio"], s3.proc.pid)
                if args.profile is not None and n == max(args.s3):  # a second, profiled run
                    pattern = [f"s3://limits/f{n}/part-*.rio"]
                    set_dataset_time(master_args, pattern, None, (args.profile, f"s3-{n}", False))
                rows.append(
                    emit(
                        {
                            "bench": "files",
                            "where": "s3 (moto)",
                            "files": n,
                            "files_per_s": round(n / got["index_s"]),
                            **got,
                            "upload_s": round(upload, 1),
                        }
                    )
                )
        finally:
            s3.stop()
    return rows


# ---- command line --------------------------------------------------------------------------


def ints(text: str) -> list[int]:
    try:
        return [int(x.replace("_", "")) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of counts"
        ) from None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Each command's --help says what it measures and how.",
    )
    ap.add_argument("--root", type=Path, help="scratch folder (default: a fresh temp folder)")
    ap.add_argument("--json-out", type=Path, help="also write every row here as a JSON list")
    ap.add_argument("--profile", type=Path, help="py-spy the master into this folder")
    ap.add_argument(
        "--master-src",
        metavar="DIR,DIR",
        help="run the command once per source tree, its masters importing chunkmaster "
        "from it (before and after a change, in one run)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    doc = (__doc__ or "").split("\n\n    ")[0]

    def section(name: str) -> str:
        text = doc.split(f"  {name}  ", 1)[1]
        for other in ("sessions", "tasks", "files", "all"):
            text = text.split(f"\n  {other}  ", 1)[0]
        return f"{name}: " + " ".join(text.split())

    s = sub.add_parser("sessions", help="trainers per master", description=section("sessions"))
    t = sub.add_parser("tasks", help="tasks per dataset", description=section("tasks"))
    f = sub.add_parser("files", help="files per dataset", description=section("files"))
    a = sub.add_parser("all", help="all three with their defaults", description=section("all"))
    for p in (s, a):
        p.add_argument(
            "--levels",
            type=ints,
            default=[0, 1000, 5000, 10000],
            help="idle sessions at each step, growing (default 0,1000,5000,10000)",
        )
        p.add_argument("--procs", type=int, default=4, help="load processes holding them")
        p.add_argument(
            "--streams-per-channel",
            type=int,
            default=1,
            help="sessions sharing one connection (default 1: one each, as trainers)",
        )
        p.add_argument(
            "--window",
            type=float,
            default=20.0,
            help="seconds of keep-alives only, for the CPU figure (default 20)",
        )
        p.add_argument("--samples", type=int, default=2000, help="dispatch latency samples")
        p.add_argument(
            "--rate",
            type=float,
            default=100.0,
            help="the working trainer's NextTask per second (default 100)",
        )
        p.add_argument(
            "--session-tasks",
            type=int,
            default=100_000,
            help="tasks of the dataset the working trainer reads",
        )
        p.add_argument(
            "--pin",
            action="store_true",
            help="pin the master to CPU 0 and the load and trainer to CPU 1",
        )
        p.add_argument(
            "--boost",
            type=int,
            default=0,
            metavar="NICE",
            help="run the master and the working trainer at this nice value "
            "(e.g. -10, as root): the machine's other work then waits for them, "
            "as on a host with a core for the master (default 0)",
        )
    for p in (t, a):
        p.add_argument(
            "--sizes",
            type=ints,
            default=[10_000, 1_000_000, 10_000_000],
            help="tasks per dataset; the smallest is the dispatch baseline",
        )
        p.add_argument(
            "--etcd-sizes",
            type=ints,
            default=[1_000_000, 10_000_000],
            help="sizes whose failover on etcd is measured",
        )
        p.add_argument(
            "--ttl",
            type=int,
            default=5,
            help="etcd lease TTL of the failover masters (failover waits it out)",
        )
        p.add_argument("--rounds", type=int, default=3, help="dispatch rounds over the sizes")
        p.add_argument("--seconds", type=float, default=5.0, help="seconds of each rate")
    for p in (f, a):
        p.add_argument(
            "--local",
            type=ints,
            default=[10_000, 100_000],
            help="local file counts (default 10000,100000)",
        )
        p.add_argument(
            "--s3",
            type=ints,
            default=[1000, 5000],
            help="file counts on the S3 test server (default 1000,5000; none: '')",
        )
    args = ap.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="limits-"))
    root.mkdir(parents=True, exist_ok=True)
    global LOG_DIR, MASTER_SRC
    LOG_DIR = root
    print(f"# scratch: {root}; machine: {os.cpu_count()} CPUs, load {os.getloadavg()}", flush=True)
    try:
        for src in args.master_src.split(",") if args.master_src else [""]:
            MASTER_SRC = src
            if src:
                print(f"# masters from {Path(src).resolve()}", flush=True)
            if args.cmd in ("sessions", "all"):
                bench_sessions(args, root)
            if args.cmd in ("tasks", "all"):
                bench_tasks(args, root)
            if args.cmd in ("files", "all"):
                bench_files(args, root)
    finally:
        if args.json_out is not None:
            args.json_out.write_text(json.dumps(ROWS, indent=1))
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

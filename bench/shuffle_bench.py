"""What seeded shuffles cost: the master's dispatch rate with --shuffle-seed, and one trainer's
records/s through a 10,000-record client shuffle buffer.

1. Dispatch: GetTask + TaskFinished cycles/s over gRPC (dispatch_bench's load: 8 asyncio
   clients in two processes, a real `chunkmaster master` process on the in-memory store), on
   100,000 one-record chunks at 10 chunks a task, so each dispatch cuts its task through the
   keyed bijection (10 evaluations) and passes roll over during the window (each rollover
   orders 10,000 tasks by the pass's permutation). Baseline: the same master without
   --shuffle-seed, the plain path every master takes today (tasks are ranges of chunks in a
   queue): there is no cheaper way to hand out the same tasks. Target: at least 0.9x. Also
   the master's CPU time per cycle (its utime + stime over the window): on a shared machine
   the rate follows whoever else runs, the CPU a cycle costs the master much less so.
   And the core's share, in this process: `apply(Dispatch)` + `apply(Finish)` on the same
   dataset's state (what the master computes per cycle, no gRPC, no journal), in short
   alternating windows so both see the same machine.
2. Buffer: one trainer (`Client`, a session) reads whole passes of 400,000 records of 32
   bytes with `shuffle_buffer=10000`, against the same client without one, whose
   `records()` is a C-level chain over the chunks' records: the fastest way this client
   hands records out, so the ratio is the whole price of the buffer (a Python draw per
   record, and the bookkeeping that keeps positions behind buffered records).

3. Window: one trainer reads whole passes of 200,000 records of 100 B and 1 KiB, and 200 MiB
   of 64 KiB records, in
   the writer's default chunks (32 MiB) from a master with `--shuffle-seed 7
   --shuffle-window 10000` (each task's records read in permuted windows of 10,000), against
   a master with the same seed and no window (file order, the same C-level chain as 2.'s
   baseline): the ratio is the whole price of the record shuffle (a window's permutation
   and its records gathered into a list).

Rounds alternate baseline and shuffled runs in the same master; the medians of the rounds are
reported (the machine is shared and noisy).

    .venv/bin/python bench/shuffle_bench.py [--rounds 3] [--seconds 5] [--parts window]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dispatch_bench import Master, make_dataset, measure

from chunkmaster.client import Client, Reading
from chunkmaster.client.connection import MasterConnection
from chunkmaster.recordio import Compressor, Writer

CHUNKS = 100_000
CPT = 10
CLIENTS = 8
RECORDS = 400_000
BUFFER = 10_000
WINDOW = 10_000
WINDOW_BYTES = 200 << 20


def window_records(size: int) -> int:
    """Records of `size` bytes in the window part: 200,000, or 200 MiB of them."""
    return min(200_000, WINDOW_BYTES // size)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dispatch_rate(root: Path, seed: int | None, seconds: float) -> tuple[float, float]:
    """Cycles/s, and the master's CPU microseconds per cycle."""
    data = make_dataset(root, CHUNKS)
    args = ["--store", ":memory:", "--chunk-per-task", str(CPT), "--task-timeout-dur", "10m"]
    if seed is not None:
        args += ["--shuffle-seed", str(seed)]
    m = Master(args)
    try:
        with MasterConnection(m.addr, timeout=600) as c:
            c.set_dataset([data])
        cpu0 = cpu_seconds(m.proc.pid)
        rate = measure(m.addr, CLIENTS, 0.0, seconds)  # no warm-up: every cycle is counted
        cpu = cpu_seconds(m.proc.pid) - cpu0
        return rate, cpu / (rate * seconds) * 1e6
    finally:
        m.stop()


def core_cycle_us(seed: int | None, cycles: int) -> float:
    """Microseconds per Dispatch + Finish applied to a fresh state (the core alone)."""
    from array import array

    from chunkmaster.core.dataset import Dataset
    from chunkmaster.core.events import Dispatch, Finish, SetDataset
    from chunkmaster.core.model import Task
    from chunkmaster.core.state import MasterState, apply

    ds = Dataset(
        ("x",),
        ("x.rio",),
        array("I", bytes(4 * CHUNKS)),
        array("Q", range(CHUNKS)),
        array("I", [1]) * CHUNKS,
        CPT,
    ).with_shuffle(seed)
    state = MasterState()
    apply(state, SetDataset(ds))
    t0 = time.perf_counter()
    for _ in range(cycles):
        task = apply(state, Dispatch(1e18))
        assert isinstance(task, Task)
        apply(state, Finish(task.meta.id, task.meta.epoch, task.pass_id))
    return (time.perf_counter() - t0) / cycles * 1e6


def records_file(root: Path) -> str:
    path = root / "records.rio"
    if not path.exists():
        with Writer(str(path), max_chunk_size=64 * 1024, compressor=Compressor.NONE) as w:
            for i in range(RECORDS):
                w.write(b"%032d" % i)
    return str(path)


def read_rate(client: Client, pass_id: int, records: int = RECORDS) -> float:
    t0 = time.perf_counter()
    n = 0
    for _ in client.records(pass_id):
        n += 1
    dt = time.perf_counter() - t0
    assert n == records, f"pass {pass_id}: {n} records, not {records}"
    return n / dt


def buffer_rates(root: Path, rounds: int) -> tuple[list[float], list[float]]:
    data = records_file(root)
    m = Master(["--store", ":memory:", "--chunk-per-task", "2", "--task-timeout-dur", "10m"])
    plain: list[float] = []
    shuffled: list[float] = []
    try:
        with (
            Client(m.addr) as a,
            Client(m.addr, reading=Reading(shuffle_buffer=BUFFER, shuffle_seed=1)) as b,
        ):
            a.set_dataset([data])
            p = 0
            read_rate(a, p)  # warm-up: page cache, connections
            for _ in range(rounds):
                p += 1
                plain.append(read_rate(a, p))
                p += 1
                shuffled.append(read_rate(b, p))
    finally:
        m.stop()
    return plain, shuffled


def window_file(root: Path, size: int) -> str:
    """window_records(size) records of `size` bytes, in the writer's default chunks."""
    path = root / f"window-{size}.rio"
    if not path.exists():
        with Writer(str(path)) as w:
            for i in range(window_records(size)):
                w.write(b"%d" % i + bytes(size - len(b"%d" % i)))
    return str(path)


def window_rates(root: Path, rounds: int, size: int) -> tuple[list[float], list[float]]:
    """One trainer's records/s through `records()` on two masters of the same seed, one with
    --shuffle-window WINDOW (records of a task read in permuted windows), one without (file
    order), passes alternating."""
    data = window_file(root, size)
    rates: tuple[list[float], list[float]] = ([], [])
    flags = ["--store", ":memory:", "--task-timeout-dur", "10m", "--shuffle-seed", "7"]
    masters = [Master(flags), Master([*flags, "--shuffle-window", str(WINDOW)])]
    try:
        with Client(masters[0].addr) as a, Client(masters[1].addr) as b:
            for c in (a, b):
                c.set_dataset([data])
                read_rate(c, 0, window_records(size))  # warm-up: page cache, connections
            for p in range(1, rounds + 1):
                for i, c in enumerate((a, b)):
                    rates[i].append(read_rate(c, p, window_records(size)))
    finally:
        for m in masters:
            m.stop()
    return rates


def dispatch_part(root: Path, rounds: int, seconds: float) -> None:
    """1. The master's dispatch rate and CPU with and without a seed, and the core's share."""
    base: list[float] = []
    seeded: list[float] = []
    base_cpu: list[float] = []
    seeded_cpu: list[float] = []
    for r in range(rounds):
        rate, cpu = dispatch_rate(root, None, seconds)
        base.append(rate)
        base_cpu.append(cpu)
        rate, cpu = dispatch_rate(root, 7, seconds)
        seeded.append(rate)
        seeded_cpu.append(cpu)
        row = {"round": r, "plain": round(base[-1]), "seeded": round(seeded[-1])}
        row |= {"plain_cpu_us": round(base_cpu[-1]), "seeded_cpu_us": round(seeded_cpu[-1])}
        print(json.dumps(row), flush=True)
    core_plain: list[float] = []
    core_seeded: list[float] = []
    for _ in range(5 * rounds):
        core_plain.append(core_cycle_us(None, 3000))
        core_seeded.append(core_cycle_us(7, 3000))
    ratios = [s / b for s, b in zip(seeded, base, strict=True)]
    print(
        f"dispatch cycles/s ({CHUNKS} chunks, {CPT} a task, {CLIENTS} clients, in-memory store), "
        f"median of {rounds} rounds:"
    )
    print(f"  without --shuffle-seed  {statistics.median(base):10.0f}")
    print(f"  with --shuffle-seed     {statistics.median(seeded):10.0f}")
    print(f"  ratio (median of rounds) {statistics.median(ratios):.2f}x  (target >= 0.9x)")
    cpu_ratios = [b / s for s, b in zip(seeded_cpu, base_cpu, strict=True)]
    print(
        f"  master CPU per cycle: {statistics.median(base_cpu):.0f} us without, "
        f"{statistics.median(seeded_cpu):.0f} us with; cycles per CPU second, with / without: "
        f"{statistics.median(cpu_ratios):.2f}x"
    )
    print(
        f"  the core alone (Dispatch + Finish applied, in process): "
        f"{statistics.median(core_plain):.1f} us without, {statistics.median(core_seeded):.1f}"
        f" us with a seed (median of {len(core_plain)} alternating windows)"
    )


def buffer_part(root: Path, rounds: int) -> None:
    """2. One trainer's records/s through the client's shuffle buffer, and without."""
    plain, shuffled = buffer_rates(root, rounds)
    buf_ratios = [s / p for s, p in zip(shuffled, plain, strict=True)]
    print(f"one trainer's records/s ({RECORDS} records of 32 bytes), median of {rounds}:")
    print(f"  no shuffle buffer        {statistics.median(plain):10.0f}")
    print(f"  shuffle_buffer={BUFFER}   {statistics.median(shuffled):10.0f}")
    print(f"  ratio (median of rounds) {statistics.median(buf_ratios):.2f}x")


def window_part(root: Path, rounds: int) -> None:
    """3. One trainer's records/s with the job's shuffle window, and in file order."""
    for size in (100, 1024, 65536):
        plain, windowed = window_rates(root, rounds, size)
        ratios = [w / p for w, p in zip(windowed, plain, strict=True)]
        print(
            f"one trainer's records/s, {window_records(size)} records of {size} bytes in the "
            f"writer's default chunks, --shuffle-seed 7, median of {rounds}:"
        )
        print(f"  file order               {statistics.median(plain):10.0f}")
        print(f"  --shuffle-window {WINDOW}  {statistics.median(windowed):10.0f}")
        print(f"  ratio (median of rounds) {statistics.median(ratios):.2f}x  (target >= 0.9x)")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument(
        "--parts", default="dispatch,buffer,window", help="which of the three to run (comma list)"
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if unknown := parts - {"dispatch", "buffer", "window"}:
        ap.error(f"--parts: no part called {', '.join(sorted(unknown))}")
    root = Path(tempfile.mkdtemp(prefix="shuffle-bench-"))
    print(f"cpus={os.cpu_count()} python={sys.version.split()[0]}", flush=True)
    if "dispatch" in parts:
        dispatch_part(root, args.rounds, args.seconds)
    if "buffer" in parts:
        buffer_part(root, args.rounds)
    if "window" in parts:
        window_part(root, args.rounds)


if __name__ == "__main__":
    main()

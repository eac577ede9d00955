"""Hostile soak (issue 19's figures): three committing trainers over three passes while the
master is SIGKILLed, its store's disk fills up, a trainer freezes past its lease and a poison
chunk fails every reader; then a connection flood against a master with 1,024 descriptors.

    .venv/bin/python bench/hostile_soak.py [--records 3000] [--kills 3] [--seed 1] [--step 0.01]
    (needs root: the store lives on a small tmpfs that is filled up for real)

The run, on a master process on the embedded store (its file on a 16 MiB tmpfs):
* trainers: `bench/hostile_trainer.py` processes with sessions, committing every 25 records,
  reporting progress every 10, reading 3 passes (read failures reported, the pass goes on);
* the dataset: numbered RecordIO records and one poison chunk (a few KB of gzip inflating to
  32 MiB, over the trainers' `--max-inflated-bytes` of 1 MiB): every reader fails it; after
  `--task-timeout-max` failures it is quarantined (the error budget allows its records);
* the schedule, one disturbance every `--every` seconds, in a loop until the trainers exit:
  the master SIGKILLed and started again on its store (`--kills` times); the store's disk
  filled up for 8 s; a trainer SIGSTOPped for its lease + 3 s and continued.

Checks, per pass, from the records each trainer logged (one line a record, written before the
training loop takes the next): lost (a record of the pass, not in the poison chunk, that no
trainer got), delivered twice (beyond the documented window: the records a frozen trainer read
past its last report, at most `report_every` per freeze), the poison quarantined (the master's
ledger), every trainer's exit status.

The flood: a fresh master whose process may hold 1,024 descriptors gets 1,100 connections that
send nothing, held for 20 s, while a trainer reads a pass: its RSS and log size before and
after, and whether the trainer's pass completed during the flood.

There is no baseline: the figures are counts and bounds, not rates.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent / "tests")]

from helpers.datasets import bomb_records, one_chunk, write_records  # noqa: E402
from helpers.full_disk import SmallDisk  # noqa: E402
from helpers.master_process import MasterProcess  # noqa: E402

from chunkmaster.client.connection import MasterConnection  # noqa: E402
from chunkmaster.recordio import Compressor  # noqa: E402

REPORT_EVERY = 10
COMMIT_EVERY = 25
TRAINER_TTL = 2.0
PASSES = 3


def status(addr: str) -> dict[str, Any]:
    with MasterConnection(addr, timeout=5.0) as c:
        return c.status()


class Trainer:
    def __init__(self, name: str, addr: str, data: str, root: Path, step: float) -> None:
        self.name = name
        self.out = root / f"{name}.out"
        self.err = root / f"{name}.err"
        cmd = [sys.executable, str(_HERE / "hostile_trainer.py"), "--addr", addr]
        cmd += ["--dataset", data, "--out", str(self.out), "--passes", str(PASSES)]
        cmd += ["--report-every", str(REPORT_EVERY), "--commit-every", str(COMMIT_EVERY)]
        cmd += ["--name", name, "--step-time", str(step)]
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        self.freezes = 0

    def marks(self) -> Counter[str]:
        """Lines other than records: "f" read failures, "k" refused commits, "x" exit."""
        if not self.out.exists():
            return Counter()
        return Counter(ln for ln in self.out.read_text().splitlines() if not ln.startswith("r"))

    def records(self) -> list[tuple[int, int]]:
        if not self.out.exists():
            return []
        out = []
        for line in self.out.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "r":
                out.append((int(parts[1]), int(parts[2])))
        return out

    def freeze(self, seconds: float) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.proc.send_signal(signal.SIGCONT)
        self.freezes += 1


def make_dataset(root: Path, records: int) -> tuple[str, set[int]]:
    """Numbered records in chunks of 10, and at the end a poison chunk of 32 records."""
    path = root / "data.rio"
    write_records(path, [b"%06d" % i for i in range(records)], max_chunk_size=60)
    with open(path, "ab") as f:
        f.write(one_chunk(bomb_records(32 << 20), Compressor.GZIP))
    return str(path), set(range(records))


def run_soak(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    disk = SmallDisk(root / "store", "16m")
    if not disk.ok:
        print(f"no tmpfs for the store ({disk.why}): the disk will not fill", flush=True)
        (root / "store").mkdir(exist_ok=True)
    data, expected = make_dataset(root, args.records)
    margs = ["--store", str(root / "store" / "s.db"), "--chunk-per-task", "2"]
    margs += ["--trainer-ttl", f"{TRAINER_TTL}s", "--task-timeout-dur", "10m"]
    margs += ["--task-timeout-max", "2", "--max-failed-records", "64"]
    master = MasterProcess(margs, log_path=root / "master.log").start()
    assert master.addr is not None
    with MasterConnection(master.addr, timeout=60) as c:
        c.set_dataset([data])
    trainers = [Trainer(f"t{i}", master.addr, data, root, args.step) for i in range(3)]
    rng = random.Random(args.seed)
    events: Counter[str] = Counter()
    ledgers: dict[int, dict[str, Any]] = {}
    kinds = ["kill"] * args.kills + ["disk", "freeze"]
    rng.shuffle(kinds)
    started = time.monotonic()
    try:
        for kind in kinds * 10:
            deadline = time.monotonic() + args.every
            while time.monotonic() < deadline:
                if all(t.proc.poll() is not None for t in trainers):
                    break
                with contextlib.suppress(Exception):
                    for led in status(master.addr)["ledger"]:
                        ledgers[int(led["pass"])] = led
                time.sleep(0.5)
            if all(t.proc.poll() is not None for t in trainers):
                break
            if kind == "kill" and events["master SIGKILLed and restarted"] < args.kills:
                master.kill()
                master.restart()
                events["master SIGKILLed and restarted"] += 1
            elif kind == "disk" and disk.ok and events["store disk full for 8 s"] == 0:
                disk.fill()
                time.sleep(8)
                disk.empty()
                events["store disk full for 8 s"] += 1
            elif kind == "freeze" and events["trainer frozen past its lease"] == 0:
                rng.choice(trainers).freeze(TRAINER_TTL + 3)
                events["trainer frozen past its lease"] += 1
        for t in trainers:
            t.proc.wait(600)
        with contextlib.suppress(Exception):
            for led in status(master.addr)["ledger"]:
                ledgers[int(led["pass"])] = led
    finally:
        for t in trainers:
            if t.proc.poll() is None:
                t.proc.send_signal(signal.SIGCONT)
                t.proc.kill()
        master.kill()
        disk.unmount()
    elapsed = time.monotonic() - started
    per_pass: dict[int, Counter[int]] = {p: Counter() for p in range(PASSES)}
    for t in trainers:
        for p, r in t.records():
            per_pass[p][r] += 1
    window = REPORT_EVERY * sum(t.freezes for t in trainers)
    result: dict[str, Any] = {
        "elapsed_s": round(elapsed, 1),
        "events": dict(events),
        "exit_codes": [t.proc.returncode for t in trainers],
        "read_failures": sum(t.marks()["f"] for t in trainers),
        "refused_commits": sum(t.marks()["k"] for t in trainers),
        "passes": [],
    }
    for p in range(PASSES):
        got = per_pass[p]
        lost = sorted(expected - set(got))
        twice = sum(n - 1 for n in got.values() if n > 1)
        led = ledgers.get(p, {})
        result["passes"].append(
            {
                "pass": p,
                "lost": len(lost),
                "delivered_twice": twice,
                "allowed_twice": window,
                "poison_quarantined_records": led.get("quarantined"),
            }
        )
    return result


def run_flood(root: Path, seconds: float = 20.0, conns: int = 1100) -> dict[str, Any]:
    data = root / "flood.rio"
    write_records(data, [b"%06d" % i for i in range(2000)], max_chunk_size=60)
    margs = ["--store", str(root / "flood.db"), "--chunk-per-task", "1"]
    limit = (1024, 1024)

    def low_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, limit)

    master = MasterProcess(
        margs, log_path=root / "flood-master.log", preexec_fn=low_fd_limit
    ).start()
    assert master.addr is not None and master.proc is not None
    host, port = master.addr.rsplit(":", 1)
    pid = master.proc.pid
    rss0, log0 = _rss(pid), (root / "flood-master.log").stat().st_size
    socks = []
    opened = 0
    try:
        for _ in range(conns):
            try:
                s = socket.create_connection((host, int(port)), timeout=2)
                socks.append(s)
                opened += 1
            except OSError:
                break
        trainer = subprocess.run(
            [sys.executable, "-m", "chunkmaster", "read", "--addr", master.addr, "--dataset",
             str(data), "--passes", "1", "--json"],
            capture_output=True, text=True, timeout=seconds + 120,
        )  # fmt: skip
        time.sleep(max(0.0, seconds - 1))
        rss1, log1 = _rss(pid), (root / "flood-master.log").stat().st_size
        with MasterConnection(master.addr, timeout=10) as c:
            served_after = c.status()["ready"]
    finally:
        for s in socks:
            s.close()
        master.kill()
    pass_line = next((json.loads(ln) for ln in trainer.stdout.splitlines() if ln), {})
    return {
        "connections_opened": opened,
        "rss_mb_before": round(rss0 / 1e6, 1),
        "rss_mb_during": round(rss1 / 1e6, 1),
        "log_bytes_during_flood": log1 - log0,
        "trainer_records_during_flood": pass_line.get("records"),
        "trainer_exit": trainer.returncode,
        "served_after": served_after,
    }


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--every", type=float, default=4.0, help="seconds between disturbances")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--step", type=float, default=0.01, help="each trainer's seconds a record")
    ap.add_argument("--skip-flood", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        soak = run_soak(args, root)
        print(json.dumps(soak, indent=1), flush=True)
        ok = all(
            p["lost"] == 0 and p["delivered_twice"] <= p["allowed_twice"] for p in soak["passes"]
        )
        ok = ok and soak["exit_codes"] == [0, 0, 0]
        if not args.skip_flood:
            flood = run_flood(root)
            print(json.dumps(flood, indent=1), flush=True)
            ok = ok and flood["trainer_exit"] == 0 and flood["served_after"]
        print("OK" if ok else "FAILED", flush=True)
        if not ok:
            for name in sorted(os.listdir(root)):
                if name.endswith(".err"):
                    print(f"--- {name}:\n" + (root / name).read_text()[-2000:])
            sys.exit(1)


if __name__ == "__main__":
    main()

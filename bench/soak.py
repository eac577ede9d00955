"""Soak: masters on etcd under 64 trainers for 10 minutes while everything around them fails.

Every `--every` seconds the next disturbance of this cycle happens:
  1. a trainer process (4 trainers) is SIGKILLed in the middle of its tasks; a new one starts;
  2. the leading master is SIGKILLed; a new standby starts (two masters remain);
  3. etcd is frozen (SIGSTOP) for 5 s;
  4. etcd's disk fills up (a tmpfs made for it; etcd stops on a full disk), then empties and
     etcd is started again;
  5. etcd is SIGKILLed and started again at once.
Half the trainers use a session (their tasks come back --trainer-ttl after a death), half the
unary calls (after the task timeout, 30 s). After `--minutes`, the trainers finish the pass they are
in and exit. Then, for every pass: every record was delivered (nothing lost), and each
duplicate is put down to its cause: a task a killed trainer had taken records of (allowed), or
one that came back to a live trainer (counted; the master's per-pass ledger says why it handed
records out again). The driver polls the leader's status every second: time with the store
unhealthy (what `status` said) and the longest stretch with no record delivered are reported.

There is no baseline: this is a correctness soak; its figures are counts, not rates.

    .venv/bin/python bench/soak.py                    # 10 minutes, 64 trainers (needs root
    .venv/bin/python bench/soak.py --minutes 1        #   for the tmpfs; else no disk fills)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent / "tests")]

from helpers.datasets import numbered_records  # noqa: E402
from helpers.etcd_server import EtcdServer  # noqa: E402
from helpers.full_disk import SmallDisk  # noqa: E402
from helpers.master_process import MasterProcess  # noqa: E402
from helpers.record_log import RecordLog  # noqa: E402

from chunkmaster.client.connection import MasterConnection  # noqa: E402

PER_TASK = 16  # chunks (= records) per task: record i is in task i // PER_TASK


def _safe_to_kill(lg: RecordLog) -> bool:
    """Not near a task's end (between passes or before its first record is fine too)."""
    last = lg.log.last
    return last is None or last[0] != "r" or lg.mid_task(PER_TASK)


class TrainerProcess:
    def __init__(
        self, name: str, endpoint: str, data: str, root: Path, threads: int, step: float
    ) -> None:
        self.name = name
        self.killed = False
        self.logs = [RecordLog(root / f"{name}.{i}") for i in range(threads)]
        self.err = root / f"{name}.err"
        cmd = [sys.executable, str(_HERE / "soak_trainer.py"), "--endpoints", endpoint]
        cmd += ["--out", str(root / name), "--threads", str(threads), "--stop", str(root / "STOP")]
        cmd += ["--step-time", str(step), "--dataset", data]
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)

    def poll(self) -> int:
        return sum(t.poll().count for t in self.logs)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.killed = True
        self.poll()


class Soak:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.data = numbered_records(root / "data.rio", args.records)
        self.etcd = EtcdServer(start=False)
        self.disk = SmallDisk(Path(self.etcd.data_dir), args.etcd_disk)  # etcd's data dir
        self.etcd.start()
        self.margs = ["--endpoints", self.etcd.endpoint, "--host", "127.0.0.1", "--ttl", "3"]
        self.margs += ["--chunk-per-task", str(PER_TASK), "--task-timeout-dur", "30s"]
        self.margs += ["--trainer-ttl", "3s", "--log-level", "warning"]
        self.masters: list[MasterProcess] = []
        self._started = 0
        self.trainers: list[TrainerProcess] = []
        self.events: Counter[str] = Counter()
        self.failovers: list[float] = []
        self.unhealthy_s = 0.0
        self.unhealthy_causes: Counter[str] = Counter()
        self.ledger: dict[int, dict[str, Any]] = {}
        self.longest_stall = 0.0
        self._last_count = 0
        self._last_progress = time.monotonic()

    # --- parts -----------------------------------------------------------------------------

    def new_master(self, wait: bool) -> MasterProcess:
        self._started += 1
        n = self._started
        m = MasterProcess(self.margs, log_path=self.root / f"m{n}.log").start(wait=wait)
        self.masters.append(m)
        return m

    def new_trainer(self) -> TrainerProcess:
        t = TrainerProcess(
            f"p{len(self.trainers)}",
            self.etcd.endpoint,
            self.data,
            self.root,
            self.args.per_process,
            self.args.step,
        )
        self.trainers.append(t)
        return t

    def leader(self) -> MasterProcess | None:
        return next((m for m in self.masters if m.running and m.addr is not None), None)

    def taken(self) -> int:
        return sum(t.poll() for t in self.trainers)

    def watch(self, seconds: float) -> None:
        """Poll the trainers' logs and the leader's status for `seconds`."""
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            count = self.taken()
            if count != self._last_count:
                self._last_count = count
                self._last_progress = now
            self.longest_stall = max(self.longest_stall, now - self._last_progress)
            self._status()
            if now >= end or self._all_exited():
                return
            time.sleep(min(1.0, max(0.0, end - now)))

    def _status(self) -> None:
        m = self.leader()
        if m is None or m.addr is None:
            return
        try:
            with MasterConnection(m.addr, timeout=1.0) as c:
                st = c.status()
        except Exception:  # the leader is down or moving: nothing to read this round
            return
        store = st.get("store", {})
        if not store.get("healthy", True):
            self.unhealthy_s += 1.0
            self.unhealthy_causes[str(store.get("error"))[:120]] += 1
        for led in st.get("ledger", []):
            self.ledger[int(led["pass"])] = led

    def _all_exited(self) -> bool:
        return all(t.proc.poll() is not None for t in self.trainers)

    # --- disturbances ----------------------------------------------------------------------

    def kill_trainer(self) -> None:
        live = [t for t in self.trainers if not t.killed and t.proc.poll() is None]
        end = time.monotonic() + 10
        while live and time.monotonic() < end:
            for t in live:
                t.poll()
                if all(_safe_to_kill(lg) for lg in t.logs):
                    t.kill()
                    self.events["trainer processes killed"] += 1
                    self.new_trainer()
                    return
            time.sleep(0.005)
        self.events["trainer kills skipped (no process mid-task)"] += 1

    def kill_leader(self) -> None:
        leader = self.leader()
        if leader is None:
            self.events["leader kills skipped (no leader)"] += 1
            return
        t0 = time.monotonic()
        leader.kill()
        self.events["leaders killed"] += 1
        self.masters = [m for m in self.masters if m.running]
        self.new_master(False)
        end = t0 + 60
        while time.monotonic() < end:
            if self.leader() is not None:
                self.failovers.append(time.monotonic() - t0)
                return
            time.sleep(0.01)
        raise AssertionError("no standby took over in 60 s")

    def freeze_etcd(self) -> None:
        self.etcd.pause()
        self.events["etcd frozen 5 s"] += 1
        self.watch(5)
        self.etcd.resume()

    def fill_etcd_disk(self) -> None:
        if not self.disk.ok:
            self.events["disk fills skipped (no tmpfs)"] += 1
            return
        self.disk.fill()
        self.events["etcd disk filled"] += 1
        end = time.monotonic() + 20
        while self.etcd.running and time.monotonic() < end:
            self.watch(0.5)
        if self.etcd.running:
            self.events["etcd survived a full disk for 20 s"] += 1
        else:
            self.events["etcd stopped on the full disk"] += 1
        self.disk.empty()
        self.etcd.restart(60)

    def restart_etcd(self) -> None:
        self.etcd.kill()
        self.etcd.start(60)
        self.events["etcd SIGKILLed and restarted"] += 1

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        t_start = time.monotonic()
        self.new_master(True)
        self.new_master(False)
        for _ in range(args.trainers // args.per_process):
            self.new_trainer()
        cycle = [
            self.kill_trainer,
            self.kill_leader,
            self.freeze_etcd,
            self.fill_etcd_disk,
            self.restart_etcd,
        ]
        end = t_start + args.minutes * 60
        step = 0
        while time.monotonic() < end:
            self.watch(min(args.every, max(0.0, end - time.monotonic())))
            if time.monotonic() >= end:
                break
            cycle[step % len(cycle)]()
            step += 1
        (self.root / "STOP").touch()
        stop_t = time.monotonic()
        while not self._all_exited():
            assert time.monotonic() < stop_t + 600, "trainers did not finish after STOP"
            self.watch(1)
        bad = [t for t in self.trainers if not t.killed and t.proc.returncode != 0]
        for t in bad:
            print(f"{t.name} exited {t.proc.returncode}:\n{t.err.read_text()[-3000:]}")
        self._status()
        ok = self.check() and not bad
        print(
            f"  runtime: {time.monotonic() - t_start:.0f} s ({args.minutes:g} min of disturbance)"
        )
        return 0 if ok else 1

    def check(self) -> bool:
        for t in self.trainers:
            t.poll()
        passes = sorted({p for t in self.trainers for lg in t.logs for p in lg.log.records})
        ok = True
        total = allowed_dups = other_dups = done_only = 0
        rows = []
        for p in passes:
            seen: Counter[int] = Counter()
            survivors: Counter[int] = Counter()
            allowed: set[int] = set()
            for t in self.trainers:
                for lg in t.logs:
                    recs = lg.log.records.get(p, [])
                    mine = set(recs)
                    for tid in lg.log.done.get(p, set()):
                        missing = [
                            r
                            for r in range(tid * PER_TASK, (tid + 1) * PER_TASK)
                            if r < self.args.records and r not in mine
                        ]
                        done_only += len(missing)
                        recs = recs + missing
                    seen.update(recs)
                    if t.killed:
                        allowed |= {r // PER_TASK for r in recs}
                    else:
                        survivors.update(recs)
            lost = self.args.records - len(set(seen))
            if lost:
                ok = False
                missing_ids = sorted(set(range(self.args.records)) - set(seen))[:10]
                print(f"  pass {p}: {lost} records LOST, e.g. {missing_ids}")
            dups = {r: n - 1 for r, n in seen.items() if n > 1}
            a = sum(n for r, n in dups.items() if r // PER_TASK in allowed)
            o = sum(n for r, n in dups.items() if r // PER_TASK not in allowed)
            allowed_dups += a
            other_dups += o
            total += sum(seen.values())
            led = self.ledger.get(p)
            again = led["redispatched"] if led else None
            rows.append((p, sum(seen.values()), a, o, again))
        print()
        print(
            f"soak: {self.args.trainers} trainers ({self.args.per_process} per process), "
            f"{self.args.records} records a pass, {len(passes)} passes"
        )
        for p, n, a, o, again in rows:
            print(
                f"  pass {p}: {n} deliveries; duplicates: {a} in tasks of killed trainers, "
                f"{o} elsewhere; master ledger, handed out again: {again}"
            )
        print(f"  records delivered: {total}; lost: {'none' if ok else 'SOME (see above)'}")
        print(f"  duplicates: {allowed_dups} from killed trainers' tasks, {other_dups} others")
        print(f"  done-but-unlogged records credited from 'd' lines: {done_only}")
        for what, n in sorted(self.events.items()):
            print(f"  {what}: {n}")
        if self.failovers:
            fo = sorted(self.failovers)
            print(
                f"  failover (SIGKILL -> a new leader serving): {fo[0]:.1f} / "
                f"{fo[len(fo) // 2]:.1f} / {fo[-1]:.1f} s (min / median / max)"
            )
        print(
            f"  store unhealthy in status: ~{self.unhealthy_s:.0f} s; causes: "
            f"{dict(self.unhealthy_causes) or 'none'}"
        )
        print(f"  longest stretch with no record delivered: {self.longest_stall:.1f} s")
        return ok

    def close(self) -> None:
        for t in self.trainers:
            if t.proc.poll() is None:
                t.proc.kill()
        for m in self.masters:
            m.kill()
        self.etcd.kill()
        self.disk.unmount()
        self.etcd.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--trainers", type=int, default=64)
    ap.add_argument("--per-process", type=int, default=4)
    ap.add_argument("--records", type=int, default=12000, help="records a pass")
    ap.add_argument("--step", type=float, default=0.05, help="seconds of 'training' a record")
    ap.add_argument("--every", type=float, default=12.0, help="seconds between disturbances")
    ap.add_argument("--etcd-disk", default="256m", help="size of etcd's tmpfs")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        soak = Soak(args, Path(tmp))
        if not soak.disk.ok:
            print(f"note: no tmpfs for etcd ({soak.disk.why}): its disk will not fill")
        try:
            return soak.run()
        finally:
            soak.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

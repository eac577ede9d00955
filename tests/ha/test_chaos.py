"""Chaos: three masters on etcd, six trainers, five passes; leaders and trainers SIGKILLed.

Kills are driven by progress (records taken, as logged by the trainers), not by the clock, so
every run makes the same number of kills at comparable points: the leader at each of several
milestones (a replacement master is started each time, so three remain) and a trainer at two
others (a fresh trainer replaces it; it starts at pass 0 and skips the passes already over).

What must hold, per pass:
* every record was delivered (the union over all trainers, killed ones included);
* no record reached the surviving trainers twice;
* every record seen twice belongs to a task a killed trainer had taken records of in that pass
  (unfinished, or finished but its report died with the trainer): the only allowed duplicates.

Trainers are killed only in the middle of a task (the last logged record is not near its
task's end), so a kill never lands between the client reporting a task finished and the
trainer logging its last record.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from helpers.datasets import numbered_records
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess, wait_leader
from helpers.record_log import Log, RecordLog

RECORDS = 480
PER_TASK = 8  # chunks (= records) per task: record i is in task i // PER_TASK
PASSES = 5
TRAINERS = 6
STEP = 0.02  # seconds of "training" per record
TTL = 2
# Longer than a failover plus the time to read the two tasks a trainer holds, so a live
# trainer's tasks never time out; a killed trainer's come back after it.
TASK_TIMEOUT = "8s"
LEADER_KILLS_AT = (0.06, 0.16, 0.26, 0.36, 0.46, 0.56, 0.66, 0.76, 0.86)  # of all records
TRAINER_KILLS_AT = (0.3, 0.6)
HERE = Path(__file__).resolve().parent


class Trainer:
    def __init__(self, name: str, endpoint: str, data: Path, root: Path) -> None:
        self.name = name
        self.out = root / f"{name}.lines"
        self.err = root / f"{name}.log"
        self.killed = False
        self.lines = RecordLog(self.out)
        self.log = self.lines.log
        cmd = [sys.executable, str(HERE / "chaos_trainer.py"), "--endpoints", endpoint]
        cmd += ["--out", str(self.out), "--passes", str(PASSES), "--step-time", str(STEP)]
        cmd += ["--dataset", str(data)]
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)

    def poll(self) -> Log:
        return self.lines.poll()

    def mid_task(self) -> bool:
        return self.lines.mid_task(PER_TASK)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.killed = True
        self.poll()


def write_dataset(path: Path) -> Path:
    return Path(numbered_records(path, RECORDS))


def test_chaos_leaders_and_trainers_killed_every_pass_delivers_every_record(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    t_start = time.monotonic()
    data = write_dataset(tmp_path / "data.rio")
    margs = ["--endpoints", etcd_server.endpoint, "--host", "127.0.0.1", "--ttl", str(TTL)]
    margs += ["--chunk-per-task", str(PER_TASK), "--task-timeout-dur", TASK_TIMEOUT]
    n_masters = 0

    def new_master(wait: bool) -> MasterProcess:
        nonlocal n_masters
        n_masters += 1
        return MasterProcess(margs, log_path=tmp_path / f"m{n_masters}.log").start(wait=wait)

    masters = [new_master(True), new_master(False), new_master(False)]
    trainers: list[Trainer] = []
    failovers: list[float] = []
    leader_kills = trainer_kills = 0
    try:
        for m in masters[1:]:
            assert m.wait_log("waiting for the master lock"), m.log()
        leader = masters[0]
        trainers = [Trainer(f"t{i}", etcd_server.endpoint, data, tmp_path) for i in range(TRAINERS)]
        total = RECORDS * PASSES
        leader_marks = [int(f * total) for f in LEADER_KILLS_AT]
        trainer_marks = [int(f * total) for f in TRAINER_KILLS_AT]
        deadline = time.monotonic() + 240  # a safety net, far above the usual runtime
        while any(t.proc.poll() is None for t in trainers if not t.killed):
            assert time.monotonic() < deadline, "chaos run did not finish"
            taken = sum(t.poll().count for t in trainers)
            if leader_marks and taken >= leader_marks[0]:
                leader_marks.pop(0)
                t_kill = time.monotonic()
                leader.kill()
                leader_kills += 1
                masters = [m for m in masters if m.running]
                masters.append(new_master(False))  # three again: two standbys
                leader = wait_leader(masters, 30)
                failovers.append(time.monotonic() - t_kill)
                continue
            if trainer_marks and taken >= trainer_marks[0]:
                victims = [t for t in trainers if not t.killed and t.proc.poll() is None]
                victim = next((t for t in victims if t.mid_task()), None)
                if victim is not None:
                    trainer_marks.pop(0)
                    victim.kill()
                    trainer_kills += 1
                    trainers.append(
                        Trainer(f"t{len(trainers)}", etcd_server.endpoint, data, tmp_path)
                    )
                    continue
            time.sleep(0.002)
        for t in trainers:
            if not t.killed:
                assert t.proc.wait(30) == 0, t.err.read_text()[-3000:]
                t.poll()
                assert t.out.read_text().endswith("x\n")  # a clean exit after the last pass
        assert not leader_marks and not trainer_marks, "not every planned kill happened"

        dups_total = 0
        done_only = 0
        rows = []
        for p in range(PASSES):
            seen: Counter[int] = Counter()
            survivors: Counter[int] = Counter()
            allowed: set[int] = set()  # tasks a killed trainer had taken records of
            unfinished: set[int] = set()  # ...without taking the last record
            for t in trainers:
                recs = t.log.records.get(p, [])
                mine = set(recs)
                for tid in t.log.done.get(p, set()):
                    # done means the client handed over the task's last record
                    task = range(tid * PER_TASK, (tid + 1) * PER_TASK)
                    missing = [r for r in task if r not in mine]
                    if not t.killed:
                        assert not missing, f"{t.name} pass {p} task {tid} done, missing {missing}"
                    done_only += len(missing)
                    recs = recs + missing
                seen.update(recs)
                if t.killed:
                    allowed |= {r // PER_TASK for r in recs}
                    unfinished |= {r // PER_TASK for r in recs} - t.log.done.get(p, set())
                else:
                    survivors.update(recs)
            assert set(seen) == set(range(RECORDS)), f"pass {p}: records lost"
            twice = [r for r, n in survivors.items() if n > 1]
            assert not twice, f"pass {p}: surviving trainers got {twice[:10]} twice"
            dups = {r: n for r, n in seen.items() if n > 1}
            bad = sorted(r for r in dups if r // PER_TASK not in allowed)
            assert not bad, f"pass {p}: duplicates {bad[:10]} not from a killed trainer's tasks"
            dups_total += sum(n - 1 for n in dups.values())
            dup_tasks = {r // PER_TASK for r in dups}
            rows.append((p, sum(seen.values()), len(dups), dup_tasks, dup_tasks - unfinished))
        print()
        print(f"chaos: {RECORDS} records x {PASSES} passes, {TRAINERS} trainers, ttl {TTL}s")
        for p, n, d, tasks, fin in rows:
            print(
                f"  pass {p}: {n} records taken, {d} duplicated, in tasks {sorted(tasks)}"
                f" (finished by a killed trainer, its report lost with it: {sorted(fin)})"
            )
        print(f"  duplicates (extra deliveries): {dups_total}; done-but-unlogged: {done_only}")
        print(f"  leader kills: {leader_kills}, trainer kills: {trainer_kills}")
        lo, mid, hi = min(failovers), statistics.median(failovers), max(failovers)
        print(f"  failover (SIGKILL -> new leader serving): {lo:.2f} / {mid:.2f} / {hi:.2f} s")
        print(f"  runtime: {time.monotonic() - t_start:.1f}s")
    finally:
        for t in trainers:
            if t.proc.poll() is None:
                t.proc.kill()
        for m in masters:
            m.kill()

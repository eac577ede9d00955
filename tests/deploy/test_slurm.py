"""deploy/slurm/chunkmaster.sbatch under a real Slurm: Debian's slurm-wlm and munge, one
munged, one slurmctld and one slurmd on loopback, each with this test's own files in a
temporary folder (nothing on the machine is configured). The batch job runs a master and three
trainer steps for two passes, every record once per pass; then a trainer step is cancelled with
scancel in the middle of a pass, and the pass is still completed by the others."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import write_records
from helpers.deploy import REPO, ensure
from helpers.etcd_server import EtcdServer

from chunkmaster.digest import Digest

pytestmark = pytest.mark.cluster

SBATCH = REPO / "deploy/slurm/chunkmaster.sbatch"
NODE = "cmnode"
TRAINERS = 3
PER_TASK = 4
PASSES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Slurm:
    """munged, slurmctld and slurmd for one node (NodeAddr 127.0.0.1), configured in `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        munge = root / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = munge / "munge.socket"
        for d in ("state", "spool", "log"):
            (root / d).mkdir()
        host = socket.gethostname()
        self.conf = root / "slurm.conf"
        # proctrack/linuxproc and task/none: no cgroups needed; config_overrides: the node
        # may claim more CPUs than the machine has (a master and three trainers on 2 cores).
        self.conf.write_text(
            f"""ClusterName=chunkmastertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "log/slurmctld.log"}
SlurmdLogFile={root / "log/slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""
        )
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        # The trainers' and the master's `chunkmaster` is this Python's.
        self.env["PATH"] = f"{Path(sys.executable).parent}:{self.env.get('PATH', '')}"

    def start(self) -> None:
        log = open(self.root / "log/daemons.out", "ab")  # noqa: SIM115
        self.procs.append(
            subprocess.Popen(
                ["munged", "--foreground", "--force", f"--socket={self.socket}",
                 f"--key-file={self.socket.parent / 'munge.key'}",
                 f"--pid-file={self.root / 'munge/munged.pid'}",
                 f"--seed-file={self.root / 'munge/munged.seed'}",
                 f"--log-file={self.root / 'log/munged.log'}"],
                stdout=log, stderr=log,
            )
        )  # fmt: skip
        self.wait(lambda: self.socket.exists(), "munged's socket", 30)
        self.procs.append(
            subprocess.Popen(["slurmctld", "-D", "-i"], env=self.env, stdout=log, stderr=log)
        )
        self.procs.append(
            subprocess.Popen(["slurmd", "-D", "-N", NODE], env=self.env, stdout=log, stderr=log)
        )
        self.wait(self.node_idle, "the node to be idle", 60)

    def node_idle(self) -> bool:
        out = self.run("sinfo", "--noheader", "--format=%t", check=False).stdout.strip()
        return out == "idle"

    def wait(self, ready: Any, what: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ready():
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"{p.args[0]} exited {p.returncode}:\n{self.logs()}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.logs()}")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
        return proc

    def job_state(self, job: str) -> str:
        out = self.run("scontrol", "show", "job", job).stdout
        return next(w.split("=", 1)[1] for w in out.split() if w.startswith("JobState="))

    def wait_job(self, job: str, timeout: float = 300) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.job_state(job)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state
            time.sleep(0.3)
        raise AssertionError(f"job {job} still {self.job_state(job)}:\n{self.logs()}")

    def steps(self, job: str) -> dict[str, str]:
        """Step name -> step ID of the job's running steps."""
        out = self.run("squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i %j")
        return {name: sid for sid, name in (ln.split() for ln in out.stdout.splitlines())}

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted((self.root / "log").iterdir())
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    if os.geteuid() != 0:
        pytest.skip("needs root: slurmd runs jobs as their users, munged and slurmctld as root")
    ensure("ensure-slurm.sh")
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o755)
    cluster = Slurm(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def dataset(d: Path) -> list[bytes]:
    """Three files of distinct records, one chunk each: task k is records 4k..4k+3 of the
    files in order (--chunk-per-task 4)."""
    d.mkdir()
    records: list[bytes] = []
    for f in range(3):
        part = [f"file {f} record {i} ".encode() + bytes(i % 13) for i in range(200)]
        write_records(d / f"part-{f}.rio", part)
        records += part
    return records


def digest(records: list[bytes]) -> Digest:
    total = Digest()
    for r in records:
        total.add(r)
    return total


def submit(
    slurm: Slurm,
    tmp: Path,
    name: str,
    step_time: str,
    where: str = '--addr "$CHUNKMASTER_ADDR"',
    hold: bool = False,
    **env: str,
) -> tuple[str, Path]:
    run_dir = tmp / name
    local = tmp / "node-tmp"  # the node's local disk: the master's store goes there
    local.mkdir()
    trainer = (
        f'exec chunkmaster read {where} --token-file "$CHUNKMASTER_TOKEN_FILE" '
        f'--dataset "{tmp}/data/*.rio" --passes {PASSES} --json --task-lines '
        f"--step-time {step_time}"
    )
    slurm.env.update(
        CHUNKMASTER_SLURM_RUN_DIR=str(run_dir),
        CHUNKMASTER_SLURM_MASTER_ARGS=f"--chunk-per-task {PER_TASK} --task-timeout-dur 60s",
        CHUNKMASTER_TRAINER_TTL="3s",
        TMPDIR=str(local),
    )
    for key in ("CHUNKMASTER_ENDPOINTS", "CHUNKMASTER_SLURM_MASTERS", "CHUNKMASTER_JOB"):
        slurm.env.pop(key, None)
    slurm.env.update(env)
    out = slurm.run(
        "sbatch", "--parsable", f"--ntasks={TRAINERS}", f"--output={tmp / name}.out",
        *(["--hold"] if hold else []), str(SBATCH), "sh", "-c", trainer,
    )  # fmt: skip
    return out.stdout.strip().split(";")[0], run_dir


def lines(run_dir: Path, i: int) -> list[dict[str, Any]]:
    text = (run_dir / f"trainer-{i}.out").read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def pass_total(outs: list[list[dict[str, Any]]], p: int) -> Digest:
    total = Digest()
    for out in outs:
        for line in out:
            if line.get("pass") == p and "task" not in line:
                total.merge(Digest(int(line["digest"], 16), int(line["records"])))
    return total


def test_a_master_and_three_trainer_steps_read_every_record_once_per_pass(
    slurm: Slurm, tmp_path: Path
) -> None:
    expected = digest(dataset(tmp_path / "data"))
    job, run_dir = submit(slurm, tmp_path, "job", "0")
    state = slurm.wait_job(job)
    job_out = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", f"{state}\n{job_out}\n{slurm.logs()}"
    assert "every trainer step succeeded" in job_out
    outs = [lines(run_dir, i) for i in range(TRAINERS)]
    for p in range(PASSES):
        assert pass_total(outs, p) == expected, f"pass {p}"
    # The token was made for the job, readable by its user only, and the master required it.
    assert (run_dir / "token").stat().st_mode & 0o077 == 0
    master_log = (run_dir / "master-0.log").read_text()
    assert "security: no TLS, a token" in master_log
    assert "shutting down" in master_log  # stopped with SIGTERM once the trainers were done
    assert not (run_dir / "master-0.json").exists()  # a clean stop removes the ready file
    assert list((tmp_path / "node-tmp").iterdir()) == []  # the store of a finished job too


def test_a_trainer_step_cancelled_mid_pass_and_the_pass_still_completes(
    slurm: Slurm, tmp_path: Path
) -> None:
    records = dataset(tmp_path / "data")
    job, run_dir = submit(slurm, tmp_path, "job", "0.01")
    victim = run_dir / "trainer-1.out"
    # Once trainer 1 has completed a task of pass 0, cancel its step (SIGTERM, then SIGKILL).
    slurm.wait(
        lambda: victim.exists() and '"task"' in victim.read_text(), "trainer-1's first task", 120
    )
    steps = slurm.steps(job)
    assert {"master-0", "trainer-0", "trainer-1", "trainer-2"} <= set(steps), steps
    slurm.run("scancel", f"{job}.{steps['trainer-1'].split('.')[1]}")
    state = slurm.wait_job(job)
    job_out = (tmp_path / "job.out").read_text()
    assert state == "FAILED", f"{state}\n{job_out}"  # the script names the step that failed
    assert "trainer steps that failed: trainer-1" in job_out
    outs = [lines(run_dir, i) for i in range(TRAINERS)]
    assert not any(line.get("pass") == 1 for line in outs[1])  # it never reached pass 1
    # The store stays on the node for a requeued job to resume from.
    (store,) = (tmp_path / "node-tmp").iterdir()
    assert (store / "state.db").exists()
    assert store.stat().st_mode & 0o777 == 0o700  # made private
    # Pass 0 is complete: every task was completed, and each task's line is a tail of its
    # records. A task trainer 1 was reading went to another from the position trainer 1 had
    # reported (records it consumed are not delivered again, but those after its last report
    # may be: a killed trainer's unreported records come at least once, docs/client.md).
    lines_of: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for i, out in enumerate(outs):
        for line in out:
            if line.get("pass") == 0 and "task" in line:
                lines_of.setdefault(line["task"], []).append((i, line))
    tasks = len(records) // PER_TASK
    assert sorted(lines_of) == list(range(tasks))
    partial = 0
    for k, found in lines_of.items():
        task = records[k * PER_TASK : (k + 1) * PER_TASK]
        for _, line in found:
            n = int(line["records"])
            assert 0 <= n <= PER_TASK
            assert Digest(int(line["digest"], 16), n) == digest(task[PER_TASK - n :]), f"task {k}"
        survivors = [line for i, line in found if i != 1]
        assert len(survivors) <= 1, f"task {k} completed by two live trainers: {found}"
        if len(found) == 1 and int(found[0][1]["records"]) < PER_TASK:
            partial += 1  # its head went to trainer 1, which reported consuming it
    assert partial <= 1  # only the task trainer 1 was reading
    # Pass 1, the two left: every record exactly once.
    assert pass_total([outs[0], outs[2]], 1) == digest(records)


@pytest.mark.parametrize("made", ["by another user", "open to others"])
def test_a_store_directory_made_by_someone_else_fails_the_job(
    slurm: Slurm, tmp_path: Path, made: str
) -> None:
    """The store's directory on the node's temporary disk, made before the job ran by another
    user (or open to them), who could then rename or delete the store: the job refuses it,
    saying what is wrong and how to fix it, and starts no master."""
    dataset(tmp_path / "data")
    job, run_dir = submit(slurm, tmp_path, "job", "0", hold=True)
    store = tmp_path / "node-tmp" / f"chunkmaster-chunkmastertest-{job}"
    store.mkdir()
    if made == "by another user":
        os.chown(store, pwd.getpwnam("nobody").pw_uid, -1)
        store.chmod(0o700)
        wrong = f"is owned by uid {pwd.getpwnam('nobody').pw_uid}, not this job's user (uid 0)"
    else:
        store.chmod(0o777)
        wrong = "has mode 777: its group or others can write it"
    slurm.run("scontrol", "release", job)
    state = slurm.wait_job(job)
    job_out = (tmp_path / "job.out").read_text()
    assert state == "FAILED", f"{state}\n{job_out}"
    assert f"chunkmaster.sbatch: the store directory {store} {wrong}: remove it (rm -r " in job_out
    assert "or set CHUNKMASTER_STORE" in job_out
    assert not (run_dir / "master-0.log").exists()  # no master step was started
    assert list(store.iterdir()) == []


def test_two_masters_on_etcd_the_leader_killed_and_the_trainers_follow(
    slurm: Slurm, tmp_path: Path, etcd_server: EtcdServer
) -> None:
    """CHUNKMASTER_ENDPOINTS: two master steps elect a leader; trainers find it through etcd.
    The leader's step is SIGKILLed mid-pass: the standby takes over within the lease TTL, the
    trainers follow it, and both passes complete."""
    records = dataset(tmp_path / "data")
    job, run_dir = submit(
        slurm, tmp_path, "job", "0.01",
        where='--endpoints "$CHUNKMASTER_ENDPOINTS" --job "$CHUNKMASTER_JOB"',
        CHUNKMASTER_ENDPOINTS=etcd_server.endpoint, CHUNKMASTER_SLURM_MASTERS="2",
        CHUNKMASTER_JOB="slurmjob", CHUNKMASTER_TTL="2",
    )  # fmt: skip
    first = run_dir / "trainer-0.out"
    slurm.wait(lambda: first.exists() and '"task"' in first.read_text(), "a first task", 120)
    (leader,) = [p for p in run_dir.glob("master-*.json") if p.stat().st_size]
    name = leader.stem  # master-M: its step's name
    steps = slurm.steps(job)
    slurm.run("scancel", "--signal=KILL", f"{job}.{steps[name].split('.')[1]}")
    state = slurm.wait_job(job)
    job_out = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", f"{state}\n{job_out}\n{slurm.logs()}"
    other = "master-1" if name == "master-0" else "master-0"
    assert "serving on" in (run_dir / f"{other}.log").read_text()  # the standby took over
    outs = [lines(run_dir, i) for i in range(TRAINERS)]
    # Pass 0, with the failover: every task completed, a tail of its records each.
    done = {
        line["task"] for out in outs for line in out if line.get("pass") == 0 and "task" in line
    }
    assert done == set(range(len(records) // PER_TASK))
    # Pass 1, after it: every record exactly once.
    assert pass_total(outs, 1) == digest(records)

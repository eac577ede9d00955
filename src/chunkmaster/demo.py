"""`make demo`: chunkmaster as it is, with real processes and real files, in under a minute.

1. A dataset of three RecordIO files, and a master on its embedded store with a long task
   timeout (10 min: a slow trainer is never taken for a stuck one) and a 3 s trainer lease (a
   dead trainer is caught by it).
2. Three trainers with sessions read two passes, committing every 50 records.
3. Trainer 2 dies mid-task in pass 0 (SIGKILL, by its own hand, right after a record): its
   lease runs out and the others read its tasks from the positions it reported.
4. The master is SIGKILLed in pass 1 and started again on its store; the trainers resume their
   sessions.
5. A data checkpoint, the documented way: every trainer commits and waits, the checkpoint is
   saved, they go on.
6. A fresh master restored from that checkpoint, and one trainer, read what was not committed.

The verdict reads every trainer's log of the records it took (one line a record, written before
the next, so a SIGKILL loses none) and the master's record ledger. Per pass: every record of
the dataset delivered, nothing else, and no more records twice than the ledger says were handed
out again (the records a lost trainer may have read past its last report, docs/sessions.md);
after the restore: exactly the records the checkpoint says were not committed, each once, and
none that a trainer had committed. No step waits on a timing that a slow machine could miss:
the deadlines are only there to report a hang. Exit status 0 on PASS, 1 on FAIL.

`python -m chunkmaster.demo trainer ...` is the demo's trainer (ten lines of training loop).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from chunkmaster.digest import Digest, record_digest
from chunkmaster.logs import plural
from chunkmaster.master.readiness import MasterNotReady, wait_ready
from chunkmaster.recordio import Compressor, Writer, load_index, scan

TRAINERS = 3
PASSES = 2
VICTIM = 2
DIES_AFTER = 120  # records: the victim dies after its 120th, mid-task (tasks of ~40)
STEP_TIME = 0.01  # seconds of "training" per record
COMMIT_EVERY = 50
TRAINER_TTL = "3s"
TASK_TIMEOUT = "10m"
KILL_MASTER_AT = 0.25  # of pass 1's records
CHECKPOINT_AT = 0.6
HANG = 300.0  # seconds without any progress that only a hang explains

_T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - _T0:5.1f}s] {text}", flush=True)


def note(text: str) -> None:
    print(f"         {text}", flush=True)


# ---- the dataset -------------------------------------------------------------------------


@dataclass
class Dataset:
    glob: str
    tasks: list[list[int]]  # task -> its records' digests, in order (one chunk a task)
    digest: Digest

    @property
    def records(self) -> Counter[int]:
        return Counter(r for task in self.tasks for r in task)


def make_dataset(directory: Path) -> Dataset:
    """Three files of binary records (NUL bytes included, one empty record), ~40 a chunk."""
    rng = random.Random(20170607)
    paths = []
    for f in range(3):
        path = directory / f"part-{f:05d}.rio"
        with Writer(str(path), max_chunk_size=4000, compressor=Compressor.SNAPPY) as w:
            for i in range(400):
                w.write(b"" if f == i == 0 else f"{f}:{i}:".encode() + rng.randbytes(40 + i % 100))
        paths.append(path)
    tasks: list[list[int]] = []
    digest = Digest()
    for path in paths:  # tasks are the chunks in file order (the glob's order)
        records = [record_digest(r) for r in scan(str(path))]
        start = 0
        for n in load_index(str(path)).chunk_records:
            tasks.append(records[start : start + n])
            start += n
        for r in records:
            digest.merge(Digest(r, 1))
    return Dataset(str(directory / "part-*.rio"), tasks, digest)


# ---- the trainer process -----------------------------------------------------------------


def trainer_main(argv: list[str]) -> int:
    """A trainer: read passes, log each record, commit every N, pause for a checkpoint when
    told (stdin), and, as the victim, die after a given record."""
    from chunkmaster.client import Client
    from chunkmaster.core.errors import MasterError

    ap = argparse.ArgumentParser(prog="chunkmaster.demo trainer")
    ap.add_argument("--addr", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--dataset")
    ap.add_argument("--first-pass", type=int, default=0)
    ap.add_argument("--passes", type=int, required=True)
    ap.add_argument("--step", type=float, default=0.0)
    ap.add_argument("--commit-every", type=int, default=0)
    ap.add_argument("--die-after", type=int, default=0)
    args = ap.parse_args(argv)
    log = TrainerLog(args.log)
    pause = threading.Event()
    go = threading.Event()
    threading.Thread(target=_listen, args=(pause, go), daemon=True).start()
    taken = 0
    with Client(args.addr, name=args.name) as client:
        if args.dataset:
            client.set_dataset([args.dataset])

        def commit(p: int) -> None:
            try:
                client.commit()
                log.write(f"c {p} {taken}")
            except MasterError as exc:  # a session lost meanwhile: the docs say what it means
                log.write(f"x {p} {taken}")
                event("refused", p, taken, why=str(exc))

        for p in range(args.first_pass, args.first_pass + args.passes):
            mine = Digest()
            for record in client.records(p):
                log.write(f"r {p} {record_digest(record):016x}")
                mine.add(record)
                taken += 1
                if taken == args.die_after:
                    event("dying", p, taken)
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.commit_every and taken % args.commit_every == 0:
                    commit(p)
                time.sleep(args.step)
                if pause.is_set():  # the checkpoint protocol: commit, wait, go on
                    pause.clear()
                    commit(p)
                    log.write(f"p {p} {taken}")
                    event("paused", p, taken)
                    go.wait()
                    go.clear()
            event("pass", p, mine.count, digest=mine.hex())
        commit(args.first_pass + args.passes - 1)
    return 0


class TrainerLog:
    """One line a record or commit, one os.write each on an O_APPEND file: a SIGKILL loses
    no line that was written, and every record taken is written before the next is taken."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())


def event(kind: str, p: int, records: int, **more: Any) -> None:
    print(json.dumps({"ev": kind, "pass": p, "records": records, **more}), flush=True)


def _listen(pause: threading.Event, go: threading.Event) -> None:
    for line in sys.stdin:
        (pause if line.strip() == "pause" else go).set()


# ---- the orchestra ---------------------------------------------------------------------


@dataclass
class Trainer:
    n: int
    proc: subprocess.Popen[str]
    log: Path
    passes: dict[int, dict[str, Any]] = field(default_factory=dict)
    died: float | None = None  # time.monotonic() of its death
    died_in: int = 0  # the pass it died in
    exited: bool = False

    @property
    def name(self) -> str:
        return f"trainer-{self.n}"


class Demo:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.py = [sys.executable, "-m", "chunkmaster"]
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.procs: list[subprocess.Popen[str]] = []
        self.events: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self.trainers: list[Trainer] = []
        self.ledger: dict[int, dict[str, Any]] = {}
        self.port = free_port()
        self.master: subprocess.Popen[str] | None = None
        self.addr = f"127.0.0.1:{self.port}"
        self.checkpoint: Path | None = None
        self.refused: list[str] = []

    # -- processes --

    def start_master(self, store: Path, port: int, *extra: str) -> tuple[str, str]:
        """A master on `store`; its (address, dashboard address)."""
        ready = self.tmp / f"ready-{len(self.procs)}.json"
        log = self.tmp / f"master-{len(self.procs)}.log"
        flags = ["--port", str(port), "--store", str(store), "--task-timeout-dur", TASK_TIMEOUT]
        flags += ["--trainer-ttl", TRAINER_TTL, "--chunk-per-task", "1", "--metrics-port", "0"]
        proc = subprocess.Popen(
            [*self.py, "master", *flags, "--ready-file", str(ready), *extra],
            stdout=subprocess.DEVNULL,
            stderr=open(log, "w"),  # noqa: SIM115
            text=True,
            env=self.env,
        )
        self.procs.append(proc)
        self.master = proc
        try:
            info = wait_ready(ready, proc, HANG, log.read_text)
        except MasterNotReady as exc:
            raise Failure(f"the master did not start: {exc}") from None
        return str(info["addr"]), str(info.get("metrics_addr"))

    def start_trainer(self, n: int, addr: str, *args: str) -> Trainer:
        log = self.tmp / f"trainer-{n}.records"
        me = [sys.executable, "-m", "chunkmaster.demo", "trainer"]
        proc = subprocess.Popen(
            [*me, "--addr", addr, "--name", f"trainer-{n}", "--log", str(log), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.tmp / f"trainer-{n}.log", "w"),  # noqa: SIM115
            text=True,
            env=self.env,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        threading.Thread(target=_pump, args=(n, proc.stdout, self.events), daemon=True).start()
        return Trainer(n, proc, log)

    def status(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The master's status, its ledger kept per pass; None while it does not answer."""
        st = ask_status(self.addr, timeout)
        for led in (st or {}).get("ledger", []):
            self.ledger[int(led["pass"])] = led
        return st

    # -- the story --

    def run(self) -> int:
        print(
            "chunkmaster demo: trainers with sessions and leases, a trainer and the master "
            "killed, commits, a data checkpoint and a restore; every record checked",
            flush=True,
        )
        say("1. the dataset")
        ds = make_dataset(self.tmp)
        note(
            f"3 RecordIO files, {len(ds.records.keys()):,} records in {len(ds.tasks)} chunks "
            f"(a task each), digest {ds.digest.hex()}"
        )
        say("2. a master on its embedded store")
        addr, dash = self.start_master(self.tmp / "state.db", self.port)
        note(f"serving on {addr}; dashboard at http://{dash}/")
        note(
            f"task timeout {TASK_TIMEOUT} (for a stuck trainer: a slow one is never taken for "
            f"it), trainer lease {TRAINER_TTL} (a dead trainer is caught by it)"
        )
        say(
            f"3. {TRAINERS} trainers with sessions read {PASSES} passes "
            f"({STEP_TIME * 1000:.0f} ms a record, a commit every {COMMIT_EVERY} records)"
        )
        for n in range(1, TRAINERS + 1):
            args = ["--dataset", ds.glob, "--passes", str(PASSES), "--step", str(STEP_TIME)]
            args += ["--commit-every", str(COMMIT_EVERY)]
            if n == VICTIM:
                args += ["--die-after", str(DIES_AFTER)]
            self.trainers.append(self.start_trainer(n, addr, *args))
        self.watch()
        restored = self.restore(ds)
        return verdict(ds, self, restored)

    def watch(self) -> None:
        """Follow the trainers to their end: report, kill the master, take the checkpoint."""
        phase = Phases()
        last_news = time.monotonic()
        shown = 0.0
        while any(not t.exited for t in self.trainers):
            try:
                n, ev = self.events.get(timeout=0.25)
            except queue.Empty:
                n, ev = 0, None
            if n:
                self.on_event(self.trainers[n - 1], ev)
                last_news = time.monotonic()
            st = self.status()
            if st is None:
                continue
            prog = st["progress"]
            if time.monotonic() - shown >= 2.0 and prog["records_total"] and prog["pass"] < PASSES:
                shown = time.monotonic()
                note(progress_line(prog, st))
            if progress_moved(phase, prog):
                last_news = time.monotonic()
                if phase.resumed and not phase.moving:
                    phase.moving = True
                    self.resume_news(st, phase)
            if time.monotonic() - last_news > HANG:
                raise Failure(f"nothing moved for {HANG:.0f}s: {json.dumps(prog)}")
            self.lease_news(st, phase)
            share = prog["records_done"] / max(1, prog["records_total"] or 1)
            if prog["pass"] == 1 and not phase.master_killed and share >= KILL_MASTER_AT:
                self.kill_master(st, phase)
            elif (
                prog["pass"] == 1
                and phase.resumed
                and share >= CHECKPOINT_AT
                and self.checkpoint is None
            ):
                self.take_checkpoint()
        if self.checkpoint is None:  # the pass ended first (a fast machine): take it at the end
            self.take_checkpoint()
        self.status()

    def on_event(self, t: Trainer, ev: dict[str, Any] | None) -> None:
        if ev is None:
            t.exited = True
            code = t.proc.wait()
            if t.died is None and code != 0:
                err = (self.tmp / f"trainer-{t.n}.log").read_text().strip()[-2000:]
                raise Failure(f"{t.name} failed (exit {code}): {err}")
            return
        kind = ev["ev"]
        if kind == "dying":
            t.died = time.monotonic()
            t.died_in = int(ev["pass"])
            st = self.status()
            held = [x["tasks_held"] for x in (st or {}).get("trainers", []) if x["name"] == t.name]
            say(
                f"   {t.name} dies (SIGKILL) right after its record {ev['records']}, in pass "
                f"{ev['pass']}, holding "
                + (plural(held[0], "task") if held else "its tasks")
                + ": no goodbye, no last report"
            )
        elif kind == "pass":
            t.passes[ev["pass"]] = ev
            say(f"   {t.name} finished pass {ev['pass']}: {ev['records']} records")
        elif kind == "refused":
            self.refused.append(f"{t.name}: {ev['why']}")
            say(f"   {t.name}'s commit was refused (its session was lost): {ev['why']}")
        elif kind == "paused":
            t.passes.setdefault(-1, ev)  # paused, its commit done

    def lease_news(self, st: dict[str, Any], phase: Phases) -> None:
        """Say when the dead trainer's lease ran out, and what became of its tasks."""
        victim = self.trainers[VICTIM - 1]
        if victim.died is None or phase.lease_seen:
            return
        if any(x["name"] == victim.name for x in st.get("trainers", [])):
            return
        phase.lease_seen = True
        again = self.ledger.get(victim.died_in, {}).get("redispatched", {})
        say(
            f"   {victim.name}'s lease ran out {time.monotonic() - victim.died:.1f}s after its "
            f"death: its tasks went to the others, each from the position it last reported "
            f"(the ledger: {again.get('trainer lost', 0)} records handed out again, 'trainer "
            "lost')"
        )

    def kill_master(self, st: dict[str, Any], phase: Phases) -> None:
        prog = st["progress"]
        phase.master_killed = True
        assert self.master is not None
        say(
            f"4. SIGKILL the master in pass 1 ({prog['records_done']:,} of "
            f"{prog['records_total']:,} records), and start it again on its store"
        )
        phase.sessions = {x["session"] for x in st.get("trainers", [])}
        self.master.send_signal(signal.SIGKILL)
        self.master.wait()
        down = time.monotonic()
        _, dash = self.start_master(self.tmp / "state.db", self.port)
        again = self.status(timeout=10.0)
        if again is None:
            raise Failure("the restarted master does not answer")
        note(
            f"serving again after {time.monotonic() - down:.1f}s (dashboard http://{dash}/): "
            f"pass {again['cur_pass']}, {again['progress']['records_done']:,} records done, "
            f"{again['sessions']} sessions recovered from the store"
        )
        phase.resumed = True

    def resume_news(self, st: dict[str, Any], phase: Phases) -> None:
        now = {x["session"] for x in st.get("trainers", [])}
        if now and now <= phase.sessions:
            note("records are moving again: the trainers resumed their sessions (same IDs)")
        else:
            note(
                "records are moving again; some trainers opened new sessions (their leases ran "
                "out while the master was down: their tasks went to others, as for a lost one)"
            )

    def take_checkpoint(self) -> None:
        """Every trainer still reading commits and waits; the checkpoint is saved; they go on."""
        live = [t for t in self.trainers if not t.exited and t.died is None]
        say(
            "5. a data checkpoint: "
            + ("every trainer commits and waits, " if live else "")
            + "`chunkmaster checkpoint save`"
            + (", then they go on" if live else "")
        )
        for t in live:
            tell(t, "pause")
        end = time.monotonic() + HANG
        waiting = set(t.n for t in live)
        while waiting:
            try:
                n, ev = self.events.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise Failure(f"trainers {sorted(waiting)} never paused") from None
            self.on_event(self.trainers[n - 1], ev)
            if ev is None or ev["ev"] == "paused":
                waiting.discard(n)
        self.checkpoint = self.tmp / "job.ckpt"
        save = ["save", "--addr", self.addr, "--timeout", str(HANG), str(self.checkpoint)]
        for cmd in (save, ["show", str(self.checkpoint)]):
            out = subprocess.run(
                [*self.py, "checkpoint", *cmd], capture_output=True, text=True, env=self.env
            )
            if out.returncode != 0:
                raise Failure(f"checkpoint {cmd[0]}: {out.stderr.strip()}")
            for line in out.stdout.splitlines():
                if not line.startswith("dataset"):
                    note(line)
        self.status()  # the ledger's commits as the checkpoint has them
        self.explain_checkpoint()
        for t in live:
            tell(t, "go")

    def explain_checkpoint(self) -> None:
        """Why a pass before the one being read can still be in the checkpoint."""
        from chunkmaster.core.checkpoint import decode

        assert self.checkpoint is not None
        cp = decode(self.checkpoint.read_bytes())
        if cp.floor < 1 <= len(self.trainers):
            note(
                "pass 0 is not wholly committed: a trainer that died (or lost its session) "
                "had read records of it that it never committed; a restore delivers them again"
            )

    def restore(self, ds: Dataset) -> Restored:
        """A fresh master from the checkpoint, and one trainer reading what it leaves."""
        from chunkmaster.core.checkpoint import decode

        assert self.checkpoint is not None
        cp = decode(self.checkpoint.read_bytes())
        say(
            "6. a fresh master restored from the checkpoint (--restore), and one trainer: "
            "they read what was not committed"
        )
        addr, _ = self.start_master(self.tmp / "restored.db", 0, "--restore", str(self.checkpoint))
        passes = PASSES - cp.floor
        restored = Restored(cp.floor, {p.pass_id: (p.full, dict(p.partial)) for p in cp.passes})
        if passes <= 0:
            return restored
        t = self.start_trainer(9, addr, "--first-pass", str(cp.floor), "--passes", str(passes))
        end = time.monotonic() + HANG
        while True:
            try:
                n, ev = self.events.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise Failure("the restored trainer did not finish") from None
            if n != 9:
                continue
            if ev is None:
                if t.proc.wait() != 0:
                    err = (self.tmp / "trainer-9.log").read_text().strip()[-2000:]
                    raise Failure(f"the restored trainer failed: {err}")
                break
            if ev["ev"] == "pass":
                note(f"pass {ev['pass']}: {ev['records']} records")
        restored.log = t.log
        st = ask_status(addr, 30.0)
        if st is None:
            raise Failure("the restored master does not answer")
        restored.ledger = {int(led["pass"]): led for led in st["ledger"]}
        return restored


@dataclass
class Phases:
    master_killed: bool = False
    resumed: bool = False
    lease_seen: bool = False
    moving: bool = False  # records moving again after the master's restart
    sessions: set[str] = field(default_factory=set)  # the sessions when the master was killed
    last: tuple[int, int] = (-1, -1)


@dataclass
class Restored:
    floor: int
    commits: dict[int, tuple[frozenset[int], dict[int, int]]]  # pass -> (whole, partial)
    log: Path | None = None
    ledger: dict[int, dict[str, Any]] = field(default_factory=dict)  # its master's, per pass


class Failure(Exception):
    """The demo cannot go on: a process failed or hung."""


def ask_status(addr: str, timeout: float) -> dict[str, Any] | None:
    """The status of the master at `addr`; None if it does not answer."""
    from chunkmaster.client.connection import MasterConnection, TransportError
    from chunkmaster.core.errors import MasterError

    try:
        with MasterConnection(addr, timeout=timeout) as c:
            return c.status()
    except (TransportError, MasterError):
        return None


def tell(t: Trainer, word: str) -> None:
    """A word on a trainer's stdin; one that has just ended its last pass hears nothing."""
    assert t.proc.stdin is not None
    with contextlib.suppress(OSError):  # BrokenPipeError: it exited
        t.proc.stdin.write(word + "\n")
        t.proc.stdin.flush()


def progress_moved(phase: Phases, prog: dict[str, Any]) -> bool:
    now = (int(prog["pass"]), int(prog["records_done"]))
    moved = now != phase.last
    phase.last = now
    return moved


def progress_line(prog: dict[str, Any], st: dict[str, Any]) -> str:
    from chunkmaster.cli.status_cmd import progress_text

    return f"{progress_text(prog)}; {plural(st['sessions'], 'trainer')} with a session"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _pump(n: int, stream: IO[str], events: queue.Queue[tuple[int, dict[str, Any] | None]]) -> None:
    for raw in stream:
        with contextlib.suppress(ValueError):
            events.put((n, json.loads(raw)))
    events.put((n, None))


# ---- the verdict ---------------------------------------------------------------------------


@dataclass
class Log:
    """What one trainer's log says: records taken per pass, and those surely committed."""

    taken: dict[int, Counter[int]] = field(default_factory=dict)
    committed: dict[int, set[int]] = field(default_factory=dict)


def read_log(path: Path) -> Log:
    """Records before a successful commit ("c") are committed, up to the checkpoint's pause
    ("p"); those before a refused one ("x") are not surely so (all or none) and are left out."""
    out = Log()
    pending: list[tuple[int, int]] = []
    paused = False
    for line in path.read_text().splitlines():
        kind, p, rest = line.split(" ", 2)
        if kind == "r":
            out.taken.setdefault(int(p), Counter())[int(rest, 16)] += 1
            if not paused:
                pending.append((int(p), int(rest, 16)))
        elif kind == "c" and not paused:
            for q, r in pending:
                out.committed.setdefault(q, set()).add(r)
            pending = []
        elif kind == "x":
            pending = []
        elif kind == "p":
            paused = True
    return out


def verdict(ds: Dataset, demo: Demo, restored: Restored) -> int:
    say("7. verdict")
    logs = [read_log(t.log) for t in demo.trainers]
    ok = True
    for p in range(PASSES):
        got: Counter[int] = Counter()
        for lg in logs:
            got.update(lg.taken.get(p, Counter()))
        good, text = delivered(ds.records, got, demo.ledger.get(p, {}))
        ok &= good
        distinct = Digest()
        for r in got:
            distinct.merge(Digest(r, 1))
        print(f"   {'OK ' if good else 'BAD'} pass {p}: {text}", flush=True)
        print(
            f"         the distinct records' digest {distinct.hex()} "
            f"{'=' if distinct == ds.digest else '!='} the dataset's {ds.digest.hex()}",
            flush=True,
        )
    ok &= check_restore(ds, logs, restored)
    say("PASS" if ok else "FAIL")
    return 0 if ok else 1


def delivered(
    expected: Counter[int], got: Counter[int], ledger: dict[str, Any]
) -> tuple[bool, str]:
    """Whether `got` is every record of `expected`, nothing else, and no more records twice
    than the master's ledger of the pass says it handed out again; and that in words."""
    missing = sum((expected - got).values())
    unknown = sum(n for r, n in got.items() if r not in expected)
    twice = sum(n - 1 for r, n in got.items() if n > 1 and r in expected)
    again: dict[str, int] = ledger.get("redispatched", {})
    allowed = sum(again.values())
    why = " and ".join(f"{n} after '{reason}'" for reason, n in sorted(again.items()))
    text = (
        (
            f"every one of the {sum(expected.values()):,} records delivered"
            if not missing
            else f"{missing} of the {sum(expected.values()):,} records NEVER delivered"
        )
        + (f", {unknown} records that should not be" if unknown else ", nothing else")
        + f"; {twice} twice"
        + (
            f", within the {allowed} the master's ledger counts as handed out again "
            f"({why}: a lost trainer may have read them past its last report)"
            if allowed
            else " (the master handed nothing out again)"
        )
    )
    return missing == 0 and unknown == 0 and twice <= allowed, text


def check_restore(ds: Dataset, logs: list[Log], restored: Restored) -> bool:
    """The restored job delivered what the checkpoint left (and, if one of its trainers lost
    its session, what its ledger allows twice), and nothing a trainer had committed."""
    ok = True
    got = read_log(restored.log) if restored.log is not None else Log()
    for p in range(restored.floor, PASSES):
        whole, partial = restored.commits.get(p, (frozenset(), {}))
        left: Counter[int] = Counter()
        for t, records in enumerate(ds.tasks):
            if t not in whole:
                left.update(records[partial.get(t, 0) :])
        mine = got.taken.get(p, Counter())
        committed = set().union(*(lg.committed.get(p, set()) for lg in logs))
        again = sum(n for r, n in mine.items() if r in committed)
        good, text = delivered(left, mine, restored.ledger.get(p, {}))
        good &= again == 0
        ok &= good
        print(
            f"   {'OK ' if good else 'BAD'} restored pass {p}, the records the checkpoint left "
            f"uncommitted: {text}; {again} of the {len(committed):,} records the trainers had "
            "committed came again",
            flush=True,
        )
    if restored.floor >= PASSES:
        print("   OK  the checkpoint holds every pass committed: nothing to restore", flush=True)
    return ok


def run() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still end every process started
    tmp = Path(tempfile.mkdtemp(prefix="chunkmaster-demo-"))
    demo = Demo(tmp)
    try:
        return demo.run()
    except Failure as exc:
        say(f"FAIL: {exc}")
        return 1
    finally:
        for p in demo.procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        if os.environ.get("DEMO_KEEP"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    if sys.argv[1:2] == ["trainer"]:
        sys.exit(trainer_main(sys.argv[2:]))
    sys.exit(run())


if __name__ == "__main__":
    main()

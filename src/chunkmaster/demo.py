"""`make demo`: three trainers read two passes through a master; one is SIGKILLed mid-pass.

What it shows, with real processes and real files:
* pass 0: trainer 2 is killed while it holds a task (and has the next one prefetched). Its
  tasks come back after the master's 3 s timeout and the survivors read them, so the tasks
  completed in pass 0 (by anyone, the victim included) cover the whole dataset, and the digest
  over those tasks equals the dataset's: every record was delivered at least once.
* pass 1: only the survivors read it; their record counts and digests add up to the dataset's
  exactly: every record exactly once.
Exit status 0 when both hold, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from chunkmaster.digest import Digest, file_digest
from chunkmaster.master.readiness import MasterNotReady, wait_ready
from chunkmaster.recordio import Compressor, Writer, load_index

TRAINERS = 3
PASSES = 2
VICTIM = 2
STEP_TIME = 0.004
TIMEOUT = "3s"
DEADLINE = 50.0

_T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - _T0:5.1f}s] {text}", flush=True)


@dataclass
class Trainer:
    n: int
    proc: subprocess.Popen[str]
    tasks: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # pass -> task lines
    passes: dict[int, dict[str, Any]] = field(default_factory=dict)  # pass -> pass line
    killed: bool = False


def make_dataset(directory: Path) -> list[Path]:
    """Three files of binary records (NUL bytes included, one empty record), ~40 per chunk."""
    rng = random.Random(20170607)
    paths = []
    for f in range(3):
        path = directory / f"part-{f:05d}.rio"
        with Writer(str(path), max_chunk_size=4000, compressor=Compressor.SNAPPY) as w:
            for i in range(400):
                if f == 0 and i == 0:
                    w.write(b"")
                    continue
                w.write(f"{f}:{i}:".encode() + rng.randbytes(rng.randint(40, 140)))
        paths.append(path)
    return paths


def run() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="chunkmaster-demo-"))
    procs: list[subprocess.Popen[str]] = []
    try:
        return _demo(tmp, procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        if os.environ.get("DEMO_KEEP"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _demo(tmp: Path, procs: list[subprocess.Popen[str]]) -> int:
    py = [sys.executable, "-m", "chunkmaster"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    say("1. a sample dataset")
    files = make_dataset(tmp)
    expected = Digest()
    chunks = 0
    for f in files:
        expected.merge(file_digest(str(f)))
        chunks += load_index(str(f)).num_chunks
    glob = str(tmp / "part-*.rio")
    say(
        f"   {len(files)} files, {expected.count} records, {chunks} chunks, digest {expected.hex()}"
    )
    say("   chunkmaster recordio inspect (the on-disk format, one file):")
    shown = subprocess.run(
        [*py, "recordio", "inspect", str(files[0])], capture_output=True, text=True, env=env
    )
    for text in (shown.stdout + shown.stderr).splitlines()[:8]:
        print("      " + text, flush=True)

    say(f"2. a master on the embedded store (task timeout {TIMEOUT}, 1 chunk per task)")
    master_log = tmp / "master.log"
    ready_file = tmp / "master.ready.json"
    master = subprocess.Popen(
        [
            *py,
            "master",
            "--port",
            "0",
            "--store",
            str(tmp / "state.db"),
            "--task-timeout-dur",
            TIMEOUT,
            "--chunk-per-task",
            "1",
            "--ready-file",
            str(ready_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(master_log, "w"),  # noqa: SIM115
        text=True,
        env=env,
    )
    procs.append(master)
    try:
        addr = str(wait_ready(ready_file, master, 20.0, master_log.read_text)["addr"])
    except MasterNotReady as exc:
        say(f"   the master did not start: {exc}")
        return 1
    say(f"   serving on {addr}")

    say(f"3. {TRAINERS} trainers read {PASSES} passes ({STEP_TIME * 1000:.0f} ms per record)")
    events: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
    trainers: list[Trainer] = []
    for n in range(1, TRAINERS + 1):
        proc = subprocess.Popen(
            [
                *py,
                "read",
                "--addr",
                addr,
                "--dataset",
                glob,
                "--passes",
                str(PASSES),
                "--json",
                "--task-lines",
                "--step-time",
                str(STEP_TIME),
                "--log-level",
                os.environ.get("DEMO_LOG", "warning"),
            ],
            stdout=subprocess.PIPE,
            stderr=open(tmp / f"trainer{n}.log", "w"),  # noqa: SIM115
            text=True,
            env=env,
        )
        procs.append(proc)
        trainers.append(Trainer(n, proc))
        assert proc.stdout is not None
        threading.Thread(target=_pump, args=(n, proc.stdout, events), daemon=True).start()

    running = {t.n for t in trainers}
    done_tasks = {p: 0 for p in range(PASSES)}
    deadline = time.monotonic() + DEADLINE
    while running:
        try:
            n, line = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            say("   timed out waiting for the trainers")
            return 1
        t = trainers[n - 1]
        if line is None:
            running.discard(n)
            code = t.proc.wait()
            if not t.killed and code != 0:
                err = (tmp / f"trainer{n}.log").read_text().strip()
                say(f"   trainer {n} failed (exit {code}): {err}")
                return 1
            continue
        p = int(line["pass"])
        if "task" in line:
            t.tasks.setdefault(p, []).append(line)
            done_tasks[p] += 1
            if done_tasks[p] % 10 == 0 or done_tasks[p] == chunks:
                say(f"   pass {p}: {done_tasks[p]} tasks completed")
            if n == VICTIM and p == 0 and not t.killed:
                _wait_holding(addr, t.proc.pid, 2)
                t.proc.send_signal(signal.SIGKILL)
                t.killed = True
                say(
                    f"   SIGKILL trainer {n} (pid {t.proc.pid}) mid-pass 0: it completed task "
                    f"{line['task']}, holds the next one and has one more prefetched"
                )
        else:
            t.passes[p] = line
            say(f"   trainer {n} finished pass {p}: {line['records']} records")
    return _verdict(trainers, expected, chunks, addr, py, env)


def _verdict(
    trainers: list[Trainer], expected: Digest, chunks: int, addr: str, py: list[str], env: Any
) -> int:
    say("4. verdict")
    ok = True
    for p in range(PASSES):
        print(f"   pass {p}:", flush=True)
        survivors = Digest()
        for t in trainers:
            lines = t.tasks.get(p, [])
            if t.killed:
                recs = sum(int(x["records"]) for x in lines)
                print(f"     trainer {t.n}: killed; completed {len(lines)} task(s), {recs} records")
                continue
            pl = t.passes[p]
            survivors.merge(Digest(int(pl["digest"], 16), int(pl["records"])))
            print(f"     trainer {t.n}: {pl['records']:5d} records  digest {pl['digest']}")
        by_task: dict[int, dict[str, Any]] = {}
        twice = 0
        for t in trainers:
            for x in t.tasks.get(p, []):
                twice += int(x["task"]) in by_task
                by_task[int(x["task"])] = x
        covered = Digest()
        for x in by_task.values():
            covered.merge(Digest(int(x["digest"], 16), int(x["records"])))
        if any(t.killed and t.tasks.get(p) for t in trainers) or p == 0:
            good = len(by_task) == chunks and covered == expected
            ok &= good
            print(
                f"     tasks completed: {len(by_task)}/{chunks} distinct ({twice} twice); "
                f"their digest {covered.hex()} over {covered.count} records"
            )
            print(
                f"     {'OK ' if good else 'BAD'} every record delivered at least once "
                f"(dataset digest {expected.hex()} over {expected.count} records)"
            )
        else:
            good = survivors == expected
            ok &= good
            print(f"     survivors together: {survivors.count} records, digest {survivors.hex()}")
            print(
                f"     {'OK ' if good else 'BAD'} every record delivered exactly once "
                f"(dataset digest {expected.hex()} over {expected.count} records)"
            )
    status = subprocess.run(
        [*py, "status", "--addr", addr, "--json"], capture_output=True, text=True, env=env
    )
    try:
        st = json.loads(status.stdout)
        timeouts = [(f["id"], r["pass"]) for f in st["failed_tasks"] for r in f["reasons"]]
        print(
            f"   master: pass {st['cur_pass']}, {len(timeouts)} task timeout(s) "
            f"(the victim's tasks, handed out again): {timeouts}",
            flush=True,
        )
    except (ValueError, KeyError):
        print(f"   master status unavailable: {status.stderr.strip()}", flush=True)
    say("PASS: no record lost to the crash" if ok else "FAIL")
    return 0 if ok else 1


def _wait_holding(addr: str, pid: int, n: int, timeout: float = 10.0) -> None:
    """Wait until trainer `pid` durably holds `n` tasks: its current one and the prefetched one.

    Then its finish report has gone out and no GetTask of it is in flight, so the kill lands
    mid-task. (Killing a trainer during a GetTask can, with the master as of this writing,
    leave a dispatched task without its timeout timer.)
    """
    from chunkmaster.client.connection import MasterConnection

    end = time.monotonic() + timeout
    with MasterConnection(addr) as c:
        while time.monotonic() < end:
            st = c.status()
            mine = [x for x in st["pending_tasks"] if f":{pid}:" in x["worker"]]
            if len(mine) >= n and st["store"]["durable_seq"] == st["store"]["seq"]:
                c.status()
                return
            time.sleep(0.005)


def _pump(n: int, stream: IO[str], events: queue.Queue[tuple[int, dict[str, Any] | None]]) -> None:
    for raw in stream:
        with contextlib.suppress(ValueError):
            events.put((n, json.loads(raw)))
    events.put((n, None))


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()

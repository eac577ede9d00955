"""The loader peers beside chunkmaster's Loader (issue 30): reading throughput, conversion time
and peak memory at 1 KiB, 64 KiB and 1 MiB records, and the exactness runs a user would do.

run.py calls `main(args)`; README.md beside this file says what each system reads and how.

Throughput: for each record size, one long-lived reading process per system (loader_peer.py
`serve`, in the system's virtualenv) converts the seeded source into its format (timed), then
reads whole passes when told. Rounds go over the systems in turn, the plain DataLoader first;
a system's ratio is the median over the rounds of its rate over the plain DataLoader's rate in
the same round (the first round warms up and is left out). Peak memory: the largest sum of the
PSS of the system's process tree (the reading process, its DataLoader workers, and for
chunkmaster the master), sampled every 0.1 s while it reads.

Exactness, 1 KiB records, each system in its own way of checkpointing (loader_peer.py
`exact`): a training loop that logs the ids of every batch it takes and saves its loader's
state with the count of ids its "model" has seen every few steps, SIGKILLed between two saves,
resumed from the last; 4 ranks (RANK/WORLD_SIZE, a gloo process group) SIGKILLed and resumed as
3; a 3-source mixture SIGKILLed and resumed. Records missing and read twice count the records
the model trained on (each log up to its checkpoint's count, then the resumed logs) against
each record once (the mixture: against the same mixture read without a kill).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

from loader_common import (  # noqa: E402
    MIXTURE,
    SIZES,
    PeakMemory,
    compare,
    read_ids,
)

SYSTEMS = ["chunkmaster", "torchdata", "litdata", "streaming"]  # beside "plain", the baseline
LABELS = {
    "plain": "plain DataLoader (baseline)",
    "chunkmaster": "chunkmaster Loader",
    "torchdata": "torchdata 0.11 StatefulDataLoader",
    "litdata": "LitData 0.2.76",
    "streaming": "MosaicML Streaming 0.13",
}
SIZE_LABELS = {"1k": "1 KiB", "64k": "64 KiB", "1m": "1 MiB"}
EXACT_RECORDS = 4800  # divisible by 4 and 3 ranks and by the batch of 64 (75 batches)
# scenario: (checkpoint every N steps, SIGKILL at step)
EXACT_STEPS = {"kill": (10, 25), "ranks": (5, 13), "mix": (10, 35)}


def envs_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chunkmaster/peers"
    return Path(os.environ.get("PEERS_ENVS", default))


def python_of(system: str) -> str:
    """The system's interpreter: this one for ours, its own virtualenv (made on first use)
    for a peer."""
    if system in ("plain", "chunkmaster"):
        return sys.executable
    env = envs_dir() / system
    if not (env / ".installed").exists():
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # pip sees no src/
        subprocess.run(["sh", str(HERE / "install.sh"), system], check=True, env=env)
    return str(env / "bin" / "python")


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **extra}
    env.pop("CHUNKMASTER_STORE", None)
    return env


@dataclass
class Reader:
    """One serving reading process."""

    system: str
    proc: subprocess.Popen[str]
    log: IO[str]
    convert_s: float = 0.0
    records: int = 0
    memory: PeakMemory | None = None
    rates: list[float] = field(default_factory=list)
    error: str = ""

    def ask(self) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write("pass\n")
        self.proc.stdin.flush()
        return self.answer()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout
        for line in self.proc.stdout:
            if line.startswith("{"):
                reply: dict[str, Any] = json.loads(line)
                return reply
        raise RuntimeError(f"{self.system} exited ({self.proc.wait()}): {self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-3:])[-400:]

    def stop(self) -> None:
        if self.memory:
            self.memory.close()
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_reader(system: str, size: str, root: Path, mb: int | None) -> Reader:
    cmd = [python_of(system), str(HERE / "loader_peer.py"), "--system", system, "serve"]
    cmd += ["--data", str(root / system), "--size", size]
    if mb is not None:
        cmd += ["--mb", str(mb)]
    log = open(root / f"{system}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
        env=child_env(TF_CPP_MIN_LOG_LEVEL="2"),
    )  # fmt: skip
    reader = Reader(system, proc, log)
    ready = reader.answer()
    reader.convert_s, reader.records = float(ready["convert_s"]), int(ready["records"])
    reader.memory = PeakMemory(proc.pid)
    return reader


@dataclass
class SizeResult:
    records: int = 0
    ratio: dict[str, float] = field(default_factory=dict)
    rate: dict[str, float] = field(default_factory=dict)
    convert_s: dict[str, float] = field(default_factory=dict)
    peak_mb: dict[str, float] = field(default_factory=dict)
    error: dict[str, str] = field(default_factory=dict)


def measure_size(size: str, systems: list[str], rounds: int, mb: int | None) -> SizeResult:
    result = SizeResult()
    root = Path(tempfile.mkdtemp(prefix=f"peers-loaders-{size}-"))
    readers: list[Reader] = []
    try:
        for system in ["plain", *systems]:
            try:
                readers.append(start_reader(system, size, root, mb))
                print(f"  {size} {system}: converted in {readers[-1].convert_s:.1f} s", flush=True)
            except Exception as exc:  # a peer that will not install or start: say why
                result.error[system] = str(exc)[-400:]
                print(f"  {size} {system}: failed to start: {exc}", flush=True)
        for r in range(rounds + 1):  # round 0 warms up (workers, page cache)
            for reader in readers:
                if reader.error:
                    continue
                assert reader.memory is not None
                reader.memory.on.set()
                try:
                    reply = reader.ask()
                    reader.rates.append(reply["records"] / reply["seconds"])
                except Exception as exc:
                    reader.error = str(exc)[-400:]
                    print(f"  {size} {reader.system}: failed: {reader.error}", flush=True)
                finally:
                    reader.memory.on.clear()
            line = " ".join(f"{x.system} {x.rates[-1]:,.0f}" for x in readers if x.rates)
            print(f"  {size} round {r}{' (warm-up)' if r == 0 else ''}: {line} rec/s", flush=True)
    finally:
        for reader in readers:
            reader.stop()
        shutil.rmtree(root, ignore_errors=True)
    base = next((x for x in readers if x.system == "plain"), None)
    for reader in readers:
        result.records = reader.records
        result.convert_s[reader.system] = reader.convert_s
        result.peak_mb[reader.system] = (reader.memory.peak if reader.memory else 0) / 1e6
        if reader.error:
            result.error[reader.system] = reader.error
            continue
        result.rate[reader.system] = statistics.median(reader.rates[1:])
        if base is not None and not base.error:
            pairs = zip(reader.rates[1:], base.rates[1:], strict=True)
            result.ratio[reader.system] = statistics.median(m / b for m, b in pairs)
    return result


# ---- exactness ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Master:
    """A chunkmaster master process on its embedded store, for one exactness run."""

    def __init__(self, root: Path) -> None:
        sys.path.insert(0, str(HERE.parent))
        from chunkmaster.master.readiness import wait_ready

        ready, log = root / "master.ready", root / "master.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chunkmaster", "master", "--port", "0", "--store",
             str(root / "master.db"), "--ready-file", str(ready)],
            stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=child_env(),  # noqa: SIM115
        )  # fmt: skip
        self.addr = str(wait_ready(ready, self.proc, 60, log.read_text)["addr"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_phase(
    system: str, scenario: str, phase: str, data: list[Path], work: Path, world: int,
    addr: str | None, timeout: float = 300,
) -> list[dict[str, Any]]:  # fmt: skip
    """One phase's processes (world of them, ranks when world > 1); their last JSON lines."""
    every, kill_at = EXACT_STEPS[scenario]
    cmd = [python_of(system), str(HERE / "loader_peer.py"), "--system", system]
    if addr:
        cmd += ["--addr", addr]
    cmd += ["exact", "--scenario", scenario, "--phase", phase, "--work", str(work)]
    cmd += ["--data", ",".join(map(str, data)), "--every", str(every), "--kill-at", str(kill_at)]
    port = str(free_port())
    procs = []
    for rank in range(world):
        extra = {}
        if world > 1:
            extra = {
                "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
            }  # fmt: skip
        if phase == "resume":
            extra["PEERS_RESTORE_KEY"] = f"{scenario}-resume"  # one restore for all ranks
        out = open(work / f"{phase}-{rank}.out", "w")  # noqa: SIM115
        log = open(work / f"{phase}-{rank}.log", "w")  # noqa: SIM115
        # A session of its own: what a SIGKILLed reader leaves running (DataLoader workers
        # of a forkserver, the server itself) is ended with it, by its group.
        procs.append(subprocess.Popen(
            cmd, stdout=out, stderr=log, text=True, env=child_env(**extra),
            start_new_session=True,
        ))  # fmt: skip
        out.close()
        log.close()
    replies = []
    deadline = time.monotonic() + timeout
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            proc.wait()
            replies.append({"rank": rank, "error": f"hung: killed after {timeout:.0f} s"})
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if replies and replies[-1]["rank"] == rank:
            continue
        text = (work / f"{phase}-{rank}.out").read_text()
        lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
        reply = lines[-1] if lines else {"rank": rank, "killed": proc.returncode}
        if proc.returncode not in (0, -9) and not reply.get("error"):
            tail = (work / f"{phase}-{rank}.log").read_text(errors="replace")[-300:]
            reply["error"] = f"exit {proc.returncode}: {tail}"
        replies.append(reply)
    return replies


def trained(work: Path, phase_first: str, ranks_first: int, ranks_next: int) -> Counter[int]:
    """What the model trained on: each first-phase rank's ids up to its checkpoint's count,
    then every id of the next phase."""
    got: Counter[int] = Counter()
    for rank in range(ranks_first):
        count_file = work / f"count-{rank}"
        count = int(count_file.read_text()) if count_file.exists() else 0
        got.update(read_ids(work / f"ids-{phase_first}-{rank}.bin", count))
    for rank in range(ranks_next):
        got.update(read_ids(work / f"ids-resume-{rank}.bin"))
    return got


def convert_exact(system: str, root: Path) -> tuple[Path, list[Path]]:
    """The exactness data in the system's format: one dataset, and the mixture's sources."""
    one = root / "one"
    jobs = [(one, EXACT_RECORDS, 0)]
    sources = []
    for name, first, n, _ in MIXTURE:
        sources.append(root / name)
        jobs.append((root / name, n, first))
    for out, n, first in jobs:
        cmd = [python_of(system), str(HERE / "loader_peer.py"), "--system", system, "convert"]
        cmd += ["--data", str(out), "--records", str(n), "--first", str(first)]
        subprocess.run(cmd, check=True, env=child_env(), capture_output=True, text=True)
    return one, sources


SCENARIOS = {"kill": (1, 1), "ranks": (4, 3), "mix": (1, 1)}  # ranks before and after


def exactness(system: str, scenarios: list[str]) -> dict[str, str]:
    """{scenario: "missing / twice" or what happened}."""
    root = Path(tempfile.mkdtemp(prefix=f"peers-exact-{system}-"))
    out: dict[str, str] = {}
    try:
        one, sources = convert_exact(system, root)
        for scenario in scenarios:
            work = root / scenario
            work.mkdir()
            data = sources if scenario == "mix" else [one]
            try:
                out[scenario] = run_scenario(system, scenario, data, work)
            except Exception as exc:
                out[scenario] = f"failed: {exc}"[:300]
            print(f"  exactness {system} {scenario}: {out[scenario]}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def run_scenario(system: str, scenario: str, data: list[Path], work: Path) -> str:
    first_world, next_world = SCENARIOS[scenario]
    expected = Counter(range(EXACT_RECORDS))
    notes: list[str] = []
    if scenario == "mix":  # what the same mixture gives without a kill
        (work / "ref").mkdir()
        master = Master(work / "ref") if system == "chunkmaster" else None
        try:
            addr = master.addr if master else None
            replies = run_phase(system, scenario, "ref", data, work / "ref", 1, addr)
        finally:
            if master:
                master.stop()
        notes += [r["error"] for r in replies if r.get("error")]
        expected = Counter(read_ids(work / "ref" / "ids-ref-0.bin"))
    master = Master(work) if system == "chunkmaster" else None
    try:
        addr = master.addr if master else None
        for phase, world in (("first", first_world), ("resume", next_world)):
            replies = run_phase(system, scenario, phase, data, work, world, addr)
            notes += [r["error"] for r in replies if r.get("error")]
            notes += [r["note"] for r in replies if r.get("note")]
    finally:
        if master:
            master.stop()
    missing, twice = compare(expected, trained(work, "first", first_world, next_world))
    cell = f"{missing} / {twice}"
    if notes:
        cell += " (" + "; ".join(sorted(set(notes)))[:300] + ")"
    return cell


# ---- the table ----


def table(
    sizes: list[str], systems: list[str], results: dict[str, SizeResult],
    exact: dict[str, dict[str, str]],
) -> str:  # fmt: skip
    head = ["system"]
    head += [f"{SIZE_LABELS[s]}: ratio (rec/s)" for s in sizes]
    if sizes:
        head += ["convert s (" + " / ".join(SIZE_LABELS[s] for s in sizes) + ")"]
        head += ["peak MB (" + " / ".join(SIZE_LABELS[s] for s in sizes) + ")"]
    if exact:
        head += ["SIGKILL + resume: missing / twice", "4 ranks -> 3", "3-source mixture"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system in ["plain", *systems]:
        row = [LABELS[system]]
        for s in sizes:
            r = results[s]
            if system in r.error:
                row.append("failed: " + r.error[system].replace("|", "/")[:120])
            elif system in r.rate:
                ratio = r.ratio.get(system)
                row.append(f"{ratio:.2f}x ({r.rate[system]:,.0f})" if ratio else "-")
            else:
                row.append("-")
        if sizes:
            row.append(" / ".join(f"{results[s].convert_s.get(system, 0):.1f}" for s in sizes))
            row.append(" / ".join(f"{results[s].peak_mb.get(system, 0):,.0f}" for s in sizes))
        if exact:
            e = exact.get(system, {})
            row += [e.get(k, "-").replace("|", "/") for k in ("kill", "ranks", "mix")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("loaders (issue 30)")
    g.add_argument("--sizes", default="1k,64k,1m", help="record sizes, of " + ",".join(SIZES))
    g.add_argument("--systems", default=",".join(SYSTEMS), help="beside the plain DataLoader")
    g.add_argument("--rounds", type=int, default=5, help="measured rounds (after a warm-up)")
    g.add_argument("--mb", type=int, help="MB of records at every size (default: 64/256/512)")
    g.add_argument("--no-exact", action="store_true", help="throughput only")
    g.add_argument("--exact-only", action="store_true", help="the exactness runs only")
    g.add_argument(
        "--scenarios", default="kill,ranks,mix", help="exactness runs, of kill,ranks,mix"
    )
    g.add_argument("--out", help="also write the markdown table to this file")


def main(args: argparse.Namespace) -> str:
    sizes = [s for s in args.sizes.split(",") if s]
    systems = [s for s in args.systems.split(",") if s and s != "plain"]
    unknown = [s for s in sizes if s not in SIZES] + [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown size or system {unknown}: sizes {list(SIZES)}, {SYSTEMS}")
    load = os.getloadavg()
    print(
        f"loaders: sizes {sizes}, systems {systems}, {args.rounds} rounds; cpus "
        f"{os.cpu_count()}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
        flush=True,
    )
    results: dict[str, SizeResult] = {s: SizeResult() for s in sizes}
    if not args.exact_only:
        for size in sizes:
            results[size] = measure_size(size, systems, args.rounds, args.mb)
    exact: dict[str, dict[str, str]] = {}
    if not args.no_exact:
        for system in systems:
            try:
                exact[system] = exactness(system, args.scenarios.split(","))
            except Exception as exc:
                exact[system] = {k: f"failed: {exc}"[:200] for k in ("kill", "ranks", "mix")}
    text = table(sizes if not args.exact_only else [], systems, results, exact)
    end = os.getloadavg()
    text += (
        f"\n\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"load average {load[0]:.1f} at the start, {end[0]:.1f} at the end"
    )
    print("\n" + text, flush=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    main(parser.parse_args())

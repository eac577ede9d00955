"""Loader soak (issue 27): a ranked `chunkmaster.torch.Loader` trainer with two persistent
DataLoader workers that leaves its loop with `break` before every checkpoint, SIGKILLed at
random and started again under the same restore key (as torchrun launched again without
`--rdzv-id` would), the master SIGKILLed and started again on its store, and stray trainers
beside the live world (one declaring WORLD_SIZE=4, one a second RANK=0).

    .venv/bin/python bench/loader_soak.py [--records 2000] [--passes 3] [--seconds 90] [--seed 1]
        [--no-strays]

The master runs with `--equal-steps drop` (a world of one rank drops nothing): without equal
steps a trainer's rank is not the world's to keep, and a stray reads like any trainer. The
trainer is tests/helpers/torch_trainer.py: its "model" counts how often it trained on each
record of each pass, saved with the loader's state every 5 steps (after a `break`); a SIGKILL
loses the model since its last save, and the restart loads both. Checks, at the end, in the
model the trainer ends with: records lost (never trained on) and repeated (trained on twice),
per pass; each stray's exit status and first error line (a stray must fail at once, and the
live world must not notice it); the trainer's exit status.

There is no baseline: the figures are counts, not rates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent / "tests")]

from helpers.datasets import write_records  # noqa: E402
from helpers.master_process import MasterProcess  # noqa: E402

TRAINER = str(_HERE.parent / "tests" / "helpers" / "torch_trainer.py")


def trainer(args: argparse.Namespace, root: Path, addr: str, data: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, TRAINER, "--addr", addr, "--dataset", data]
    cmd += ["--records", str(args.records), "--passes", str(args.passes)]
    cmd += ["--out", str(root / "report.json"), "--checkpoint", str(root / "ckpt.pt")]
    cmd += ["--save-every", "5", "--break-to-save", "--restore-key", "soak", "--name", "rank0"]
    cmd += ["--transform", "slow_record_id", "--batch-size", "8"]
    log = open(root / "trainer.log", "a")  # noqa: SIM115 - closed with the process
    env = dict(os.environ, WORLD_SIZE="1", RANK="0", PYTHONUNBUFFERED="1")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)


def stray(addr: str, data: str, world: int, rank: int) -> dict[str, Any]:
    """A `chunkmaster read` trainer declaring rank `rank` of `world`: how it ended."""
    env = dict(os.environ, WORLD_SIZE=str(world), RANK=str(rank))
    cmd = [sys.executable, "-m", "chunkmaster", "read", "--addr", addr, "--dataset", data]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [*cmd, "--passes", "1"], capture_output=True, text=True, env=env, timeout=120
        )
    except subprocess.TimeoutExpired:
        return {"world": world, "rank": rank, "exit": None, "seconds": 120.0}
    errors = [line for line in proc.stderr.splitlines() if "rror" in line]
    return {
        "world": world,
        "rank": rank,
        "exit": proc.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "error": errors[-1][:300] if errors else "",
    }


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    data = str(
        write_records(
            root / "d.rio", [b"%06d" % i for i in range(args.records)], max_chunk_size=400
        )
    )
    store = ["--store", str(root / "state.db"), "--chunk-per-task", "1", "--trainer-ttl", "3"]
    store += ["--equal-steps", "drop"]  # ranks are the world's only with equal steps
    master = MasterProcess(store, log_path=root / "master.log").start()
    assert master.addr is not None
    addr = master.addr
    events: list[str] = []
    strays: list[dict[str, Any]] = []
    proc = trainer(args, root, addr, data)
    started = time.monotonic()
    end = started + args.seconds
    while proc.poll() is None:
        if time.monotonic() > end + 600:
            proc.kill()
            events.append("trainer did not finish")
            break
        try:
            proc.wait(rng.uniform(2.0, 6.0))
            break
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > end:
            continue  # disturbances over: let it finish
        what = rng.choices(["trainer", "master", "stray"], [6, 2, 2 if args.strays else 0])[0]
        if what == "trainer" and (root / "ckpt.pt").exists():
            if time.monotonic() - started < 8.0:
                continue  # still starting (importing torch): a kill there tests nothing
            proc.kill()
            proc.wait()
            events.append("trainer SIGKILLed")
            proc = trainer(args, root, addr, data)
            started = time.monotonic()
        elif what == "master":
            master.restart()
            events.append("master SIGKILLed")
        elif what == "stray" and time.monotonic() - started >= 10.0:
            # Only beside a trainer whose session is up: a second rank 0 while the trainer is
            # still starting after a kill is the world's rank 0 (the old one is dead), not a
            # stray.
            world, rank = rng.choice([(4, 3), (1, 0)])
            strays.append(stray(addr, data, world, rank))
            events.append(f"stray rank {rank} of world {world}")
    code = proc.wait()
    master.terminate()
    report = json.loads((root / "report.json").read_text()) if code == 0 else {"counts": []}
    passes = [
        {"pass": p, "lost": c.count(0), "repeated": sum(1 for x in c if x > 1)}
        for p, c in enumerate(report["counts"])
    ]
    return {"trainer_exit": code, "events": events, "passes": passes, "strays": strays}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=90.0, help="how long disturbances go on")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-strays", dest="strays", action="store_false", help="no stray trainers")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="loader-soak-"))
    result = run(args, root)
    print(json.dumps(result, indent=1))
    ok = result["trainer_exit"] == 0 and all(
        p["lost"] == 0 and p["repeated"] == 0 for p in result["passes"]
    )
    print(f"loader soak: {'PASS' if ok else 'FAIL'} (logs in {root})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""Take docs/dashboard.png: the dashboard of a real master in the middle of a pass.

A master (in-memory store, --metrics-port 0), a RecordIO dataset of 600 records in 300 tasks,
three session trainers reading at different speeds, and one task a reader reports failed; once
about a third of the pass is done, headless chromium shoots the page. Run once by hand, from
the repository root (needs chromium: scripts/ensure-chromium.sh); it also saves a scrape of the
metrics (docs/metrics-during-a-pass.txt):

    .venv/bin/python scripts/dashboard_screenshot.py [--out docs/dashboard.png] [--size 1200,900]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from chunkmaster.master.readiness import wait_ready
from chunkmaster.recordio import Writer
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc import master_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
TRAINER = ROOT / "tests" / "helpers" / "session_trainer.py"
RECORDS = 600
TRAINERS = (("trainer-0@gpu-node-1", 0.03), ("trainer-1@gpu-node-2", 0.05), ("eval@cpu-3", 0.1))


def status(addr: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{addr}/status.json", timeout=10) as r:
        body: dict[str, Any] = json.loads(r.read())
    return body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    ap.add_argument(
        "--metrics-out",
        default=str(ROOT / "docs" / "metrics-during-a-pass.txt"),
        help="where to save a scrape of /metrics taken with the screenshot",
    )
    ap.add_argument("--size", default="1200,900", help="window WIDTH,HEIGHT (a phone: 390,1400)")
    args = ap.parse_args()
    browser = shutil.which("chromium")
    if browser is None:
        sys.exit("chromium is not installed: run scripts/ensure-chromium.sh")
    work = Path(tempfile.mkdtemp(prefix="dashboard-"))
    data = work / "train-00000.recordio"
    with Writer(str(data), max_chunk_size=1) as w:
        for i in range(RECORDS):
            w.write(b"%06d" % i)
    ready = work / "ready.json"
    cmd = [sys.executable, "-m", "chunkmaster", "master", "--store", ":memory:", "--port", "0"]
    cmd += ["--metrics-port", "0", "--chunk-per-task", "2", "--ready-file", str(ready)]
    master = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        info = wait_ready(ready, master, 30)
        rpc, http = str(info["addr"]), str(info["metrics_addr"])
        with grpc.insecure_channel(rpc) as channel:
            stub = pb_grpc.MasterStub(channel)
            stub.SetDataset(pb.SetDatasetRequest(globs=[str(data)]), timeout=30)
            task = stub.GetTask(pb.GetTaskRequest(pass_id=0, worker="reader-9"), timeout=10).task
            stub.TaskFailed(
                pb.TaskFailedRequest(
                    meta=task.meta, reason="checksum mismatch in chunk 1 of train-00000.recordio"
                ),
                timeout=10,
            )
        for name, step in TRAINERS:
            procs.append(
                subprocess.Popen(
                    [
                        *(sys.executable, str(TRAINER), "--addr", rpc, "--passes", "2"),
                        *("--out", str(work / f"{name}.log"), "--name", name),
                        *("--report-every", "5", "--step-time", str(step)),
                    ],
                    stderr=subprocess.DEVNULL,
                )
            )
        while status(http)["done"] < status(http)["num_tasks"] // 3:
            time.sleep(0.2)
        subprocess.run(
            [
                *(browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars"),
                *(f"--user-data-dir={work / 'profile'}", "--virtual-time-budget=3000"),
                *(f"--screenshot={Path(args.out).resolve()}", f"--window-size={args.size}"),
                f"http://{http}/",
            ],
            check=True,
            capture_output=True,
        )
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as r:
            Path(args.metrics_out).write_bytes(r.read())
        print(f"wrote {args.out} and {args.metrics_out}")
    finally:
        for p in [*procs, master]:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

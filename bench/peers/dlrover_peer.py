"""DLRover 0.6.1's master, driven like chunkmaster: get a data-shard task, report it done.

Runs in bench/peers/.envs/dlrover (`sh bench/peers/install.sh dlrover`), never in the repo's
.venv. The master is DLRover's own standalone entry point, in its own process:

    python -m dlrover.python.master.main --platform local --job_name peers-bench --port P

`--platform local` builds a `LocalJobMaster` (no Kubernetes): its `TaskManager` behind the gRPC
`elastic.Master` service (`GrpcMasterServicer`, a 64-thread `grpc.server`). The dataset is
registered the way DLRover's trainers do it, with one `report(DatasetShardParams)` (batch 1,
one mini-batch a shard: one record a task, `num_epochs=0`: endless epochs, like
`dataset.repeat()`; the table splitter). One cycle is then what a DLRover trainer sends per
shard: `get(TaskRequest)` returning a `Task` of type TRAINING, then
`report(TaskResult(task_id))`. Both are DLRover's own wire messages (pickled `comm` dataclasses
in an `elastic.Message`), sent through its generated stub, the same bytes its `MasterClient`
sends, without that class's retry/sleep wrapper.

    .envs/dlrover/bin/python bench/peers/dlrover_peer.py --clients 8 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from drive import Window, count_cycles, run_clients

DATASET = "peers-bench"


def free_port() -> int:
    # DLRover's local master takes a fixed --port and does not report the one it bound.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def message(node_id: int, payload: object) -> object:
    from dlrover.proto import elastic_training_pb2 as et

    return et.Message(node_id=node_id, node_type="worker", data=payload.serialize())  # type: ignore[attr-defined]


def dlrover_client(addr: str, index: int, wait_start: Callable[[], Window]) -> int:
    from dlrover.proto import elastic_training_pb2 as et
    from dlrover.proto import elastic_training_pb2_grpc as et_grpc
    from dlrover.python.common import comm

    with grpc.insecure_channel(addr) as channel:
        stub = et_grpc.MasterStub(channel)
        get_task = message(index, comm.TaskRequest(DATASET))

        def cycle() -> bool:
            task = comm.deserialize_message(stub.get(get_task, timeout=10).data)
            if task is None or task.type != et.TRAINING:
                return False  # WAIT: every shard of this epoch is out
            done = comm.TaskResult(DATASET, task.task_id, "")
            reply = stub.report(message(index, done), timeout=10)
            if not reply.success:
                raise RuntimeError(f"DLRover master refused the result of task {task.task_id}")
            return True

        return count_cycles(cycle, wait_start())


class DlroverMaster:
    def __init__(self, tasks: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="peers-dlrover-"))
        self.log = self.dir / "master.log"
        port = free_port()
        cmd = [sys.executable, "-m", "dlrover.python.master.main", "--platform", "local"]
        cmd += ["--job_name", DATASET, "--port", str(port), "--xpu_type", "cpu"]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.addr = f"127.0.0.1:{port}"
        try:
            self._wait_ready(60)
            self._register(tasks)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"DLRover master exited: {self.tail()}")
            with grpc.insecure_channel(self.addr) as ch:
                try:
                    grpc.channel_ready_future(ch).result(timeout=1)
                    return
                except grpc.FutureTimeoutError:
                    continue
        raise RuntimeError(f"DLRover master not serving on {self.addr}: {self.tail()}")

    def _register(self, tasks: int) -> None:
        from dlrover.proto import elastic_training_pb2 as et
        from dlrover.proto import elastic_training_pb2_grpc as et_grpc
        from dlrover.python.common import comm

        params = comm.DatasetShardParams(
            batch_size=1,
            num_epochs=0,
            dataset_size=tasks,
            shuffle=False,
            num_minibatches_per_shard=1,
            dataset_name=DATASET,
            task_type=et.TRAINING,
            storage_type="table",
        )
        with grpc.insecure_channel(self.addr) as ch:
            reply = et_grpc.MasterStub(ch).report(message(0, params), timeout=30)
        if not reply.success:
            raise RuntimeError(f"DLRover master refused the dataset: {self.tail()}")

    def tail(self) -> str:
        return "".join(self.log.read_text(errors="replace").splitlines(keepends=True)[-20:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--tasks", type=int, default=100_000)
    args = ap.parse_args()
    master = DlroverMaster(args.tasks)
    try:
        result = run_clients(
            dlrover_client, master.addr, args.clients, args.warmup, args.seconds, [master.proc.pid]
        )
        if master.proc.poll() is not None:
            raise RuntimeError(f"DLRover master died during the run: {master.tail()}")
    finally:
        master.stop()
    log_mb = os.path.getsize(master.log) / 2**20
    print(json.dumps({**result, "master_log_mb": round(log_mb, 1)}), flush=True)


if __name__ == "__main__":
    main()

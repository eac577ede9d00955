"""Values from the wire are checked before they reach the state: a refusal is INVALID_ARGUMENT
naming the argument, and changes nothing (issue: hostile inputs)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.aio import run
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import InvalidArgumentError
from chunkmaster.core.model import TaskMeta
from chunkmaster.master.service import Service
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.store.memory import InMemStore


def _state(c: MasterConnection) -> dict[str, Any]:
    st = c.status()
    keys = ("cur_pass", "todo", "pending", "done", "failed", "save_model")
    held = [(t["id"], t["epoch"], t["worker"]) for t in st["pending_tasks"]]
    return {"held": held, **{k: st[k] for k in keys}}


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda c, t: c.request_save_model("a", math.inf), "block_dur inf"),
        (lambda c, t: c.request_save_model("a", math.nan), "block_dur nan"),
        (lambda c, t: c.request_save_model("a", -1.0), "block_dur -1.0"),
        (lambda c, t: c.request_save_model("a", 1e12), "block_dur"),
        (lambda c, t: c.task_finished(t.meta.id, epoch=-5, pass_id=0), "epoch -5"),
        (lambda c, t: c.task_finished(-1, epoch=0), "task_id -1"),
        (lambda c, t: c.task_finished(t.meta.id, epoch=0, pass_id=-7), "pass_id -7"),
        (lambda c, t: c.task_failed(TaskMeta(t.meta.id, -1), "x"), "epoch -1"),
        (lambda c, t: c.get_task(-3), "pass_id -3"),
    ],
)
def test_out_of_range_values_are_refused_and_change_nothing(
    tmp_path: Path, call: Any, named: str
) -> None:
    data = numbered_records(tmp_path / "d.rio", 10, b"%03d")
    with InProcessMaster(chunks_per_task=1) as m, MasterConnection(m.addr) as c:
        c.set_dataset([data])
        task = c.get_task(0)
        before = _state(c)
        with pytest.raises(InvalidArgumentError, match=f"invalid argument: {named}"):
            call(c, task)
        assert _state(c) == before
        assert c.task_finished(task.meta.id, epoch=task.meta.epoch, pass_id=0)


def test_an_infinite_wait_is_refused(tmp_path: Path) -> None:
    with InProcessMaster() as m, pytest.raises(InvalidArgumentError, match="wait inf"):
        m.call(lambda: m.service.get_task(0, wait=math.inf))


def test_malformed_request_bytes_get_invalid_argument(tmp_path: Path) -> None:
    """Bytes that are not the request message: INVALID_ARGUMENT, not UNKNOWN."""
    with InProcessMaster() as m, grpc.insecure_channel(m.addr) as ch:
        call = ch.unary_unary(
            "/chunkmaster.v1.Master/TaskFinished",
            request_serializer=lambda b: b,
            response_deserializer=pb.TaskReportResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            call(b"\xff\xff\xff\xff\xff", timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_calls_before_start_raise_a_clear_error() -> None:
    async def main() -> None:
        svc = Service(InMemStore())
        with pytest.raises(RuntimeError, match=r"start\(\) must be awaited"):
            await svc.get_task(0)
        with pytest.raises(RuntimeError, match=r"start\(\) must be awaited"):
            await svc.set_dataset(["/nonexistent/*.rio"])

    run(main())

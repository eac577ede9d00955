"""The metrics endpoint of a real master process: scraped over HTTP, parsed as Prometheus text,
and its figures follow real RPCs (dispatches, finishes, failures, refusals)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chunkmaster.master.readiness import read_ready_file
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc import master_pb2_grpc as pb_grpc
from tests.helpers.datasets import numbered_records
from tests.helpers.master_process import MasterProcess

TASKS = 6


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterProcess]:
    m = MasterProcess(
        ["--store", ":memory:", "--metrics-port", "0", "--chunk-per-task", "1"]
    ).start()
    try:
        yield m
    finally:
        m.kill()


def metrics_addr(m: MasterProcess) -> str:
    info = read_ready_file(m.ready_file)
    assert info is not None
    return str(info["metrics_addr"])


def scrape(addr: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the master's /metrics, by name and sorted labels."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_follow_dispatch_finish_fail_and_refusals(
    master: MasterProcess, tmp_path: Path
) -> None:
    addr = metrics_addr(master)
    assert addr.startswith("127.0.0.1:")  # the RPC port's interface: loopback by default
    s = scrape(addr)
    assert value(s, "chunkmaster_ready") == 0
    assert value(s, "chunkmaster_leader") == 1
    assert value(s, "chunkmaster_dispatches_total") == 0

    path = numbered_records(tmp_path / "data.recordio", TASKS)
    with grpc.insecure_channel(master.addr or "") as channel:
        stub = pb_grpc.MasterStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.SetDataset(pb.SetDatasetRequest(globs=[]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stub.SetDataset(pb.SetDatasetRequest(globs=[path]), timeout=30)

        s = scrape(addr)
        assert value(s, "chunkmaster_ready") == 1
        assert value(s, "chunkmaster_dataset_tasks") == TASKS
        assert value(s, "chunkmaster_tasks", queue="todo") == TASKS
        assert (
            value(s, "chunkmaster_rpc_refused_total", method="SetDataset", code="INVALID_ARGUMENT")
            == 1
        )

        first = stub.GetTask(pb.GetTaskRequest(pass_id=0, worker="w1"), timeout=10).task
        second = stub.GetTask(pb.GetTaskRequest(pass_id=0, worker="w1"), timeout=10).task
        s = scrape(addr)
        assert value(s, "chunkmaster_dispatches_total") == 2
        assert value(s, "chunkmaster_tasks", queue="pending") == 2
        assert value(s, "chunkmaster_tasks", queue="todo") == TASKS - 2
        assert value(s, "chunkmaster_pass_records", **{"pass": "0", "stage": "dispatched"}) == 2
        assert value(s, "chunkmaster_rpc_duration_seconds_count", method="GetTask") == 2
        assert value(s, "chunkmaster_store_commit_seconds_count") >= 1
        assert value(s, "chunkmaster_store_batch_entries_sum") >= 3  # dataset + 2 dispatches

        stub.TaskFinished(
            pb.TaskFinishedRequest(task_id=first.meta.id, epoch=first.meta.epoch, pass_id=0),
            timeout=10,
        )
        stub.TaskFailed(pb.TaskFailedRequest(meta=second.meta, reason="bad disk"), timeout=10)
        s = scrape(addr)
        assert value(s, "chunkmaster_finishes_total") == 1
        assert value(s, "chunkmaster_task_duration_seconds_count") == 1
        assert value(s, "chunkmaster_failures_total", reason="read failure") == 1
        assert value(s, "chunkmaster_failures_total", reason="timeout") == 0
        assert value(s, "chunkmaster_tasks", queue="done") == 1
        assert value(s, "chunkmaster_tasks", queue="pending") == 0
        assert value(s, "chunkmaster_tasks_with_failures") == 1
        assert value(s, "chunkmaster_pass_records", **{"pass": "0", "stage": "consumed"}) == 1
        assert (
            value(
                s,
                "chunkmaster_pass_records_redispatched",
                **{"pass": "0", "reason": "read failure"},
            )
            == 1
        )
        assert value(s, "chunkmaster_journal_durable_seq") == value(s, "chunkmaster_journal_seq")


def test_status_json_and_unknown_paths(master: MasterProcess) -> None:
    addr = metrics_addr(master)
    with urllib.request.urlopen(f"http://{addr}/status.json", timeout=10) as r:
        status = json.loads(r.read())
    assert status["cur_pass"] == 0 and status["ready"] is False
    with urllib.request.urlopen(f"http://{addr}/", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/html")
        assert b"status.json" in r.read()
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://{addr}/nothing", timeout=10)
    assert missing.value.code == 404


def test_no_metrics_port_by_default() -> None:
    m = MasterProcess(["--store", ":memory:"]).start()
    try:
        info = read_ready_file(m.ready_file)
        assert info is not None and "metrics_addr" not in info
    finally:
        m.kill()


def test_a_mixture_shows_every_source_in_metrics_status_and_the_dashboard(
    master: MasterProcess, tmp_path: Path
) -> None:
    """Per source: records handed out, consumed, committed, its epoch, its weight in force and
    its share of the records consumed (docs/mixtures.md, "Status, metrics, dashboard")."""
    addr = metrics_addr(master)
    a = numbered_records(tmp_path / "a.recordio", 6)
    b = numbered_records(tmp_path / "b.recordio", 2)
    with grpc.insecure_channel(master.addr or "") as channel:
        stub = pb_grpc.MasterStub(channel)
        sources = [
            pb.Source(name="big", globs=[a], weight=3.0),
            pb.Source(name="small", globs=[b], weight=1.0),
        ]
        stub.SetDataset(pb.SetDatasetRequest(sources=sources), timeout=30)
        got = []
        for _ in range(4):  # one record a task: 3 of "big" and 1 of "small"
            task = stub.GetTask(pb.GetTaskRequest(pass_id=0, worker="w1"), timeout=10).task
            got.append(task.source)
            stub.TaskFinished(
                pb.TaskFinishedRequest(task_id=task.meta.id, epoch=task.meta.epoch, pass_id=0),
                timeout=10,
            )
    assert sorted(got) == ["big", "big", "big", "small"]
    s = scrape(addr)
    assert value(s, "chunkmaster_dataset_tasks") == 8
    for name, n in (("big", 3), ("small", 1)):
        for stage in ("handed_out", "consumed"):
            assert value(s, "chunkmaster_source_records", source=name, stage=stage) == n
        # Commits are a session's (docs/sessions.md); these finishes were unary.
        assert value(s, "chunkmaster_source_records", source=name, stage="committed") == 0
        assert value(s, "chunkmaster_source_share", source=name) == n / 4
    assert value(s, "chunkmaster_source_weight", source="big") == 0.75
    assert value(s, "chunkmaster_source_weight", source="small") == 0.25
    assert value(s, "chunkmaster_source_epoch", source="big") == 0
    with urllib.request.urlopen(f"http://{addr}/status.json", timeout=10) as r:
        mix = json.loads(r.read())["mixture"]
    assert mix["units"] == 8
    assert [(x["name"], x["tasks"], x["consumed"]) for x in mix["sources"]] == [
        ("big", 6, 3),
        ("small", 2, 1),
    ]
    with urllib.request.urlopen(f"http://{addr}/", timeout=10) as r:
        page = r.read()
    assert b'id="sources"' in page and b"s.mixture" in page

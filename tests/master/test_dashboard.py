"""The dashboard, rendered by a real headless browser (Debian's chromium, installed by
scripts/ensure-chromium.sh from `make test`) against a real master with a real trainer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chunkmaster.master.readiness import read_ready_file
from tests.helpers.datasets import numbered_records
from tests.helpers.master_process import MasterProcess

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
TRAINER = "dash-trainer-7"
QUEUES = ("todo", "pending", "done", "failed")


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is not installed: run scripts/ensure-chromium.sh (make test does)")
    return path


def render(url: str, profile: Path) -> str:
    """The page's DOM once its scripts ran (virtual time lets its first fetches finish)."""
    out = subprocess.run(
        [
            chromium(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=3000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def status(addr: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{addr}/status.json", timeout=10) as r:
        body: dict[str, Any] = json.loads(r.read())
    return body


def text_of(dom: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert m is not None, f"no element #{element_id} in the rendered page"
    return m.group(1)


@pytest.fixture
def busy_master(tmp_path: Path) -> Iterator[tuple[MasterProcess, str]]:
    """A master in the middle of a pass: one trainer holds a task and reads slowly."""
    m = MasterProcess(
        ["--store", ":memory:", "--metrics-port", "0", "--chunk-per-task", "1"]
    ).start()
    data = numbered_records(tmp_path / "data.recordio", 40)
    trainer = subprocess.Popen(
        [
            sys.executable,
            str(HELPERS / "session_trainer.py"),
            "--addr",
            m.addr or "",
            "--out",
            str(tmp_path / "trainer.log"),
            "--passes",
            "1",
            "--dataset",
            data,
            "--name",
            TRAINER,
            "--report-every",
            "1",
            "--step-time",
            "600",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        info = read_ready_file(m.ready_file)
        assert info is not None
        yield m, str(info["metrics_addr"])
    finally:
        trainer.kill()
        trainer.wait(10)
        m.kill()


def test_dashboard_shows_the_pass_queues_and_trainer(
    busy_master: tuple[MasterProcess, str], tmp_path: Path
) -> None:
    master, addr = busy_master
    end = time.monotonic() + 60
    while True:  # the trainer has opened its session and holds a task
        st = status(addr)
        if st["sessions"] == 1 and st["pending"] >= 1:
            break
        assert time.monotonic() < end, f"the trainer never started: {master.log()[-2000:]}"
        time.sleep(0.1)
    for _ in range(5):  # the trainer may still be fetching ahead: retry until it holds still
        before = status(addr)
        dom = render(f"http://{addr}/", tmp_path / "profile")
        after = status(addr)
        if all(before[q] == after[q] for q in QUEUES) and (
            before["progress"]["records_done"] == after["progress"]["records_done"]
        ):
            break
    else:
        pytest.fail("the queues never held still for one render")
    assert text_of(dom, "pass") == str(after["cur_pass"]) == "0"
    for q in QUEUES:
        assert text_of(dom, f"q-{q}") == str(after[q]), q
    assert sum(after[q] for q in QUEUES) == 40 and after["pending"] >= 1
    assert text_of(dom, "n-trainers") == "1"
    assert f"<td>{TRAINER}</td>" in dom
    assert "store healthy" in text_of(dom, "health")
    # The pass in records, the trainers' rate and the time left, as `chunkmaster status` has them
    prog = after["progress"]
    done, total = prog["records_done"], prog["records_total"]
    assert total == 40
    assert text_of(dom, "records") == f"{done} of 40 records ({100 * done // total}%)"
    rate = text_of(dom, "rate")
    m = re.fullmatch(r"([\d,.]+) records/s( · about \d+ (s|min|h)( \d+ min)? left)?", rate)
    assert m is not None, rate
    if before["progress"]["records_per_second"] and float(m.group(1).replace(",", "")):
        assert m.group(2), rate  # a rate gives a time left


def test_dashboard_warns_when_trainers_outnumber_the_tasks(tmp_path: Path) -> None:
    """Two trainers, a pass of one task: the status's warning shows in the page's band."""
    m = MasterProcess(
        ["--store", ":memory:", "--metrics-port", "0", "--chunk-per-task", "1000"]
    ).start()
    data = numbered_records(tmp_path / "data.recordio", 40)
    args = ["--addr", m.addr or "", "--passes", "1", "--dataset", data, "--step-time", "600"]
    helper = str(HELPERS / "session_trainer.py")
    trainers = [
        subprocess.Popen(
            [sys.executable, helper, *args, "--name", f"t{i}", "--out", str(tmp_path / f"t{i}")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(2)
    ]
    try:
        info = read_ready_file(m.ready_file)
        assert info is not None
        addr = str(info["metrics_addr"])
        end = time.monotonic() + 60
        while status(addr)["sessions"] < 2:
            assert time.monotonic() < end, f"the trainers never started: {m.log()[-2000:]}"
            time.sleep(0.1)
        (warning,) = status(addr)["warnings"]
        dom = render(f"http://{addr}/", tmp_path / "profile")
        assert text_of(dom, "warnings") == warning
        assert "1 task for 2 trainers" in warning
    finally:
        for t in trainers:
            t.kill()
            t.wait(10)
        m.kill()


def test_dashboard_shows_the_records_rate_and_time_left_of_a_moving_pass(tmp_path: Path) -> None:
    """A trainer reading steadily: the page shows the pass's records done of its total, the
    trainers' rate and the time that leaves, between the figures of the status before and
    after the render."""
    m = MasterProcess(
        ["--store", ":memory:", "--metrics-port", "0", "--chunk-per-task", "10"]
    ).start()
    data = numbered_records(tmp_path / "data.recordio", 2000)
    trainer = subprocess.Popen(
        [
            sys.executable,
            str(HELPERS / "session_trainer.py"),
            "--addr",
            m.addr or "",
            "--out",
            str(tmp_path / "trainer.log"),
            "--passes",
            "1",
            "--dataset",
            data,
            "--report-every",
            "1",
            "--step-time",
            "0.02",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        info = read_ready_file(m.ready_file)
        assert info is not None
        addr = str(info["metrics_addr"])
        end = time.monotonic() + 60
        while not status(addr)["progress"]["seconds_left"]:
            assert time.monotonic() < end, f"no rate yet: {m.log()[-2000:]}"
            time.sleep(0.1)
        before = status(addr)["progress"]
        dom = render(f"http://{addr}/", tmp_path / "profile")
        after = status(addr)["progress"]
    finally:
        trainer.kill()
        trainer.wait(10)
        m.kill()
    records = re.fullmatch(r"([\d,]+) of 2,000 records \((\d+)%\)", text_of(dom, "records"))
    assert records is not None, text_of(dom, "records")
    done = int(records.group(1).replace(",", ""))
    assert before["records_done"] <= done <= after["records_done"]
    assert int(records.group(2)) == 100 * done // 2000
    rate = re.fullmatch(
        r"([\d,.]+) records/s · about (\d+) (s|min)( \d+ min)? left", text_of(dom, "rate")
    )
    assert rate is not None, text_of(dom, "rate")
    assert float(rate.group(1).replace(",", "")) > 0


def test_dashboard_shows_each_sources_records_under_its_pass(tmp_path: Path) -> None:
    """A mixture: the "Records by pass" table has, under the pass's row, a row per source with
    what that source's tasks were in the pass (the status's `ledger[].sources`)."""
    import grpc

    from chunkmaster.rpc import master_pb2 as pb
    from chunkmaster.rpc import master_pb2_grpc as pb_grpc

    m = MasterProcess(
        ["--store", ":memory:", "--metrics-port", "0", "--chunk-per-task", "1"]
    ).start()
    try:
        info = read_ready_file(m.ready_file)
        assert info is not None
        addr = str(info["metrics_addr"])
        a = numbered_records(tmp_path / "a.recordio", 6)
        b = numbered_records(tmp_path / "b.recordio", 2)
        with grpc.insecure_channel(m.addr or "") as channel:
            stub = pb_grpc.MasterStub(channel)
            sources = [
                pb.Source(name="big", globs=[a], weight=3.0),
                pb.Source(name="small", globs=[b], weight=1.0),
            ]
            stub.SetDataset(pb.SetDatasetRequest(sources=sources), timeout=30)
            for i in range(5):  # one record a task: 3 of "big" and 1 of "small" finished
                task = stub.GetTask(pb.GetTaskRequest(pass_id=0, worker="w1"), timeout=10).task
                if i < 4:
                    stub.TaskFinished(
                        pb.TaskFinishedRequest(
                            task_id=task.meta.id, epoch=task.meta.epoch, pass_id=0
                        ),
                        timeout=10,
                    )
        (led,) = status(addr)["ledger"]
        sources = led["sources"]
        assert [(n, c["dispatched"], c["consumed"]) for n, c in sources.items()] == [
            ("big", 3 + (task.source == "big"), 3),
            ("small", 1 + (task.source == "small"), 1),
        ]
        dom = render(f"http://{addr}/", tmp_path / "profile")
        body = re.search(r'<tbody id="ledger">(.*?)</tbody>', dom, re.S)
        assert body is not None
        rows = [
            re.findall(r"<td[^>]*>([^<]*)</td>", tr)
            for tr in re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)
        ]
        assert [r[:3] for r in rows] == [
            ["0", "5", "4"],
            *([f"· {n}", str(c["dispatched"]), str(c["consumed"])] for n, c in sources.items()),
        ]
    finally:
        m.kill()

"""The mixture's CLI from outside (docs/mixtures.md): `read --source`, `weights` and `status`
against a real master process; a bad flag or weights that do not fit are one line naming
what is wrong, and nothing is set."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess

from chunkmaster.client.connection import MasterConnection

CLI = [sys.executable, "-m", "chunkmaster"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def master() -> Iterator[MasterProcess]:
    m = MasterProcess(["--store", ":memory:", "--chunk-per-task", "1"]).start()
    try:
        yield m
    finally:
        m.kill()


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode != 0 and len(lines) == 1, out.stderr
    return lines[0]


def test_bad_source_flags_are_one_line_naming_the_flag(master: MasterProcess) -> None:
    base = ["read", "--addr", master.addr or "", "--passes", "1"]
    line = one_line(run_cli(*base, "--source", "web"))
    assert "--source 'web'" in line and "NAME=PATTERN@WEIGHT" in line
    line = one_line(run_cli(*base, "--source", "web=/d/*.rio@-1"))
    assert "--source 'web=/d/*.rio@-1'" in line
    line = one_line(run_cli(*base, "--source", "a=/x@1", "--source", "a=/y@2"))
    assert "source 'a' has weight 1" in line
    line = one_line(run_cli(*base, "--dataset", "/x", "--source", "a=/y@1"))
    assert "--dataset and --source" in line
    with MasterConnection(master.addr or "") as c:
        assert c.status()["ready"] is False  # nothing was set


def test_weights_status_and_read_of_a_mixture(master: MasterProcess, tmp_path: Path) -> None:
    a = numbered_records(tmp_path / "a.recordio", 30)
    b = numbered_records(tmp_path / "b.recordio", 10, b"b%05d")
    addr = master.addr or ""
    line = one_line(run_cli("weights", "--addr", addr, "a=1,b=1"))
    assert "master has no dataset yet" in line
    out = run_cli(
        "read", "--addr", addr, "--passes", "1", "--json",
        "--source", f"a={a}@3", "--source", f"b={b}@1",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (pass_line,) = [json.loads(ln) for ln in out.stdout.splitlines()]
    assert pass_line["records"] == 40
    assert {n: s["records"] for n, s in pass_line["sources"].items()} == {"a": 30, "b": 10}

    line = one_line(run_cli("weights", "--addr", addr, "a=1,c=1"))
    assert "c is none of them" in line and "b has none" in line
    line = one_line(run_cli("weights", "--addr", addr, "a=1,b=1", "0:a=2,b=1"))
    assert "first point" in line or "grow" in line
    out = run_cli("weights", "--addr", addr, "--json", "a=1,b=1")
    assert out.returncode == 0, out.stderr
    change = json.loads(out.stdout)
    assert change["pass"] == 1 and change["unit"] == 0  # pass 1 has had nothing yet
    status = run_cli("status", "--addr", addr)
    assert status.returncode == 0, status.stderr
    assert "mixture  2 sources, 40 units a pass" in status.stdout
    assert "  a: weight 50.0%, consumed 75.0%; 30 handed out, 30 consumed" in status.stdout
    assert "  b: weight 50.0%, consumed 25.0%; 10 handed out, 10 consumed" in status.stdout


def test_weights_for_a_job_that_is_no_mixture_say_so(master: MasterProcess, tmp_path: Path) -> None:
    path = numbered_records(tmp_path / "one.recordio", 5)
    out = run_cli("read", "--addr", master.addr or "", "--passes", "1", "--dataset", path)
    assert out.returncode == 0, out.stderr
    line = one_line(run_cli("weights", "--addr", master.addr or "", "a=1"))
    assert "not a mixture" in line

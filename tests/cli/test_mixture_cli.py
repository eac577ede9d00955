"""The mixture's CLI from outside (docs/mixtures.md): `read --source`, `weights` (and its
`--add`) and `status` against a real master process; a bad flag, weights that do not fit or a
source that cannot be added are one line naming what is wrong, and nothing is set."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

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
        assert status_view(c.status()).ready is False  # nothing was set


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
    assert "'c' is none of them" in line and "'b' has none" in line
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
    # the ledger's line of pass 0 and, under it, what each source delivered in it
    lines = status.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("records  pass 0: 40 handed out"))
    assert lines[at + 1].split(": ", 1) == [
        "           by source (handed out/consumed/committed)",
        "a 30/30/0, b 10/10/0",  # `read` finishes its tasks without a session: no commits
    ]


def test_weights_for_a_job_that_is_no_mixture_say_so(master: MasterProcess, tmp_path: Path) -> None:
    path = numbered_records(tmp_path / "one.recordio", 5)
    out = run_cli("read", "--addr", master.addr or "", "--passes", "1", "--dataset", path)
    assert out.returncode == 0, out.stderr
    line = one_line(run_cli("weights", "--addr", master.addr or "", "a=1"))
    assert "not a mixture" in line
    with MasterConnection(master.addr or "") as c:
        (led,) = c.status()["ledger"]  # a one-source job's ledger is as it always was
    assert led["consumed"] == 5 and "sources" not in led
    status = run_cli("status", "--addr", master.addr or "")
    assert "records  pass 0: 5 handed out" in status.stdout and "by source" not in status.stdout


def mixture_status(addr: str, token: str | None = None) -> dict[str, Any]:
    from chunkmaster.client import Client

    with Client(addr, token=token) as c:
        mix = c.status()["mixture"]
    assert isinstance(mix, dict)
    return mix


def read_pass(addr: str, first: int, *sources: str) -> dict[str, Any]:
    args = [f for src in sources for f in ("--source", src)]
    out = run_cli(
        "read", "--addr", addr, "--passes", "1", "--first-pass", str(first), "--json", *args
    )
    assert out.returncode == 0, out.stderr
    (line,) = [json.loads(ln) for ln in out.stdout.splitlines()]
    assert isinstance(line, dict)
    return line


def test_a_source_added_over_the_cli_is_read_and_shown(
    master: MasterProcess, tmp_path: Path
) -> None:
    """`weights --add` without weights: the weights in force hold and the added source has its
    @WEIGHT on their scale, from the next unit nobody had (here pass 1's first); a pass keeps
    its 40 units; status shows the source, and a trainer naming the grown mixture reads it,
    one whole epoch of it in pass 1 (its 20 one-record tasks once each)."""
    a = numbered_records(tmp_path / "a.recordio", 30)
    b = numbered_records(tmp_path / "b.recordio", 10, b"b%05d")
    c = numbered_records(tmp_path / "c.recordio", 20, b"c%05d")
    addr = master.addr or ""
    read_pass(addr, 0, f"a={a}@3", f"b={b}@1")
    out = run_cli("weights", "--addr", addr, "--add", f"c={c}@4")
    assert out.returncode == 0, out.stderr
    assert (
        "source c added; weights set: in effect at record 40 (pass 1 from its start)" in out.stdout
    )
    mix = mixture_status(addr)
    assert mix["units"] == 40
    assert [(s["name"], s["target"], s["tasks"]) for s in mix["sources"]] == [
        ("a", 0.375, 30),
        ("b", 0.125, 10),
        ("c", 0.5, 20),
    ]
    line = read_pass(addr, 1, f"a={a}@3", f"b={b}@1", f"c={c}@4")
    got = {n: s["records"] for n, s in line["sources"].items()}
    assert got == {"a": 15, "b": 5, "c": 20} and line["records"] == 40
    whole = run_cli("recordio", "digest", c)
    assert whole.returncode == 0, whole.stderr
    assert line["sources"]["c"]["digest"] in whole.stdout
    status = run_cli("status", "--addr", addr)
    assert "mixture  3 sources, 40 units a pass" in status.stdout
    assert "  c: weight 50.0%" in status.stdout


def test_adding_a_source_that_cannot_be_is_one_line_and_changes_nothing(
    master: MasterProcess, tmp_path: Path
) -> None:
    """A name the job has, a pattern matching nothing, weights that leave the new source out,
    a format that is none, a malformed --add: each refused in one line naming it; the job's
    mixture is as it was."""
    a = numbered_records(tmp_path / "a.recordio", 30)
    b = numbered_records(tmp_path / "b.recordio", 10, b"b%05d")
    c = numbered_records(tmp_path / "c.recordio", 20, b"c%05d")
    addr = master.addr or ""
    line = one_line(run_cli("weights", "--addr", addr, "--add", f"c={c}"))
    assert "master has no dataset yet" in line
    read_pass(addr, 0, f"a={a}@3", f"b={b}@1")
    before = mixture_status(addr)
    base = ["weights", "--addr", addr]
    line = one_line(run_cli(*base, "--add", f"a={c}"))
    assert "source 'a' is in the job already (its sources: a, b)" in line
    line = one_line(run_cli(*base, "--add", f"c={tmp_path}/none-*.recordio"))
    assert "source 'c'" in line and "none-*.recordio" in line
    line = one_line(run_cli(*base, "--add", f"c={c}", "a=1,b=1"))
    assert "'c' has none" in line
    line = one_line(run_cli(*base, "--add", f"c={c}", "--add", f"c={c}@2"))
    assert "--add" in line and "source 'c' has weight 1" in line
    line = one_line(run_cli(*base, "--add", "c"))
    assert "--add 'c': expected NAME=PATTERN@WEIGHT" in line
    line = one_line(run_cli(*base))
    assert "give the weights (POINT), or a source to add (--add)" in line
    from chunkmaster.client import Client, Source
    from chunkmaster.core.errors import DatasetError

    with Client(addr) as client, pytest.raises(DatasetError, match="source 'c'.*nope"):
        client.add_sources({"c": Source(c, format="nope")})
    assert mixture_status(addr) == before


def test_weights_and_names_out_of_bounds_are_one_line_and_change_nothing(
    master: MasterProcess, tmp_path: Path
) -> None:
    """Weights whose sum overflows (1e308 each: the master failed with UNKNOWN IndexError and
    held a job of 0 tasks), a share that rounds to 0, a source name with a control character
    (it was escaped and set): refused in one line naming the source; the next correct call
    works."""
    a = numbered_records(tmp_path / "a.recordio", 30)
    b = numbered_records(tmp_path / "b.recordio", 10, b"b%05d")
    addr = master.addr or ""
    base = ["read", "--addr", addr, "--passes", "1"]
    line = one_line(run_cli(*base, "--source", f"a={a}@1e308", "--source", f"b={b}@1e308"))
    assert "source 'a' has weight 1e+308 at record 0: a weight is 0 or a number from" in line
    line = one_line(run_cli(*base, "--source", f"a\x1b[31m={a}", "--source", f"b={b}"))
    assert "source name 'a\\x1b[31m' holds U+001B (Cc" in line and "at character 2:" in line
    with MasterConnection(addr) as c:
        assert status_view(c.status()).ready is False  # nothing was set
    read_pass(addr, 0, f"a={a}@3", f"b={b}@1")
    before = mixture_status(addr)
    line = one_line(run_cli("weights", "--addr", addr, "a=1e308,b=1e308"))
    assert "source 'a' has weight 1e+308 at record 0" in line
    line = one_line(run_cli("weights", "--addr", addr, "a=1,b=1e-13"))
    assert "source 'b' has weight 1e-13 at record 0, 1e-13 of their sum" in line
    line = one_line(run_cli("weights", "--addr", addr, "--add", f"c\u2028={b}"))
    assert "holds U+2028 (Zl" in line and "at character 2:" in line
    assert mixture_status(addr) == before
    out = run_cli("weights", "--addr", addr, "--json", "a=1,b=0")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pass"] == 1


def test_adding_a_source_needs_the_token_as_weights_do(tmp_path: Path) -> None:
    """With a token the master refuses an add without it (or with another) as it refuses
    every call, weights too: UNAUTHENTICATED in one line, nothing added."""
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    m = MasterProcess(
        ["--store", ":memory:", "--chunk-per-task", "1", "--token-file", str(token)]
    ).start()
    try:
        addr = m.addr or ""
        a = numbered_records(tmp_path / "a.recordio", 30)
        b = numbered_records(tmp_path / "b.recordio", 10, b"b%05d")
        c = numbered_records(tmp_path / "c.recordio", 20, b"c%05d")
        from chunkmaster.client import Client, Source

        with Client(addr, token="s3cret-token") as client:
            client.set_dataset({"a": Source(a, 3), "b": Source(b, 1)})
        before = mixture_status(addr, "s3cret-token")
        line = one_line(run_cli("weights", "--addr", addr, "--add", f"c={c}"))
        assert "unauthenticated" in line
        other = tmp_path / "other"
        other.write_text("not-the-token\n")
        args = ["weights", "--addr", addr, "--token-file", str(other), "--add", f"c={c}"]
        assert "unauthenticated" in one_line(run_cli(*args))
        assert mixture_status(addr, "s3cret-token") == before
        args = ["weights", "--addr", addr, "--token-file", str(token), "--add", f"c={c}"]
        assert run_cli(*args).returncode == 0
        assert [s["name"] for s in mixture_status(addr, "s3cret-token")["sources"]] == [
            "a",
            "b",
            "c",
        ]
    finally:
        m.kill()


def test_a_grown_mixtures_checkpoint_restores_and_refuses_its_added_source_changed(
    tmp_path: Path,
) -> None:
    """A data checkpoint of a job that had a source added: a fresh master restores it with
    its three sources and its passes of 40 units (set with two, the third added); with the
    added source's file changed since, or one of the first two's, it refuses to start, naming
    the source and the file."""
    a = numbered_records(tmp_path / "a.recordio", 30)
    b = numbered_records(tmp_path / "b.recordio", 10, b"b%05d")
    c = numbered_records(tmp_path / "c.recordio", 20, b"c%05d")
    ckpt = tmp_path / "job.ckpt"
    first = MasterProcess(["--store", str(tmp_path / "a.db"), "--chunk-per-task", "1"]).start()
    try:
        addr = first.addr or ""
        read_pass(addr, 0, f"a={a}@3", f"b={b}@1")
        assert run_cli("weights", "--addr", addr, "--add", f"c={c}@4").returncode == 0
        out = run_cli("checkpoint", "save", "--addr", addr, str(ckpt))
        assert out.returncode == 0, out.stderr
    finally:
        first.kill()
    fresh = MasterProcess(
        ["--store", str(tmp_path / "b.db"), "--chunk-per-task", "1", "--restore", str(ckpt)]
    ).start()
    try:
        mix = mixture_status(fresh.addr or "")
        assert mix["units"] == 40
        assert [(s["name"], s["target"]) for s in mix["sources"]] == [
            ("a", 0.375),
            ("b", 0.125),
            ("c", 0.5),
        ]
    finally:
        fresh.kill()
    numbered_records(tmp_path / "c.recordio", 21, b"c%05d")
    cmd = ["master", "--store", str(tmp_path / "c.db"), "--port", "0", "--restore", str(ckpt)]
    out = run_cli(*cmd)
    assert out.returncode != 0
    assert "source 'c'" in out.stderr and f"{c}: chunk count changed: 20 -> 21" in out.stderr
    numbered_records(tmp_path / "c.recordio", 20, b"c%05d")  # as it was
    numbered_records(tmp_path / "a.recordio", 29)  # a source the job was set with
    cmd = ["master", "--store", str(tmp_path / "d.db"), "--port", "0", "--restore", str(ckpt)]
    out = run_cli(*cmd)
    assert out.returncode != 0
    assert "source 'a'" in out.stderr and f"{a}: chunk count changed: 30 -> 29" in out.stderr
    assert "source 'c'" not in out.stderr


def test_a_schedule_over_the_bound_is_one_line_and_one_at_it_is_taken(
    master: MasterProcess, tmp_path: Path
) -> None:
    """`chunkmaster weights` with 1,001 points (MAX_SCHEDULE_POINTS: each point is kept,
    journaled and replayed): refused in one line naming both figures, nothing changed, the
    trainers read on; 1,000 points are taken."""
    a = numbered_records(tmp_path / "a.recordio", 30)
    b = numbered_records(tmp_path / "b.recordio", 10, b"b%05d")
    addr = master.addr or ""
    read_pass(addr, 0, f"a={a}@3", f"b={b}@1")
    before = mixture_status(addr)
    points = ["a=1,b=1", *(f"{k * 10}:a={1 + k % 5},b=1" for k in range(1, 1_001))]
    line = one_line(run_cli("weights", "--addr", addr, *points))
    assert "a weight schedule of 1,001 points, over the 1,000 a schedule may hold" in line
    assert mixture_status(addr) == before
    assert read_pass(addr, 1, f"a={a}", f"b={b}")["records"] == 40
    out = run_cli("weights", "--addr", addr, "--json", *points[:1_000])
    assert out.returncode == 0, out.stderr
    assert len(mixture_status(addr)["schedule"]) == 100  # the status shows the first 100

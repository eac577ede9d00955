"""What a new user meets first, from outside: a wrong address, a port in use, a misspelt
variable, a relative pattern, the status's wording and the progress of a pass (issue 20,
"Friction a new user met"). Real processes, real sockets, a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster
from helpers.master_process import MasterProcess

from chunkmaster.cli.status_cmd import render
from chunkmaster.client.connection import MasterConnection

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
CLI = [sys.executable, "-m", "chunkmaster"]


def run_cli(
    args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **(env or {})),
        cwd=cwd,
    )


def closed_port() -> int:
    """A loopback port nothing listens on (bound once, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("chunkmaster: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


# ---- a wrong --addr ------------------------------------------------------------------------


def test_read_from_a_wrong_address_says_never_connected_once_and_fails_in_one_line() -> None:
    port = closed_port()
    addr = f"127.0.0.1:{port}"
    out = run_cli(
        [
            "read",
            "--addr",
            addr,
            "--dataset",
            "/nonexistent/*.rio",
            "--passes",
            "1",
            "--retry-timeout",
            "2",
        ]
    )
    assert out.returncode == 1, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "WARNING" in line]
    # One warning for the client (not one per call: set_dataset and the session both try),
    # short, saying what is wrong and what to check.
    assert len(warnings) == 1, out.stderr
    (warning,) = warnings
    assert f"never connected to {addr}" in warning and "connection refused" in warning, warning
    assert "host and port" in warning and "TLS" in warning and "token" in warning, warning
    assert len(warning.split(": ", 1)[1]) < 250, warning
    err = error_line(out.stderr)
    assert f"never connected to {addr}" in err and "host and port" in err, err
    assert "Traceback" not in out.stderr and len(err) < 300, err


def test_status_of_a_wrong_address_fails_in_one_line_saying_what_to_check() -> None:
    addr = f"127.0.0.1:{closed_port()}"
    out = run_cli(["status", "--addr", addr, "--timeout", "2"])
    assert out.returncode == 1 and out.stdout == "", out
    err = error_line(out.stderr)
    assert f"cannot reach the master at {addr}" in err and "connection refused" in err, err
    assert "host and port" in err and "TLS" in err and "token" in err, err
    assert len(err) < 300 and out.stderr.count("\n") == 1, out.stderr


def test_never_connected_reminders_come_less_and_less_often() -> None:
    """Pure schedule: a reminder a minute after the first warning, then twice as far apart
    each time, never more than ten minutes apart."""
    from chunkmaster.client.link import NEVER_CONNECTED_REMINDERS

    gaps = [b - a for a, b in itertools.pairwise(NEVER_CONNECTED_REMINDERS)]
    assert NEVER_CONNECTED_REMINDERS[0] == 60.0
    assert all(b >= a for a, b in itertools.pairwise(gaps)) and max(gaps) == 600.0


# ---- a port in use ---------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
def test_a_port_in_use_is_one_line_naming_it(flag: str, taken_port: int) -> None:
    args = ["master", "--store", ":memory:", "--port", "0", flag, str(taken_port)]
    out = run_cli(args)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    err = error_line(out.stderr)
    assert f"{flag} {taken_port}" in err and "in use" in err, err
    assert "another port" in err, err
    # Nothing else but the error: the check comes before the master starts.
    assert out.stderr.strip().splitlines() == [err], out.stderr


# ---- a store folder that cannot be one -------------------------------------------------------


def test_a_store_whose_folder_is_a_file_is_one_line_saying_so(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    out = run_cli(["master", "--store", str(tmp_path / "afile" / "sub" / "state.db")])
    assert out.returncode == 2, out.stderr
    err = error_line(out.stderr)
    assert err.startswith("chunkmaster: error: --store: "), err
    assert f"{tmp_path / 'afile'} is a file, not a directory" in err, err
    assert "File exists" not in out.stderr and out.stderr.strip() == err, out.stderr
    # The default store's folder (under XDG_STATE_HOME) is checked by the store itself.
    out = run_cli(["master", "--port", "0"], env={"XDG_STATE_HOME": str(tmp_path / "afile")})
    assert out.returncode == 1, out.stderr
    err = error_line(out.stderr)
    assert f"{tmp_path / 'afile'} is a file, not a directory" in err, err
    assert "File exists" not in out.stderr and "Traceback" not in out.stderr, out.stderr


# ---- misspelt variables ----------------------------------------------------------------------


def test_a_misspelt_variable_is_named_with_the_closest_known_one(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [*CLI, "master", "--store", ":memory:", "--port", "0", "--ready-file", str(ready)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, CHUNKMASTER_TASK_TIMEOUT="5m", CHUNKMASTER_TRAINER_TTL="4s"),
    )
    try:
        end = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < end, "the master did not start"
            time.sleep(0.05)
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    warned = [line for line in stderr.splitlines() if "CHUNKMASTER_TASK_TIMEOUT" in line]
    assert len(warned) == 1, stderr
    assert "WARNING" in warned[0] and "did you mean " in warned[0]
    assert "CHUNKMASTER_TASK_TIMEOUT_DUR" in warned[0].split("did you mean ")[1], warned[0]
    assert "ignored" in warned[0]
    assert "CHUNKMASTER_TRAINER_TTL" not in stderr  # a real one is not warned about


def test_commands_other_than_master_warn_about_misspelt_variables_too() -> None:
    out = run_cli(
        ["status", "--addr", f"127.0.0.1:{closed_port()}", "--timeout", "1"],
        env={"CHUNKMASTER_TOKNE": "x"},
    )
    warned = [line for line in out.stderr.splitlines() if "CHUNKMASTER_TOKNE" in line]
    assert len(warned) == 1 and "did you mean CHUNKMASTER_TOKEN" in warned[0], out.stderr


def test_the_slurm_recipes_own_variables_are_not_warned_about() -> None:
    """Every CHUNKMASTER_* name deploy/slurm/chunkmaster.sbatch sets or reads, on a command
    of a trainer step; a misspelt one beside them still warns."""
    recipe = (Path(__file__).resolve().parents[2] / "deploy/slurm/chunkmaster.sbatch").read_text()
    names = set(re.findall(r"\bCHUNKMASTER_[A-Z_]+[A-Z]\b", recipe)) - {"CHUNKMASTER_TOKEN_FILE"}
    assert {"CHUNKMASTER_SLURM_TRAINER", "CHUNKMASTER_SLURM_HEAD", "CHUNKMASTER_ADDR"} <= names
    env = dict.fromkeys(names, "1") | {"CHUNKMASTER_SLURM_MINE": "x", "CHUNKMASTER_TOKN_FILE": "t"}
    out = run_cli(["status", "--addr", f"127.0.0.1:{closed_port()}", "--timeout", "1"], env=env)
    warned = [line for line in out.stderr.splitlines() if "not a chunkmaster variable" in line]
    assert len(warned) == 1, out.stderr  # CHUNKMASTER_SLURM_*: the recipe's namespace
    assert warned[0].startswith("chunkmaster: warning: CHUNKMASTER_TOKN_FILE "), warned
    assert "did you mean CHUNKMASTER_TOKEN_FILE" in warned[0], warned


# ---- relative patterns -----------------------------------------------------------------------


def test_read_says_what_a_relative_pattern_resolves_against(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    numbered_records(tmp_path / "data" / "a.rio", 5)
    with InProcessMaster() as m:
        out = run_cli(
            ["read", "--addr", m.addr, "--dataset", "data/*.rio", "--passes", "1", "--json"],
            cwd=tmp_path,
        )
        globs = m.status()["dataset"]["globs"]
    assert out.returncode == 0, out.stderr
    assert globs == [str(tmp_path / "data" / "*.rio")]
    said = [line for line in out.stderr.splitlines() if "data/*.rio" in line]
    assert len(said) == 1, out.stderr
    assert str(tmp_path / "data" / "*.rio") in said[0] and "working directory" in said[0]
    assert json.loads(out.stdout.splitlines()[-1])["records"] == 5


# ---- status wording --------------------------------------------------------------------------


def test_status_says_each_failure_reason_once_and_counts_in_words(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "a.rio", 20)
    with InProcessMaster(chunks_per_task=1000, failure_max=3) as m:
        with MasterConnection(m.addr) as c:
            c.set_dataset([data])
            for _ in range(4):
                c.task_failed(c.get_task(0).meta, "bad CRC in chunk 3")
        text = render(m.status())
    assert "(s)" not in text, text
    assert re.search(r"\b1 tasks\b|\b1 files\b|\b1 patterns\b|\b1 failures\b", text) is None
    assert "1 task of up to 1000 chunks" in text and "1 recordio file," in text, text
    (line,) = [ln for ln in text.splitlines() if "bad CRC" in ln]
    assert line.count("bad CRC in chunk 3") == 1, line
    assert "4 failures" in line and "4 times" in line and "epochs 1-4" in line, line


# ---- progress in records ---------------------------------------------------------------------


def _slow_trainer(addr: str, data: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            str(HELPERS / "session_trainer.py"),
            "--addr",
            addr,
            "--out",
            str(out),
            "--passes",
            "1",
            "--dataset",
            data,
            "--report-every",
            "1",
            "--step-time",
            "0.05",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_status_shows_records_done_of_the_pass_the_rate_and_the_time_left(
    tmp_path: Path,
) -> None:
    m = MasterProcess(["--store", ":memory:", "--chunk-per-task", "10"]).start()
    data = numbered_records(tmp_path / "a.rio", 400)
    trainer = _slow_trainer(m.addr or "", data, tmp_path / "t.log")
    try:
        end = time.monotonic() + 60
        while True:
            st = json.loads(run_cli(["status", "--addr", m.addr or "", "--json"]).stdout)
            prog = st["progress"]
            if prog["records_done"] >= 5 and prog["records_per_second"]:
                break
            assert time.monotonic() < end, f"no progress: {st}"
            time.sleep(0.2)
        assert prog["pass"] == 0 and prog["records_total"] == 400
        (led,) = [x for x in st["ledger"] if x["pass"] == 0]
        assert prog["records_done"] == led["consumed"]
        rate = prog["records_per_second"]
        assert rate == pytest.approx(sum(t["records_per_second"] for t in st["trainers"]), abs=0.1)
        left = (400 - prog["records_done"]) / rate
        assert prog["seconds_left"] == pytest.approx(left, rel=0.01, abs=0.5)
        text = run_cli(["status", "--addr", m.addr or ""]).stdout
        (line,) = [ln for ln in text.splitlines() if ln.startswith("progress")]
        assert re.search(r"pass 0: [\d,]+ of 400 records \(\d+%\), [\d.,]+ records/s, ", line)
        assert re.search(r"about [\d.]+ (s|min|h)\b.* left", line), line
    finally:
        trainer.kill()
        trainer.wait(10)
        m.kill()


def _read_pty(args: Sequence[str]) -> tuple[int, str]:
    """Run a command with stdout and stderr on a pseudo-terminal; its exit code and output."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    proc = subprocess.Popen([*CLI, *args], stdout=terminal, stderr=terminal, close_fds=True)
    os.close(terminal)
    chunks: list[bytes] = []
    end = time.monotonic() + 120
    while time.monotonic() < end:
        ready, _, _ = select.select([controller], [], [], 1.0)
        if ready:
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(controller)
    return proc.wait(30), b"".join(chunks).decode(errors="replace")


@pytest.fixture
def master_with_data(tmp_path: Path) -> Iterator[tuple[str, str]]:
    data = numbered_records(tmp_path / "a.rio", 300)
    with InProcessMaster(chunks_per_task=10) as m:
        yield m.addr, data


def test_read_on_a_terminal_shows_a_bar_of_the_pass_in_records(
    master_with_data: tuple[str, str],
) -> None:
    addr, data = master_with_data
    code, out = _read_pty(["read", "--addr", addr, "--dataset", data, "--passes", "1"])
    assert code == 0, out
    assert "/300" in out and "rec/s" in out, out  # the pass's records, and a rate
    assert "pass 0: 300 records" in out


def test_read_json_on_a_terminal_has_no_bar(master_with_data: tuple[str, str]) -> None:
    addr, data = master_with_data
    code, out = _read_pty(["read", "--addr", addr, "--dataset", data, "--passes", "1", "--json"])
    assert code == 0, out
    lines: list[Any] = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines == [{"pass": 0, "records": 300, "digest": lines[0]["digest"]}], out

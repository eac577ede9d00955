"""Data checkpoint files handed to `chunkmaster checkpoint show FILE` and `chunkmaster master
--restore FILE` (real processes, real files): a file larger than its header allows is refused
before it is read, a hostile header gets a one-line refusal naming the field (never a
traceback), a FIFO is refused at once, and another job's checkpoint restores only with
--restore-other-job."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.status_view import status_view
from test_checkpoint_blob import checkpoint, parts

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.checkpoint import MAGIC, VERSION, encode

GIB = 1 << 30
SMALL_RSS = 200 << 20  # bytes: a process that never holds the file's bytes stays well under
RESTORE = ("master", "--port", "0", "--store", ":memory:", "--restore")


# Runs the command, then prints the peak resident memory of its own process image (VmHWM: what
# ru_maxrss would give includes the test process's memory at fork, before the exec).
_MEASURED = """
import atexit, sys
def peak():
    with open("/proc/self/status") as f:
        print(next(ln.split()[1] for ln in f if ln.startswith("VmHWM:")), flush=True)
atexit.register(peak)
from chunkmaster.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def run(tmp_path: Path, *args: str) -> tuple[int, str, int]:
    """`chunkmaster ARGS`: its exit code, its stderr, and its peak resident memory in bytes.
    SIGKILLed after 120 s (a master that restored what it should have refused serves on)."""
    with open(tmp_path / "out", "w+b") as out, open(tmp_path / "err", "w+b") as err:
        proc = subprocess.Popen([sys.executable, "-c", _MEASURED, *args], stdout=out, stderr=err)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        peak = out.read().split()
        return proc.returncode, err.read().decode(), int(peak[-1]) * 1024 if peak else 0


def refusal(stderr: str, prefix: str) -> str:
    """The one error line at the end of a refused command's stderr (no traceback before it)."""
    assert "Traceback" not in stderr and stderr.strip(), stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"chunkmaster: error: {prefix}"), stderr
    return last


def show_and_restore_refuse(tmp_path: Path, ckpt: Path, *words: str) -> None:
    code, err, _ = run(tmp_path, "checkpoint", "show", str(ckpt))
    line = refusal(err, f"{ckpt}: ")
    assert code == 1 and all(w in line for w in words), line
    code, err, _ = run(tmp_path, *RESTORE, str(ckpt))
    line = refusal(err, f"--restore {ckpt}: ")
    assert code == 1 and all(w in line for w in words), line


def test_a_gigabyte_past_the_checkpoint_is_refused_before_it_is_read(tmp_path: Path) -> None:
    ckpt = tmp_path / "padded.ckpt"
    ckpt.write_bytes(encode(checkpoint()))
    with open(ckpt, "r+b") as f:
        f.truncate(GIB)  # a sparse gigabyte of zeros after the checkpoint's end
    for args in (
        ["checkpoint", "show", str(ckpt)],
        [*RESTORE, str(ckpt)],
    ):
        code, err, rss = run(tmp_path, *args)
        assert code == 1 and "bytes after its end" in refusal(err, "")
        assert rss < SMALL_RSS, f"{args[0]} held {rss >> 20} MiB"


def test_a_header_claiming_a_gigabyte_is_refused_before_the_body_is_read(tmp_path: Path) -> None:
    """The header says the body is a gigabyte, and the file is that long; but the checkpoint
    holds 6 tasks, and the sections its JSON declares add up to a few bytes."""
    forged = bytearray(encode(checkpoint())[:-16])
    body_len = GIB
    forged[12:20] = body_len.to_bytes(8, "little")
    ckpt = tmp_path / "forged.ckpt"
    with open(ckpt, "wb") as f:
        f.write(forged)
        f.truncate(20 + body_len + 16)
    code, err, rss = run(tmp_path, "checkpoint", "show", str(ckpt))
    line = refusal(err, "")
    assert code == 1 and "6 tasks" in line and "bytes" in line, line
    assert rss < SMALL_RSS, f"show held {rss >> 20} MiB"


def sealed(js: bytes, sections: bytes) -> bytes:
    """A blob of this JSON header and these sections, its checksum valid."""
    body = struct.pack("<I", len(js)) + js + sections
    out = MAGIC + struct.pack("<IQ", VERSION, len(body)) + body
    return out + hashlib.blake2b(out, digest_size=16).digest()


def hostile(tmp_path: Path, name: str, edit: dict[str, Any], nest: str | None = None) -> Path:
    """A checkpoint whose JSON header has `edit` applied, and the field `nest` replaced by a
    list nested 100,000 deep; its checksum valid."""
    head, sections = parts(encode(checkpoint(())))
    head.update(edit)
    if nest is not None:
        head[nest] = "NEST"
    js = json.dumps(head).encode().replace(b'"NEST"', b"[" * 100_000 + b"]" * 100_000)
    path = tmp_path / f"{name}.ckpt"
    path.write_bytes(sealed(js, sections))
    return path


@pytest.mark.parametrize(
    ("name", "edit", "nest", "words"),
    [
        ("nested", {}, "job", ["nest"]),
        ("nested-dataset", {}, "dataset", ["nest"]),
        ("created-huge", {"created": 10**400}, None, ["created"]),
        ("created-far", {"created": 1e300}, None, ["created", "out of range"]),
        ("created-negative", {"created": -1e13}, None, ["created", "out of range"]),
        ("floor-huge", {"floor": 2**70}, None, ["floor", "out of range"]),
        ("job-control", {"job": "a\x1b[2Jb"}, None, ["job"]),
    ],
)
def test_hostile_headers_are_refused_in_one_line(
    tmp_path: Path, name: str, edit: dict[str, Any], nest: str | None, words: list[str]
) -> None:
    show_and_restore_refuse(tmp_path, hostile(tmp_path, name, edit, nest), *words)


@pytest.mark.parametrize(
    ("where", "value", "words"),
    [
        (("files", 0, 1), 2**80, ["file 0 size", "out of range"]),
        (("files", 0, 3), 2**70, ["file 0 records", "out of range"]),
        (("files", 0, 0), "/d/a\x00.rio", ["file 0 path"]),
        (("globs", 0), "/d/\x00*.rio", ["glob"]),
        (("cpt",), 2**70, ["chunks per task", "out of range"]),
        (("chunk_size",), 2**70, ["chunk size", "out of range"]),
        (("chunk_size",), 0, ["chunk size", "out of range"]),
        (("format",), "x" * 5000, ["format"]),
    ],
)
def test_hostile_dataset_fields_are_refused_in_one_line(
    tmp_path: Path, where: tuple[Any, ...], value: Any, words: list[str]
) -> None:
    head, sections = parts(encode(checkpoint(())))
    target = head["dataset"]
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    ckpt = tmp_path / "hostile.ckpt"
    ckpt.write_bytes(sealed(json.dumps(head).encode(), sections))
    show_and_restore_refuse(tmp_path, ckpt, *words)


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "job.ckpt"
    os.mkfifo(fifo)  # no writer: opening it to read would block for ever
    for args in (("checkpoint", "show"), RESTORE):
        done = subprocess.run(
            [sys.executable, "-m", "chunkmaster", *args, str(fifo)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and "FIFO" in refusal(done.stderr, ""), done.stderr


def test_another_jobs_checkpoint_restores_only_when_asked(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", 20)
    m = MasterProcess(["--store", ":memory:", "--job", "alpha", "--chunk-per-task", "1"]).start()
    try:
        with MasterConnection(str(m.addr)) as conn:
            conn.set_dataset([data])
        ckpt = tmp_path / "alpha.ckpt"
        code, err, _ = run(tmp_path, "checkpoint", "save", "--addr", str(m.addr), str(ckpt))
        assert code == 0, err
    finally:
        m.kill()
    for job in (["--job", "beta"], []):  # another name, or none ("default")
        code, err, _ = run(tmp_path, *RESTORE, str(ckpt), *job)
        line = refusal(err, f"--restore {ckpt}: ")
        assert code == 1 and "'alpha'" in line and "--restore-other-job" in line, line
    m = MasterProcess(
        ["--store", ":memory:", "--job", "beta", "--restore", str(ckpt), "--restore-other-job"]
    ).start()
    try:
        with MasterConnection(str(m.addr)) as conn:
            assert status_view(conn.status()).ready is True
        assert "restored the data checkpoint of job 'alpha'" in m.log()
    finally:
        m.kill()

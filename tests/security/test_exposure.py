"""Secure by default: a real `chunkmaster master` process listens beyond loopback only with
TLS or a token, or when told `--insecure`; the CLI commands take the matching flags."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence

import pytest
from conftest import RECORDS, Pki
from helpers.master_process import MasterProcess


def _master_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "chunkmaster", "master", "--store", ":memory:", "--port", "0"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "chunkmaster", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def masters() -> Iterator[list[MasterProcess]]:
    started: list[MasterProcess] = []
    yield started
    for m in started:
        m.kill()


def _start(masters: list[MasterProcess], args: Sequence[str]) -> MasterProcess:
    m = MasterProcess(["--store", ":memory:", *args])
    masters.append(m)
    return m.start()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--host", "0.0.0.0"], "--host"),
        (["--host", "10.1.2.3"], "--host"),
        (["--endpoints", "http://127.0.0.1:1", "--store", ""], "--endpoints"),
    ],
)
def test_an_unprotected_master_refuses_to_listen_beyond_loopback(
    args: list[str], named: str
) -> None:
    done = _master_cmd(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert named in lines[0] and "--insecure" in lines[0] and "--token-file" in lines[0]


def test_insecure_lets_it_listen_everywhere_and_says_so(masters: list[MasterProcess]) -> None:
    m = _start(masters, ["--host", "0.0.0.0", "--insecure"])
    assert "no TLS and no token: anyone can call" in m.log()
    port = m.port
    assert _cli("status", "--addr", f"127.0.0.1:{port}").returncode == 0


def test_by_default_it_listens_on_loopback_and_says_so(masters: list[MasterProcess]) -> None:
    m = _start(masters, [])
    assert m.addr is not None and m.addr.startswith("127.0.0.1:")
    assert "listening on loopback only" in m.log()


def test_a_token_opens_every_interface_and_the_cli_needs_it(
    masters: list[MasterProcess], token_file: str, dataset: str
) -> None:
    m = _start(masters, ["--host", "0.0.0.0", "--token-file", token_file])
    addr = f"127.0.0.1:{m.port}"
    refused = _cli("status", "--addr", addr)
    assert refused.returncode == 1 and "unauthenticated" in refused.stderr
    assert _cli("status", "--addr", addr, "--token-file", token_file).returncode == 0
    read = _cli(
        "read",
        "--addr",
        addr,
        "--dataset",
        dataset,
        "--passes",
        "1",
        "--json",
        "--token-file",
        token_file,
    )
    assert read.returncode == 0, read.stderr
    assert f'"records": {RECORDS}' in read.stdout
    assert "job-token" not in m.log()


def test_tls_with_client_certificates_from_the_command_line(
    masters: list[MasterProcess], pki: Pki, tmp_path: object
) -> None:
    m = _start(
        masters,
        [
            "--host",
            "0.0.0.0",
            "--tls-cert",
            pki.server_cert,
            "--tls-key",
            pki.server_key,
            "--tls-client-ca",
            pki.ca,
        ],
    )
    assert "security: mutual TLS, no token" in m.log()
    addr = f"127.0.0.1:{m.port}"
    tls = ["--tls-ca", pki.ca, "--tls-cert", pki.client_cert, "--tls-key", pki.client_key]
    assert _cli("status", "--addr", addr, "--timeout", "2", "--tls-ca", pki.ca).returncode == 1
    assert _cli("status", "--addr", addr, *tls).returncode == 0
    saved = _cli("checkpoint", "save", "--addr", addr, *tls, str(tmp_path) + "/job.ckpt")
    assert "no dataset is set yet" in saved.stderr  # the master's own answer: it got through


def test_the_token_is_never_a_command_line_value(tmp_path: object) -> None:
    helped = _cli("master", "--help").stdout
    assert "--token-file PATH" in helped and "--token " not in helped
    missing = f"{tmp_path}/missing"
    done = _master_cmd("--token-file", missing)
    assert done.returncode == 2
    assert missing not in done.stderr  # a value naming no file may be the token: not echoed
    assert f"--token-file: the value given ({len(missing)} characters" in done.stderr
    assert "is not a file path that exists" in done.stderr

"""Where the token comes from and what one may be, from outside: the real `chunkmaster` CLI
(master and client commands) and real master processes over real gRPC (issue items 9, 14).

A token is one line of printable ASCII; the master and its clients take it from the same
places (chunkmaster.tokens); errors never quote it, nor a value that may have been it; a
trainer is told whether it sent no token or another one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from conftest import TOKEN
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

import chunkmaster
from chunkmaster.client import Connection
from chunkmaster.core.errors import UnauthenticatedError

SECRET = "hunter2-not-a-path"


def run_cli(
    args: Sequence[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`chunkmaster ARGS` with no token variable of the caller's, and `env` over that."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKMASTER_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "chunkmaster", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **(env or {})},
    )


def error_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in out.stderr.splitlines() if line.startswith("chunkmaster: error:")]
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.fixture
def master(token_file: str) -> Iterator[MasterProcess]:
    m = MasterProcess(["--store", ":memory:", "--token-file", token_file]).start()
    try:
        yield m
    finally:
        m.terminate()


@pytest.fixture
def no_token_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CHUNKMASTER_TOKEN", "CHUNKMASTER_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


# ---- a token where its file was expected -----------------------------------------------------


@pytest.mark.parametrize("command", ["master", "status"])
def test_a_token_given_as_the_token_file_is_never_echoed(command: str) -> None:
    # `--token` is argparse's abbreviation of --token-file: the secret lands where a path goes.
    args = [command, "--token", SECRET]
    args += ["--port", "0"] if command == "master" else ["--addr", "127.0.0.1:1"]
    out = run_cli(args)
    assert out.returncode == 2, out.stderr
    err = error_line(out)
    assert SECRET not in out.stderr and SECRET not in out.stdout, out.stderr
    assert "--token-file" in err and "not a file path that exists" in err, err
    assert "Traceback" not in out.stderr


# ---- what a token file may hold ----------------------------------------------------------------

BAD_FILES = {
    "a line break inside": (b"zqx\nzqy\n", "holds a line break"),
    "non-ASCII text": ("zq-caf\u00e9\n".encode(), "holds a non-ASCII character"),
    "bytes that are not text": (b"\xff\xfe\x00zq", "holds a non-ASCII character"),
    "a control character": (b"zq\x01zq", "holds a control character"),
    "nothing": (b"\n", "is empty"),
}


@pytest.fixture(params=sorted(BAD_FILES))
def bad_token_file(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    content, said = BAD_FILES[request.param]
    path = tmp_path / "token"
    path.write_bytes(content)
    return str(path), said


def test_a_master_refuses_a_token_no_client_could_send(bad_token_file: tuple[str, str]) -> None:
    path, said = bad_token_file
    for args, env, source in (
        (["--token-file", path], {}, "--token-file"),
        ([], {"CHUNKMASTER_TOKEN_FILE": path}, "CHUNKMASTER_TOKEN_FILE"),
    ):
        out = run_cli(["master", "--store", ":memory:", "--port", "0", *args], env)
        assert out.returncode == 2, out.stderr
        err = error_line(out)
        assert err.startswith(f"chunkmaster: error: {source}: the token file {path} {said}"), err
        assert out.stderr.strip() == err, out.stderr  # refused before the master starts
        assert "zq" not in out.stderr, err  # the content is never quoted


def test_a_master_refuses_a_control_character_in_the_token_variable() -> None:
    out = run_cli(["master", "--store", ":memory:", "--port", "0"], {"CHUNKMASTER_TOKEN": "ab\tc"})
    assert out.returncode == 2, out.stderr
    err = error_line(out)
    assert err.startswith("chunkmaster: error: CHUNKMASTER_TOKEN: "), err
    assert "control character" in err, err


def test_a_client_refuses_the_same_tokens(
    bad_token_file: tuple[str, str], no_token_variables: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, said = bad_token_file
    out = run_cli(["status", "--addr", "127.0.0.1:1", "--token-file", path])
    assert out.returncode == 2, out.stderr
    assert f"--token-file: the token file {path} {said}" in error_line(out)
    out = run_cli(["status", "--addr", "127.0.0.1:1"], {"CHUNKMASTER_TOKEN_FILE": path})
    assert out.returncode == 2, out.stderr
    assert f"CHUNKMASTER_TOKEN_FILE: the token file {path} {said}" in error_line(out)
    monkeypatch.setenv("CHUNKMASTER_TOKEN_FILE", path)
    with pytest.raises(ValueError, match=f"CHUNKMASTER_TOKEN_FILE: the token file {path} {said}"):
        chunkmaster.Client("127.0.0.1:1", session=False)
    with pytest.raises(ValueError, match="the token given holds a line break"):
        chunkmaster.Client("127.0.0.1:1", token="abc\ndef", session=False)


# ---- the client's token sources are the master's ---------------------------------------------


def test_commands_read_the_token_file_the_master_and_the_slurm_recipe_name(
    master: MasterProcess, token_file: str
) -> None:
    assert master.addr is not None
    out = run_cli(
        ["status", "--addr", master.addr, "--json"], {"CHUNKMASTER_TOKEN_FILE": token_file}
    )
    assert out.returncode == 0, out.stderr
    out = run_cli(["status", "--addr", master.addr], {"CHUNKMASTER_TOKEN": TOKEN})
    assert out.returncode == 0, out.stderr
    both = {"CHUNKMASTER_TOKEN_FILE": token_file, "CHUNKMASTER_TOKEN": TOKEN}
    out = run_cli(["status", "--addr", master.addr], both)
    assert out.returncode == 2, out.stderr
    assert "give the token one way, not both" in error_line(out)


def test_the_client_reads_the_token_file_variable_and_an_explicit_token_wins(
    master: MasterProcess,
    token_file: str,
    no_token_variables: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert master.addr is not None
    monkeypatch.setenv("CHUNKMASTER_TOKEN_FILE", token_file)
    connection = Connection(retry_timeout=10)
    with chunkmaster.Client(master.addr, session=False, connection=connection) as client:
        assert status_view(client.status()).ready is False
    with (
        chunkmaster.Client(master.addr, token="another", session=False) as client,
        pytest.raises(UnauthenticatedError, match="not this master's"),
    ):
        client.status()


# ---- no token, or another one: the trainer is told which --------------------------------------


def test_status_says_whether_no_token_or_another_was_sent(
    master: MasterProcess, tmp_path: Path
) -> None:
    assert master.addr is not None
    out = run_cli(["status", "--addr", master.addr])
    assert out.returncode == 1, out.stderr
    err = error_line(out)
    assert "unauthenticated: no token was sent" in err, err
    assert "--token-file" in err and "CHUNKMASTER_TOKEN_FILE" in err, err
    other = tmp_path / "other"
    other.write_text("not-the-token\n")
    out = run_cli(["status", "--addr", master.addr, "--token-file", str(other)])
    assert out.returncode == 1, out.stderr
    err = error_line(out)
    assert "unauthenticated: the token sent is not this master's" in err, err
    assert TOKEN not in out.stderr and str(len(TOKEN)) not in err, err


def test_a_reading_trainer_without_a_token_is_told_how_to_give_one(
    master: MasterProcess, no_token_variables: None
) -> None:
    assert master.addr is not None
    with chunkmaster.Client(master.addr, connection=Connection(retry_timeout=10)) as client:
        client.start_get_records(0)
        with pytest.raises(UnauthenticatedError, match="no token was sent: give one with"):
            client.next_record(timeout=30)

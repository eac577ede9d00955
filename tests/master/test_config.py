"""The master's configuration: bad flags and environment variables are refused in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.status_view import status_view

from chunkmaster.cli.master_cmd import SETTINGS
from chunkmaster.core.model import FailedPolicy
from chunkmaster.master.config import ConfigError, MasterConfig

# Variables the master reads that a developer's shell may set; cleared so each case is alone.
_MASTER_VARS = {s for setting in SETTINGS for s in setting.env}


def run_master(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in _MASTER_VARS}
    base = {k: v for k, v in base.items() if not k.startswith("CHUNKMASTER_")}
    return subprocess.run(
        [sys.executable, "-m", "chunkmaster", "master", "--store", ":memory:", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PORT": "abc"}, "PORT"),
        ({"CHUNKMASTER_PORT": "70000"}, "CHUNKMASTER_PORT"),
        ({"CHUNKMASTER_TTL": "-1"}, "CHUNKMASTER_TTL"),
        ({"TASK_TIMOUT_DUR": "banana"}, "TASK_TIMOUT_DUR"),
        ({"TASK_TIMEOUT_MAX": "-2"}, "TASK_TIMEOUT_MAX"),
        ({"CHUNK_PER_TASK": "ten"}, "CHUNK_PER_TASK"),
        ({"FAILED_POLICY": "forget"}, "FAILED_POLICY"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
        ({"CHUNKMASTER_STORE_SYNC": "sometimes"}, "CHUNKMASTER_STORE_SYNC"),
        ({"CHUNKMASTER_CHUNK_SIZE": "big"}, "CHUNKMASTER_CHUNK_SIZE"),
        # Retired in favour of --chunk-size: refused rather than silently ignored.
        ({"CHUNKMASTER_LINES_CHUNK_BYTES": "700"}, "CHUNKMASTER_LINES_CHUNK_BYTES"),
        ({"CHUNKMASTER_TFRECORD_CHUNK_BYTES": "700"}, "CHUNKMASTER_TFRECORD_CHUNK_BYTES"),
        ({"CHUNKMASTER_MAX_INFLATED_BYTES": "lots"}, "CHUNKMASTER_MAX_INFLATED_BYTES"),
    ],
)
def test_a_bad_environment_variable_is_one_line_naming_it(env: dict[str, str], named: str) -> None:
    done = run_master([], env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"chunkmaster: error: {named}: "), lines


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--port", "abc"], "--port"),
        (["--port", "-1"], "--port"),
        (["--ttl", "0"], "--ttl"),
        (["--task-timout-dur", "0"], "--task-timeout-dur"),
        (["--task-timeout-dur", "banana"], "--task-timeout-dur"),
        (["--failed-policy", "forget"], "--failed-policy"),
        (["--endpoints", "ftp://etcd:2379"], "--endpoints"),
        (["--endpoints", "127.0.0.1:2379"], "--store and --endpoints"),
        (["--etcd-cert", "c.pem"], "--etcd-cert and --etcd-key"),
        (["--job", "a/b"], "--job"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--metrics-port", "nine"], "--metrics-port"),
        (["--chunk-size", "0"], "--chunk-size"),
        (["--chunk-size", "2GiB"], "--chunk-size"),
        (["--chunk-size", "4MB"], "--chunk-size"),
        (["--max-inflated-bytes", "0"], "--max-inflated-bytes"),
        (["--max-inflated-bytes", "1.5G"], "--max-inflated-bytes"),
        (["--data-root", "s3://"], "--data-root"),
        (["--data-root", "s3://bucket/../other/"], "--data-root"),
        (["--data-root", "s3://bucket/%2e%2e/other/"], "--data-root"),
        (["--data-root", "file://host/data"], "--data-root"),
        (["--restore-other-job"], "--restore-other-job"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it(args: list[str], named: str) -> None:
    done = run_master(args, {})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"chunkmaster: error: {named}: "), lines


def test_the_flag_wins_over_the_environment() -> None:
    """PORT is wrong, but --port is given: the variable is never read."""
    done = run_master(["--port", "-5"], {"PORT": "abc"})
    assert done.returncode == 2 and "error: --port: " in done.stderr, done.stderr


def test_from_text_types_every_field() -> None:
    config = MasterConfig.from_text(
        {
            "port": "0",
            "ttl_sec": "5",
            "task_timeout": "1m30s",
            "task_timeout_max": "0",
            "chunks_per_task": "4",
            "chunk_size": "64KiB",
            "failed_policy": "keep",
            "job": "j1",
            "endpoints": "http://a:2379, b",
            "host": "127.0.0.1",  # loopback: no TLS or token needed
            "etcd_user": "u",
            "etcd_password": "s3cret-pw",
            "max_inflated_bytes": "2GiB",
        }
    )
    assert config.max_inflated_bytes == 2 << 30
    assert config.port == 0 and config.ttl_sec == 5 and config.task_timeout == 90.0
    assert config.chunk_size == 64 << 10
    assert config.failed_policy is FailedPolicy.KEEP and config.job == "j1"
    assert config.etcd is not None and config.store_name == "etcd"
    assert [e.target for e in config.etcd.endpoints] == ["a:2379", "b:2379"]
    assert "s3cret-pw" not in repr(config)  # the password is never printed


@pytest.mark.parametrize(
    ("text", "size"),
    [("65536", 65536), ("64k", 65536), ("64KiB", 65536), ("4M", 4 << 20), ("4MiB", 4 << 20),
     ("1g", 1 << 30), ("700B", 700), (" 32 KiB ", 32 << 10), ("1073741824", 1 << 30),
     ("512MiB", 512 << 20), ("2G", 2 << 30), ("3 GiB", 3 << 30), ("2TiB", 2 << 40)],
)  # fmt: skip
def test_sizes_read_as_size_text_writes_them(text: str, size: int) -> None:
    """--chunk-size and --max-inflated-bytes (and read --max-inflated-bytes) read sizes so."""
    from chunkmaster.core.sizes import size_text
    from chunkmaster.master.config import parse_size

    assert parse_size(text) == size
    assert parse_size(size_text(size)) == size  # what messages suggest can be typed back


@pytest.mark.parametrize("text", ["", "0", "-1", "1.5G", "lots", "12iB", "5 PB", "4MB"])
def test_bad_sizes_are_refused_naming_them(text: str) -> None:
    from chunkmaster.master.config import parse_size

    with pytest.raises(ValueError, match=re.escape(f"{text!r} is not a byte count")):
        parse_size(text)


def test_defaults_and_the_embedded_stores() -> None:
    assert MasterConfig.from_text({}) == MasterConfig()
    assert MasterConfig().store_name == "sqlite"
    assert MasterConfig(store=":memory:").store_name == "memory"


def test_the_constructor_validates_too() -> None:
    with pytest.raises(ConfigError) as info:
        MasterConfig(task_timeout=0)
    assert info.value.fields == ("task_timeout",)
    with pytest.raises(ConfigError):
        MasterConfig(port=65536)


def test_the_ready_file_names_the_address_and_goes_at_a_clean_exit() -> None:
    from helpers.master_process import MasterProcess

    from chunkmaster.client.connection import MasterConnection
    from chunkmaster.master.readiness import read_ready_file

    m = MasterProcess(["--store", ":memory:"]).start()
    try:
        info = read_ready_file(m.ready_file)
        assert info is not None and m.proc is not None
        assert info == {"addr": m.addr, "pid": m.proc.pid, "store": "memory"}
        with MasterConnection(str(info["addr"])) as c:
            assert status_view(c.status()).cur_pass == 0
        assert m.terminate() == 0
        assert read_ready_file(m.ready_file) is None
    finally:
        m.kill()


def test_waiting_for_a_master_that_exits_fails_at_once_with_its_log(tmp_path: Path) -> None:
    from chunkmaster.master.readiness import MasterNotReady, wait_ready

    (tmp_path / "state.db").mkdir()  # a folder where the store file should be: it cannot open
    proc = subprocess.Popen(
        [sys.executable, "-m", "chunkmaster", "master", "--store", str(tmp_path / "state.db"),
         "--port", "0", "--ready-file", str(tmp_path / "ready.json")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with pytest.raises(MasterNotReady, match="exited with code") as info:
            wait_ready(tmp_path / "ready.json", proc, 60)
        assert "state.db" in str(info.value)
    finally:
        proc.kill()
        proc.wait(10)

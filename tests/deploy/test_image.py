"""The container image, built and run for real: a base root file system from Debian's packages
(mmdebstrap), imported into podman, the Containerfile built on it with scripts/build-image.sh,
then a master and two trainers in containers of one pod (loopback only), reading a dataset
from a volume, with the token as a podman secret (a file), every record once per pass.

podman runs with this test's own files: tests/deploy/podman/containers.conf (runc, the
cgroupfs manager, no default ulimits: podman's defaults fail on this machine) and a storage
directory under the test's temporary folder. Nothing on the machine is changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from helpers.datasets import write_records
from helpers.deploy import REPO, ensure

import chunkmaster
from chunkmaster.digest import Digest, file_digest

pytestmark = pytest.mark.cluster

IMAGE = "localhost/chunkmaster:dev"
BASE = "localhost/chunkmaster-base:bookworm"
POD = "chunkmaster-test"
TOKEN_TARGET = "/run/secrets/chunkmaster/token"
PASSES = 2


class Podman:
    """podman with the test's containers.conf and storage."""

    def __init__(self, root: Path) -> None:
        storage = root / "storage.conf"
        storage.write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{root / "graph"}"\n'
            f'runroot = "{root / "run"}"\n'
        )
        self.env = dict(
            os.environ,
            CONTAINERS_CONF=str(REPO / "tests/deploy/podman/containers.conf"),
            CONTAINERS_STORAGE_CONF=str(storage),
        )

    def run(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["podman", *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}")
        return proc


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    if os.geteuid() != 0:
        pytest.skip("needs root: mmdebstrap --mode=root, and podman's runc with cgroupfs")
    ensure("ensure-podman.sh")
    root = tmp_path_factory.mktemp("podman")
    pm = Podman(root)
    yield pm
    pm.run("pod", "rm", "--force", "--ignore", POD, check=False)
    pm.run("rm", "--all", "--force", check=False)
    pm.run("system", "reset", "--force", check=False, timeout=120)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    """localhost/chunkmaster:dev built by `scripts/build-image.sh` on a base made with
    mmdebstrap."""
    tar = tmp_path_factory.mktemp("base") / "base.tar"
    made = subprocess.run(
        ["sh", str(REPO / "scripts/make-base-image.sh"), str(tar)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert made.returncode == 0, f"mmdebstrap failed:\n{made.stderr[-3000:]}"
    podman.run("import", "--quiet", str(tar), BASE)
    tar.unlink()
    name, tag = IMAGE.rsplit(":", 1)  # as `make image IMAGE=... TAG=...` passes them
    env = dict(podman.env, BASE=BASE, IMAGE=name, TAG=tag, PY=sys.executable)
    built = subprocess.run(
        ["sh", str(REPO / "scripts/build-image.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=REPO,
    )
    assert built.returncode == 0, f"build-image.sh failed:\n{built.stdout}\n{built.stderr}"
    return IMAGE


def dataset(d: Path) -> tuple[Digest, int]:
    """Three RecordIO files of distinct records, readable by the image's user."""
    d.mkdir(mode=0o755)
    for f in range(3):
        write_records(
            d / f"part-{f}.rio",
            [f"file {f} record {i} ".encode() + bytes(i % 17) for i in range(300)],
            max_chunk_size=400,
        )
        (d / f"part-{f}.rio").chmod(0o644)
    total = Digest()
    for p in sorted(d.glob("*.rio")):
        total.merge(file_digest(str(p)))
    return total, total.count


def wait_healthy(podman: Podman, name: str, timeout: float = 60.0) -> None:
    """The image's HEALTHCHECK, run as podman's timer would (no systemd here to run it)."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = podman.run("healthcheck", "run", name, check=False)
        if last.returncode == 0:
            return
        time.sleep(0.2)
    logs = podman.run("logs", name, check=False)
    raise AssertionError(f"{name} never healthy: {last}\n{logs.stdout}{logs.stderr}")


def start_master(podman: Podman, name: str, data: Path, *extra: str) -> None:
    podman.run(
        "run", "--detach", "--pod", POD, "--name", name,
        "--secret", f"chunkmaster-token,target={TOKEN_TARGET},uid=10001,mode=0400",
        "--volume", "chunkmaster-state:/var/lib/chunkmaster",
        "--volume", f"{data}:/data:ro",
        "--env", f"CHUNKMASTER_TOKEN_FILE={TOKEN_TARGET}",
        "--env", "CHUNKMASTER_HOST=0.0.0.0",
        "--env", "CHUNKMASTER_DATA_ROOT=/data",
        IMAGE, "master", "--chunk-per-task", "4", *extra,
    )  # fmt: skip
    wait_healthy(podman, name)


def trainer(podman: Podman, name: str, data: Path, args: Sequence[str]) -> None:
    podman.run(
        "run", "--detach", "--pod", POD, "--name", name,
        "--secret", f"chunkmaster-token,target={TOKEN_TARGET},uid=10001,mode=0400",
        "--volume", f"{data}:/data:ro",
        IMAGE, "read", "--addr", "127.0.0.1:8080", *args,
    )  # fmt: skip


def test_master_and_two_trainers_in_one_pod_read_every_record_once(
    podman: Podman, image: str, tmp_path: Path
) -> None:
    expected, n = dataset(tmp_path / "data")
    data = tmp_path / "data"
    token = tmp_path / "token"
    token.write_text(os.urandom(24).hex() + "\n")
    podman.run("secret", "create", "chunkmaster-token", str(token))
    # One pod, no network but its loopback: the containers share it.
    podman.run("pod", "create", "--name", POD, "--network", "none")

    start_master(podman, "master", data)
    # Not root: the image's user, 10001.
    assert podman.run("exec", "master", "id", "-u").stdout.strip() == "10001"
    inspect = json.loads(podman.run("inspect", "master").stdout)[0]
    assert inspect["Config"]["Healthcheck"]["Test"][:2] == ["CMD", "chunkmaster-health"]

    # Without the token a trainer is refused at once.
    refused = podman.run(
        "run", "--rm", "--pod", POD, IMAGE, "read", "--addr", "127.0.0.1:8080",
        "--dataset", "/data/*.rio", "--passes", "1", check=False,
    )  # fmt: skip
    assert refused.returncode == 1 and "UnauthenticatedError" in refused.stderr, refused.stderr

    args = ["--token-file", TOKEN_TARGET, "--dataset", "/data/*.rio", "--passes", str(PASSES)]
    args += ["--json", "--step-time", "0.001"]
    for i in range(2):
        trainer(podman, f"trainer{i}", data, args)
    for i in range(2):
        code = podman.run("wait", f"trainer{i}", timeout=300).stdout.strip()
        logs = podman.run("logs", f"trainer{i}")
        assert code == "0", f"trainer{i} exit {code}: {logs.stderr}"
    lines = [
        [json.loads(x) for x in podman.run("logs", f"trainer{i}").stdout.splitlines()]
        for i in range(2)
    ]
    for p in range(PASSES):
        total = Digest()
        for out in lines:
            (line,) = [x for x in out if x.get("pass") == p and "digest" in x and "task" not in x]
            total.merge(Digest(int(line["digest"], 16), int(line["records"])))
        assert total == expected, f"pass {p}: {total.count} records of {n}, or another digest"

    # The store lives in the volume: a new master container recovers the job where it was.
    assert podman.run("stop", "--time", "20", "master").returncode == 0
    exited = json.loads(podman.run("inspect", "master").stdout)[0]["State"]["ExitCode"]
    assert exited == 0  # SIGTERM: a clean stop
    podman.run("rm", "master")
    start_master(podman, "master2", data)
    status = podman.run(
        "run", "--rm", "--pod", POD,
        "--secret", f"chunkmaster-token,target={TOKEN_TARGET},uid=10001,mode=0400",
        IMAGE, "status", "--addr", "127.0.0.1:8080", "--token-file", TOKEN_TARGET, "--json",
    )  # fmt: skip
    assert json.loads(status.stdout)["cur_pass"] == PASSES


def test_the_image_carries_its_version_and_revision(podman: Podman, image: str) -> None:
    """OCI labels: the package's version (pyproject's, through the wheel) and the commit."""
    labels = json.loads(podman.run("image", "inspect", image).stdout)[0]["Labels"]
    assert labels["org.opencontainers.image.version"] == chunkmaster.__version__
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, check=False
    )
    revision = head.stdout.strip() if head.returncode == 0 else "unknown"
    assert labels["org.opencontainers.image.revision"] == revision

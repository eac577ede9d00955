"""The sdist and the wheel, built as `make dist` builds them (scripts/dist.sh: `python -m build`,
the wheel from the sdist, then `twine check --strict`), and the wheel installed for real: a fresh
virtualenv (`python3 -m venv`, not the project's), `pip install dist/chunkmaster-*.whl`, then,
from the installed package alone (the working directory outside the checkout, no PYTHONPATH, no
CHUNKMASTER_* variable), `chunkmaster --version`, a master and a trainer over a RecordIO
dataset (every record once a pass), the demo; then the `[torch]` extra in the same virtualenv,
with torch from where scripts/bootstrap.sh takes it (its CPU build where the package index or a
wheel folder has it, else PyPI's), and a Loader with two workers reading a pass.

The tests run in file order and share the module's virtualenv: the plain wheel's tests come
first, before torch is installed (they also show the plain install works without torch)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
from helpers.datasets import write_records
from helpers.deploy import REPO

import chunkmaster
from chunkmaster.digest import Digest, file_digest
from chunkmaster.master.readiness import MasterNotReady, wait_ready

pytestmark = pytest.mark.cluster

PACKAGE = REPO / "src" / "chunkmaster"
FILES, RECORDS = 3, 200  # the dataset: 600 distinct records, ~25 chunks a file


@dataclass
class Dist:
    wheel: Path
    sdist: Path


@dataclass
class Venv:
    root: Path
    home: Path  # the working directory of every command: outside the checkout
    env: dict[str, str]

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def run(
        self, *cmd: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            cmd, cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n"
                f"{proc.stderr[-3000:]}"
            )
        return proc

    def pip_install(self, *reqs: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run(self.bin("python"), "-m", "pip", "install", "-q", *reqs, timeout=timeout)


def bare_env(venv: Path) -> dict[str, str]:
    """This process's environment as a user's shell would have it with `venv` activated:
    nothing that points at the checkout or the project's virtualenv, no CHUNKMASTER_*."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("CHUNKMASTER")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """`make dist`'s script, with this Python (the test extra has build and twine)."""
    missing = [m for m in ("build", "twine") if not _importable(m)]
    assert not missing, f"{missing} not installed: the test extra has them (`make test-cluster`)"
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        ["sh", str(REPO / "scripts/dist.sh"), str(out)],
        env=dict(os.environ, PY=sys.executable),
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = f"scripts/dist.sh: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, said
    assert "PASSED" in proc.stdout, proc.stdout  # twine check, once a file
    version = chunkmaster.__version__
    built = sorted(p.name for p in out.iterdir())
    assert built == [f"chunkmaster-{version}-py3-none-any.whl", f"chunkmaster-{version}.tar.gz"]
    return Dist(out / built[0], out / built[1])


def _importable(module: str) -> bool:
    probe = [sys.executable, "-c", f"import {module}"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """A fresh virtualenv with the wheel installed (its dependencies from the package index)."""
    root = tmp_path_factory.mktemp("venv")
    home = tmp_path_factory.mktemp("home")
    assert REPO not in home.parents and REPO not in root.parents
    env = bare_env(root)
    made = subprocess.run(
        ["python3", "-m", "venv", str(root)], env=env, capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    v = Venv(root, home, env)
    v.pip_install(str(dist.wheel))
    yield v
    shutil.rmtree(root, ignore_errors=True)  # 1.6 GB once torch is in: not left for pytest's


def test_the_wheel_holds_the_package_and_its_data_and_the_sdist_what_a_build_needs(
    dist: Dist,
) -> None:
    version = chunkmaster.__version__
    with zipfile.ZipFile(dist.wheel) as whl:
        names = set(whl.namelist())
        info = f"chunkmaster-{version}.dist-info"
        meta = Parser().parsestr(whl.read(f"{info}/METADATA").decode())
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    # Every file of the package in the checkout (the .proto, the .pyi, the dashboard, py.typed
    # and every module) is in the wheel, and nothing outside the package but its metadata.
    package = {
        "chunkmaster/" + p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    for data in ("py.typed", "rpc/master.proto", "rpc/master_pb2.pyi", "master/dashboard.html"):
        assert f"chunkmaster/{data}" in package
    assert package - names == set()
    assert {n.split("/")[0] for n in names} == {"chunkmaster", info}
    assert meta["Name"] == "chunkmaster" and meta["Version"] == version
    assert meta["Requires-Python"] == ">=3.11"
    assert 'extra == "torch"' in " ".join(meta.get_all("Requires-Dist") or [])
    assert "chunkmaster = chunkmaster.cli.main:main" in entry_points
    assert "chunkmaster-health = chunkmaster.healthcheck:main" in entry_points
    # The sdist: what `python -m build` built the wheel from (scripts/dist.sh).
    top = f"chunkmaster-{version}"
    with tarfile.open(dist.sdist) as sd:
        members = {m.name.removeprefix(top + "/") for m in sd.getmembers()}
        pkg_info = sd.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        assert Parser().parsestr(pkg_info.read().decode())["Version"] == version
    assert {"pyproject.toml", "README.md"} <= members
    assert {"src/" + n for n in package} <= members


def test_the_installed_command_says_the_version_and_runs_from_the_virtualenv(
    venv: Venv,
) -> None:
    out = venv.run(venv.bin("chunkmaster"), "--version").stdout
    assert out == f"chunkmaster {chunkmaster.__version__}\n"
    where = venv.run(venv.bin("python"), "-c", "import chunkmaster; print(chunkmaster.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(venv.root), where.stdout
    assert venv.run(venv.bin("chunkmaster-health"), "--help").returncode == 0
    # The plain wheel brings no torch: the extra does (the last test).
    assert venv.run(venv.bin("python"), "-c", "import torch", check=False).returncode != 0


def dataset(d: Path) -> tuple[str, Digest]:
    d.mkdir()
    for f in range(FILES):
        records = [f"file {f} record {i} ".encode() + bytes(i % 13) for i in range(RECORDS)]
        write_records(d / f"part-{f}.rio", records, max_chunk_size=300)
    total = Digest()
    for path in sorted(d.glob("*.rio")):
        total.merge(file_digest(str(path)))
    assert total.count == FILES * RECORDS
    return str(d / "part-*.rio"), total


class Master:
    """`chunkmaster master` from the virtualenv, on its embedded store; its address from its
    ready file (chunkmaster/master/readiness.py)."""

    def __init__(self, venv: Venv, *args: str) -> None:
        self.ready = venv.home / "ready.json"
        self.log = venv.home / "master.log"
        cmd = [venv.bin("chunkmaster"), "master", "--port", "0", "--ready-file", str(self.ready)]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [*cmd, *args], cwd=venv.home, env=venv.env, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self.addr = str(wait_ready(self.ready, self.proc, 60, self.log.read_text)["addr"])
        except MasterNotReady:
            self.close()
            raise

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def test_a_master_and_a_trainer_from_the_wheel_read_every_record_once_a_pass(
    venv: Venv,
) -> None:
    pattern, total = dataset(venv.home / "data")
    master = Master(venv, "--store", str(venv.home / "job.db"))
    try:
        read = venv.run(
            venv.bin("chunkmaster"),
            *("read", "--addr", master.addr, "--dataset", pattern, "--passes", "2", "--json"),
        )
        status = venv.run(venv.bin("chunkmaster"), "status", "--addr", master.addr, "--json")
    finally:
        master.close()
    passes = [json.loads(line) for line in read.stdout.splitlines() if line.startswith("{")]
    assert [p["pass"] for p in passes] == [0, 1], read.stdout
    for p in passes:
        assert Digest(int(p["digest"], 16), int(p["records"])) == total, p
    assert json.loads(status.stdout)["cur_pass"] == 2, status.stdout
    assert master.proc.returncode == 0, master.log.read_text()


def test_the_demo_passes_from_the_wheel(venv: Venv) -> None:
    demo = venv.run(venv.bin("python"), "-m", "chunkmaster.demo", timeout=300)
    assert demo.stdout.rstrip().endswith("PASS"), demo.stdout


#: The Loader's trainer: one pass with two DataLoader workers, every record's number printed.
LOADER_TRAINER = """\
import json
import sys

from chunkmaster.torch import Loader


def number(record):  # at the top level: the workers import it
    return int(record.split()[-1])


if __name__ == "__main__":
    addr, pattern = sys.argv[1:3]
    taken = []
    with Loader(addr, dataset=[pattern], transform=number, batch_size=8, num_workers=2) as loader:
        for batch in loader:
            taken += batch.tolist()
            loader.commit()
    print(json.dumps(taken))
"""


def torch_pins() -> tuple[str, str]:
    """scripts/bootstrap.sh's torch: its CPU build, and the plain release it falls back to."""
    text = (REPO / "scripts/bootstrap.sh").read_text()
    cpu = re.search(r'"(torch==[\w.]+\+cpu)"', text)
    plain = re.search(r'"(torch==[\w.]+)"', text)
    assert cpu and plain, "no torch pins in scripts/bootstrap.sh"
    return cpu[1], plain[1]


def test_the_torch_extra_installs_and_a_loader_reads_a_pass(venv: Venv, dist: Dist) -> None:
    cpu, plain = torch_pins()
    # --no-compile: pip would compile every module of torch (thousands) ahead, half the
    # install's time here; Python compiles those it imports as it imports them.
    extra = (f"{dist.wheel}[torch]", "--no-compile")
    try:
        venv.pip_install(*extra, cpu)
    except AssertionError:  # no CPU build here: bootstrap.sh falls back to PyPI's torch
        venv.pip_install(*extra, plain, timeout=1800)
    d = venv.home / "numbers"
    d.mkdir()
    n = 300
    write_records(d / "n.rio", [b"%06d" % i for i in range(n)], max_chunk_size=60)
    (venv.home / "loader_trainer.py").write_text(LOADER_TRAINER)
    master = Master(venv, "--store", str(venv.home / "loader.db"))
    try:
        run = venv.run(
            venv.bin("python"), "loader_trainer.py", master.addr, str(d / "n.rio"), timeout=180
        )
    finally:
        master.close()
    assert Counter(json.loads(run.stdout.splitlines()[-1])) == Counter(range(n))

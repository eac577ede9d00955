"""Shared fixtures: puts tests/ on the path for `helpers`; the real etcd server, master
processes on the embedded store, `chunkmaster read` trainer processes, and a small filesystem to
fill up (`small_fs`). Marks `slow` every test that starts processes (`make test-fast` leaves
them out, `make test` runs them)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import inspect  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from helpers.etcd_server import etcd_server  # noqa: E402, F401
from helpers.full_disk import small_fs  # noqa: E402, F401
from helpers.master_process import MasterProcess  # noqa: E402
from helpers.trainers import Trainer  # noqa: E402

#: Fixtures that start a process (a master, trainers, etcd, an S3 server) or mount a filesystem.
PROCESS_FIXTURES = frozenset(
    {"master_process", "trainers", "etcd_server", "s3_server", "s3", "small_fs"}
)
#: A test module that imports one of these starts processes (or, for helpers.deploy and
#: helpers.reference_recordio, installs or downloads what it needs): all its tests are slow.
PROCESS_MODULES = frozenset(
    {
        "subprocess",
        "multiprocessing",
        "helpers.master_process",
        "helpers.etcd_server",
        "helpers.s3_server",
        "helpers.full_disk",
        "helpers.deploy",
        "helpers.reference_recordio",
        "helpers.session_trainer_process",
    }
)
#: What of helpers.trainers starts `chunkmaster read` processes (the rest is datasets, digests).
PROCESS_NAMES = frozenset({"Trainer", "wait_until_holding"})
#: Directories whose every test starts processes: PyTorch DataLoader workers, containers.
#: No directory here is named after a package the tests import: with tests/ on sys.path it
#: would be imported in the package's place (a `torch` directory makes importorskip("torch")
#: succeed on a machine without PyTorch).
PROCESS_DIRS = frozenset({"loader", "deploy"})


def _starts_processes(item: pytest.Item) -> bool:
    if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    path = Path(str(item.fspath)).resolve()
    if path.parent.name in PROCESS_DIRS and path.parent.parent == Path(_TESTS):
        return True
    module = getattr(item, "module", None)
    for name, value in vars(module).items() if module is not None else ():
        origin = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", "")
        origin = str(origin).removeprefix("tests.")  # `from tests.helpers...` too
        if origin in PROCESS_MODULES or (origin == "helpers.trainers" and name in PROCESS_NAMES):
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under -m "not slow", the directories of process tests are not even imported (PyTorch
    alone takes seconds to import)."""
    if config.getoption("markexpr", "").strip() != "not slow":
        return None
    here = collection_path.resolve()
    return (here.name in PROCESS_DIRS and here.parent == Path(_TESTS)) or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow`: the tests that start processes; the rest are pure or in-process (`make
    test-fast`: pytest -m "not slow")."""
    slow = pytest.mark.slow
    for item in items:
        if item.get_closest_marker("slow") is None and _starts_processes(item):
            item.add_marker(slow)


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[Any]:
    """trainers(n, args) -> [Trainer] (`chunkmaster read` processes); SIGKILLed at teardown."""
    made: list[Trainer] = []

    def start(n: int, args: Sequence[str], prefix: str = "trainer") -> list[Trainer]:
        new = [Trainer(f"{prefix}{len(made) + i}", args, tmp_path) for i in range(n)]
        made.extend(new)
        return new

    yield start
    for t in made:
        t.kill()


@pytest.fixture
def master_process(tmp_path: Path) -> Iterator[Any]:
    """master_process(*args) -> a started MasterProcess on the embedded store; killed after."""
    made: list[MasterProcess] = []

    def start(*args: str) -> MasterProcess:
        m = MasterProcess(
            ["--store", str(tmp_path / f"state{len(made)}.db"), *args],
            log_path=tmp_path / f"master{len(made)}.log",
        ).start()
        made.append(m)
        return m

    yield start
    for m in made:
        m.kill()

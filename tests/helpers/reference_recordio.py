"""The reference library (Go, via ctypes) from the PyPI wheel recordio==0.1.7, fetched once.

Its only wheel is tagged cp35, so it is downloaded for that tag and unpacked instead of installed.
Shared by the interop tests and bench/recordio_bench.py.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE = REPO_ROOT / ".cache" / "recordio-0.1.7"


def reference_module() -> ModuleType:
    """Download (once), unpack and import the reference `recordio` package; raise on failure."""
    purelib = CACHE / "x" / "recordio-0.1.7.data" / "purelib"
    if not (purelib / "recordio").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        wheels = list(CACHE.glob("recordio-0.1.7-*.whl"))
        if not wheels:
            subprocess.run(
                [
                    sys.executable, "-m", "pip", "download", "recordio==0.1.7", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.5", "--implementation", "cp",
                    "--abi", "cp35m", "--platform", "manylinux1_x86_64", "-q", "-d", str(CACHE),
                ],
                check=True,
            )  # fmt: skip
            wheels = list(CACHE.glob("recordio-0.1.7-*.whl"))
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(CACHE / "x")
    _ensure_six()
    if str(purelib) not in sys.path:
        sys.path.insert(0, str(purelib))
    module = importlib.import_module("recordio")
    if not hasattr(module, "reader"):
        raise ImportError(f"{module.__file__} is not the reference recordio wrapper")
    return module


def _ensure_six() -> None:
    """The wrapper imports `six` for three names; provide them if six is not installed."""
    try:
        importlib.import_module("six")
    except ImportError:
        six = ModuleType("six")
        six.text_type = str  # type: ignore[attr-defined]
        six.binary_type = bytes  # type: ignore[attr-defined]
        six.b = lambda s: s.encode("latin-1")  # type: ignore[attr-defined]
        sys.modules["six"] = six


def read_all(module: ModuleType, path: str) -> list[bytes]:
    """Every record the reference reader returns (None ends the list: EOF or error alike)."""
    r = module.reader(path)
    out: list[bytes] = []
    try:
        while (rec := r.read()) is not None:
            out.append(rec)
    finally:
        r.close()
    return out


def write_all(module: ModuleType, path: str, records: list[bytes]) -> None:
    """Write with the reference writer (its defaults: 32 MiB chunks, snappy)."""
    w = module.writer(path)
    try:
        for rec in records:
            w.write(rec)
    finally:
        w.close()

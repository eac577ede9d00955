"""The house's layers, read from the source: what imports what (docs/architecture.md).

- No import circle anywhere in `chunkmaster`, type-hint imports included: neither between
  modules nor between packages (`chunkmaster.recordio`, `chunkmaster.formats`, ...).
- `core/` is pure: it imports nothing of the shell.
- `store/` imports nothing of `etcd/`; `etcd/` uses only `store.base` of `store/`.
- A trainer's `import chunkmaster` loads nothing of the master, its stores or SQLite.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import chunkmaster

SRC = Path(chunkmaster.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports() -> dict[str, set[str]]:
    """Each module's imports of chunkmaster modules, wherever they are written (in functions,
    under TYPE_CHECKING): `from pkg import mod` names the module, `from mod import x` the
    module."""
    modules = _modules()

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("chunkmaster"):
                assert node.module is not None
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in modules else known(node.module))
            elif isinstance(node, ast.Import):
                deps.update(known(a.name) for a in node.names if a.name.startswith("chunkmaster"))
        deps.discard(name)
        graph[name] = deps
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the path around it; None if there is none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(mod: str) -> list[str] | None:
        state[mod] = 1
        path.append(mod)
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)) is not None:
                return found
        path.pop()
        state[mod] = 2
        return None

    for mod in sorted(graph):
        if mod not in state and (found := visit(mod)) is not None:
            return found
    return None


def test_no_import_circle() -> None:
    circle = _circle(_imports())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with each module collapsed to its package (`chunkmaster.X`); a
    top-level module such as `chunkmaster.logs` is a package of its own."""

    def package(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        outside = {package(d) for d in deps} - {package(mod)}
        packages.setdefault(package(mod), set()).update(outside)
    return packages


def test_no_package_circle() -> None:
    circle = _circle(_packages(_imports()))
    assert circle is None, "package circle: " + " -> ".join(circle or [])


def test_recordio_imports_nothing_of_the_formats() -> None:
    graph = _imports()
    assert not {
        (m, d)
        for m, deps in graph.items()
        if m.startswith("chunkmaster.recordio")
        for d in deps
        if d.startswith("chunkmaster.formats")
    }


def test_core_imports_nothing_of_the_shell() -> None:
    graph = _imports()
    outside = {
        (mod, dep)
        for mod, deps in graph.items()
        if mod.startswith("chunkmaster.core")
        for dep in deps
        if not dep.startswith("chunkmaster.core")
    }
    assert not outside


def test_store_and_etcd_import_one_way() -> None:
    graph = _imports()
    store_to_etcd = {
        (m, d)
        for m, deps in graph.items()
        if m.startswith("chunkmaster.store")
        for d in deps
        if d.startswith("chunkmaster.etcd")
    }
    etcd_to_store = {
        d
        for m, deps in graph.items()
        if m.startswith("chunkmaster.etcd")
        for d in deps
        if d.startswith("chunkmaster.store")
    }
    assert not store_to_etcd
    assert etcd_to_store <= {"chunkmaster.store.base"}


def test_a_trainer_imports_nothing_of_the_master() -> None:
    """`import chunkmaster` in a fresh interpreter: the client, the core's values and errors,
    the formats; not the service, the stores, the state machine, SQLite or etcd's master side."""
    code = "import json, sys, chunkmaster; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert "chunkmaster.client.client" in loaded
    master_side = sorted(
        m
        for m in loaded
        if m.startswith(("chunkmaster.master", "chunkmaster.store"))
        or m
        in (
            "sqlite3",
            "chunkmaster.core.state",
            "chunkmaster.core.master_state",
            "chunkmaster.core.queues",
            "chunkmaster.core.passes",
            "chunkmaster.core.commits",
            "chunkmaster.core.mixture_events",
            "chunkmaster.core.restore",
            "chunkmaster.core.codec",
            "chunkmaster.etcd.journal",
            "chunkmaster.etcd.election",
        )
    )
    assert master_side == []
    # ... and the master's names are there all the same, on first use.
    assert chunkmaster.Service.__module__ == "chunkmaster.master.service"
    assert chunkmaster.SqliteStore.__module__ == "chunkmaster.store.sqlite"


MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 400
MAX_CLASS_METHODS = 25


def _definitions() -> Iterator[tuple[str, ast.AST]]:
    for path in SRC.rglob("*.py"):
        if "_pb2" in path.name:
            continue
        name = path.relative_to(SRC.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            yield name, node


def _lines(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_function_is_longer_than_60_lines() -> None:
    long = {
        f"{path}:{node.name}"
        for path, node in _definitions()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and _lines(node) > MAX_FUNCTION_LINES
    }
    assert not long, sorted(long)


def test_no_class_is_over_400_lines_or_25_methods() -> None:
    """A class that grows past these has taken on several jobs: split it at its seams."""
    large = {
        f"{path}:{node.name}"
        for path, node in _definitions()
        if isinstance(node, ast.ClassDef)
        and (
            _lines(node) > MAX_CLASS_LINES
            or sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
            > MAX_CLASS_METHODS
        )
    }
    assert not large, sorted(large)

"""deploy/kubernetes/'s overlays rendered as `kubectl apply -k` would apply them: `kubectl
kustomize` (Debian's kubernetes-client when there is no kubectl: scripts/ensure-kubectl.sh)."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from helpers.deploy import REPO, ensure

KUBERNETES = REPO / "deploy/kubernetes"
OVERLAYS = sorted(p.parent.name for p in (KUBERNETES / "overlays").glob("*/kustomization.yaml"))


def render(directory: Path) -> list[dict[str, Any]]:
    """Every object the kustomization at `directory` makes."""
    if shutil.which("kubectl") is None:
        ensure("ensure-kubectl.sh")  # skips, saying why, where it cannot install kubectl
    proc = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory}:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@functools.cache
def overlay(name: str) -> tuple[dict[str, Any], ...]:
    """The objects of deploy/kubernetes/overlays/NAME."""
    return tuple(render(KUBERNETES / "overlays" / name))


def kustomization(name: str) -> dict[str, Any]:
    """overlays/NAME/kustomization.yaml as data."""
    doc = yaml.safe_load((KUBERNETES / "overlays" / name / "kustomization.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def pod_template(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A workload's pod template; None for any other object."""
    if obj["kind"] in ("StatefulSet", "Deployment", "Job"):
        template = obj["spec"]["template"]
        assert isinstance(template, dict)
        return template
    return None


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found

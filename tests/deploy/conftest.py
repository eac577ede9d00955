"""The deployment tests. Those marked `cluster` build a container image with mmdebstrap and
podman, or run a real Slurm: they install what they need (scripts/ensure-*.sh), take minutes,
and run under `make test-cluster` (CHUNKMASTER_CLUSTER_TESTS=1), not under `make test`."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("CHUNKMASTER_CLUSTER_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="a cluster test: `make test-cluster` runs it")
    for item in items:
        if item.get_closest_marker("cluster") is not None:
            item.add_marker(skip)

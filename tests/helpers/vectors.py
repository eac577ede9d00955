"""The RecordIO reference vectors (tests/data/recordio), records regenerated from manifests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

# The manifests the reference produced; listed so that a vanished file fails loudly.
MANIFESTS = [
    "default_10000",
    "empty",
    "hello_world_default",
    "hello_world_none",
    "maxchunk0_none",
    "mixed_gzip",
    "mixed_none",
    "mixed_snappy",
    "small_gzip",
    "small_none",
    "small_snappy",
    "text10000_maxchunk1000_none",
]


# Written by the reference Go library; kept in the repository so that a bare clone tests itself.
VECTORS_DIR = Path(__file__).resolve().parents[1] / "data" / "recordio"


def vectors_dir() -> Path:
    """The vectors folder; fails loudly if the repository lost it."""
    if not (VECTORS_DIR / "errors" / "errors.json").is_file():
        pytest.fail(f"RecordIO reference vectors missing from {VECTORS_DIR}", pytrace=False)
    return VECTORS_DIR


def load_manifest(name: str) -> dict[str, Any]:
    with open(vectors_dir() / f"{name}.recordio.json") as fh:
        manifest: dict[str, Any] = json.load(fh)
    return manifest


def vector_path(name: str) -> Path:
    return vectors_dir() / f"{name}.recordio"


def make_record(entry: dict[str, Any]) -> bytes:
    """Regenerate record bytes from a manifest entry per its `content_rules`, then check them."""
    i, n, kind = entry["i"], entry["len"], entry["kind"]
    if kind == "empty":
        data = b""
    elif kind == "pat":
        base = (i * 13) % 251
        data = bytes((base + j) % 251 for j in range(n))
    elif kind == "rnd":
        blocks = []
        k = 0
        while 32 * k < n:
            blocks.append(hashlib.sha256(f"rnd:{i}:{k}".encode()).digest())
            k += 1
        data = b"".join(blocks)[:n]
    elif kind == "text":
        data = f"{i}:".encode() + chr(97 + i % 26).encode() * (i % 23)
    elif kind == "lit":
        data = bytes.fromhex(entry["hex"])
    else:
        raise AssertionError(f"unknown record kind {kind!r}")
    assert len(data) == n, entry
    if "hex" in entry:
        assert data.hex() == entry["hex"], entry
    if "sha256" in entry:
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry
    return data


def manifest_records(manifest: dict[str, Any]) -> list[bytes]:
    return [make_record(e) for e in manifest["records"]]


def load_errors() -> dict[str, Any]:
    with open(vectors_dir() / "errors" / "errors.json") as fh:
        cases: dict[str, Any] = json.load(fh)
    return cases

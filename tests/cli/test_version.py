"""The version is written once, `chunkmaster.__version__`; pyproject.toml reads it (a dynamic
version) and `chunkmaster --version` prints it. tests/deploy/test_wheel.py checks the built
wheel's metadata and the installed command against it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

import chunkmaster
from chunkmaster.cli.main import main

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"


def test_pyproject_takes_the_version_from_the_package_and_writes_none_of_its_own() -> None:
    meta = tomllib.loads(PYPROJECT.read_text())
    assert "version" not in meta["project"]
    assert "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "chunkmaster.__version__"}
    assert str(Version(chunkmaster.__version__)) == chunkmaster.__version__  # PEP 440, normal


def test_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"chunkmaster {chunkmaster.__version__}\n"


def test_help_names_the_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--version" in capsys.readouterr().out


def test_the_docs_name_the_files_and_the_version_of_this_release() -> None:
    """docs/install.md and docs/torch.md name dist/'s files (chunkmaster-0.1.0-py3-none-any.whl)
    and what `--version` prints: a new `__version__` fails here until they say it too."""
    said: dict[str, set[str]] = {}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        found = re.findall(r"chunkmaster-(\d+(?:\.\d+)+)(?:-py3|\.tar\.gz)", text)
        found += re.findall(r"# chunkmaster (\d+(?:\.\d+)+)", text)
        if found:
            said[doc.name] = set(found)
    assert {"install.md", "torch.md"} <= set(said)
    assert all(v == {chunkmaster.__version__} for v in said.values()), said

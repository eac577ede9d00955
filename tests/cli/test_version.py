"""The version is written once, `chunkmaster.__version__`; pyproject.toml reads it (a dynamic
version) and `chunkmaster --version` prints it. tests/deploy/test_wheel.py checks the built
wheel's metadata and the installed command against it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

import chunkmaster
from chunkmaster.cli.main import main

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


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

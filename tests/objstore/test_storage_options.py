"""Storage options as users write them: `--storage-option KEY=VALUE` (repeatable, or one per
line in the variable), `--storage-options-file FILE`; errors name the flag and never quote a
value; the config never prints them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from chunkmaster.cli.common import CliError
from chunkmaster.cli.master_cmd import config_from, register
from chunkmaster.formats.options import merge, parse_settings


def parse(argv: list[str], environ: dict[str, str] | None = None) -> object:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return config_from(parser.parse_args(["master", *argv]), environ or {})[0]


def test_settings_read_types_and_dotted_keys() -> None:
    assert parse_settings(
        ["endpoint_url=http://h:9000/a=b", "anon=true", "n=3", "client_kwargs.region_name=x"]
    ) == {
        "endpoint_url": "http://h:9000/a=b",
        "anon": True,
        "n": 3,
        "client_kwargs": {"region_name": "x"},
    }
    assert merge({"a": 1, "c": {"x": 1, "y": 2}}, {"a": 2, "c": {"y": 3}}) == {
        "a": 2,
        "c": {"x": 1, "y": 3},
    }


def test_flags_over_the_file_and_never_in_the_repr(tmp_path: Path) -> None:
    f = tmp_path / "s3.json"
    f.write_text(json.dumps({"key": "AKIA1", "secret": "top-secret-value", "anon": True}))
    config = parse(
        ["--storage-options-file", str(f), "--storage-option", "anon=false",
         "--storage-option", "client_kwargs.region_name=eu-west-1"]
    )  # fmt: skip
    assert config.storage_options == {  # type: ignore[attr-defined]
        "key": "AKIA1",
        "secret": "top-secret-value",
        "anon": False,
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    assert "top-secret-value" not in repr(config)
    from_env = parse([], {"CHUNKMASTER_STORAGE_OPTION": "anon=true\nendpoint_url=http://h,x"})
    assert from_env.storage_options == {  # type: ignore[attr-defined]
        "anon": True,
        "endpoint_url": "http://h,x",
    }


def test_bad_options_name_the_flag_and_never_quote_the_value(tmp_path: Path) -> None:
    with pytest.raises(CliError) as err:
        parse(["--storage-option", "secret-without-a-key"])
    assert "--storage-option" in str(err.value) and "secret-without-a-key" not in str(err.value)
    bad = tmp_path / "bad.json"
    bad.write_text('{"secret": "leaky-secret"')
    with pytest.raises(CliError) as err:
        parse(["--storage-options-file", str(bad)])
    assert str(bad) in str(err.value) and "leaky-secret" not in str(err.value)
    with pytest.raises(CliError, match="does not hold a JSON object"):
        bad.write_text('["x"]')
        parse(["--storage-options-file", str(bad)])

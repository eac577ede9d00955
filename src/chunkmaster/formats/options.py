"""`storage_options` from what a user writes: `KEY=VALUE` settings and a JSON file.

The options go to the fsspec filesystem of URL datasets (s3fs: `endpoint_url`, `anon`,
`key`/`secret`, `client_kwargs`, ...). They may hold credentials, so no error here quotes a
value: errors name the setting by its key or its position, and the file by its path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def parse_value(text: str) -> Any:
    """`true`, `false`, `null` and numbers as JSON reads them; anything else as the text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if value is None or isinstance(value, bool | int | float) else text


def parse_settings(items: Iterable[str]) -> dict[str, Any]:
    """`KEY=VALUE` settings as a dict; a dotted key (`client_kwargs.region_name=...`) sets a
    nested one."""
    out: dict[str, Any] = {}
    for n, item in enumerate(items, 1):
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"storage option {n} is not KEY=VALUE")
        *parents, leaf = key.split(".")
        where = out
        for part in parents:
            nested = where.setdefault(part, {})
            if not isinstance(nested, dict):
                raise ValueError(f"storage option {key!r}: {part!r} is already a value")
            where = nested
        where[leaf] = parse_value(text)
    return out


def read_file(path: str) -> dict[str, Any]:
    """The JSON object held in `path`."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        raise ValueError(
            f"{path} is not valid JSON" + (f" (line {line})" if line else "")
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object of storage options")
    return value


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, nested dicts merged key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out

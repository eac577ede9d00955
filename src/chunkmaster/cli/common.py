"""Helpers shared by the command modules: errors, durations, environment defaults."""

from __future__ import annotations

import os
import re


class CliError(Exception):
    """A user-facing error: printed as one line, exits non-zero."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go-style duration ("20m", "1.5s", "1h2m3s", "300ms") into seconds.

    A bare number is taken as seconds, which Go would reject; users type it.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    try:
        return sign * float(s)
    except ValueError:
        pass
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r} (examples: 20m, 1.5s, 1h30m, 500ms)")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def env_default(names: tuple[str, ...], default: str) -> str:
    """The first set environment variable among `names`, else `default`."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value != "":
            return value
    return default

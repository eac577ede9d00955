"""Helpers shared by the command modules: errors and durations."""

from __future__ import annotations

from chunkmaster.master.config import parse_duration

__all__ = ["CliError", "parse_duration"]


class CliError(Exception):
    """A user-facing error: printed as one line, exits non-zero."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

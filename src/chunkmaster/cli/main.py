"""Entry point of the `chunkmaster` command: builds the parser from each command module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from chunkmaster import __version__
from chunkmaster.cli import (
    checkpoint_cmd,
    master_cmd,
    read_cmd,
    recordio_cmd,
    status_cmd,
    weights_cmd,
)
from chunkmaster.cli.common import CliError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chunkmaster",
        description=(
            "Fault-tolerant data dispatch for distributed training over dataset files "
            "(RecordIO, Parquet, JSON Lines, text, TFRecord, WebDataset; local or in an "
            "object store)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"chunkmaster {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (recordio_cmd, master_cmd, status_cmd, read_cmd, checkpoint_cmd, weights_cmd):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "master":  # the master logs them, in its log's format
        for warning in master_cmd.unknown_variables(os.environ):
            print(f"chunkmaster: warning: {warning}", file=sys.stderr)
    try:
        code: int = args.func(args)
    except CliError as exc:
        print(f"chunkmaster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `chunkmaster recordio cat big.rio | head` is normal use, not an error.
        sys.stderr.close()
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())

"""`chunkmaster status`: placeholder until its issue lands."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("status", help="(not yet available)")
    p.set_defaults(func=lambda args: 2)

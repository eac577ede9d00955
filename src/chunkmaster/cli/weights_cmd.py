"""`chunkmaster weights`: change a mixture's weights, from now on or by a schedule, maybe
adding sources to it (`--add`, docs/mixtures.md). The units of the pass never handed out are
planned again under them; it prints where they took effect."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from chunkmaster.cli.common import CliError, add_master_location, add_security_flags, ask_master


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "weights",
        help="change a mixture's weights (from now on, or a schedule by records planned), "
        "or add a source",
        description=(
            "Give a mixture job new weights, every source by name (0 retires one). One POINT "
            "is the weights from now on: web=0.7,code=0.2,books=0.1. Several make a schedule "
            "by records planned over the whole job (`chunkmaster status` shows the count so "
            "far): the first from record 0, each next one RECORDS:NAME=W,...; between two "
            "points the weights are held, or with --linear interpolated. Nothing handed out "
            "is planned again: the units of the pass nobody has had are. --add adds a source "
            "to the running job first (it starts at its epoch 0; a pass keeps its units): the "
            "POINTs then name it too, or without POINTs the weights in force hold and each "
            "added source has its @WEIGHT on the same scale."
        ),
    )
    add_master_location(p, positionals=True)
    p.add_argument(
        "points",
        nargs="*",
        metavar="POINT",
        help="[RECORDS:]NAME=WEIGHT[,NAME=WEIGHT...]; the first without RECORDS (or 0:)",
    )
    p.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="NAME=PATTERN@WEIGHT",
        help="add a source to the mixture, as read's --source names one (@WEIGHT may be left "
        "out: 1; its files' format by their names, or the master's --format); repeat it for "
        "more sources, or more patterns of one",
    )
    p.add_argument(
        "--linear", action="store_true", help="interpolate between points (default: held)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an answer")
    add_security_flags(p)
    p.set_defaults(func=run)


def parse_point(text: str, first: bool) -> tuple[int, dict[str, float]]:
    """`[RECORDS:]NAME=W,...` as (records, weights by name); CliError naming what is wrong."""
    at, sep, rest = text.partition(":")
    if not sep or "=" in at:
        at, rest = "0", text
    try:
        records = int(at)
    except ValueError:
        raise CliError(f"weights: {at!r} in {text!r} is not a record count") from None
    if records < 0 or (first and records != 0):
        raise CliError(f"weights: {text!r}: the first point is at record 0, later ones after")
    out: dict[str, float] = {}
    for part in rest.split(","):
        name, eq, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not eq or not name or not math.isfinite(weight) or weight < 0:
            raise CliError(f"weights: {part!r} in {text!r} is not NAME=WEIGHT (a number >= 0)")
        if name in out:
            raise CliError(f"weights: {text!r} names {name!r} twice")
        out[name] = weight
    return records, out


def run(args: argparse.Namespace) -> int:
    if not args.points and not args.add:
        raise CliError("weights: give the weights (POINT), or a source to add (--add)")
    points = [parse_point(t, i == 0) for i, t in enumerate(args.points)]
    mode = "linear" if args.linear else "step"
    from chunkmaster.cli.read_cmd import parse_sources
    from chunkmaster.client.connection import DATASET_TIMEOUT
    from chunkmaster.client.mixture import schedule_to_pb, sources_to_pb

    wire = schedule_to_pb(points)
    add = sources_to_pb(parse_sources(args.add, "--add"))
    wait = max(args.timeout, DATASET_TIMEOUT) if add else None  # the master indexes them
    pass_id, unit, records = ask_master(args, lambda conn: conn.set_weights(wire, mode, add, wait))
    if args.json:
        print(json.dumps({"pass": pass_id, "unit": unit, "records": records}))
    else:
        where = (
            f"pass {pass_id} from its unit {unit} on" if unit else f"pass {pass_id} from its start"
        )
        added = "".join(f"source {s.name} added; " for s in add)
        print(f"{added}weights set: in effect at record {records:,} ({where})")
    return 0

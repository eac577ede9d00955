"""A mixture as a trainer names it (docs/mixtures.md): named sources, each its own patterns,
weight and format, and weight schedules, as the wire carries them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from chunkmaster.rpc import master_pb2 as pb


@dataclass(frozen=True)
class Source:
    """One source of a mixture: its file patterns (one or several), its weight when the
    dataset is set (later ones with `Client.set_weights`), and its files' format (None: by
    their names, or the master's --format)."""

    patterns: Sequence[str] | str
    weight: float = 1.0
    format: str | None = None

    @property
    def globs(self) -> list[str]:
        return [self.patterns] if isinstance(self.patterns, str) else list(self.patterns)


#: What `Client.set_dataset` takes for a mixture: source name -> a Source, or its patterns
#: (weight 1).
Sources = Mapping[str, "Source | Sequence[str] | str"]
#: What `Client.set_weights` takes: weights by source name from now on, or a schedule of
#: (records planned over the whole job, weights by source name), the first at 0.
Schedule = Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]


class WeightChange(NamedTuple):
    """Where new weights took effect: from unit `unit` of pass `pass_id` on, after `records`
    records planned over the whole job (`unit` equal to a pass's units: the next pass)."""

    pass_id: int
    unit: int
    records: int


def absolute(patterns: Sequence[str]) -> list[str]:
    """Local patterns made absolute in this trainer's working directory (URLs as they are)."""
    return [
        os.path.abspath(p) if isinstance(p, str) and p and "://" not in p else p for p in patterns
    ]


def sources_to_pb(sources: Sources) -> list[pb.Source]:
    """The wire's sources, in the mapping's order, patterns absolute."""
    out = []
    for name, spec in sources.items():
        src = spec if isinstance(spec, Source) else Source(spec)
        out.append(
            pb.Source(
                name=name, globs=absolute(src.globs), weight=src.weight, format=src.format or ""
            )
        )
    return out


def schedule_to_pb(weights: Schedule) -> list[pb.WeightPoint]:
    points: Sequence[tuple[int, Mapping[str, float]]]
    points = [(0, weights)] if isinstance(weights, Mapping) else weights
    return [
        pb.WeightPoint(
            records=at,
            weights=[pb.SourceWeight(name=n, weight=float(w)) for n, w in by_name.items()],
        )
        for at, by_name in points
    ]

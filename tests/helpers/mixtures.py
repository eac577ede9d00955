"""Checks of a mixture's plans and shares, shared by the core and the process tests."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from chunkmaster.core.dataset import Dataset

WINDOW = 10_000


def check_source_epochs(ds: Dataset, plans: dict[int, list[int]]) -> dict[int, int]:
    """Each source's tasks, in the order the passes' plans hold them, are whole epochs: every
    task of the source once, then again (the last epoch may be unfinished, never repeating).
    Returns each source's complete epochs."""
    per_source: dict[int, list[int]] = defaultdict(list)
    for p in sorted(plans):
        for t in plans[p]:
            per_source[ds.source_of(t)].append(t)
    epochs = {}
    for s, tasks in per_source.items():
        own = set(ds.source_tasks(s))
        n = len(own)
        for i in range(0, len(tasks), n):
            block = tasks[i : i + n]
            assert len(set(block)) == len(block), f"source {s}: a task twice in one epoch"
            assert set(block) <= own
        epochs[s] = len(tasks) // n
    return epochs


def windows(consumed: list[tuple[int, int]], sources: int) -> list[list[float]]:
    """Each source's share of every window of WINDOW consumed records after the first."""
    out, acc, total, lo, seen = [], [0] * sources, 0, 0, 0
    for s, r in consumed:
        acc[s] += r
        total += r
        seen += r
        while total - consumed[lo][1] >= WINDOW:
            acc[consumed[lo][0]] -= consumed[lo][1]
            total -= consumed[lo][1]
            lo += 1
        if total >= WINDOW and seen >= 2 * WINDOW:
            out.append([a / total for a in acc])
    return out


STAGES = ("dispatched", "consumed", "committed", "quarantined", "dropped", "padded")


def check_ledger_sums(ledger: Any) -> None:
    """Each pass's per-source counts add up to the pass's, stage by stage and reason by reason:
    `ledger` is the state's (pass -> PassLedger, sources by index) or the status's (a list of
    objects, sources by name)."""
    rows = (
        [
            (p, vars_of(led), {s: vars_of(c) for s, c in led.sources.items()})
            for p, led in ledger.items()
        ]
        if isinstance(ledger, dict)
        else [(led["pass"], led, led["sources"]) for led in ledger]
    )
    for p, led, sources in rows:
        for stage in STAGES:
            got = sum(c[stage] for c in sources.values())
            assert got == led[stage], (
                f"pass {p}: the sources' {stage} add up to {got}, not {led[stage]}"
            )
        again: Counter[str] = Counter()
        for c in sources.values():
            again.update(c["redispatched"])
        assert +again == Counter(led["redispatched"]), f"pass {p}: handed out again by source"


def vars_of(counts: Any) -> dict[str, Any]:
    """A core RecordCounts as the status's names for it."""
    return {f: getattr(counts, f) for f in (*STAGES, "redispatched")}

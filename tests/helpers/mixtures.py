"""Checks of a mixture's plans and shares, shared by the core and the process tests."""

from __future__ import annotations

from collections import defaultdict

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

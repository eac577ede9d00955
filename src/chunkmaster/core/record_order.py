"""The order a task's records are read in when the job has a shuffle window.

With `chunkmaster master --shuffle-seed S --shuffle-window W` (docs/shuffle.md), a task's
records, taken in file order (its chunks in the task's order, each chunk's records in order),
are cut into windows of W consecutive records, and each window is read in a permutation keyed
by (S, the pass, the task's source, the task, the window's number). Without a window the order
is the file order.

A task's position (how many of its records are consumed) counts in this order, as it counts in
file order without a window. Every reader of a task (any trainer, any DataLoader worker, after
any restart, failover or restore) reads the same record at the same position, so commits,
hand-backs, pieces and restores stay exact while the master never learns which record a
position holds. The permutation is drawn with `random.Random(key).random()` only, whose
sequence Python guarantees across versions (unlike `shuffle`'s).
"""

from __future__ import annotations

import hashlib
import random
from itertools import repeat


def window_permutation(
    seed: int, pass_id: int, source: str, task_id: int, window: int, length: int
) -> list[int]:
    """The order in which the `length` records of window `window` of a task are read: a
    permutation of range(length), the same on every machine and Python version."""
    key = hashlib.blake2b(
        f"{seed}/{pass_id}/{source}/{task_id}/{window}".encode(),
        digest_size=16,
        person=b"cm-window",
    ).digest()
    draw = random.Random(int.from_bytes(key, "big")).random
    keys = [draw() for _ in repeat(None, length)]
    return sorted(range(length), key=keys.__getitem__)

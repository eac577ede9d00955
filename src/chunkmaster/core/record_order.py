"""The order a task's records are read in when the job has a shuffle window.

With `chunkmaster master --shuffle-seed S --shuffle-window W` (docs/shuffle.md), a task's
records, taken in file order (its chunks in the task's order, each chunk's records in order),
are cut into windows of W consecutive records, and each window is read in a permutation keyed
by the task's order key (from S, the pass and the dataset's task whose chunks it reads: the
same for a whole dispatch and for a piece of it) and the window's number. Without a window the
order is the file order.

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


def task_order_key(seed: int, pass_id: int, unit: int) -> int:
    """The key of the record order of unit `unit` of pass `pass_id`: the dataset's task of
    that number, or in a mixture the unit of the pass's plan, so that a task planned twice in
    a pass is read in two orders. The master sends it with every dispatch and piece of the
    unit, so every reader reads one order."""
    return _digest(b"task", f"{seed}/{pass_id}/{unit}")


def window_permutation(key: int, window: int, length: int) -> list[int]:
    """The order in which the `length` records of window `window` of the task whose order key
    is `key` are read: a permutation of range(length), the same on every machine and Python
    version."""
    draw = random.Random(_digest(b"window", f"{key}/{window}")).random
    keys = [draw() for _ in repeat(None, length)]
    return sorted(range(length), key=keys.__getitem__)


def _digest(what: bytes, text: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=8, person=b"cm-order-" + what).digest(),
        "big",
    )

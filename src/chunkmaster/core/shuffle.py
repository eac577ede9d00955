"""Seeded shuffles that a master recomputes instead of storing: keyed bijections of 0..n-1.

`Permutation(n, seed, pass_id, domain)` maps an index to its place in a pseudo-random order
of range(n), one index at a time, in O(1) memory: a 4-round Feistel network over Z_m x Z_m
(m = ceil(sqrt(n)), so the square holds n with under 2m+1 to spare), walking the cycle of
an index until it lands back in range(n). Each round adds F(one half) to the other, mod m:
a bijection whatever F is. F hashes the half and a round key with two 32-bit
multiply-xorshift steps, unrolled (the master evaluates it per chunk of each task it hands
out). The round keys come from blake2b of (domain, seed, pass), so the order depends on
nothing but those: not on the Python version, the platform or the events that came before.

A seeded master uses two per pass (see docs/shuffle.md): the order in which the pass hands
its tasks out ("tasks") and which chunks form each task ("chunks": task k covers chunk
positions k*cpt .. k*cpt+cpt-1 of the permuted order). Records per task then depend on the
pass: `PassTaskRecords` counts them lazily, once per task and pass.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from math import isqrt
from typing import overload

ROUNDS = 4
MAX_SEED = 2**64 - 1
#: The largest job shuffle window (records): a trainer holds a whole window's records in
#: memory to read them in its permuted order.
MAX_WINDOW = 10_000_000
_MASK = 2**32 - 1
_M1, _M2 = 0x9E3779B1, 0x85EBCA6B  # odd: multiplying by one is a bijection of 32-bit words
TASKS = b"tasks"
CHUNKS = b"chunks"


class ShuffleSeedError(ValueError):
    """A shuffle seed that contradicts the one a job was started with (the text says which)."""


class ShuffleWindowError(ShuffleSeedError):
    """A shuffle window that contradicts the one a job was started with: like its seed, every
    trainer's positions count records in the window's permuted order."""


def check_seed(seed: int) -> int:
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"shuffle seed {seed} is not in 0..{MAX_SEED}")
    return seed


def round_keys(seed: int, pass_id: int, domain: bytes) -> tuple[int, ...]:
    """ROUNDS 32-bit keys for one (seed, pass, domain)."""
    h = hashlib.blake2b(
        domain + b"\0" + str(seed).encode() + b"\0" + str(pass_id).encode(),
        digest_size=4 * ROUNDS,
        person=b"chunkmaster-shuf",
    ).digest()
    return tuple(int.from_bytes(h[4 * i : 4 * i + 4], "little") for i in range(ROUNDS))


class Permutation:
    """A keyed bijection of range(n), computed per index (see the module docstring)."""

    __slots__ = ("_keys", "_m", "n")

    def __init__(self, n: int, seed: int, pass_id: int, domain: bytes) -> None:
        if n < 0:
            raise ValueError(f"a permutation of {n} elements")
        self.n = n
        self._m = isqrt(n - 1) + 1 if n > 1 else 1
        self._keys = round_keys(seed, pass_id, domain)

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} is not in 0..{self.n - 1}")
        return self.images(i, i + 1)[0]

    def images(self, start: int, stop: int) -> list[int]:
        """The images of start..stop-1 (in range(n)), in one loop: the master calls this per
        task it hands out, and per pass for the task order."""
        n, m = self.n, self._m
        k0, k1, k2, k3 = self._keys
        out = []
        for x in range(start, stop):
            while True:  # the rounds unrolled
                a, b = divmod(x, m)
                z = ((b ^ k0) * _M1) & _MASK
                a = (a + ((((z ^ (z >> 16)) * _M2) & _MASK) >> 16)) % m
                z = ((a ^ k1) * _M1) & _MASK
                b = (b + ((((z ^ (z >> 16)) * _M2) & _MASK) >> 16)) % m
                z = ((b ^ k2) * _M1) & _MASK
                a = (a + ((((z ^ (z >> 16)) * _M2) & _MASK) >> 16)) % m
                z = ((a ^ k3) * _M1) & _MASK
                b = (b + ((((z ^ (z >> 16)) * _M2) & _MASK) >> 16)) % m
                x = a * m + b
                if x < n:  # cycle walking: x's cycle returns to range(n), since it started there
                    break
            out.append(x)
        return out

    def __iter__(self) -> Iterator[int]:
        return iter(self.images(0, self.n))


def pass_queue(
    seed: int | None, pass_id: int, num_tasks: int, tasks: Iterable[int] | None = None
) -> deque[int]:
    """The Todo queue a pass starts with: `tasks` (all of them if None), in the pass's order.

    Without a seed that is the order given (today's: task IDs, then finish order); with one,
    the pass's permutation of the task IDs, whatever order `tasks` came in."""
    if seed is None:
        if isinstance(tasks, deque):
            return tasks
        return deque(range(num_tasks) if tasks is None else tasks)
    order = Permutation(num_tasks, seed, pass_id, TASKS)
    if tasks is None:
        return deque(order)
    member = bytearray(num_tasks)
    for t in tasks:
        member[t] = 1
    return deque(t for t in order if member[t])


class PassChunks:
    """Which chunks form each task in one pass of a seeded job."""

    __slots__ = ("_last", "_perm", "cpt", "num_chunks")

    def __init__(self, num_chunks: int, cpt: int, seed: int, pass_id: int) -> None:
        self.num_chunks = num_chunks
        self.cpt = cpt
        self._perm = Permutation(num_chunks, seed, pass_id, CHUNKS)
        self._last: tuple[int, list[int]] = (-1, [])  # a dispatch asks for its records, then chunks

    def chunks(self, task_id: int) -> list[int]:
        if self._last[0] == task_id:
            return self._last[1]
        start = task_id * self.cpt
        if task_id < 0 or start >= self.num_chunks:
            raise KeyError(task_id)
        got = self._perm.images(start, min(start + self.cpt, self.num_chunks))
        self._last = (task_id, got)
        return got


class PassTaskRecords(Sequence[int]):
    """Records per task in one pass, counted on first use (8 bytes a task)."""

    def __init__(self, layout: PassChunks, chunk_records: Sequence[int], num_tasks: int) -> None:
        self._layout = layout
        self._chunk_records = chunk_records
        self._records: array[int] = array("q", [-1]) * num_tasks

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, task_id: int) -> int: ...

    @overload
    def __getitem__(self, task_id: slice) -> Sequence[int]: ...

    def __getitem__(self, task_id: int | slice) -> int | Sequence[int]:
        if isinstance(task_id, slice):
            return [self[t] for t in range(len(self))[task_id]]
        n = self._records[task_id]
        if n < 0:
            cr = self._chunk_records
            n = self._records[task_id] = sum(cr[c] for c in self._layout.chunks(task_id))
        return n

"""What the loader bench's processes share, standard library only (every virtualenv imports it).

* The source records: record i of a size is its id (8 bytes, big-endian) followed by bytes of
  one seeded pool, so every system converts the same bytes and every reader can say which
  record it got (`record_id`).
* The JSON-line protocol of a reading process: one line when it is ready (with its conversion
  time), then one answer per `pass` line read from stdin.
* The memory of a process tree: the sum of each process's PSS (`/proc/PID/smaps_rollup`:
  resident pages, shared ones split among the processes that map them, so a tree's sum counts
  each page once), sampled by a thread.
* The exactness runs' log: the ids of the records a training loop took, 8 bytes each, appended
  batch by batch; a checkpoint file says how many of them its model had trained on.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

SEED = 30  # issue 30
# record size name: (bytes, chunk size of the RecordIO source, chunks a chunkmaster task,
# MB of records): torch_bench.py's SIZES, so the figures compare with its.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "1k": (1 << 10, 64 << 10, 32, 64),
    "64k": (64 << 10, 4 << 20, 4, 256),
    "1m": (1 << 20, 16 << 20, 1, 512),
}
BATCH = 64
WORKERS = 2


class Records:
    """The seeded source: `n` records of `size` bytes, ids from `first`."""

    def __init__(self, size: int, n: int, first: int = 0, seed: int = SEED) -> None:
        self.size, self.n, self.first = size, n, first
        rng = random.Random(seed)
        self.pool = rng.randbytes((1 << 20) + size)
        self.step = 4099  # prime: neighbouring records start at different offsets

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> bytes:
        off = (i * self.step) % (1 << 20)
        return (self.first + i).to_bytes(8, "big") + self.pool[off : off + self.size - 8]

    def __iter__(self) -> Iterator[bytes]:
        return (self[i] for i in range(self.n))

    def ids(self) -> range:
        return range(self.first, self.first + self.n)


def record_id(record: bytes | memoryview) -> int:
    return int.from_bytes(bytes(record[:8]), "big")


# The three sources of the mixture runs: (name, first id, records, weight).
MIXTURE = (("web", 0, 3000, 0.5), ("code", 1_000_000, 2000, 0.3), ("books", 2_000_000, 1000, 0.2))


def emit(**fields: object) -> None:
    """One JSON line to the coordinator."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def serve(one_pass: Callable[[], int], **ready: object) -> None:
    """Answer `pass` lines with {"records", "seconds"} until `quit` or end of input."""
    emit(ready=True, **ready)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if cmd == "pass":
            t = time.perf_counter()
            n = one_pass()
            emit(records=n, seconds=time.perf_counter() - t)


def tree_pids(root: int) -> list[int]:
    """root and all its descendants (by /proc/*/stat's parent field)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def tree_pss(root: int) -> int:
    """Bytes: the sum of the PSS of root's process tree."""
    total = 0
    for pid in tree_pids(root):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


class PeakMemory:
    """Samples tree_pss(root) every `every` seconds while on; `peak` is the largest seen."""

    def __init__(self, root: int, every: float = 0.1) -> None:
        self.root, self.every, self.peak = root, every, 0
        self.on = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.on.wait(0.5) and not self.stop.is_set():
                self.peak = max(self.peak, tree_pss(self.root))
                time.sleep(self.every)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


class IdLog:
    """Appends the ids of each batch the loop takes; `count` is how many so far."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "ab")  # noqa: SIM115
        self.count = self.f.tell() // 8

    def add(self, ids: list[int]) -> None:
        self.f.write(b"".join(i.to_bytes(8, "big") for i in ids))
        self.f.flush()
        self.count += len(ids)

    def close(self) -> None:
        self.f.close()


def read_ids(path: Path, limit: int | None = None) -> list[int]:
    if not path.exists():
        return []
    data = path.read_bytes()
    n = len(data) // 8 if limit is None else min(limit, len(data) // 8)
    return [int.from_bytes(data[8 * i : 8 * i + 8], "big") for i in range(n)]


def save_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def compare(expected: Counter[int], got: Counter[int]) -> tuple[int, int]:
    """(records missing, records read more often than expected) of got against expected."""
    missing = sum(max(0, c - got.get(i, 0)) for i, c in expected.items())
    extra = sum(max(0, c - expected.get(i, 0)) for i, c in got.items())
    return missing, extra

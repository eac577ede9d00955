"""Every way out of a Loader's iteration, then `commit()` or `state_dict()` (issue 27, 2):
a `break` at max steps, an exception in the training loop, the iterator's `close()`, the
iterator dropped and collected. The commit covers exactly the batches the loop took: a master
restored from the checkpoint delivers every other record of the pass once, none of those.

Real DataLoader workers (fork and spawn, persistent), a real master over gRPC on its SQLite
store; records are numbered, so every check is on exact counts.
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster
from helpers.torch_parts import ids_of, record_id

from chunkmaster.store.sqlite import SqliteStore
from chunkmaster.torch import Loader

N = 600


class Stop(Exception):
    """The training loop's own error (a NaN loss, a failed step)."""


def take_by_break(loader: Loader, steps: int) -> list[int]:
    taken: list[int] = []
    for step, batch in enumerate(loader):
        taken += ids_of(batch)
        if step + 1 == steps:
            break  # max steps
    return taken


def take_until_exception(loader: Loader, steps: int) -> list[int]:
    taken: list[int] = []
    try:
        for step, batch in enumerate(loader):
            taken += ids_of(batch)
            if step + 1 == steps:
                raise Stop
    except Stop:
        pass
    return taken


def _next_steps(it: Iterator[Any], steps: int) -> list[int]:
    return [i for _ in range(steps) for i in ids_of(next(it))]


def take_then_close(loader: Loader, steps: int) -> list[int]:
    it = iter(loader)
    taken = _next_steps(it, steps)
    it.close()  # type: ignore[attr-defined]
    return taken


def take_then_drop(loader: Loader, steps: int) -> list[int]:
    it = iter(loader)
    taken = _next_steps(it, steps)
    del it
    gc.collect()
    return taken


def take_and_keep(loader: Loader, steps: int) -> list[int]:
    """The iterator stays alive, suspended (the loop may go on later)."""
    it = iter(loader)
    loader._kept = it  # type: ignore[attr-defined]
    return _next_steps(it, steps)


EXITS: dict[str, Callable[[Loader, int], list[int]]] = {
    "break": take_by_break,
    "exception": take_until_exception,
    "close": take_then_close,
    "collected": take_then_drop,
    "suspended": take_and_keep,
}

WORKERS = {
    "no-workers": dict(num_workers=0),
    "fork-persistent": dict(num_workers=2, persistent_workers=True, prefetch_factor=4),
    "spawn-persistent": dict(
        num_workers=2, persistent_workers=True, multiprocessing_context="spawn"
    ),
}

CASES = [
    *(pytest.param(e, "fork-persistent", id=f"{e}-fork") for e in EXITS),
    pytest.param("break", "spawn-persistent", id="break-spawn"),
    pytest.param("break", "no-workers", id="break-no-workers"),
    pytest.param("exception", "no-workers", id="exception-no-workers"),
]


def numbered(tmp_path: Path, max_chunk_size: int = 600) -> str:
    return numbered_records(tmp_path / "d.rio", N, max_chunk_size=max_chunk_size)


def rest_after_restore(
    tmp_path: Path, state: dict[str, Any], settings: dict[str, Any]
) -> list[int]:
    """What a fresh master restored from `state` delivers of the pass."""
    with InProcessMaster(SqliteStore(str(tmp_path / "b.db")), chunks_per_task=1) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.restore(state["checkpoint"]))
        with Loader(m.addr, transform=record_id, batch_size=8, **settings) as again:
            return [i for batch in again for i in ids_of(batch)]


@pytest.mark.parametrize(("exit_by", "workers"), CASES)
@pytest.mark.parametrize("then", ["state_dict", "commit-then-state_dict"])
def test_a_checkpoint_after_leaving_the_loop_covers_exactly_the_batches_taken(
    tmp_path: Path, exit_by: str, workers: str, then: str
) -> None:
    settings = WORKERS[workers]
    data = numbered(tmp_path)
    with (
        InProcessMaster(SqliteStore(str(tmp_path / "a.db")), chunks_per_task=1) as m,
        Loader(m.addr, dataset=[data], transform=record_id, batch_size=8, **settings) as loader,
    ):
        taken = EXITS[exit_by](loader, 13)  # 104 records, tasks taken part way
        assert len(taken) == 104
        if then == "commit-then-state_dict":
            loader.commit()
        state = loader.state_dict()
        (ledger,) = [led for led in m.status()["ledger"] if led["pass"] == 0]
        assert ledger["committed"] == len(taken)
    rest = rest_after_restore(tmp_path, state, settings)
    assert Counter(taken + rest) == Counter(range(N))


@pytest.mark.parametrize("exit_by", ["break", "exception", "collected"])
def test_the_loop_goes_on_after_leaving_it_and_every_record_comes_once(
    tmp_path: Path, exit_by: str
) -> None:
    """A loop that stops at max steps, saves, and goes on (evaluation between two epochs of
    steps): the pass continues where the loop left it, every record once, all committed."""
    data = numbered(tmp_path, max_chunk_size=64 << 10)  # one chunk: one task, left mid-way
    with (
        InProcessMaster(SqliteStore(str(tmp_path / "a.db"))) as m,
        Loader(
            m.addr,
            dataset=[data],
            transform=record_id,
            batch_size=8,
            num_workers=2,
            persistent_workers=True,
        ) as loader,
    ):
        taken = EXITS[exit_by](loader, 5)
        loader.state_dict()
        loader.set_pass(0)
        taken += [i for batch in loader for i in ids_of(batch)]
        loader.commit()
        assert Counter(taken) == Counter(range(N))
        (ledger,) = [led for led in m.status()["ledger"] if led["pass"] == 0]
        assert ledger["committed"] == N


def test_a_loop_left_at_the_last_batch_of_a_pass_comes_back_to_its_end(tmp_path: Path) -> None:
    """A loader that did not read the pass before (a new one, or one restored) leaves its loop
    at the pass's last batch, saves, and comes back: the pass is over, and that is its end, not
    a PassOverError (the next iteration reads the pass after)."""
    data = numbered(tmp_path)
    with InProcessMaster(chunks_per_task=1) as m:
        with Loader(m.addr, dataset=[data], transform=record_id, batch_size=8) as first:
            assert len([b for b in first]) == math.ceil(N / 8)  # pass 0, by another loader
        with Loader(m.addr, transform=record_id, batch_size=8, num_workers=2) as loader:
            taken: list[int] = []
            for batch in loader:  # pass 1
                taken += ids_of(batch)
                if len(taken) == N:
                    break  # its last batch: the master's pass is 2 now
            loader.state_dict()
            assert [b for b in loader] == []  # pass 1 again: over, and it took part in it
            assert Counter(taken) == Counter(range(N))
            assert Counter(i for batch in loader for i in ids_of(batch)) == Counter(range(N))

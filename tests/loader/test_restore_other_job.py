"""A data checkpoint of another job is refused, naming both (issue 27, 3).

Two jobs on the same files (both `--job default`, so the same name, dataset and task count):
a Loader state saved in one, loaded in the other, would skip the records the first committed.
A checkpoint carries its job's identity (made when the job's dataset is set, kept across
master restarts, taken over by a master started from the checkpoint); a running job goes back
only to its own, unless the caller says `other_job=True`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers.datasets import write_records
from helpers.inproc import InProcessMaster
from helpers.loader_state import saved_after
from helpers.status_view import status_view
from helpers.torch_parts import ids_of, record_id

from chunkmaster.core import checkpoint
from chunkmaster.core.errors import CheckpointRefusedError
from chunkmaster.store.sqlite import SqliteStore
from chunkmaster.torch import Loader

N = 200


def test_a_state_of_another_job_on_the_same_files_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    data = str(
        write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(N)], max_chunk_size=80)
    )
    with InProcessMaster(chunks_per_task=1) as other:
        _, foreign = saved_after(other.addr, data, 4)
    with InProcessMaster(chunks_per_task=1) as m:
        mine, state = saved_after(m.addr, data, 2)
        ledger = m.status()["ledger"]
        with (
            Loader(m.addr, transform=record_id, batch_size=10) as loader,
            pytest.raises(CheckpointRefusedError, match="of another job") as refused,
        ):
            loader.load_state_dict(foreign)
            next(iter(loader))
        own = checkpoint.decode(state["checkpoint"]).job_id
        theirs = checkpoint.decode(foreign["checkpoint"]).job_id
        assert own and theirs and own != theirs
        assert own in str(refused.value) and theirs in str(refused.value)
        assert m.status()["ledger"] == ledger  # nothing changed
        with Loader(m.addr, transform=record_id, batch_size=10) as loader:
            loader.load_state_dict(state)  # its own: taken
            rest = [i for batch in loader for i in ids_of(batch)]
        assert Counter(mine + rest) == Counter(range(N))
        with Loader(m.addr, transform=record_id, batch_size=10) as loader:
            loader.load_state_dict(foreign, other_job=True)  # said so: taken
            assert status_view(loader.client.status()).cur_pass == 0
            (ledger,) = [led for led in m.status()["ledger"] if led["pass"] == 0]
            assert ledger["committed"] == 40


def test_a_job_started_from_a_checkpoint_is_that_checkpoints_job(tmp_path: Path) -> None:
    """A master started from a checkpoint (a new store: `master --restore FILE`) continues its
    job: the trainers' Loaders load the same state beside their model, accepted; the job keeps
    its identity across a master restart on its store."""
    data = str(
        write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(N)], max_chunk_size=80)
    )
    with InProcessMaster(chunks_per_task=1) as m:
        taken, state = saved_after(m.addr, data, 3)
    for _ in range(2):  # started from the checkpoint, then restarted on its store
        with InProcessMaster(SqliteStore(str(tmp_path / "b.db")), chunks_per_task=1) as m:
            service = m.service
            assert service is not None
            m.call(lambda s=service: s.restore(state["checkpoint"]))  # type: ignore[misc]
            assert service.ledger.state.job_id == checkpoint.decode(state["checkpoint"]).job_id
    with (
        InProcessMaster(SqliteStore(str(tmp_path / "b.db")), chunks_per_task=1) as m,
        Loader(m.addr, transform=record_id, batch_size=10) as loader,
    ):
        loader.load_state_dict(state)
        rest = [i for batch in loader for i in ids_of(batch)]
    assert Counter(taken + rest) == Counter(range(N))

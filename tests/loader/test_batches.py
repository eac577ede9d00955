"""A worker's leftovers (fewer than a batch) cross to the main process stacked into one tensor
when they are tensors of one shape, and merge into the same batches as one by one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import default_collate  # noqa: E402

from chunkmaster.torch.batches import Batcher, Loose, Merger  # noqa: E402


def _leftovers(samples: list, collate=default_collate) -> Loose:
    batcher = Batcher(8, collate)
    assert list(batcher.add((0, 1, 1), 0, iter(samples), None)) == []
    loose = batcher.rest()
    assert loose is not None
    return loose


def test_leftover_tensors_of_one_shape_go_stacked_and_merge_into_the_same_batch() -> None:
    a = [torch.full((3,), i, dtype=torch.uint8) for i in range(5)]
    b = [torch.full((3,), 10 + i, dtype=torch.uint8) for i in range(5)]
    loose_a, loose_b = _leftovers(a), _leftovers(b)
    assert loose_a.packed and loose_a.samples.shape == (5, 3)
    merger = Merger(8, default_collate)
    merger.add(loose_a)
    merger.add(loose_b)
    batch = merger.pop()
    assert batch is not None
    assert torch.equal(batch.data, torch.stack(a + b[:3]))
    assert batch.marks == (((0, 1, 1), 3),)  # the task's position after the batch's last
    rest = merger.pop()
    assert rest is not None and torch.equal(rest.data, torch.stack(b[3:]))


@pytest.mark.parametrize(
    "samples",
    [
        [torch.zeros(3), torch.zeros(4)],  # shapes differ: default_collate's own error later
        [torch.zeros(2), torch.zeros(2, dtype=torch.int64)],
        [{"x": torch.zeros(2)}, {"x": torch.ones(2)}],
        [b"ab", b"cd"],
    ],
)
def test_other_leftovers_go_one_by_one(samples: list) -> None:
    loose = _leftovers(samples)
    assert (not loose.packed and loose.samples == samples) or not loose.packed


def test_a_collate_of_the_user_gets_the_samples_themselves() -> None:
    loose = _leftovers([torch.zeros(2), torch.ones(2)], collate=lambda s: s)
    assert not loose.packed and len(loose.rows()) == 2

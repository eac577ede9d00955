"""Which kind an ID of the queues is (core/ids.py, `MasterState.is_piece` and `unit_of`): a
unit, or a piece of one (equal steps), numbered after the units."""

from __future__ import annotations

from array import array

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import Dispatch, OpenSession, SetDataset
from chunkmaster.core.ids import UnitId
from chunkmaster.core.model import Task
from chunkmaster.core.state import MasterState, apply
from chunkmaster.core.steps import Piece


def dataset() -> Dataset:
    return Dataset(
        ("x",), ("f",), array("I", [0] * 4), array("Q", range(4)), array("I", [10] * 4), 1
    )


def test_units_are_themselves_and_a_piece_names_its_unit() -> None:
    st = MasterState()
    apply(st, SetDataset(dataset()))
    assert st.num_tasks == 4
    assert not st.is_piece(3) and st.unit_of(3) == 3
    st.steps.pieces[4] = Piece(0, UnitId(2), 0, 5)
    assert st.is_piece(4) and st.unit_of(4) == 2
    assert st.unit_task(st.unit_of(4)) == 2  # not a mixture: a unit is its task


def test_a_dispatched_unit_is_handed_out_as_its_task() -> None:
    st = MasterState()
    apply(st, SetDataset(dataset()))
    apply(st, OpenSession("s", "t", "h", 1, 0))
    task = apply(st, Dispatch(60.0, "w", session="s"))
    assert isinstance(task, Task)
    assert not st.is_piece(task.meta.id)
    assert task.chunks == st.task_chunks(st.unit_of(task.meta.id))

"""How many chunks a task holds when the user does not say (no `--chunk-per-task`).

A fixed 10 chunks a task (PaddlePaddle's default) sizes tasks for the file, not the job: a
dataset of 10 RecordIO files of 20 MB, written with the writer's 32 MiB chunk bound, is 10
chunks, so one task, and one DataLoader worker of one trainer reads it all while the rest
idle. The master instead cuts a pass into at least `MIN_TASKS` tasks where it can, and takes
the most chunks a task (up to `MAX_CHUNKS_PER_TASK`) that still does so: fewer, larger tasks
cost less dispatching, and enough of them keep every reader busy.
"""

from __future__ import annotations

from chunkmaster.core.dataset import count_tasks

MIN_TASKS = 64
"""The tasks a pass should have: a task or more for each of 64 readers (8 trainers of 8
DataLoader workers), several for each of the usual 2x4, so a slow reader holds few records."""

MAX_CHUNKS_PER_TASK = 10
"""The most chunks a task the master chooses: PaddlePaddle's default, which large datasets
keep."""


def chosen_chunks_per_task(num_chunks: int) -> int:
    """The largest c <= MAX_CHUNKS_PER_TASK cutting `num_chunks` chunks into at least
    MIN_TASKS tasks (ceil(num_chunks / c) >= MIN_TASKS), else 1: a small dataset is a task a
    chunk, the most tasks it can make; a large one keeps Paddle's 10 chunks a task."""
    for c in range(MAX_CHUNKS_PER_TASK, 1, -1):
        if count_tasks(num_chunks, c) >= MIN_TASKS:
            return c
    return 1


def chosen_text(chunks_per_task: int) -> str:
    """Why a dataset is cut at `chunks_per_task` chunks a task the master chose (for logs)."""
    return (
        f"chosen: {chunks_per_task} chunk(s) a task, the most up to {MAX_CHUNKS_PER_TASK} "
        f"that make at least {MIN_TASKS} tasks (else 1); --chunk-per-task sets it"
    )

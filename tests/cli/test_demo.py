"""`make demo` runs `python -m chunkmaster.demo`: it must pass, and tell its whole story."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_demo_passes_and_shows_each_part_of_the_system() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "chunkmaster.demo"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    text = out.stdout
    assert out.returncode == 0, text + out.stderr
    assert text.rstrip().endswith("PASS"), text
    for step in (
        "dies (SIGKILL)",  # a trainer killed mid-task
        "lease ran out",  # caught by its lease
        "SIGKILL the master",  # the master killed and restarted on its store
        "serving again",
        "a data checkpoint",
        "restored from the checkpoint",
        "OK  pass 0",
        "OK  pass 1",
        "OK  restored pass 1",
    ):
        assert step in text, f"{step!r} not in the demo's story:\n{text}"
    assert "BAD" not in text and "FAIL" not in text, text


def test_the_verdict_fails_for_a_lost_record_a_stranger_or_one_twice_too_many() -> None:
    """The demo's check, on its own (pure logic): what the docs allow passes, nothing more."""
    from collections import Counter

    from chunkmaster.demo import delivered

    dataset = Counter({1: 1, 2: 1, 3: 1})
    lost = {"redispatched": {"trainer lost": 2}}
    assert delivered(dataset, Counter({1: 1, 2: 1, 3: 1}), {})[0]
    assert delivered(dataset, Counter({1: 2, 2: 2, 3: 1}), lost)[0]  # within the ledger
    assert not delivered(dataset, Counter({1: 3, 2: 2, 3: 1}), lost)[0]  # past it
    assert not delivered(dataset, Counter({1: 2, 2: 1, 3: 1}), {})[0]  # nothing handed again
    assert not delivered(dataset, Counter({1: 1, 2: 1}), lost)[0]  # a record lost
    assert not delivered(dataset, Counter({1: 1, 2: 1, 3: 1, 4: 1}), lost)[0]  # a stranger

"""chunkmaster.torch.init_process_group: what it takes from torchrun's variables, what it refuses
(naming the variable or the argument), and a real group of one outside torchrun."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

import torch.distributed as dist

from chunkmaster.torch import init_process_group

VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture(autouse=True)
def no_torchrun(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (*VARIABLES, "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("missing", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_outside_torchrun_a_missing_variable_is_named(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in env.items():
        if name != missing:
            monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{missing} is not set"):
        init_process_group()
    assert not dist.is_initialized()


def test_arguments_that_contradict_torchruns_or_that_it_makes_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="rank=0 contradicts RANK=1"):
        init_process_group(rank=0)
    with pytest.raises(ValueError, match="world_size=4 contradicts WORLD_SIZE=2"):
        init_process_group(world_size=4)
    for made in ("store", "init_method"):
        with pytest.raises(TypeError, match=f"makes its own {made}"):
            init_process_group(**{made: object()})
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="rank 2 is not within a world of 2"):
        init_process_group()
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK='one' is not an integer"):
        init_process_group()
    assert not dist.is_initialized()


def test_a_group_of_one_with_rank_and_world_given_under_a_restarts_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    init_process_group("gloo", rank=0, world_size=1)
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")

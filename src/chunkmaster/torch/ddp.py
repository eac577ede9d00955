"""`init_process_group`: torch.distributed's process group for a rank under torchrun, keyed by
the elastic restart so that a restarted group never meets the ranks that died."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# torch.distributed re-exports the stores without declaring it (no `as`, no __all__).
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

#: What `init_process_group` makes itself, so does not take.
_MADE_HERE = ("store", "init_method")


def _env_int(name: str, given: int | None, what: str) -> int:
    """`given`, or the variable `name` as torchrun sets it; ValueError naming the variable
    when neither is there, or when both are and they differ."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if given is None:
            raise ValueError(
                f"{name} is not set: run under torchrun, which sets it, or give {what}="
            )
        return given
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if given is not None and given != value:
        raise ValueError(f"{what}={given} contradicts {name}={value}: give one or the other")
    return value


def init_process_group(
    backend: str = "gloo",
    *,
    rank: int | None = None,
    world_size: int | None = None,
    timeout: timedelta | None = None,
    **kwargs: Any,
) -> None:
    """`torch.distributed.init_process_group(backend)` for this rank, safe across torchrun's
    elastic restarts.

    Why: under torchrun the ranks meet in the agent's TCPStore at MASTER_ADDR:MASTER_PORT,
    and that store outlives an elastic restart. `init_process_group(backend)` alone uses the
    same keys at every restart, so after a rank dies and the group starts again the new ranks
    can read the addresses the dead ones published (gloo on torch 2.13 then connects to them
    and fails or hangs). Here the rendezvous keys are prefixed by TORCHELASTIC_RESTART_COUNT,
    so each restart meets in a namespace of its own.

    `rank` and `world_size` default to RANK and WORLD_SIZE (torchrun's); a value given where
    the variable is set must agree with it. MASTER_ADDR and MASTER_PORT must be set (torchrun
    sets them; outside it, set them, and rank 0 then hosts the store as torch's env://
    rendezvous does). Each missing variable is a ValueError naming it. `timeout` goes to the
    store and to the group; other keyword arguments go to `torch.distributed.
    init_process_group` as they are, but `store` and `init_method`, which this function makes
    (a TypeError).
    """
    for name in _MADE_HERE:
        if name in kwargs:
            raise TypeError(
                f"init_process_group() makes its own {name} (a store keyed by the elastic "
                "restart); call torch.distributed.init_process_group to give one"
            )
    rank = _env_int("RANK", rank, "rank")
    world_size = _env_int("WORLD_SIZE", world_size, "world_size")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not within a world of {world_size}")
    addr = os.environ.get("MASTER_ADDR") or ""
    if not addr:
        raise ValueError("MASTER_ADDR is not set: run under torchrun, which sets it, or set it")
    port = _env_int("MASTER_PORT", None, "port")
    restart = _restart_count()
    store_timeout = timeout if timeout is not None else timedelta(minutes=30)
    # torchrun's agent hosts the store (as torch's own env:// rendezvous assumes); elsewhere
    # rank 0 does.
    store = TCPStore(
        addr,
        port,
        world_size,
        is_master=not _agent_store() and rank == 0,
        timeout=store_timeout,
    )
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(
        backend,
        store=PrefixStore(f"chunkmaster/restart{restart}", store),
        rank=rank,
        world_size=world_size,
        **kwargs,
    )


def _restart_count() -> int:
    """torchrun's restart count (0 outside torchrun)."""
    raw = os.environ.get("TORCHELASTIC_RESTART_COUNT") or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"TORCHELASTIC_RESTART_COUNT={raw!r} is not an integer") from None


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"

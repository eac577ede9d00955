"""PyTorch: `Loader`, a DataLoader over a chunkmaster job, one pass per iteration.

    loader = Loader(addr, dataset=["/data/train-*.rio"], transform=decode, batch_size=64,
                    num_workers=4, persistent_workers=True)
    for epoch in range(epochs):
        for batch in loader:
            train_step(batch)
            loader.commit()          # exactly the batches taken so far
        torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, path)

One session per rank, held by the main process; DataLoader workers (any number, persistent or
not, any start method, in order or not) read the tasks it hands them. Under torchrun each rank
is one trainer of the job (WORLD_SIZE, RANK); `init_process_group(backend)` starts its process
group with rendezvous keys of its own at every elastic restart. docs/torch.md has the whole story.

Needs the optional extra: `pip install 'chunkmaster[torch]'`.
"""

from __future__ import annotations

from typing import Any

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "chunkmaster.torch needs PyTorch; install it with: pip install 'chunkmaster[torch]'"
    ) from exc

from chunkmaster.torch.ddp import init_process_group
from chunkmaster.torch.loader import Loader

__all__ = ["Loader", "init_process_group"]


def __getattr__(name: str) -> Any:
    if name in ("MasterDataset", "make_loader"):
        raise ImportError(
            f"chunkmaster.torch.{name} was replaced by chunkmaster.torch.Loader, which keeps "
            "every record once per pass with persistent workers and in-order loading, and "
            "commits what the training loop took (docs/torch.md)"
        )
    raise AttributeError(f"module 'chunkmaster.torch' has no attribute {name!r}")

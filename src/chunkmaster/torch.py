"""PyTorch: an IterableDataset whose records come from a master, task by task.

Each DataLoader worker (or the main process, with num_workers=0) opens its own Client when it
starts iterating, so workers pull their own tasks: with several workers and several trainer
processes, every record is seen once per pass in total (at least once if a trainer dies). Like
`DistributedSampler.set_epoch`, call `set_pass(p)` before each epoch; without it the dataset
asks the master which pass is current.

With several workers, build the DataLoader with `in_order=False` (or use `make_loader`): a
worker with nothing left to read waits for the pass to end, and an in-order DataLoader would
stop taking the other workers' records while it waits, so their tasks would never finish.

Needs the optional extra: `pip install 'chunkmaster[torch]'`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

try:
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "chunkmaster.torch needs PyTorch; install it with: pip install 'chunkmaster[torch]'"
    ) from exc

from chunkmaster.client.client import Client

__all__ = ["MasterDataset", "make_loader"]


class MasterDataset(IterableDataset[Any]):
    """Records of one pass, decoded by `transform` (records are yielded as the dataset's format
    makes them when it is None: bytes, dicts, str; docs/formats.md).

    Picklable (it holds only settings), so it works with every multiprocessing start method.
    """

    def __init__(
        self,
        addr: str | None = None,
        *,
        etcd_endpoints: Sequence[str] | str | None = None,
        etcd_timeout: float = 5.0,
        dataset: Sequence[str] | str | None = None,
        transform: Callable[[Any], Any] | None = None,
        buffer_size: int = 1024,
        client_options: dict[str, Any] | None = None,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        if (addr is None) == (etcd_endpoints is None):
            raise ValueError("give exactly one of addr and etcd_endpoints")
        self.addr = addr
        self.etcd_endpoints = etcd_endpoints
        self.etcd_timeout = etcd_timeout
        self.dataset = dataset
        self.transform = transform
        self.buffer_size = buffer_size
        self.client_options = dict(client_options or {})
        # Paths and the token, passed to each worker's Client (see Client for their meaning).
        for name, value in (
            ("token", token),
            ("tls_ca", tls_ca),
            ("tls_cert", tls_cert),
            ("tls_key", tls_key),
        ):
            if value is not None:
                self.client_options[name] = value
        self.pass_id: int | None = None

    def set_pass(self, pass_id: int) -> None:
        """Select the pass the next iteration reads (call it before creating the iterator)."""
        self.pass_id = pass_id

    def _client(self) -> Client:
        info = get_worker_info()
        worker = None if info is None else f"worker{info.id}"
        options = dict(self.client_options)
        if worker is not None and "worker" not in options:
            import os
            import socket

            options["worker"] = f"{socket.gethostname()}:{os.getpid()}:{worker}"
        return Client(
            self.addr,
            etcd_endpoints=self.etcd_endpoints,
            etcd_timeout=self.etcd_timeout,
            buffer_size=self.buffer_size,
            **options,
        )

    def __iter__(self) -> Iterator[Any]:
        client = self._client()
        try:
            if self.dataset is not None:
                client.set_dataset(self.dataset)
            pass_id = self.pass_id
            if pass_id is None:
                pass_id = int(client.status()["cur_pass"])  # type: ignore[call-overload]
            transform = self.transform
            if transform is None:
                yield from client.records(pass_id)
            else:
                for record in client.records(pass_id):
                    yield transform(record)
        finally:
            client.close()


def make_loader(dataset: MasterDataset, **kwargs: Any) -> DataLoader[Any]:
    """A DataLoader over `dataset` with `in_order=False`, which several workers need."""
    kwargs.setdefault("in_order", False)
    return DataLoader(dataset, **kwargs)

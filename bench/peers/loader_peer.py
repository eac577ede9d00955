"""One reading process of the loader bench, in the virtualenv of its system (loaders.py starts
it; README.md beside this file says what each system reads and how).

    python loader_peer.py --system S serve --data DIR --size 64k
        converts the source into S's format (timed), then reads one pass per `pass` line on
        stdin (loader_common.serve)
    python loader_peer.py --system S exact --scenario kill|ranks|mix --phase ref|first|resume
        --data DIR --work DIR [--addr HOST:PORT]
        one process of an exactness run: reads, logs the ids of the batches it takes, saves
        its checkpoint every --every steps (phase first), SIGKILLs itself at step --kill-at

Systems: plain (a DataLoader over a map-style dataset of the RecordIO source:
torch_bench.py's baseline), chunkmaster (chunkmaster.torch.Loader over a master), torchdata
(StatefulDataLoader over the same map-style dataset), litdata (StreamingDataset over
litdata.optimize()'s output), streaming (MosaicML StreamingDataset over MDS shards).
Every system yields the same batches: uint8 tensors of (batch, record size), the records'
bytes, stacked by torch's default_collate in 2 workers (persistent).
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loader_common import (  # noqa: E402
    BATCH,
    MIXTURE,
    SIZES,
    WORKERS,
    IdLog,
    Records,
    emit,
    save_atomic,
    serve,
)

MIX_EPOCH = sum(n for _, _, n, _ in MIXTURE)  # Streaming's epoch_size for the mixture


def as_tensor(record: Any) -> torch.Tensor:
    """A record's bytes as a uint8 tensor (the samples every system yields)."""
    return torch.frombuffer(bytearray(record), dtype=torch.uint8)


def batch_ids(batch: torch.Tensor) -> list[int]:
    ids: list[int] = batch[:, :8].contiguous().numpy().copy().view(">u8").ravel().tolist()
    return ids


def loader_kwargs() -> dict[str, Any]:
    return {"batch_size": BATCH, "num_workers": WORKERS, "persistent_workers": True}


# ---- the datasets of each system (top level: the workers unpickle them) ----


def recordio_dataset(path: str) -> Any:
    sys.path.insert(0, str(HERE.parent))
    from torch_bench import RecordIOFiles

    return RecordIOFiles(path)


def streaming_samples() -> Any:
    return StreamingSamples


try:  # at the top level, so that workers started by spawn find the class
    from streaming import StreamingDataset as _StreamingDataset

    class StreamingSamples(_StreamingDataset):  # type: ignore[misc]
        """MDS samples ({"data": bytes}) as tensors: Streaming's way is a subclass."""

        def __getitem__(self, i: int) -> torch.Tensor:
            return as_tensor(super().__getitem__(i)["data"])

except ImportError:  # another system's virtualenv
    pass


_LITDATA_SOURCE: Records | None = None


def litdata_item(i: int) -> bytes:
    """optimize()'s fn: record i of the source (its workers rebuild the seeded pool once)."""
    global _LITDATA_SOURCE
    size, first = int(os.environ["PEERS_SIZE"]), int(os.environ["PEERS_FIRST"])
    if _LITDATA_SOURCE is None:
        _LITDATA_SOURCE = Records(size, 0, first=first)  # any index: records are computed
    return _LITDATA_SOURCE[i - first]


# ---- conversion: the source records into each system's format ----


def convert(system: str, records: Records, out: Path) -> float:
    """Writes the records in the system's format; the seconds it took (imports excluded)."""
    out.mkdir(parents=True, exist_ok=True)
    if system in ("plain", "chunkmaster", "torchdata"):
        from chunkmaster.recordio import Compressor, Writer

        chunk = next(c for r, c, _, _ in SIZES.values() if r == records.size)
        t = time.perf_counter()
        with Writer(str(out / "data.rio"), max_chunk_size=chunk, compressor=Compressor.NONE) as w:
            for r in records:
                w.write(r)
    elif system == "streaming":
        from streaming import MDSWriter

        t = time.perf_counter()
        with MDSWriter(out=str(out), columns={"data": "bytes"}) as w:  # its defaults
            for r in records:
                w.write({"data": r})
    elif system == "litdata":
        from litdata import optimize

        os.environ["PEERS_SIZE"] = str(records.size)
        os.environ["PEERS_FIRST"] = str(records.first)
        t = time.perf_counter()
        optimize(
            fn=litdata_item,
            inputs=list(records.ids()),
            output_dir=str(out),
            chunk_bytes="64MB",
            num_workers=WORKERS,
        )
    else:
        raise ValueError(system)
    return time.perf_counter() - t


# ---- loaders ----


class System:
    """A system's loader for the scenarios: make(), state(), load(), after_step()."""

    def __init__(self, name: str, addr: str | None) -> None:
        self.name, self.addr = name, addr
        # One state for all ranks, rank 0's, which every rank loads: chunkmaster's (the job's
        # data checkpoint) and Streaming's (its state counts the samples of all ranks). The
        # others' is per rank: each rank saves its own and loads its own.
        self.global_state = name in ("chunkmaster", "streaming")

    def make(self, data: list[Path], rank: int = 0, world: int = 1) -> Any:
        n = self.name
        if n == "plain":
            from torch.utils.data import DataLoader

            return DataLoader(recordio_dataset(str(data[0] / "data.rio")), **loader_kwargs())
        if n == "torchdata":
            from torchdata.stateful_dataloader import StatefulDataLoader
            from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

            ds = recordio_dataset(str(data[0] / "data.rio"))
            if len(data) > 1:
                return torchdata_mixture(data)
            sampler = None
            if world > 1:
                sampler = StatefulDistributedSampler(ds, world, rank, shuffle=False)
            return StatefulDataLoader(ds, sampler=sampler, **loader_kwargs())
        if n == "chunkmaster":
            from chunkmaster import Source
            from chunkmaster.torch import Loader

            dataset: Any = [str(data[0] / "data.rio")]
            if len(data) > 1:
                dataset = {
                    name: Source(str(d / "data.rio"), w)
                    for (name, _, _, w), d in zip(MIXTURE, data, strict=True)
                }
            restore = os.environ.get("PEERS_RESTORE_KEY")
            return Loader(
                self.addr, dataset=dataset, transform=as_tensor, restore_key=restore,
                **loader_kwargs(),
            )  # fmt: skip
        if n == "streaming":
            from streaming import Stream, StreamingDataLoader
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()  # a SIGKILLed run leaves its shared memory behind
            samples = streaming_samples()
            if len(data) > 1:
                streams = [
                    Stream(local=str(d), proportion=w)
                    for (_, _, _, w), d in zip(MIXTURE, data, strict=True)
                ]
                ds = samples(streams=streams, epoch_size=MIX_EPOCH, batch_size=BATCH)
            else:
                ds = samples(local=str(data[0]), batch_size=BATCH)
            return StreamingDataLoader(ds, **loader_kwargs())
        if n == "litdata":
            from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset

            if len(data) > 1:
                parts = [StreamingDataset(input_dir=str(d), transform=as_tensor) for d in data]
                weights = [w for _, _, _, w in MIXTURE]
                ds = CombinedStreamingDataset(
                    parts, seed=30, weights=weights, iterate_over_all=False
                )  # weights need iterate_over_all=False: it ends when a source runs out
            else:
                ds = StreamingDataset(input_dir=str(data[0]), transform=as_tensor)
            return StreamingDataLoader(ds, **loader_kwargs())
        raise ValueError(n)

    def state(self, loader: Any) -> Any:
        return loader.state_dict()

    def load(self, loader: Any, state: Any) -> None:
        loader.load_state_dict(state)

    def after_step(self, loader: Any) -> None:
        if self.name == "chunkmaster":
            loader.commit()


def torchdata_mixture(data: list[Path]) -> Any:
    """torchdata's way to mix sources: nodes.MultiNodeWeightedSampler over one node per
    source (its records in order), batched, collated, in a nodes.Loader (state_dict)."""
    from torch.utils.data import SequentialSampler, default_collate
    from torchdata import nodes

    sources = {}
    for (name, _, _, _), d in zip(MIXTURE, data, strict=True):
        ds = recordio_dataset(str(d / "data.rio"))
        sources[name] = nodes.Mapper(nodes.SamplerWrapper(SequentialSampler(ds)), ds.__getitem__)
    weights = {name: w for name, _, _, w in MIXTURE}
    mixed = nodes.MultiNodeWeightedSampler(sources, weights, seed=30)
    batches = nodes.Mapper(nodes.Batcher(mixed, BATCH, drop_last=False), default_collate)
    return nodes.Loader(batches)


# ---- the two commands ----


def cmd_serve(args: argparse.Namespace) -> None:
    size = SIZES[args.size][0]
    n = SIZES[args.size][3] * (1 << 20) // size if args.mb is None else args.mb * (1 << 20) // size
    records = Records(size, n)
    data = Path(args.data)
    converted = convert(args.system, records, data)
    master = None
    if args.system == "chunkmaster":  # a real master process on the same machine
        sys.path.insert(0, str(HERE.parent))
        from torch_bench import start_master

        master, args.addr = start_master(data, SIZES[args.size][2])
    system = System(args.system, args.addr)
    loader = system.make([data])

    def one_pass() -> int:
        got = 0
        for batch in loader:
            got += len(batch)
        if got != n:
            raise RuntimeError(f"{args.system}: a pass of {got} records, not {n}")
        return got

    try:
        serve(one_pass, convert_s=converted, records=n)
    finally:
        if master is not None:
            loader.close()
            master.terminate()
            master.wait(30)


def cmd_convert(args: argparse.Namespace) -> None:
    """The exactness runs' data: --records records of --size from id --first."""
    records = Records(SIZES[args.size][0], args.records, first=args.first)
    emit(convert_s=convert(args.system, records, Path(args.data)), records=args.records)


def cmd_exact(args: argparse.Namespace) -> None:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    work = Path(args.work)
    data = [Path(p) for p in args.data.split(",")]
    system = System(args.system, args.addr)
    loader = system.make(data, rank, world)
    if args.phase == "resume":
        owner = 0 if system.global_state else rank
        ckpt = work / f"ckpt-{owner}.pt"
        if ckpt.exists():
            system.load(loader, torch.load(ckpt, weights_only=False))
        else:
            emit(rank=rank, note=f"no checkpoint of rank {owner}: starts from the beginning")
    log = IdLog(work / f"ids-{args.phase}-{rank}.bin")
    step = 0
    error = ""
    try:
        for batch in loader:
            log.add(batch_ids(batch))
            system.after_step(loader)
            step += 1
            if args.phase != "first":
                continue
            if step % args.every == 0:
                checkpoint(system, loader, work, rank, world, log.count)
            if step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    except Exception as exc:  # what the system does is the result: report it, do not hide it
        error = f"{type(exc).__name__}: {exc}"[:300]
    log.close()
    emit(rank=rank, steps=step, records=log.count, error=error)
    if args.system == "chunkmaster":
        loader.close()
    os._exit(0)  # no teardown of workers or process groups left in odd states


def checkpoint(system: System, loader: Any, work: Path, rank: int, world: int, count: int) -> None:
    """Every rank has taken the same steps; the model (here: the count of ids logged) and the
    loader's state are saved together, as a training loop saves them."""
    dist: Any = None
    if world > 1:
        import torch.distributed as dist

        dist.barrier()  # every rank took (and committed) its steps
    if rank == 0 or not system.global_state:
        buf = io.BytesIO()
        torch.save(system.state(loader), buf)
        save_atomic(work / f"ckpt-{rank}.pt", buf.getvalue())
    save_atomic(work / f"count-{rank}", str(count).encode())
    if dist is not None:
        dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", required=True)
    ap.add_argument("--addr", help="the master (chunkmaster)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--data", required=True)
    s.add_argument("--size", required=True, choices=list(SIZES))
    s.add_argument("--mb", type=int)
    c = sub.add_parser("convert")
    c.add_argument("--data", required=True)
    c.add_argument("--size", default="1k", choices=list(SIZES))
    c.add_argument("--records", type=int, required=True)
    c.add_argument("--first", type=int, default=0)
    e = sub.add_parser("exact")
    e.add_argument("--scenario", choices=["kill", "ranks", "mix"], required=True)
    e.add_argument("--phase", choices=["ref", "first", "resume"], required=True)
    e.add_argument("--data", required=True, help="comma-separated: one per source")
    e.add_argument("--work", required=True)
    e.add_argument("--every", type=int, default=10)
    e.add_argument("--kill-at", type=int, default=25)
    args = ap.parse_args()
    {"serve": cmd_serve, "convert": cmd_convert, "exact": cmd_exact}[args.cmd](args)


if __name__ == "__main__":
    main()

"""Data-parallel training over a chunkmaster job under torchrun: commits beside the model.

    chunkmaster master --port 8080 &
    torchrun --nproc-per-node 4 examples/train_ddp.py --addr 127.0.0.1:8080 \\
        --dataset 'data/*.rio' --records 1200 --passes 2 --checkpoint run/ckpt.pt

Each rank is one trainer of the job: its `Loader` holds the rank's session (WORLD_SIZE and RANK
come from torchrun), and its DataLoader workers read the tasks the master hands that rank. The
master gives ranks equal steps (`--equal-steps auto`, its default): every rank gets the same
number of records in a pass, so the same number of batches, and no rank waits for ever at the
next all-reduce.

The process group starts with `chunkmaster.torch.init_process_group`, whose rendezvous keys
are new at every elastic restart (with gloo, torch 2.13, a restarted group would otherwise meet
the addresses of the ranks that died). After each optimizer step the rank commits the batches
it took. Every `--save-every` steps all
ranks have committed; after a barrier rank 0 saves the model and the loader's state (the job's
data checkpoint) in one file. A rank that dies makes torchrun restart the whole group (give it
`--max-restarts`): every rank then loads that file, and the loader takes the master back to the
same point, so the job trains on every record exactly once per pass whatever died when.

The model is a linear regression; beside it the job keeps `seen`, how many times it trained on
each record in each pass (summed over ranks at every step, checkpointed with the model). With
`--report FILE` rank 0 writes it at the end: every count is 1 when the promise holds. It also
counts, per pass, the neighbours in a batch and how many of them are consecutive records
(`adjacent`): about one in a thousand when the master shuffles records (--shuffle-window).
Records are 8 bytes of ID then 4 float32 features and a float32 target (see `encode`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from chunkmaster.tokens import read_token
from chunkmaster.torch import Loader, init_process_group

RECORD = struct.Struct("<q5f")  # record ID, 4 features, target


def encode(record_id: int, features: list[float], target: float) -> bytes:
    return RECORD.pack(record_id, *features, target)


def decode(record: bytes) -> torch.Tensor:
    """A record as [ID, x1..x4, y] (float64 keeps IDs exact)."""
    return torch.tensor(RECORD.unpack(record), dtype=torch.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", required=True, help="the master's host:port")
    ap.add_argument("--dataset", required=True, help="file pattern of the dataset")
    ap.add_argument("--token-file", help="the master's token (default: CHUNKMASTER_TOKEN)")
    ap.add_argument("--tls-ca", help="talk TLS; the CA that signed the master's certificate")
    ap.add_argument("--records", type=int, required=True, help="records in the dataset")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    ap.add_argument("--checkpoint", required=True, help="model + data checkpoint file")
    ap.add_argument("--save-every", type=int, default=5, help="steps between checkpoints")
    ap.add_argument("--report", help="rank 0 writes the per-pass record counts here")
    ap.add_argument("--die", help="RANK:STEP: that rank SIGKILLs itself at that step (a test)")
    ap.add_argument("--stop-after", type=int, help="every rank exits after this many steps")
    args = ap.parse_args()

    # The group's rendezvous keys are kept per elastic restart: gloo (torch 2.13) would
    # otherwise read the addresses of the ranks that died.
    init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1).double())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = torch.zeros(args.passes, args.records, dtype=torch.int64)
    adjacent = torch.zeros(args.passes, 2, dtype=torch.int64)  # (consecutive, neighbours)
    loader = Loader(
        args.addr,
        dataset=[args.dataset],
        transform=decode,
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=True,
        name=f"rank{rank}",
        token=None if args.token_file is None else read_token(args.token_file),
        tls_ca=args.tls_ca,
    )
    ckpt = Path(args.checkpoint)
    step = 0
    if ckpt.exists():  # a restart: the model and the data go back to the same point
        state = torch.load(ckpt, weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        seen = state["seen"]
        adjacent = state["adjacent"]
        step = state["step"]
        loader.load_state_dict(state["loader"])
    die_rank, die_step = (int(x) for x in args.die.split(":")) if args.die else (-1, -1)

    first = int(loader.client.status()["cur_pass"])  # type: ignore[call-overload]
    for pass_id in range(first, args.passes):
        loader.set_pass(pass_id)
        for batch in loader:
            ids, x, y = batch[:, 0].long(), batch[:, 1:5], batch[:, 5:6]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            counts = torch.bincount(ids, minlength=args.records)
            dist.all_reduce(counts)  # what every rank trained on at this step
            seen[pass_id] += counts
            pairs = torch.tensor([int((ids[1:] == ids[:-1] + 1).sum()), len(ids) - 1])
            dist.all_reduce(pairs)
            adjacent[pass_id] += pairs
            loader.commit()  # exactly the batches this rank took
            step += 1
            if rank == die_rank and step == die_step and restart == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % args.save_every == 0:
                dist.barrier()  # every rank has committed this step
                if rank == 0:
                    save(ckpt, model, optimizer, (seen, adjacent), step, loader.state_dict())
                dist.barrier()  # nobody commits the next step before the save
            if args.stop_after is not None and step >= args.stop_after:
                loader.close()
                dist.destroy_process_group()
                return
    if rank == 0 and args.report:
        Path(args.report).write_text(
            json.dumps({"world": world, "seen": seen.tolist(), "adjacent": adjacent.tolist()})
        )
    loader.close()
    dist.destroy_process_group()


def save(
    path: Path,
    model: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    counts: tuple[torch.Tensor, torch.Tensor],
    step: int,
    loader_state: dict[str, object],
) -> None:
    """One file for the model and the data, written atomically."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "seen": counts[0],
            "adjacent": counts[1],
            "step": step,
            "loader": loader_state,
        },
        tmp,
    )
    os.replace(tmp, path)


if __name__ == "__main__":
    main()

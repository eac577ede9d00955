"""A PyTorch trainer process for the tests: a chunkmaster.torch.Loader with DataLoader workers,
a "model" that counts how often it trained on each record in each pass, a commit after every
step and, with --checkpoint, the model and the loader's state saved together every few steps.

    python torch_trainer.py --addr A --dataset PATTERN --records N --passes P --out FILE
        [--workers 2] [--batch-size 8] [--prefetch-factor 2] [--checkpoint FILE --save-every K]
        [--die-at-step S] [--transform record_id|slow_record_id|worker_and_head_id]
        [--name NAME]
        [--restore-key KEY] [--break-to-save]
        [--context fork|spawn|forkserver] [--not-persistent]

Started again with the same --checkpoint after a SIGKILL (--die-at-step kills it once: a file
beside the checkpoint remembers it did), it loads the model and the loader's state, so the
master goes back to the checkpoint's position. At the end it writes {"counts": [[...]]} (per
pass, per record ID) and the loader's read errors to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chunkmaster.torch import Loader
from helpers import torch_parts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--passes", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--checkpoint")
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--die-at-step", type=int)
    ap.add_argument("--transform", default="record_id")
    ap.add_argument("--name")
    ap.add_argument("--context", help="the workers' start method (default: the Loader's)")
    ap.add_argument("--not-persistent", action="store_true", help="workers started each round")
    ap.add_argument("--log", help="append each batch's record IDs here, a line a batch")
    ap.add_argument(
        "--freeze-after-step", type=int, help="SIGSTOP the process group after this step's commit"
    )
    ap.add_argument("--restore-key", help="the Loader's restore_key (the same at every restart)")
    ap.add_argument(
        "--break-to-save",
        action="store_true",
        help="leave the loop with `break` before each save, save, then go on with the pass",
    )
    args = ap.parse_args()
    batches = open(args.log, "a") if args.log else None  # noqa: SIM115 - closed at exit

    loader = Loader(
        args.addr,
        dataset=[args.dataset],
        transform=getattr(torch_parts, args.transform),
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=args.workers > 0 and not args.not_persistent,
        prefetch_factor=args.prefetch_factor,
        multiprocessing_context=args.context,
        worker_init_fn=torch_parts.dump_on_crash,
        name=args.name,
        restore_key=args.restore_key,
    )
    counts = torch.zeros(args.passes, args.records, dtype=torch.int64)
    step = 0
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        counts, step = state["counts"], state["step"]
        loader.load_state_dict(state["loader"])
    died = Path(f"{args.checkpoint}.died") if args.checkpoint else None
    workers: set[int] = set()  # the DataLoader workers whose records were trained on
    first = int(loader.client.status()["cur_pass"])  # type: ignore[call-overload]
    for p in range(first, args.passes):
        loader.set_pass(p)
        read_to_end = False
        while not read_to_end:  # with --break-to-save, the loop is left before each save
            for batch in loader:
                if args.transform == "worker_and_head_id":  # rows of [record, worker]
                    workers.update(int(w) for w in batch[:, 1].tolist())
                    batch = batch[:, 0]
                ids = torch_parts.ids_of(batch)
                for i in ids:
                    counts[p, i] += 1  # "training" on the batch
                if batches is not None:
                    batches.write(f"{p} {' '.join(map(str, ids))}\n")
                    batches.flush()
                loader.commit()
                step += 1
                if step == args.freeze_after_step:  # frozen, workers and all, until SIGCONT
                    os.killpg(os.getpgid(0), signal.SIGSTOP)
                if args.die_at_step == step and died is not None and not died.exists():
                    died.write_text("")
                    os.kill(os.getpid(), signal.SIGKILL)
                if ckpt is not None and step % args.save_every == 0:
                    if args.break_to_save:
                        break
                    save(ckpt, counts, step, loader)
            else:
                read_to_end = True
                continue
            save(ckpt, counts, step, loader)  # after a break: the loop's batches, no more
        loader.commit()  # the pass's last batches (a no-op when nothing is left to commit)
    Path(args.out).write_text(
        json.dumps(
            {
                "counts": counts.tolist(),
                "read_errors": loader.read_errors,
                "workers": sorted(workers),
            }
        )
    )
    loader.close()


def save(ckpt: Path | None, counts: torch.Tensor, step: int, loader: Loader) -> None:
    """The model and the loader's state in one file, atomically."""
    assert ckpt is not None
    state = {"counts": counts, "step": step, "loader": loader.state_dict()}
    torch.save(state, f"{ckpt}.tmp")
    os.replace(f"{ckpt}.tmp", ckpt)


if __name__ == "__main__":
    main()

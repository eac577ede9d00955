"""`chunkmaster checkpoint`: save a running job's data checkpoint, or show what one holds."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from chunkmaster.cli.common import CliError, add_master_location, add_security_flags, ask_master
from chunkmaster.core.sizes import size_text
from chunkmaster.logs import plural


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "checkpoint",
        help="save a job's data checkpoint (its position at the last commits), or show one",
        description=(
            "A data checkpoint is the job's data position at the trainers' last commits. Save "
            "it beside the model checkpoint; start a fresh master with --restore FILE to "
            "continue from exactly there."
        ),
    )
    cmds = p.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    save = cmds.add_parser("save", help="ask a master for its data checkpoint; write it to FILE")
    add_master_location(save, positionals=True)
    save.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    save.add_argument("file", metavar="FILE", help="where to write it (atomically)")
    add_security_flags(save)
    save.set_defaults(func=run_save)
    show = cmds.add_parser("show", help="print what a data checkpoint file holds")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=run_show)


def write_atomically(path: str, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync it, and rename it over `path`."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CliError(f"cannot write {path}: {exc.strerror}") from None
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def run_save(args: argparse.Namespace) -> int:
    blob = ask_master(args, lambda conn: conn.data_checkpoint())
    write_atomically(args.file, blob)
    print(f"saved the data checkpoint of {args.addr} to {args.file} ({len(blob)} bytes)")
    return 0


def describe(cp: Any) -> dict[str, Any]:
    ds = cp.dataset
    return {
        "job": cp.job,
        "job_id": cp.job_id or None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cp.created)),
        "dataset": {
            "globs": list(ds.globs),
            "files": len(ds.files),
            "chunks": ds.num_chunks,
            "chunks_per_task": ds.chunks_per_task,
            "format": ds.format,
            "chunk_size": ds.chunk_size,  # None: the files' own chunks, or not recorded
        },
        "shuffle_seed": cp.shuffle_seed,
        "shuffle_window": cp.shuffle_window,  # 0: off (and in checkpoints older than it)
        "tasks": cp.num_tasks,
        "first_pass_not_committed": cp.floor,
        "passes": [
            {
                "pass": p.pass_id,
                "tasks_committed": len(p.full),
                "tasks_partly": len(p.partial),
                # split by equal steps, a later piece committed before the ones ahead of it
                **({"tasks_with_ranges_ahead": len(p.ranges)} if p.ranges else {}),
            }
            for p in cp.passes
        ],
    }


def run_show(args: argparse.Namespace) -> int:
    from chunkmaster.core.checkpoint import CheckpointError, decode
    from chunkmaster.master.checkpoint_file import read_checkpoint

    try:
        cp = decode(read_checkpoint(args.file))
    except CheckpointError as exc:
        raise CliError(f"{args.file}: {exc}") from None
    info = describe(cp)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    ds = info["dataset"]
    size = "" if ds["chunk_size"] is None else f" of up to {size_text(ds['chunk_size'])}"
    print(f"job      {info['job']} (saved {info['created']}, id {info['job_id'] or 'none'})")
    print(
        f"dataset  {ds['globs']}: {plural(ds['files'], ds['format'] + ' file')}, "
        f"{plural(ds['chunks'], 'chunk')}{size}, {plural(info['tasks'], 'task')} of up to "
        f"{plural(ds['chunks_per_task'], 'chunk')}"
    )
    if info["shuffle_seed"] is not None:
        window = info["shuffle_window"]
        print(
            f"shuffle  seed {info['shuffle_seed']}"
            + (f", window {plural(window, 'record')}" if window else "")
        )
    print(f"position pass {info['first_pass_not_committed']} (earlier passes are done)")
    for p in info["passes"]:
        print(
            f"  pass {p['pass']}: {plural(p['tasks_committed'], 'task')} committed whole, "
            f"{p['tasks_partly']} in part"
        )
    return 0

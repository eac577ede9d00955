"""A trainer for the upgrade test, run by the python of either release (the old one's venv,
or this checkout's): it reads one pass through `chunkmaster.Client`, committing every
`--commit-every` records, stops after `--take` records (0: the whole pass) with a last commit,
closes its client and prints the records it read as one JSON list of strings.

Only the Client calls every release has: Client(addr), set_dataset, records, commit, close."""

from __future__ import annotations

import argparse
import json
import sys

import chunkmaster


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--pass", dest="pass_id", type=int, required=True)
    p.add_argument("--take", type=int, default=0)
    p.add_argument("--commit-every", type=int, default=100)
    args = p.parse_args()
    got: list[str] = []
    client = chunkmaster.Client(args.addr)
    try:
        client.set_dataset([args.dataset])
        for record in client.records(args.pass_id):
            got.append(bytes(record).decode())
            # The last commit is made while the pass is being read: 469d9ed's client drops a
            # commit of the task it was reading once the loop over the pass is left.
            if len(got) % args.commit_every == 0 or len(got) == args.take:
                client.commit()
            if args.take and len(got) == args.take:
                break
        client.commit()
    finally:
        client.close()
    json.dump(got, sys.stdout)


if __name__ == "__main__":
    main()

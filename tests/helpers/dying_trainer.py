"""A trainer that dies by its own hand (SIGKILL) as soon as it reads a record that starts with
a marker: a stand-in for a chunk that kills whoever reads it (a decoder that eats all memory,
or crashes). Reads pass 0 with a session and prints one JSON line at its end: its records and
their digest.

Usage: python -m helpers.dying_trainer ADDR PATTERN MARKER
"""

from __future__ import annotations

import json
import os
import signal
import sys

from chunkmaster import Client
from chunkmaster.digest import Digest


def main() -> None:
    addr, pattern, marker = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    digest = Digest()
    with Client(addr) as client:
        client.set_dataset([pattern])
        for record in client.records(0):
            if record.startswith(marker):
                os.kill(os.getpid(), signal.SIGKILL)
            digest.add(record)
    print(json.dumps({"records": digest.count, "digest": digest.hex()}), flush=True)


if __name__ == "__main__":
    main()

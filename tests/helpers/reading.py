"""Reading through a Client in a test."""

from __future__ import annotations

from chunkmaster.client import EndOfPass
from chunkmaster.client.client import Client


def rest_of_pass(client: Client, timeout: float = 60.0) -> list[bytes]:
    """The records left of the client's pass, in the order it reads them."""
    out = []
    while True:
        try:
            out.append(client.next_record(timeout=timeout))
        except EndOfPass:
            return out

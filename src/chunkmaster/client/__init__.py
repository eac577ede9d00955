"""The trainer's side: a connection to the master, and the record-streaming client."""

from chunkmaster.client.client import Client, ClientClosedError, EndOfPass, TaskReadError
from chunkmaster.client.connection import MasterConnection, TransportError
from chunkmaster.client.mixture import Source, WeightChange

__all__ = [
    "Client",
    "ClientClosedError",
    "EndOfPass",
    "MasterConnection",
    "Source",
    "TaskReadError",
    "TransportError",
    "WeightChange",
]

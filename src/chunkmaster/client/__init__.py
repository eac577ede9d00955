"""The trainer's side: a connection to the master, and the record-streaming client."""

from chunkmaster.client.client import Client, ClientClosedError, EndOfPass, TaskReadError
from chunkmaster.client.connection import MasterConnection, TransportError
from chunkmaster.client.errors import NeverConnectedError, StartupTimeoutError
from chunkmaster.client.mixture import Source, WeightChange
from chunkmaster.client.options import Connection, Reading, Session

__all__ = [
    "Client",
    "ClientClosedError",
    "Connection",
    "EndOfPass",
    "MasterConnection",
    "NeverConnectedError",
    "Reading",
    "Session",
    "Source",
    "StartupTimeoutError",
    "TaskReadError",
    "TransportError",
    "WeightChange",
]

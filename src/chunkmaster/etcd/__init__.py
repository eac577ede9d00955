"""chunkmaster on etcd, in layers, for the master and for trainers.

`options` (where etcd is and how to log in), `keys` (the key layout of a job), `rpc` (the v3
protocol messages) and `discovery` (the trainers' `MasterLocator`) need nothing of the master.
`connection` (an asyncio connection with fail-over and deadlines), `election` (lease, lock,
fencing) and `chunked` (values larger than one etcd request) serve the master's journal store,
`chunkmaster.store.etcd`.

This module imports nothing, so a trainer importing `chunkmaster.etcd.discovery` loads only
what discovery needs.
"""

"""chunkmaster on etcd, in layers, for the master and for trainers.

`options` (where etcd is and how to log in), `keys` (the key layout of a job), `rpc` (the v3
protocol messages) and `discovery` (the trainers' `MasterLocator`) need nothing of the master.
`connection` (an asyncio connection with fail-over and deadlines), `election` (lease, lock,
fencing) and `chunked` (values larger than one etcd request) serve `journal`, the master's
journal store on etcd (`EtcdStore`, also its `Leadership`). Of `chunkmaster.store` the layers
use only `store.base` (the `Store` protocol and its errors); `store` uses nothing of etcd.

This module imports nothing, so a trainer importing `chunkmaster.etcd.discovery` loads only
what discovery needs.
"""

"""The imperative shell around the core: durability, timers, dataset loading, RPC.

runner.py         a master process: store, leadership, recovery, serving, stopping
config.py         MasterConfig: the command line's values, checked
settings.py       Settings: how the service runs the job; the one table of defaults
leadership.py     who leads: etcd's election, or a master alone on an embedded store
server.py         the gRPC servicer (unary calls) and the health service
stream.py         one trainer's Session stream, its messages in order
auth.py           TLS, mutual TLS and the token
metrics.py        Prometheus metrics and the dashboard (HTTP)
readiness.py      the ready file
service.py        Service: the parts below wired together, and the operations
checks.py         request checks for every path (one wait limit)
owners.py         who may report on a task
job_dataset.py    set_dataset: the job's one dataset
datasets.py       indexing dataset files on daemon threads; the same-dataset test
roots.py          where datasets may lie (--data-root)
dispatch.py       handing out tasks, and waiting for one
reports.py        finishes, failures, progress, tasks handed back
timeouts.py       task deadlines (stuck, not slow) -> Fail("timeout")
sessions.py       sessions opened, resumed and ended; leases.py: their leases
checkpoints.py    commits, data checkpoints, restores; checkpoint_file.py: the files
save_model.py     save-model approval
status.py         the status as a typed view
ledger.py         the state and its journal: apply now, acknowledge once durable
"""

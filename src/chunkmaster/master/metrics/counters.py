"""The master's metrics registry: the state's figures (`collector.StateCollector`) plus counters
of what leaves no trace in the state: dispatches, finishes and failures (the ledger's
`event_applied`), store writes (its `batch_written`), RPCs (`interceptor.RpcMetrics`) and
leadership. Every figure lives in a private registry, so two masters in one process (the tests)
never mix their numbers."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from chunkmaster.core.events import Dispatch, Event, Fail, Finish
from chunkmaster.core.master_state import READ_FAILURE
from chunkmaster.core.model import TIMEOUT_REASON, Task
from chunkmaster.master.ledger import LedgerSubscriber
from chunkmaster.master.metrics.collector import StateCollector
from chunkmaster.master.service import Service

#: Seconds a task may take between dispatch and finish: from a tiny test task to hours.
TASK_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1200, 3600, 4 * 3600)
#: Seconds for one RPC or one store write: sub-millisecond to a GetTask's long wait.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
    10, 30, 60,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class LeadershipChanges:
    """Elections this process won or lost, over all its terms. A term's registry is new (a
    standby serves no metrics), so its counter starts from this count: what Prometheus
    scrapes grows from one term to the next instead of being 1 at every term."""

    def __init__(self) -> None:
        self.count = 0


class MasterMetrics(LedgerSubscriber):
    """The master's registry: state figures read at scrape time plus event counters."""

    def __init__(self, service: Service, changes: LeadershipChanges | None = None) -> None:
        self.service = service
        self._changes = LeadershipChanges() if changes is None else changes
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        r.register(StateCollector(service))
        self.dispatches = Counter("chunkmaster_dispatches", "Tasks handed out.", registry=r)
        self.finishes = Counter("chunkmaster_finishes", "Tasks reported finished.", registry=r)
        self.failures = Counter(
            "chunkmaster_failures",
            "Task failures by reason: 'timeout' (no finish in time) or 'read failure' "
            "(the trainer reported one).",
            ["reason"],
            registry=r,
        )
        self.task_seconds = Histogram(
            "chunkmaster_task_duration_seconds",
            "Seconds from a task's dispatch to its finish.",
            buckets=TASK_BUCKETS,
            registry=r,
        )
        self._register_rpc_and_store(r)
        self.leader = Gauge(
            "chunkmaster_leader", "1 while this master leads and serves.", registry=r
        )
        self.leadership_changes = Counter(
            "chunkmaster_leadership_changes",
            "Times this process won or lost the job's leadership (etcd).",
            registry=r,
        )
        self.leadership_changes.inc(self._changes.count)
        for reason in (TIMEOUT_REASON, READ_FAILURE):
            self.failures.labels(reason)
        # task -> (epoch, monotonic time) of its latest dispatch; one entry per task at most,
        # so tasks handed back without a finish (a session's end) cost no more than that
        self._dispatched_at: dict[int, tuple[int, float]] = {}
        service.ledger.subscribe(self)

    def _register_rpc_and_store(self, r: CollectorRegistry) -> None:
        """The RPCs' latencies and refusals, and the store's batches and their latencies."""
        self.rpc_seconds = Histogram(
            "chunkmaster_rpc_duration_seconds",
            "Seconds a unary RPC took to answer, by method (GetTask includes its wait).",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.refused = Counter(
            "chunkmaster_rpc_refused",
            "RPCs answered with an error, by method and status code.",
            ["method", "code"],
            registry=r,
        )
        self.store_seconds = Histogram(
            "chunkmaster_store_commit_seconds",
            "Seconds one batch of journal entries took to be durable in the store.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.store_batch = Histogram(
            "chunkmaster_store_batch_entries",
            "Journal entries written per store batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )

    def event_applied(self, event: Event, result: Task | bool | int | None) -> None:
        if isinstance(event, Dispatch) and isinstance(result, Task):
            self.dispatches.inc()
            self._dispatched_at[result.meta.id] = (result.meta.epoch, time.monotonic())
        elif isinstance(event, Finish) and result:
            self.finishes.inc()
            began = self._dispatched_at.pop(event.task_id, None)
            if began is not None and began[0] == event.epoch:
                self.task_seconds.observe(time.monotonic() - began[1])
        elif isinstance(event, Fail) and result:
            self.failures.labels(
                TIMEOUT_REASON if event.reason == TIMEOUT_REASON else READ_FAILURE
            ).inc()
            self._dispatched_at.pop(event.task_id, None)

    def batch_written(self, entries: int, seconds: float) -> None:
        self.store_batch.observe(entries)
        self.store_seconds.observe(seconds)

    def leading(self, leads: bool, *, change: bool) -> None:
        """Note whether this master leads; `change`: it won or lost an election."""
        self.leader.set(1 if leads else 0)
        if change:
            self._changes.count += 1
            self.leadership_changes.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

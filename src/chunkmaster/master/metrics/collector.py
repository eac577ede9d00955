"""The figures the master's state holds, read from the service when Prometheus scrapes, so
they can never drift from it."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chunkmaster.master.service import Service
from chunkmaster.master.status import MixtureView, PassRecords, StoreView, Trainer


class StateCollector(Collector):
    """The figures the state holds, read at scrape time from `Service.status_view()`."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        st = self.service.status_view()
        yield _gauge("chunkmaster_pass", "The pass being dispatched.", st.cur_pass)
        yield _gauge("chunkmaster_ready", "1 once a dataset is set.", int(st.ready))
        yield _gauge("chunkmaster_dataset_tasks", "Tasks in one pass.", st.num_tasks)
        queues = GaugeMetricFamily(
            "chunkmaster_tasks", "Tasks of the current pass by queue.", labels=["queue"]
        )
        for queue, n in (("todo", st.todo), ("pending", st.pending), ("done", st.done)):
            queues.add_metric([queue], n)
        queues.add_metric(["failed"], st.failed)
        yield queues
        yield _gauge(
            "chunkmaster_tasks_with_failures",
            "Tasks that failed at least once (all passes).",
            st.tasks_with_failures,
        )
        yield _gauge("chunkmaster_trainers", "Trainers with a live session.", st.sessions)
        yield CounterMetricFamily(
            "chunkmaster_task_requests",
            "Requests for a task (GetTask, or a session's NextTask asking for one), answered "
            "or not: the trainers' demand.",
            value=self.service.task_requests,
        )
        yield from _trainer_metrics(st.trainers)
        yield from _pass_metrics(st.ledger)
        yield _gauge(
            "chunkmaster_job_stopped",
            "1 once more records were quarantined in a pass than the error budget allows.",
            int(st.job_stopped is not None),
        )
        yield _gauge(
            "chunkmaster_commit_floor", "The first pass not wholly committed.", st.commit_floor
        )
        yield from _store_metrics(st.store)
        if st.mixture is not None:
            yield from _source_metrics(st.mixture)


def _source_metrics(mixture: MixtureView) -> Iterator[Metric]:
    records = GaugeMetricFamily(
        "chunkmaster_source_records",
        "Records of each source of a mixture, the whole job, by stage: handed out, "
        "reported consumed, committed.",
        labels=["source", "stage"],
    )
    target = GaugeMetricFamily(
        "chunkmaster_source_weight",
        "Each source's weight in force (normalised: the share of records it is planned).",
        labels=["source"],
    )
    share = GaugeMetricFamily(
        "chunkmaster_source_share",
        "Each source's share of the records consumed so far (0 to 1).",
        labels=["source"],
    )
    epoch = GaugeMetricFamily(
        "chunkmaster_source_epoch", "The epoch of each source's next task.", labels=["source"]
    )
    for s in mixture.sources:
        for stage, n in (
            ("handed_out", s.handed_out),
            ("consumed", s.consumed),
            ("committed", s.committed),
        ):
            records.add_metric([s.name, stage], n)
        target.add_metric([s.name], s.target)
        if s.share is not None:
            share.add_metric([s.name], s.share)
        epoch.add_metric([s.name], s.epoch)
    yield records
    yield target
    yield share
    yield epoch


#: The labels of a trainer's series: its name and its rank ("" when it declared none), as the
#: trainer declares them, never its session: a rank restarted under the same name continues
#: its series, so they stay as many as the trainers (docs/observability.md).
TRAINER_LABELS = ["trainer", "rank"]


def trainer_label(t: Trainer) -> str:
    """The `trainer` label: the trainer's name, but a ranked trainer's host where its name is
    the client's default (HOST:PID:N, new with every process: a torchrun rank's), so that a
    restarted rank continues its series. A trainer without a rank keeps its name: several of
    them may share a host."""
    if t.rank is not None and re.fullmatch(rf"{re.escape(t.host)}:{t.pid}:\d+", t.name):
        return t.host
    return t.name


def trainer_series(trainers: Sequence[Trainer]) -> dict[tuple[str, str], Trainer]:
    """The live sessions by their labels, one each: where a restarted trainer's new session
    shares them with its old one (not yet expired), the one opened last."""
    series: dict[tuple[str, str], Trainer] = {}
    for t in trainers:  # in the order the sessions were opened
        series[(trainer_label(t), "" if t.rank is None else str(t.rank))] = t
    return series


def _trainer_metrics(trainers: Sequence[Trainer]) -> Iterator[Metric]:
    rate = GaugeMetricFamily(
        "chunkmaster_trainer_records_per_second",
        "Each trainer's recent reading rate (records/s), from its progress reports.",
        labels=TRAINER_LABELS,
    )
    consumed = GaugeMetricFamily(
        "chunkmaster_trainer_records_consumed",
        "Records each trainer's session reported consumed, all passes.",
        labels=TRAINER_LABELS,
    )
    wait = GaugeMetricFamily(
        "chunkmaster_trainer_data_wait_seconds",
        "How long each trainer's training loop waited for a batch over its last minute "
        "(p50, p99), as its loader measured it.",
        labels=[*TRAINER_LABELS, "quantile"],
    )
    share = GaugeMetricFamily(
        "chunkmaster_trainer_data_wait_share",
        "The share of each trainer's wall time its training loop spent waiting for data "
        "over its last minute (0 to 1): a rank that starves shows here.",
        labels=TRAINER_LABELS,
    )
    for (name, rank), t in trainer_series(trainers).items():
        labels = [name, rank]
        if t.records_per_second is not None:
            rate.add_metric(labels, t.records_per_second)
        consumed.add_metric(labels, t.records_consumed)
        w = t.data_wait
        if w is not None:
            wait.add_metric([*labels, "0.5"], w.p50_ms / 1000)
            wait.add_metric([*labels, "0.99"], w.p99_ms / 1000)
            share.add_metric(labels, w.share)
    yield rate
    yield consumed
    yield wait
    yield share


def _pass_metrics(ledger: Sequence[PassRecords]) -> Iterator[Metric]:
    records = GaugeMetricFamily(
        "chunkmaster_pass_records",
        "Records of a pass (the current and the previous one) by stage: handed out, "
        "reported consumed, committed, quarantined (not delivered: their task failed "
        "more than the limit); with equal steps also dropped (not handed out) and "
        "padded (handed out again to even the trainers up).",
        labels=["pass", "stage"],
    )
    again = GaugeMetricFamily(
        "chunkmaster_pass_records_redispatched",
        "Records of a pass handed out again, by why.",
        labels=["pass", "reason"],
    )
    for entry in ledger:
        p = str(entry.pass_id)
        for stage in ("dispatched", "consumed", "committed", "quarantined", "dropped", "padded"):
            records.add_metric([p, stage], getattr(entry, stage))
        for reason, n in entry.redispatched.items():
            again.add_metric([p, reason], n)
    yield records
    yield again


def _store_metrics(store: StoreView) -> Iterator[Metric]:
    yield _gauge("chunkmaster_store_healthy", "1 while the store takes writes.", int(store.healthy))
    yield _gauge(
        "chunkmaster_store_failed_attempts",
        "Store writes that failed since it last worked.",
        store.failed_attempts,
    )
    yield _gauge("chunkmaster_journal_seq", "Last journal entry applied.", store.seq)
    yield _gauge(
        "chunkmaster_journal_durable_seq",
        "Last journal entry the store acknowledged.",
        store.durable_seq,
    )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)

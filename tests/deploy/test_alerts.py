"""Scraping that works and alerts that are right (issue 31), against real master processes with
TLS and a token (docs/security.md):

- a real Prometheus runs deploy/prometheus/scrape-config.yaml (its targets and files replaced)
  on a master and a standby's port: the master is up, the standby down, every rule of
  deploy/prometheus/chunkmaster-alerts.yaml evaluates without error and none fires (nor is
  pending), and its scrapes never raise the master's refusal counter; the ServiceMonitor's
  endpoint, made a scrape job as the operator would, scrapes a master behind two Services
  once;
- the master is scraped as Prometheus scrapes it (HTTPS, the bearer token, the text format)
  through a job's life: trainers reading, the job finished, scrapes without the token (401),
  RPCs with a wrong token, the master gone; a job whose trainer holds a task and stops; one
  whose trainer asks for tasks it never gets (its pass waits for a rank that never comes); and
  one whose trainer reads one long task slowly, reporting its progress.
  The scrapes, a minute apart, are `promtool test rules`' input series (each with the target
  labels Prometheus gives it, and `up`), and the test asserts which alerts fire when:
  ChunkmasterPassStalled never on the finished job and on the stalled one after its 15 + 5
  minutes and never on the slow one, ChunkmasterUnauthenticatedCalls for the RPCs and not for
  the refused scrapes,
  ChunkmasterNoLeader once the master is gone.

promtool and prometheus come from Debian's prometheus package (scripts/ensure-promtool.sh,
which `make test` runs)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.datasets import numbered_records
from helpers.deploy import REPO, ensure, server_pki
from helpers.master_process import MasterProcess
from helpers.waits import wait_for
from prometheus_client.parser import text_string_to_metric_families

from chunkmaster.client.connection import ChannelSecurity, MasterConnection
from chunkmaster.core.errors import UnauthenticatedError
from chunkmaster.master.readiness import read_ready_file

RULES = REPO / "deploy" / "prometheus" / "chunkmaster-alerts.yaml"
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "scrape-config.yaml"
SERVICE_MONITOR = REPO / "deploy" / "prometheus" / "servicemonitor.yaml"
TRAINER = str(REPO / "tests" / "helpers" / "metrics_trainer.py")
TOKEN = "alerts-token-0123456789abcdef"
#: Any job name: the rules take the job from the scrape.
JOB = "training-7"
RECORDS = 60

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Secured:
    """A master's TLS files and token file."""

    ca: str
    cert: str
    key: str
    token_file: str


@pytest.fixture(scope="module")
def promtool() -> str:
    ensure("ensure-promtool.sh")
    path = shutil.which("promtool")
    assert path is not None
    return path


@pytest.fixture
def secured(tmp_path: Path) -> Secured:
    ca, cert, key = server_pki(tmp_path, "localhost", ips=("127.0.0.1",))
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return Secured(ca, cert, key, str(token))


def secured_master(s: Secured, *extra: str) -> MasterProcess:
    args = ["--store", ":memory:", "--metrics-port", "0", "--chunk-per-task", "1"]
    args += ["--token-file", s.token_file, "--tls-cert", s.cert, "--tls-key", s.key]
    return MasterProcess([*args, *extra]).start()


def metrics_url(m: MasterProcess) -> str:
    info = read_ready_file(m.ready_file)
    assert info is not None
    return f"https://{info['metrics_addr']}/metrics"


def get(url: str, ca: str, token: str | None) -> tuple[int, str]:
    """One scrape as Prometheus makes it: HTTPS checked against the CA, the bearer token."""
    headers = {"Accept": "text/plain;version=0.0.4"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    ctx = ssl.create_default_context(cafile=ca)
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=")
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""


def samples(text: str) -> dict[tuple[str, Labels], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def families(text: str) -> set[str]:
    """The metric names a scrape declares, with and without samples."""
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def start_trainer(m: MasterProcess, s: Secured, out: Path, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, TRAINER, "--addr", str(m.addr), "--ca", s.ca, "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKMASTER_")}
    env["CHUNKMASTER_TOKEN_FILE"] = s.token_file
    return subprocess.Popen([*cmd, *args], env=env, stderr=subprocess.DEVNULL)


@dataclass
class Target:
    """One scrape target's samples a minute apart (None: the scrape failed, up 0), with the
    labels Prometheus gives them: job, instance, and the scrape config's app="chunkmaster"."""

    job: str
    instance: str
    steps: list[dict[tuple[str, Labels], float] | None] = field(default_factory=list)

    @property
    def now(self) -> int:
        """The minute of the last step."""
        return len(self.steps) - 1

    def scrape(self, url: str, ca: str) -> dict[tuple[str, Labels], float] | None:
        try:
            status, text = get(url, ca, TOKEN)
        except (urllib.error.URLError, ConnectionError):
            self.steps.append(None)
            return None
        assert status == 200
        self.steps.append(samples(text))
        return self.steps[-1]

    def again(self, minutes: int) -> None:
        """The last scrape's samples, every minute for `minutes` more (nothing changes)."""
        self.steps += [self.steps[-1]] * minutes

    def input_series(self) -> list[dict[str, str]]:
        target = {"job": self.job, "instance": self.instance, "app": "chunkmaster"}
        keys: dict[tuple[str, Labels], None] = {("up", ()): None}
        for step in self.steps:
            keys.update(dict.fromkeys(step or {}))
        series = []
        for name, labels in keys:
            values: list[str] = []
            seen = False
            for step in self.steps:
                if name == "up":
                    v: float | None = 0.0 if step is None else 1.0
                else:
                    v = None if step is None else step.get((name, labels))
                if v is None:  # gone: a stale marker as Prometheus writes, then nothing
                    values.append("stale" if seen else "_")
                    seen = False
                    continue
                assert math.isfinite(v), (name, labels, v)
                values.append(repr(v))
                seen = True
            all_labels = {**dict(labels), **target}
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(all_labels.items()))
            series.append({"series": f"{name}{{{text}}}", "values": " ".join(values)})
        return series


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


FIRING = 'count by (alertname) (ALERTS{alertstate="firing"})'


def promtool_test(
    promtool: str, tmp_path: Path, target: Target, expect: dict[int, set[str]]
) -> None:
    """`promtool test rules` over the target's series: at each minute of `expect`, exactly
    those alerts of the rules file fire."""
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": target.input_series(),
                "promql_expr_test": [
                    {
                        "expr": FIRING,
                        "eval_time": f"{minute}m",
                        "exp_samples": [
                            {"labels": f'{{alertname="{a}"}}', "value": 1} for a in sorted(names)
                        ],
                    }
                    for minute, names in sorted(expect.items())
                ],
            }
        ],
    }
    path = tmp_path / "alerts-test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_leader_is_told_per_namespace_where_every_job_is_called_chunkmaster(
    promtool: str, tmp_path: Path
) -> None:
    """Two deployments scraped through the ServiceMonitor, both job "chunkmaster", in two
    namespaces: the one whose masters serve but none leads fires ChunkmasterNoLeader, named by
    its namespace; the other's leader does not hide it. (Series written here: the rule's
    logic alone, the scrapes above give it real metrics.)"""

    def series(ns: str, metric: str, value: int) -> dict[str, str]:
        labels = f'job="chunkmaster",namespace="{ns}",instance="{ns}-0:9090",app="chunkmaster"'
        return {"series": f"{metric}{{{labels}}}", "values": f"{value}x10"}

    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("team-a", "up", 1),
                    series("team-a", "chunkmaster_leader", 1),
                    series("team-b", "up", 1),
                    series("team-b", "chunkmaster_leader", 0),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": "ChunkmasterNoLeader",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "job": "chunkmaster",
                                    "namespace": "team-b",
                                },
                                "exp_annotations": {
                                    "summary": "chunkmaster: no chunkmaster master serves (none "
                                    "leads, or its scrape fails)"
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "namespaces-test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def rule_metrics() -> set[str]:
    """The chunkmaster metric names the rules read (histogram and counter names as scraped)."""
    rules = yaml.safe_load(RULES.read_text())
    exprs = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    return set(re.findall(r"\bchunkmaster_[a-z_]+", exprs))


def test_the_rules_pass_promtools_check_and_read_metrics_the_master_has(
    promtool: str, secured: Secured
) -> None:
    proc = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    n = len(yaml.safe_load(RULES.read_text())["groups"][0]["rules"])
    assert proc.returncode == 0 and f"SUCCESS: {n} rules found" in proc.stdout, proc
    m = secured_master(secured)
    try:
        status, text = get(metrics_url(m), secured.ca, TOKEN)
        assert status == 200
    finally:
        m.kill()
    declared = families(text)
    scraped = (
        {n for n in declared}
        | {n + "_total" for n in declared}
        | {n + suffix for n in declared for suffix in ("_bucket", "_sum", "_count")}
    )
    assert rule_metrics() - scraped == set()  # a misspelt metric would make a silent rule


def test_a_running_then_finished_job_refused_scrapes_a_wrong_token_and_no_master(
    promtool: str, secured: Secured, tmp_path: Path
) -> None:
    m = secured_master(secured)
    url = metrics_url(m)
    t = Target(JOB, url.split("/")[2])
    expect: dict[int, set[str]] = {}
    data = numbered_records(tmp_path / "data.rio", RECORDS)
    trainers: list[subprocess.Popen[bytes]] = []
    try:
        first = t.scrape(url, secured.ca)
        assert first is not None and first[("chunkmaster_ready", ())] == 0
        # two trainers read two passes: a scrape every half second, a minute apart in the test
        for i in range(2):
            args = ["--passes", "2", "--name", f"w{i}", "--step-time", "0.15"]
            trainers.append(
                start_trainer(m, secured, tmp_path / f"w{i}.out", *args, "--dataset", data)
            )
        while any(p.poll() is None for p in trainers):
            t.scrape(url, secured.ca)
            expect[t.now] = set()
            time.sleep(0.5)
        assert [p.returncode for p in trainers] == [0, 0]
        running = t.now
        assert running >= 8, "too few scrapes of the running job"
        # finished: the trainers are gone, the master sits in pass 2 with every task to do
        last = t.scrape(url, secured.ca)
        assert last is not None
        assert last[("chunkmaster_pass", ())] == 2
        assert last[("chunkmaster_tasks", (("queue", "todo"),))] == RECORDS
        assert last[("chunkmaster_trainers", ())] == 0
        t.again(45)
        for minute in (5, 16, 20, 25, 35, 45):
            expect[running + minute] = set()  # ChunkmasterPassStalled above all

        # a second scraper without the token (annotation scraping, say) every minute, beside
        # the one with it: it is refused (401) and counted, the one with the token never is,
        # and ChunkmasterUnauthenticatedCalls is not about either
        http = ("chunkmaster_rpc_refused_total", (("code", "UNAUTHENTICATED"), ("method", "HTTP")))
        assert http not in last
        for i in range(15):
            assert get(url, secured.ca, None if i % 2 else "not-the-token")[0] == 401
            refused = t.scrape(url, secured.ca)
            assert refused is not None and refused[http] == i + 1
        assert t.scrape(url, secured.ca)[http] == 15  # type: ignore[index]
        expect[t.now] = set()  # 16 minutes of refused scrapes
        t.again(5)

        # a trainer with a wrong token calls every minute: that one is
        calls = t.now
        assert m.addr is not None
        for _ in range(15):
            with (
                MasterConnection(
                    m.addr,
                    security=ChannelSecurity.load(token="wrong-token", tls_ca=secured.ca),
                ) as conn,
                pytest.raises(UnauthenticatedError),
            ):
                conn.status()
            t.scrape(url, secured.ca)
        refusals = [k for k in t.steps[-1] or {} if k[0] == "chunkmaster_rpc_refused_total"]
        assert any(dict(k[1])["method"] != "HTTP" for k in refusals), refusals
        expect[calls + 5] = set()  # for 10m
        expect[t.now] = {"ChunkmasterUnauthenticatedCalls"}

        # the master is gone: its scrapes fail (up 0)
        m.kill()
        gone = t.now + 1
        assert t.scrape(url, secured.ca) is None
        t.again(10)
        # for 2m; the refusals' rate still reads the five minutes before it went
        expect[gone + 1] = {"ChunkmasterUnauthenticatedCalls"}
        expect[gone + 5] = {"ChunkmasterNoLeader"}
    finally:
        for p in trainers:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)
        m.kill()
    promtool_test(promtool, tmp_path, t, expect)


def test_a_trainer_holding_a_task_without_reading_it_stalls_the_pass(
    promtool: str, secured: Secured, tmp_path: Path
) -> None:
    m = secured_master(secured)
    url = metrics_url(m)
    t = Target(JOB, url.split("/")[2])
    data = numbered_records(tmp_path / "data.rio", RECORDS)
    out = tmp_path / "stuck.out"
    args = ["--name", "stuck", "--step-time", "0.1", "--hold-after", "5", "--dataset", data]
    p = start_trainer(m, secured, out, *args)
    consumed = ("chunkmaster_pass_records", (("pass", "0"), ("stage", "consumed")))
    try:
        # read five records, then hold the task in hand with the session alive
        while not (out.exists() and out.read_text().count("r ") >= 5):
            assert p.poll() is None
            t.scrape(url, secured.ca)
            time.sleep(0.3)

        def held() -> bool:
            s = t.scrape(url, secured.ca)
            assert s is not None
            return s.get(consumed, 0) >= 5 and s[("chunkmaster_tasks", (("queue", "pending"),))] > 0

        wait_for(held, "the master to know the trainer consumed 5 records", 30)
        for _ in range(3):
            t.scrape(url, secured.ca)
        t.again(30)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        m.kill()
    # the last step where a task finished or a record was reported consumed: quiet 14 minutes
    # after it (the 15 minutes' window still holds it), firing 15 + 5 minutes after
    moved = [
        i
        for i in range(1, len(t.steps))
        if any(progress(t.steps[i], k) != progress(t.steps[i - 1], k) for k in MOVES)
    ]
    last = moved[-1]
    assert len(t.steps) - 1 - last >= 30, "the trainer kept moving"
    assert progress(t.steps[last], consumed) >= 5
    promtool_test(
        promtool,
        tmp_path,
        t,
        {last: set(), last + 14: set(), last + 22: {"ChunkmasterPassStalled"}},
    )


def test_a_trainer_asking_for_tasks_it_never_gets_stalls_the_pass(
    promtool: str, secured: Secured, tmp_path: Path
) -> None:
    """Rank 0 of 2 asks and asks (its long polls end every 2 s), but the pass waits for rank 1,
    which never comes: no task is held, yet trainers wait on the pass."""
    m = secured_master(secured, "--equal-steps", "drop", "--rank-wait", "1h")
    url = metrics_url(m)
    t = Target(JOB, url.split("/")[2])
    data = numbered_records(tmp_path / "data.rio", RECORDS)
    args = ["--world-size", "2", "--rank", "0", "--dataset", data]
    p = start_trainer(m, secured, tmp_path / "rank0.out", *args)
    requests = ("chunkmaster_task_requests_total", ())
    try:
        assert m.wait_log(r"waits for rank\(s\) 1", 60), m.log()
        for _ in range(25):
            t.scrape(url, secured.ca)
            time.sleep(0.5)
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        m.kill()
    first, last = t.steps[0], t.steps[-1]
    assert first is not None and last is not None
    assert last[requests] >= first[requests] + 3  # asked again and again
    assert last[("chunkmaster_tasks", (("queue", "pending"),))] == 0
    assert last[("chunkmaster_finishes_total", ())] == 0
    promtool_test(promtool, tmp_path, t, {t.now: {"ChunkmasterPassStalled"}})


def test_a_slow_trainer_reading_one_long_task_does_not_stall_the_pass(
    promtool: str, secured: Secured, tmp_path: Path
) -> None:
    """No task finishes for more than 15 + 5 minutes, but the trainer reports its progress:
    not stalled."""
    # One task of 120 records read at 0.3 s each: 36 s, over 40 scrapes on a quiet machine and
    # well over the 22 the rule needs on a loaded one (a scrape and its pause a step).
    m = secured_master(secured, "--chunk-per-task", "120")
    url = metrics_url(m)
    t = Target(JOB, url.split("/")[2])
    data = numbered_records(tmp_path / "data.rio", 120)
    out = tmp_path / "slow.out"
    p = start_trainer(m, secured, out, "--name", "slow", "--step-time", "0.3", "--dataset", data)
    try:
        while p.poll() is None:
            t.scrape(url, secured.ca)
            time.sleep(0.5)
        assert p.returncode == 0
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        m.kill()
    reading = [
        i
        for i, step in enumerate(t.steps)
        if progress(step, MOVES[0]) == 0 and progress(step, MOVES[1]) > 0
    ]
    assert len(reading) >= 22, "the task was read too fast to outlast the rule's 15 + 5 minutes"
    promtool_test(promtool, tmp_path, t, {i: set() for i in reading})


#: What moves while trainers read: finishes, and records reported consumed (progress).
MOVES = (
    ("chunkmaster_finishes_total", ()),
    ("chunkmaster_pass_records", (("pass", "0"), ("stage", "consumed"))),
)


def progress(step: dict[tuple[str, Labels], float] | None, key: tuple[str, Labels]) -> float:
    assert step is not None
    return step.get(key, 0.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_query(base: str, query: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{base}/api/v1/query?{q}", timeout=10) as r:
        answer = json.load(r)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def operator_job(endpoint: dict[str, Any], token_file: str, ca: str, target: str) -> dict[str, Any]:
    """The scrape job the Prometheus Operator makes of the ServiceMonitor's endpoint, as far
    as a test without Kubernetes can: its scheme, path, token (the Secret's key as a file),
    CA and server name, and its relabelings, for one pod found through two Services (the
    etcd kit's headless one beside the clients' one)."""
    keys = {"targetLabel": "target_label", "sourceLabels": "source_labels"}
    return {
        "job_name": "chunkmaster-operator",
        "scheme": endpoint["scheme"],
        "metrics_path": endpoint["path"],
        "authorization": {
            "type": endpoint["authorization"]["type"],
            "credentials_file": token_file,
        },
        "tls_config": {"ca_file": ca, "server_name": endpoint["tlsConfig"]["serverName"]},
        "static_configs": [
            {"targets": [target], "labels": {"service": service}}
            for service in ("chunkmaster", "chunkmaster-masters")
        ],
        "relabel_configs": [
            {keys.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]
        ],
    }


def test_prometheus_scrapes_the_master_with_the_scrape_config_and_the_servicemonitors_terms(
    promtool: str, tmp_path: Path
) -> None:
    """The shipped scrape config, run by a real Prometheus against a master with TLS and a
    token: only its targets and its two files replaced. Beside it, the ServiceMonitor's
    endpoint as the operator would make it a scrape job (`operator_job`)."""
    prometheus = shutil.which("prometheus")
    assert prometheus is not None  # the package that ships promtool ships it
    monitor = yaml.safe_load(SERVICE_MONITOR.read_text())
    (endpoint,) = monitor["spec"]["endpoints"]
    # the master's certificate holds the ServiceMonitor's server name as well
    ca, cert, key = server_pki(
        tmp_path, "localhost", endpoint["tlsConfig"]["serverName"], ips=("127.0.0.1",)
    )
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    secured = Secured(ca, cert, key, str(token))
    m = secured_master(secured)
    url = metrics_url(m)
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    (job,) = config["scrape_configs"]
    assert job["scheme"] == "https" and job["authorization"]["type"] == "Bearer"
    job["authorization"]["credentials_file"] = secured.token_file
    job["tls_config"]["ca_file"] = secured.ca
    # the leader, and a standby (it serves no metrics until it leads: nothing listens)
    leader, standby = url.split("/")[2], f"127.0.0.1:{free_port()}"
    job["static_configs"] = [{"targets": [leader, standby]}]
    config["scrape_configs"].append(operator_job(endpoint, secured.token_file, secured.ca, leader))
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    shutil.copy(RULES, tmp_path / config["rule_files"][0])
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    check = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "prometheus.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=err,
            stderr=subprocess.STDOUT,
        )
    try:

        def scraped(n: int) -> bool:
            try:
                got = prometheus_query(base, 'count_over_time(up{job="chunkmaster"}[1m])')
            except (urllib.error.URLError, ConnectionError):
                return False
            return bool(got) and min(int(r["value"][1]) for r in got) >= n

        wait_for(
            lambda: scraped(5), "Prometheus to scrape the master 5 times", 60, explain=log.read_text
        )
        up = {
            r["metric"]["instance"]: r["value"][1]
            for r in prometheus_query(base, 'up{job="chunkmaster"}')
        }
        assert up == {leader: "1", standby: "0"}
        assert prometheus_query(base, 'up{app="chunkmaster", job="chunkmaster"}') != []
        (serving,) = prometheus_query(base, 'chunkmaster_leader{job="chunkmaster"}')
        assert serving["value"][1] == "1"
        # the ServiceMonitor's terms: the pod behind two Services is one target, with the
        # alerts' label and without the Service's name, and it is up (token, CA, server name)
        with urllib.request.urlopen(f"{base}/api/v1/targets", timeout=10) as r:
            targets = json.load(r)["data"]["activeTargets"]
        (operator,) = [t for t in targets if t["labels"]["job"] == "chunkmaster-operator"]
        assert operator["labels"]["app"] == "chunkmaster" and "service" not in operator["labels"]
        assert operator["health"] == "up", operator
        assert prometheus_query(base, "ALERTS") == []

        def evaluated() -> bool:
            with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as r:
                groups = json.load(r)["data"]["groups"]
            rules = [rule for g in groups for rule in g["rules"]]
            assert len(rules) == len(yaml.safe_load(RULES.read_text())["groups"][0]["rules"])
            assert all(r["health"] != "err" for r in rules), [
                r for r in rules if r.get("lastError")
            ]
            return all(r["health"] == "ok" for r in rules)

        wait_for(evaluated, "every rule to be evaluated", 30)
        # a thousand scrapes or one: the scraper with the token is never refused
        status, text = get(url, secured.ca, TOKEN)
        assert status == 200 and "chunkmaster_rpc_refused_total{" not in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        m.kill()


def test_the_servicemonitor_says_what_the_scrape_config_says() -> None:
    """What a real Prometheus runs above, in the operator's words: https, the token from the
    Secret the masters mount, the CA from theirs, the label the alerts need."""
    monitor = yaml.safe_load(SERVICE_MONITOR.read_text())
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "chunkmaster-token", "key": "token"},
    }
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "chunkmaster-tls", "key": "ca.crt"}}
    assert {"targetLabel": "app", "replacement": "chunkmaster"} in endpoint["relabelings"]
    scrape = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"][0]
    assert {"target_label": "app", "replacement": "chunkmaster"} in scrape["relabel_configs"]

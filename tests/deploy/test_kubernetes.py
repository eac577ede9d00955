"""deploy/kubernetes/: every manifest validated offline against the Kubernetes API schemas of the
versions docs/deploy.md names (kubernetes-validate's strict schemas: an unknown field is an
error), and checked against chunkmaster itself: every flag a manifest passes is one the command
takes, every CHUNKMASTER_ variable one the master or the probe reads, every file it names lies
in a mounted volume, every $(VAR) is defined before use, selectors select the pods, and no pod
gets Kubernetes' service variables (a Service named chunkmaster would set CHUNKMASTER_PORT)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helpers.deploy import REPO

from chunkmaster.cli import master_cmd
from chunkmaster.cli.common import CliError
from chunkmaster.cli.main import build_parser

#: The Kubernetes versions docs/deploy.md promises the manifests for.
KUBERNETES_VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36")
MANIFESTS = sorted((REPO / "deploy/kubernetes").rglob("*.yaml"))
HEALTH_VARS = {
    "CHUNKMASTER_HEALTH_ADDR",
    "CHUNKMASTER_HEALTH_TLS_CA",
    "CHUNKMASTER_HEALTH_SERVER_NAME",
    "CHUNKMASTER_HEALTH_TLS_CERT",
    "CHUNKMASTER_HEALTH_TLS_KEY",
    "CHUNKMASTER_HEALTH_STANDBY_OK",
}
MASTER_VARS = {name for s in master_cmd.SETTINGS for name in s.env if name.startswith("CHUNK")}
MASTER_VARS |= {name for names in master_cmd.ENV_ONLY.values() for name in names}
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append(
                    (f"{path.relative_to(REPO)}:{doc['kind']}/{doc['metadata']['name']}", doc)
                )
    return docs


DOCS = documents()


def pod_specs() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, the object, its pod template) for every workload."""
    for name, doc in DOCS:
        if doc["kind"] in ("StatefulSet", "Deployment", "Job"):
            yield name, doc, doc["spec"]["template"]


def test_the_manifests_are_there() -> None:
    kinds = sorted(doc["kind"] for _, doc in DOCS)
    assert kinds.count("StatefulSet") == 2  # one master on the embedded store; three on etcd
    assert kinds.count("PodDisruptionBudget") == 2
    assert kinds.count("Job") == 2  # the reference trainer, and torchrun (DDP)
    assert kinds.count("Service") == 3


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_strict_schemas(version: str) -> None:
    for name, doc in DOCS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} against Kubernetes {version}: {exc.message} at {exc.path}")


@pytest.mark.parametrize("name", [n for n, _, _ in pod_specs()])
def test_pods_run_as_the_images_user_without_service_variables(name: str) -> None:
    (template,) = [t for n, _, t in pod_specs() if n == name]
    spec = template["spec"]
    assert spec["enableServiceLinks"] is False, "CHUNKMASTER_PORT=tcp://... would stop the master"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    for c in spec["containers"]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]


def test_a_service_variable_is_what_enable_service_links_keeps_out() -> None:
    """What Kubernetes puts in a pod for a Service named chunkmaster stops a master."""
    args = build_parser().parse_args(["master"])
    with pytest.raises(CliError, match="CHUNKMASTER_PORT") as caught:
        master_cmd.config_from(args, {"CHUNKMASTER_PORT": "tcp://10.0.0.7:8080"})
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("name", [n for n, _, _ in pod_specs()])
def test_variables_flags_and_files_are_ones_chunkmaster_knows(name: str) -> None:
    ((doc, template),) = [(d, t) for n, d, t in pod_specs() if n == name]
    spec = template["spec"]
    volumes = {v["name"] for v in spec["volumes"]}
    volumes |= {v["metadata"]["name"] for v in doc["spec"].get("volumeClaimTemplates", [])}
    for c in spec["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert set(mounts.values()) <= set(volumes), "a mount without its volume"
        defined: set[str] = set()
        for e in c.get("env", []):
            for ref in VAR_REF.findall(e.get("value", "")):
                assert ref in defined, f"{e['name']} uses $({ref}) before it is defined"
            defined.add(e["name"])
            if e["name"].startswith("CHUNKMASTER_") and c.get("args", [None])[0] == "master":
                assert e["name"] in MASTER_VARS | HEALTH_VARS, f"no such variable: {e['name']}"
            value = e.get("value", "")
            if value.startswith("/etc/") or value.startswith("/var/lib/"):
                assert any(value.startswith(m + "/") for m in mounts), f"{value}: not mounted"
        args = [_expand(a, c.get("env", [])) for a in c.get("args", [])]
        for a in args:
            for ref in VAR_REF.findall(a):
                raise AssertionError(f"$({ref}) in the arguments is not defined")
            path = a.split("=", 1)[-1]
            if path.startswith("/etc/"):
                assert any(path.startswith(m + "/") for m in mounts), f"{path}: not mounted"
        if c.get("command") == ["torchrun"]:
            script = [a for a in args if a.endswith(".py")]
            assert script == ["/app/train_ddp.py"]
            flags = _example_flags()
            after = args[args.index(script[0]) + 1 :]
            for a in after:
                assert a.split("=", 1)[0] in flags, f"examples/train_ddp.py has no {a}"
        elif args:
            build_parser().parse_args(args)  # exits (SystemExit) on an unknown flag
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in c:
                assert c[probe]["exec"]["command"][0] == "chunkmaster-health"


@pytest.mark.parametrize("kind", ["Service", "PodDisruptionBudget"])
def test_selectors_select_the_masters(kind: str) -> None:
    pods = [t.get("metadata", {}).get("labels", {}) for _, _, t in pod_specs()]
    for name, doc in DOCS:
        if doc["kind"] != kind:
            continue
        selector = doc["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        if selector == {"job-name": "chunkmaster-ddp"}:
            continue  # set by the Job controller on its pods
        assert any(selector.items() <= labels.items() for labels in pods), name


def _expand(arg: str, env: list[dict[str, Any]]) -> str:
    """`arg` as Kubernetes expands it: each variable's value is expanded with those before it
    (a value from a field or a Secret stands as `x`)."""
    values: dict[str, str] = {}
    for e in env:
        values[e["name"]] = VAR_REF.sub(
            lambda m: values.get(m.group(1), m.group(0)), e.get("value", "x")
        )
    return VAR_REF.sub(lambda m: values.get(m.group(1), m.group(0)), arg)


def _example_flags() -> set[str]:
    text = (REPO / "examples/train_ddp.py").read_text()
    return set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', text))


def test_the_ddp_job_runs_the_example_the_suite_tests() -> None:
    assert {"--token-file", "--tls-ca", "--addr", "--dataset"} <= _example_flags()
    assert Path(REPO / "examples/train_ddp.py").exists()

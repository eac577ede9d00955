"""deploy/kubernetes/: a kustomize base and overlays (embedded store, etcd HA, the reference
trainers' Job, torchrun), each rendered with `kubectl kustomize` as `kubectl apply -k` would
apply it, and every rendered object validated offline against the Kubernetes API schemas of the
versions docs/deploy.md names (kubernetes-validate's strict schemas: an unknown field is an
error). The objects are checked against chunkmaster itself: every flag a manifest passes is one
the command takes, every CHUNKMASTER_ variable (env or the settings ConfigMap) one the master or
the probe reads, every file it names lies in a mounted volume, every $(VAR) is defined before
use, selectors select the pods, no pod gets Kubernetes' service variables (a Service named
chunkmaster would set CHUNKMASTER_PORT). The image, the namespace, the etcd endpoints, the storage
class and the claims are each set in one place, the overlay: changed there, they change in every
object that uses them. The Service `chunkmaster` reaches the ready master, and only the leader is
ready (tests/deploy/test_leader_service.py runs the probes against three masters on etcd)."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helpers.deploy import REPO
from helpers.kustomize import (
    KUBERNETES,
    OVERLAYS,
    find,
    kustomization,
    overlay,
    pod_template,
    render,
)

from chunkmaster.cli import master_cmd
from chunkmaster.cli.common import CliError
from chunkmaster.cli.main import build_parser

#: The Kubernetes versions docs/deploy.md promises the manifests for.
KUBERNETES_VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36")
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
MASTER_LABELS = {"app.kubernetes.io/name": "chunkmaster", "app.kubernetes.io/component": "master"}


def named(name: str) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{name}:{o['kind']}/{o['metadata']['name']}", o) for o in overlay(name)]


def kinds(name: str) -> list[str]:
    return sorted(o["kind"] for o in overlay(name))


def test_the_overlays_are_there_and_make_what_they_say() -> None:
    assert OVERLAYS == ["embedded", "etcd", "read-job", "torchrun"]
    assert kinds("embedded") == [
        "ConfigMap",
        "PodDisruptionBudget",
        "Service",
        "StatefulSet",
    ]
    assert kinds("etcd") == [
        "ConfigMap",
        "PodDisruptionBudget",
        "Service",
        "Service",
        "StatefulSet",
    ]
    assert kinds("read-job") == ["Job"]
    assert kinds("torchrun") == ["Job", "Service"]
    assert find(overlay("embedded"), "StatefulSet", "chunkmaster")["spec"]["replicas"] == 1
    assert find(overlay("etcd"), "StatefulSet", "chunkmaster")["spec"]["replicas"] == 3


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", OVERLAYS)
def test_every_rendered_object_validates_against_the_strict_schemas(
    name: str, version: str
) -> None:
    for what, doc in named(name):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{what} against Kubernetes {version}: {exc.message} at {exc.path}")


@pytest.mark.parametrize("name", OVERLAYS)
def test_pods_run_hardened_as_the_images_user_without_service_variables(name: str) -> None:
    for what, doc in named(name):
        template = pod_template(doc)
        if template is None:
            continue
        spec = template["spec"]
        assert spec["enableServiceLinks"] is False, f"{what}: CHUNKMASTER_PORT=tcp://..."
        assert spec["automountServiceAccountToken"] is False, what
        assert spec["securityContext"]["runAsNonRoot"] is True, what
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, what
        for c in spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, what
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, what
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
            if c["name"] != "train":  # torchrun's own image may need to write
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, what
            for m in c["volumeMounts"]:
                if m["mountPath"].startswith("/etc/chunkmaster/"):
                    assert m.get("readOnly") is True, f"{what}: {m}"
        for v in spec["volumes"]:
            if "secret" in v:
                assert v["secret"]["defaultMode"] in (0o440, 0o444), f"{what}: {v}"


def test_no_prometheus_annotations_scraping_needs_the_token() -> None:
    """Annotation-based scraping sends no token: it would get 401 (docs/observability.md)."""
    for name in OVERLAYS:
        assert "prometheus.io/" not in yaml.safe_dump_all(overlay(name)), name


def test_a_service_variable_is_what_enable_service_links_keeps_out() -> None:
    """What Kubernetes puts in a pod for a Service named chunkmaster stops a master."""
    args = build_parser().parse_args(["master"])
    with pytest.raises(CliError, match="CHUNKMASTER_PORT") as caught:
        master_cmd.config_from(args, {"CHUNKMASTER_PORT": "tcp://10.0.0.7:8080"})
    assert caught.value.exit_code == 2


def _env(objects: tuple[dict[str, Any], ...], c: dict[str, Any]) -> list[dict[str, Any]]:
    """A container's variables in the order Kubernetes defines them: its envFrom ConfigMaps'
    (which must be in the overlay), then env."""
    env: list[dict[str, Any]] = []
    for source in c.get("envFrom", []):
        (cm,) = [
            o
            for o in objects
            if o["kind"] == "ConfigMap" and o["metadata"]["name"] == source["configMapRef"]["name"]
        ]
        env += [{"name": k, "value": v} for k, v in cm["data"].items()]
    return env + c.get("env", [])


@pytest.mark.parametrize("name", OVERLAYS)
def test_variables_flags_and_files_are_ones_chunkmaster_knows(name: str) -> None:
    objects = overlay(name)
    for what, doc in named(name):
        template = pod_template(doc)
        if template is None:
            continue
        spec = template["spec"]
        volumes = {v["name"] for v in spec["volumes"]}
        volumes |= {v["metadata"]["name"] for v in doc["spec"].get("volumeClaimTemplates", [])}
        for c in spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert set(mounts.values()) <= volumes, f"{what}: a mount without its volume"
            env = _env(objects, c)
            defined: set[str] = set()
            for e in env:
                for ref in VAR_REF.findall(e.get("value", "")):
                    assert ref in defined, f"{what}: {e['name']} uses $({ref}) before it is defined"
                defined.add(e["name"])
                if e["name"].startswith("CHUNKMASTER_") and c.get("args", [None])[0] == "master":
                    assert e["name"] in MASTER_VARS | HEALTH_VARS, f"no such variable: {e['name']}"
                value = e.get("value", "")
                if value.startswith("/etc/") or value.startswith("/var/lib/"):
                    assert any(value.startswith(m + "/") for m in mounts), f"{value}: not mounted"
            args = [_expand(a, env) for a in c.get("args", [])]
            for a in args:
                for ref in VAR_REF.findall(a):
                    raise AssertionError(f"{what}: $({ref}) in the arguments is not defined")
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
                    assert c[probe]["exec"]["command"][0] == "chunkmaster-health", what


@pytest.mark.parametrize("name", OVERLAYS)
def test_selectors_select_the_pods(name: str) -> None:
    templates = [t for o in overlay(name) if (t := pod_template(o)) is not None]
    pods = [t.get("metadata", {}).get("labels", {}) for t in templates]
    for what, doc in named(name):
        if doc["kind"] not in ("Service", "PodDisruptionBudget", "StatefulSet"):
            continue
        selector = doc["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        if selector == {"job-name": "chunkmaster-ddp"}:
            continue  # set by the Job controller on its pods
        assert any(selector.items() <= labels.items() for labels in pods), what


@pytest.mark.parametrize("name", ["embedded", "etcd"])
def test_the_service_chunkmaster_reaches_the_leader_alone(name: str) -> None:
    """A normal Service (a virtual IP, not headless) over the masters whose endpoints are the
    ready masters, and a master is ready only while it leads; standbys stay live."""
    objects = overlay(name)
    service = find(objects, "Service", "chunkmaster")
    assert service["spec"].get("clusterIP") != "None"
    assert not service["spec"].get("publishNotReadyAddresses", False)
    assert service["spec"]["selector"] == MASTER_LABELS
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "grpc": 8080,
        "metrics": 9090,
    }
    master = find(objects, "StatefulSet", "chunkmaster")
    (c,) = master["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["exec"]["command"][:2] == ["chunkmaster-health", "--leader"]
    assert "--leader" not in c["livenessProbe"]["exec"]["command"]
    env = {e["name"]: e.get("value") for e in _env(objects, c)}
    if name == "etcd":  # a standby has nothing listening: live, not ready
        assert env["CHUNKMASTER_HEALTH_STANDBY_OK"] == "1"
        assert master["spec"]["updateStrategy"] == {"type": "OnDelete"}
        headless = find(objects, "Service", "chunkmaster-masters")
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"]["publishNotReadyAddresses"] is True
        assert master["spec"]["serviceName"] == "chunkmaster-masters"
    else:
        assert "CHUNKMASTER_HEALTH_STANDBY_OK" not in env


def _version() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    if "version" in project:
        return str(project["version"])
    from chunkmaster import __version__

    return __version__


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_image_is_a_registrys_not_a_local_tag(name: str) -> None:
    """What users apply names a registry's image (the overlay's `images:` entry, the one place
    to set it), never the local `chunkmaster:dev`; chunkmaster's own at this version (what
    `make image IMAGE=registry.example.com/chunkmaster TAG=<version>` tags)."""
    for what, doc in named(name):
        template = pod_template(doc)
        for c in template["spec"]["containers"] if template else []:
            image = c["image"]
            assert "/" in image.split(":")[0] and ":" in image, f"{what}: {image}"
            assert not image.endswith(":dev") and not image.endswith(":latest"), what
            if c["name"] != "train":
                assert image == f"registry.example.com/chunkmaster:{_version()}", what


#: What each overlay is given in place of what it says, to show that one change there reaches
#: every object: the namespace, each image, the etcd endpoints, the claims, the storage class.
CHANGED = {
    "namespace": "ns-under-test",
    "registry": "registry.test:5000/team",
    "tag": "9.9.9",
    "endpoints": "https://etcd-a.test:2379,https://etcd-b.test:2379",
    "claim": "claim-under-test-",
    "class": "class-under-test",
}


def _changed_copy(name: str, tmp: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of deploy/kubernetes whose overlay NAME sets CHANGED's values, in its
    kustomization.yaml and volumes.yaml only; the copy's overlay and what it set."""
    shutil.copytree(KUBERNETES, tmp / "kubernetes")
    where = tmp / "kubernetes/overlays" / name
    k = kustomization(name)
    k["namespace"] = CHANGED["namespace"]
    for image in k["images"]:
        image["newName"] = f"{CHANGED['registry']}/{image['name']}"
        image["newTag"] = CHANGED["tag"]
    for generator in k.get("configMapGenerator", []):
        generator["literals"] = [
            f"CHUNKMASTER_ENDPOINTS={CHANGED['endpoints']}"
            if lit.startswith("CHUNKMASTER_ENDPOINTS=")
            else lit
            for lit in generator["literals"]
        ]
    (where / "kustomization.yaml").write_text(yaml.safe_dump(k))
    volumes = (where / "volumes.yaml").read_text()
    claims = set(re.findall(r"claimName: ([\w-]+)", volumes))
    for claim in claims:
        volumes = volumes.replace(f"claimName: {claim}", f"claimName: {CHANGED['claim']}{claim}")
    volumes = re.sub(r"storageClassName: \S+", f"storageClassName: {CHANGED['class']}", volumes)
    (where / "volumes.yaml").write_text(volumes)
    return where, {"claims": claims, "k": kustomization(name)}


@pytest.mark.parametrize("name", OVERLAYS)
def test_image_namespace_endpoints_and_volumes_are_set_in_one_place(
    name: str, tmp_path: Path
) -> None:
    where, was = _changed_copy(name, tmp_path)
    objects = render(where)
    text = yaml.safe_dump_all(objects)
    for image in was["k"]["images"]:
        assert image["newName"] not in text, f"{image['newName']} left behind"
    assert "registry.example.com" not in text and "chunkmaster:dev" not in text
    for o in objects:
        what = f"{o['kind']}/{o['metadata']['name']}"
        assert o["metadata"]["namespace"] == CHANGED["namespace"], what
        template = pod_template(o)
        if template is None:
            continue
        for c in template["spec"]["containers"]:
            assert c["image"] == f"{CHANGED['registry']}/{_base_image(c['image'])}:9.9.9", what
        for v in template["spec"]["volumes"]:
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                assert claim.startswith(CHANGED["claim"]), f"{what}: {claim} not set in one place"
        for t in o["spec"].get("volumeClaimTemplates", []):
            assert t["spec"]["storageClassName"] == CHANGED["class"], what
    assert was["claims"], "the overlay names no claim"
    if name == "embedded":
        assert "class-under-test" in text
    if name == "etcd":
        assert "etcd-0.etcd.etcd.svc" not in text
        master = find(tuple(objects), "StatefulSet", "chunkmaster")
        (c,) = master["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in _env(tuple(objects), c)}
        assert env["CHUNKMASTER_ENDPOINTS"] == CHANGED["endpoints"]


def _base_image(image: str) -> str:
    """`registry.test:5000/team/chunkmaster:9.9.9` -> `chunkmaster`."""
    return image.rsplit("/", 1)[-1].split(":")[0]


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

"""docs/deploy.md and deploy/prometheus/chunkmaster-alerts.yaml name only metrics the master
serves, and files that exist; the README points to the guide; every `chunkmaster` command in
the guides parses as written, and every overlay the guide applies exists (the overlays are
rendered and validated by test_kubernetes.py)."""

from __future__ import annotations

import re

import yaml
from helpers.deploy import REPO

METRIC = re.compile(r"\bchunkmaster_[a-z_]+\b")
SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def served() -> set[str]:
    text = "".join(p.read_text() for p in (REPO / "src/chunkmaster/master/metrics").glob("*.py"))
    return set(re.findall(r'"(chunkmaster_[a-z_]+)"', text))


def base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in served():
            return name.removesuffix(suffix)
    return name


def test_every_metric_named_in_the_guide_and_the_alerts_is_served() -> None:
    names = set()
    for path in ("docs/deploy.md", "deploy/prometheus/chunkmaster-alerts.yaml"):
        names |= {base(n) for n in METRIC.findall((REPO / path).read_text())}
    assert names, "no metric named"
    assert names <= served(), f"not served by master/metrics/: {sorted(names - served())}"


def test_the_alert_rules_are_rules() -> None:
    doc = yaml.safe_load((REPO / "deploy/prometheus/chunkmaster-alerts.yaml").read_text())
    rules = doc["groups"][0]["rules"]
    assert len(rules) >= 10
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"].startswith("Chunkmaster") and METRIC.search(rule["expr"])
        assert rule["labels"]["severity"] in ("critical", "warning", "info")


def test_files_the_guide_names_exist_and_the_readme_points_to_it() -> None:
    guide = (REPO / "docs/deploy.md").read_text()
    for path in re.findall(r"`((?:deploy|tests|scripts|bench|src|examples)/[\w./-]+)`", guide):
        assert (REPO / path).exists(), path
    assert "docs/deploy.md" in (REPO / "README.md").read_text()


def shell_commands(path: str) -> list[list[str]]:
    """The commands of the guide's `sh` blocks, continuation lines joined, comments dropped."""
    import shlex

    text = (REPO / path).read_text()
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def test_every_chunkmaster_command_in_the_guides_parses_with_the_cli_as_written() -> None:
    """A flag renamed or removed fails here before it fails an operator following the guide."""
    from chunkmaster.cli.main import build_parser

    commands = [
        words
        for path in ("docs/deploy.md", "docs/etcd.md", "docs/install.md")
        for words in shell_commands(path)
        if words[0] == "chunkmaster"
    ]
    assert len(commands) >= 5, commands
    parser = build_parser()
    for words in commands:
        try:
            parser.parse_args(words[1:])
        except SystemExit as exc:
            raise AssertionError(f"the guide's command does not parse: {' '.join(words)}") from exc


def test_every_kustomize_directory_the_guide_applies_exists() -> None:
    applied = [
        words[words.index("-k") + 1]
        for words in shell_commands("docs/deploy.md")
        if words[:2] == ["kubectl", "apply"] and "-k" in words
    ]
    assert applied, "the guide applies no overlay"
    for path in applied:
        assert (REPO / path / "kustomization.yaml").is_file(), path

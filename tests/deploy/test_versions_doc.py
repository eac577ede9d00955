"""docs/deploy.md's Upgrades section says the format versions the code writes and reads, and
quotes its refusals as the code words them: read from the text, compared with the constants."""

from __future__ import annotations

import re

from helpers.deploy import REPO

from chunkmaster.core import checkpoint, codec
from chunkmaster.store import damage


def upgrades() -> str:
    """The Upgrades section of the guide, its lines joined (a phrase may break anywhere)."""
    text = (REPO / "docs/deploy.md").read_text()
    section = text[text.index("## Upgrades\n") : text.index("\n## ", text.index("## Upgrades\n"))]
    return " ".join(section.split())


def bullet(name: str) -> str:
    """The bullet that starts with **name**."""
    text = upgrades()
    start = text.index(f"- **{name}**")
    end = text.find(" - **", start + 1)
    return text[start : end if end >= 0 else len(text)]


def one(pattern: str, text: str) -> tuple[int, ...]:
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{pattern!r} found {len(found)} times in: {text}"
    groups = found[0] if isinstance(found[0], tuple) else (found[0],)
    return tuple(int(g) for g in groups)


def test_the_store_format_is_the_code_s() -> None:
    text = bullet("The embedded store")
    assert one(r"`user_version`, (\d+) today", text) == (damage.FORMAT_VERSION,)
    newer, reads = one(r"\(store format (\d+); this one reads up to (\d+)\)", text)
    assert (newer, reads) == (damage.FORMAT_VERSION + 1, damage.FORMAT_VERSION)


def test_the_snapshot_versions_are_the_code_s() -> None:
    text = bullet("Snapshots")
    written = one(
        r"(\d+) today for a plain job \(seeded or not\), (\d+) a mixture, (\d+) a mixture that "
        r"sources were added to while it ran, (\d+) a job with a shuffle window",
        text,
    )
    assert written == (
        codec.SNAPSHOT_VERSION,
        codec.SNAPSHOT_VERSION_MIXTURE,
        codec.SNAPSHOT_VERSION_GROWN,
        codec.SNAPSHOT_VERSION_WINDOWED,
    )
    assert codec.SNAPSHOT_VERSION_SHUFFLED == codec.SNAPSHOT_VERSION  # "seeded or not"
    low, high = one(r"This build reads versions (\d+) to (\d+)", text)
    assert tuple(range(low, high + 1)) == tuple(sorted(codec.READABLE_VERSIONS))


def test_the_snapshot_refusal_is_quoted_as_the_master_says_it() -> None:
    newer = max(codec.READABLE_VERSIONS) + 1
    quoted = one(r"snapshot version (\d+) was written by a newer chunkmaster", upgrades())
    assert quoted == (newer,)
    assert codec._version_refusal(newer) in upgrades()


def test_the_data_checkpoint_versions_are_the_code_s() -> None:
    text = bullet("Data checkpoints")
    named = dict(
        (what, int(v))
        for v, what in re.findall(
            r"(\d+) (plain|with a shuffle seed|a mixture|with a shuffle window|with ranges)", text
        )
    )
    assert named == {
        "plain": checkpoint.VERSION,
        "with a shuffle seed": checkpoint.VERSION_SHUFFLED,
        "a mixture": checkpoint.VERSION_MIXTURE,
        "with a shuffle window": checkpoint.VERSION_WINDOWED,
        "with ranges": checkpoint.VERSION_RANGES,
    }
    low, high = one(r"This build reads versions (\d+) to (\d+)", text)
    assert tuple(range(low, high + 1)) == checkpoint.VERSIONS
    newer = max(checkpoint.VERSIONS) + 1
    try:
        checkpoint.decode(checkpoint.MAGIC + newer.to_bytes(4, "little") + bytes(12))
    except checkpoint.CheckpointError as exc:
        refusal = str(exc)
    assert refusal in text, refusal


def test_the_loader_state_mark_is_the_code_s() -> None:
    text = bullet("A Loader's state")
    source = (REPO / "src/chunkmaster/torch/loader.py").read_text()  # without importing torch
    (version,) = one(r"\nSTATE_VERSION = (\d+)\n", source)
    assert one(r'`\{"chunkmaster": (\d+), \.\.\.\}`', text) == (version,)


def test_the_release_the_upgrade_test_installs_is_the_one_named() -> None:
    test = (REPO / "tests/deploy/test_upgrade.py").read_text()
    release = re.search(r'^OLD_RELEASE = "([0-9a-f]{40})"', test, re.M)
    assert release is not None
    assert f"commit `{release[1][:7]}` of this repository" in upgrades()

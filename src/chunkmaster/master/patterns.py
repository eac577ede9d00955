"""A trainer's glob patterns as the master reads them: made absolute (a relative local pattern
is relative to the master's working directory, which the master says in its log), expanded to
files held to the data roots, and compared with the dataset's, however spelled."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import DatasetError, NoDatasetError
from chunkmaster.master.roots import DataRoots, is_url
from chunkmaster.remote import FsspecStorage
from chunkmaster.remote import shared as shared_storage

NO_ROOTS = DataRoots()  # local paths only, anywhere; no URLs


def _expand_one(pattern: str, remote: FsspecStorage | None) -> list[str]:
    if is_url(pattern):
        assert remote is not None
        return remote.expand(pattern)
    return sorted(m for m in glob.glob(pattern) if not os.path.isdir(m))


def expand_globs(
    globs: Sequence[str], remote: FsspecStorage | None = None, roots: DataRoots = NO_ROOTS
) -> list[str]:
    """Matches in pattern order, sorted within a pattern, each path once. URL patterns are
    listed through `remote` (which keeps the listed sizes). Every pattern is held to `roots`
    before it is listed, and every file it matched after (a symlink, an object key, a link in
    an HTTP page may lead elsewhere), before any is opened."""
    if not globs:
        raise NoDatasetError()
    roots.check_all(globs)
    seen: dict[str, None] = {}
    for pattern in globs:
        if not isinstance(pattern, str) or not pattern:
            raise DatasetError(f"no valid dataset specified: bad pattern {pattern!r}")
        if remote is None and is_url(pattern):
            remote = shared_storage()
        try:
            matches = _expand_one(pattern, remote)
        except OSError as exc:
            raise DatasetError(f"no valid dataset specified: cannot list {exc}") from None
        for path in matches:
            roots.check(path, pattern)
            seen.setdefault(path, None)
    if not seen:
        raise DatasetError(f"no valid dataset specified: nothing matches {list(globs)}")
    return list(seen)


def absolute_path(path: str) -> str:
    """A local path or pattern made absolute in the master's working directory; URLs as they
    are. What the master indexes and keeps."""
    return path if is_url(path) else os.path.abspath(path)


def absolute_pattern(pattern: str) -> str:
    """A pattern as the master reads it: a URL with its scheme in lower case (nothing else:
    an object store reads `.`, `..` and doubled slashes as part of a key, and the data roots
    refuse them, master/roots.py); a local path absolute (a relative one in the master's
    working directory), `.`, `..` and doubled slashes folded. Two spellings of one pattern
    give the same text."""
    if is_url(pattern):
        scheme, _, rest = pattern.partition("://")
        return f"{scheme.lower()}://{rest}"
    return os.path.abspath(pattern)


def relative_note(globs: Sequence[str]) -> str:
    """What the master made of the relative patterns among `globs`: "" if there are none."""
    rel = [g for g in globs if isinstance(g, str) and g and not is_url(g) and not os.path.isabs(g)]
    if not rel:
        return ""
    shown = ", ".join(f"{g!r} as {absolute_pattern(g)!r}" for g in rel[:3])
    more = f" and {len(rel) - 3} more" if len(rel) > 3 else ""
    return (
        f"relative patterns are read in the master's working directory {os.getcwd()}: {shown}{more}"
    )


def same_patterns(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two lists of patterns are the same once spelled alike (absolute_pattern),
    whatever their order and repetitions. No file system access."""
    return {absolute_pattern(g) for g in a} == {absolute_pattern(g) for g in b}


def _file_key(path: str) -> str:
    """One text per file however it was reached: symlinks and relative paths resolved."""
    return absolute_pattern(path) if is_url(path) else os.path.realpath(path)


def file_keys(paths: Iterable[str]) -> set[str]:
    """One text per file however each was reached (symlinks and relative paths resolved)."""
    return {_file_key(p) for p in paths}


def _patterns_text(globs: Sequence[str]) -> str:
    shown = [absolute_pattern(g) for g in globs[:4]]
    more = f" and {len(globs) - 4} more" if len(globs) > 4 else ""
    return f"{shown}{more}"


def dataset_mismatch(
    dataset: Dataset,
    globs: Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    roots: DataRoots = NO_ROOTS,
) -> str | None:
    """None if `globs` name `dataset`: the same patterns (same_patterns), or patterns that
    match exactly its files (symlinks resolved); else why not, naming both, in one line.
    Lists the patterns' files when they differ from the dataset's (a file system access),
    held to `roots` as any dataset's (PermissionDeniedError)."""
    if same_patterns(dataset.globs, globs):
        return None
    try:
        files = expand_globs(
            [absolute_path(g) for g in globs], shared_storage(storage_options), roots
        )
    except DatasetError as exc:
        theirs = f"matches no dataset: {str(exc).removeprefix('no valid dataset specified: ')}"
    else:
        mine = {_file_key(f) for f in dataset.files}
        keys = {_file_key(f) for f in files}
        if keys == mine:
            return None
        common = len(keys & mine)
        theirs = f"{len(keys)} file(s), {common} of them in the master's dataset"
    note = relative_note([*globs, *dataset.globs])
    return (
        f"the dataset differs from the master's: this trainer's {_patterns_text(globs)} "
        f"({theirs}) is not the master's {_patterns_text(dataset.globs)} ({len(dataset.files)} "
        f"{dataset.format} file(s), {dataset.num_records} records)"
        + (f"; {note}" if note else "")
        + ". A master serves one dataset: give this trainer the master's patterns, or run "
        "another job for this dataset (another --store or --job, or an empty store)"
    )

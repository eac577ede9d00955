"""Where a master may read datasets: `--data-root` directories and URL prefixes.

`DataRoots.check` is the one decision, for every path and URL the master is asked to read
however it arrives (a trainer's SetDataset, a restored data checkpoint's globs) and for every
file a pattern matched once it was listed. Without roots: local paths only, anywhere, no URLs.

A URL is held to its root as written, and as any reader along the way could take it: the
scheme's case aside, object stores read keys literally (`x/../train/a` and `data//train` are
other objects), while HTTP clients and servers fold `..` and decode `%2e%2e`. So a URL must be
in one spelling all of them agree on: no empty, `.` or `..` segment, raw or percent-decoded
(twice), no encoded `/`, no backslash, no fsspec chain (`::`); then its segments must begin with
a root's, both raw and decoded. `file://` URLs are local paths, held to the local roots like any
path: resolved with `os.path.realpath` (symlinks and `..` followed) as the master opens them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

from chunkmaster.core.errors import DatasetError, PermissionDeniedError

LOCAL_SCHEMES = ("file", "local")  # fsspec's local filesystem: a path in another spelling
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*$")


def is_url(text: str) -> bool:
    """Whether `text` is a URL to the master: anything with `://` (so a local path never passes
    for one, and nothing that fsspec would take as a URL passes for a path)."""
    return "://" in text


class BadRoot(ValueError):
    """A --data-root that is not a directory or a URL prefix in its one spelling."""


class _Refused(Exception):
    """Why a path or URL is not allowed (the caller names the pattern)."""


def _segments(rest: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The raw and the decoded segments of a URL after `scheme://`, or _Refused if any reader
    could take them for another path (one trailing `/` is allowed)."""
    if "\\" in rest:
        raise _Refused("holds a backslash, which some servers read as '/'")
    decoded = rest
    for _ in range(2):  # a server that decodes twice sees %252e as '.'
        once = unquote(decoded, errors="strict") if "%" in decoded else decoded
        if once.count("/") != decoded.count("/") or "\\" in once:
            raise _Refused("holds a percent-encoded '/' or '\\'")
        decoded = once
    raw_parts = rest.removesuffix("/").split("/")
    parts = decoded.removesuffix("/").split("/")
    for part in parts:
        if part in ("", ".", ".."):
            shown = "an empty" if not part else f"a {part!r}"
            encoded = "" if part in raw_parts else " (percent-encoded)"
            raise _Refused(f"has {shown} path segment{encoded}; spell it without")
    return tuple(raw_parts), tuple(parts)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class DataRoots:
    """The roots of one master; `check` says whether a path or URL lies under one of them."""

    def __init__(self, roots: Iterable[str] = ()) -> None:
        self.roots = tuple(roots)
        local: list[str] = []
        urls: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
        for root in self.roots:
            try:
                if not is_url(root):
                    local.append(os.path.realpath(root))
                    continue
                scheme, rest = self._split(root)
                if scheme in LOCAL_SCHEMES:
                    local.append(os.path.realpath(self._file_path(rest)))
                    continue
                if not rest.strip("/"):
                    raise _Refused("names a whole scheme: give a bucket or a prefix")
                raw, decoded = _segments(rest)
                urls.append((scheme, raw, decoded))
            except (_Refused, UnicodeDecodeError, ValueError) as exc:
                raise BadRoot(f"{root!r} {exc}") from None
        self.local = tuple(local)
        self.urls = tuple(urls)

    def __bool__(self) -> bool:
        return bool(self.roots)

    @staticmethod
    def _split(url: str) -> tuple[str, str]:
        scheme, _, rest = url.partition("://")
        if not _SCHEME.match(scheme):
            raise _Refused(f"is not a URL this master can read (its scheme {scheme!r})")
        return scheme.lower(), rest

    @staticmethod
    def _file_path(rest: str) -> str:
        """The absolute path a `file://` URL names: `file:///PATH` only (fsspec reads
        `file://host/PATH` as a relative path, so that spelling is no local path at all)."""
        if not rest.startswith("/"):
            raise _Refused("is a file URL without an absolute path: write file:///PATH")
        return rest

    def check(self, path: str, pattern: str | None = None) -> None:
        """Refuse `path` (a pattern, or a file that `pattern` matched) unless the roots allow
        it: PermissionDeniedError naming the pattern, before anything is opened or listed."""
        pattern = path if pattern is None else pattern
        if "\x00" in path:
            raise DatasetError(f"no valid dataset specified: bad pattern {pattern!r} (a NUL)")
        try:
            self._check(path)
        except _Refused as exc:
            what = "" if path == pattern else f"matches {path!r}, which "
            raise PermissionDeniedError(
                f"permission denied: dataset pattern {pattern!r} {what}{exc}"
            ) from None

    def check_all(self, patterns: Sequence[str]) -> None:
        """`check` every pattern (not what they match: the caller lists them, then checks)."""
        for pattern in patterns:
            if isinstance(pattern, str) and pattern:  # expand_globs names a bad one
                self.check(pattern)

    def _check(self, path: str) -> None:
        if "::" in path:  # fsspec chaining would open a second URL the roots never named
            raise _Refused("chains URLs (::), which is not allowed")
        if not is_url(path):
            if self.roots:
                self._check_local(path)
            return
        if not self.roots:
            raise _Refused(
                "is a URL, and this master reads local paths only; start it with "
                "--data-root SCHEME://PREFIX to allow URLs under that prefix"
            )
        scheme, rest = self._split(path)
        if scheme in LOCAL_SCHEMES:
            self._check_local(self._file_path(rest))
            return
        try:
            raw, decoded = _segments(rest)
        except UnicodeDecodeError:
            raise _Refused("holds percent-encoded bytes that are not UTF-8") from None
        for s, root_raw, root_decoded in self.urls:
            if (
                s == scheme
                and raw[: len(root_raw)] == root_raw
                and decoded[: len(root_decoded)] == root_decoded
            ):
                return
        if not self.urls:
            raise _Refused("is a URL, and the master's data roots are all local directories")
        allowed = ", ".join(r for r in self.roots if is_url(r))
        raise _Refused(f"is outside the master's URL data roots ({allowed})")

    def _check_local(self, path: str) -> None:
        if not self.local:
            raise _Refused("is a local path, and the master's data roots are all URLs")
        resolved = os.path.realpath(path)
        if not any(_within(resolved, root) for root in self.local):
            raise _Refused(f"is outside the master's data roots ({', '.join(self.local)})")

"""Dataset files behind URLs (s3://, gs://, file://, ...), read through fsspec.

Object stores are latency-bound: one ranged GET costs a round trip whatever its size, so
`read_ranges` folds neighbouring ranges separated by small gaps into one request and keeps
several requests in flight. Files opened for indexing use a small read-ahead block, since an
index walk reads a few header bytes per chunk and s3fs's default block is tens of MiB.

`storage_options` are handed to the fsspec filesystem as they are (credentials, an endpoint,
...); they are never logged, and `scrub` removes their values from any error text that might
quote them. Without them each library finds its credentials in its usual places.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

DEFAULT_CONCURRENCY = 8  # ranged requests in flight per read_ranges call
DEFAULT_GAP = 64 * 1024  # neighbouring ranges closer than this are fetched in one request
DEFAULT_MERGE_LIMIT = 16 * 1024 * 1024  # a coalesced request spans at most this many bytes
DEFAULT_BLOCK_SIZE = 256 * 1024  # read-ahead block of files opened for indexing

_BUCKETED = ("s3", "s3a", "gs", "gcs", "az", "abfs", "oss")  # a path's first part: the bucket
_UNLISTED = ("http", "https")  # no listing: fsspec would scrape a page's links for one
_SECRET_MIN = 4  # option values shorter than this are too common to scrub from text


def has_url_scheme(path: str) -> bool:
    """Whether `path` starts with a well-formed scheme and `://` (`s3://...`, `file://...`):
    what a reader opens as a URL. The master's `roots.is_url` is broader (any `://`), so that
    nothing fsspec might take for a URL passes the data roots as a path."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum()


def is_remote(path: str) -> bool:
    """A URL read through fsspec (`file://` URLs are local files, read directly)."""
    return has_url_scheme(path) and not path.startswith("file://")


def local_path(path: str) -> str:
    """The local path a `file://` URL (or a plain path) names."""
    return path[len("file://") :] if path.startswith("file://") else path


def _secrets(options: Mapping[str, Any]) -> Iterator[str]:
    for value in options.values():
        if isinstance(value, Mapping):
            yield from _secrets(value)
        elif isinstance(value, str) and len(value) >= _SECRET_MIN:
            yield value


def scrub(text: str, options: Mapping[str, Any] | None) -> str:
    """`text` with every string value of `options` replaced by `***`."""
    if not options:
        return text
    for secret in sorted(set(_secrets(options)), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def coalesce(
    ranges: Sequence[tuple[int, int]], gap: int, limit: int
) -> list[tuple[int, int, list[int]]]:
    """Requests `(start, end, [indexes of ranges it serves])` covering `ranges`: ranges sorted by
    offset and separated by at most `gap` bytes share a request spanning at most `limit` bytes
    (a single larger range still gets its own)."""
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    out: list[tuple[int, int, list[int]]] = []
    for i in order:
        offset, length = ranges[i]
        end = offset + max(length, 0)
        if out:
            start, last, members = out[-1]
            if offset - last <= gap and max(end, last) - start <= limit:
                out[-1] = (start, max(end, last), [*members, i])
                continue
        out.append((offset, end, [i]))
    return out


class FsspecStorage:
    """`formats.base.Storage` for URLs. Thread-safe: fsspec's async filesystems run their
    requests on their own event loop thread, whichever thread asks."""

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        gap: int = DEFAULT_GAP,
        merge_limit: int = DEFAULT_MERGE_LIMIT,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self._options = dict(storage_options or {})
        self.concurrency = concurrency
        self.gap = gap
        self.merge_limit = merge_limit
        self.block_size = block_size
        self._lock = threading.Lock()
        self._filesystems: dict[str, Any] = {}  # protocol and URL's arguments -> filesystem
        self._sizes: dict[str, int] = {}  # URL -> bytes, learnt from listings

    # ---- plumbing ----------------------------------------------------------------------------

    def _fs(self, url: str) -> tuple[Any, str]:
        """The filesystem serving `url`, and the path it knows the file by."""
        import fsspec  # lazy: importing fsspec and its backends costs tens of ms

        protocol, sep, rest = url.partition("://")
        protocol = protocol.lower()
        url = protocol + sep + rest  # filesystems strip only their scheme in lower case
        try:
            cls = fsspec.get_filesystem_class(protocol)
            from_url = cls._get_kwargs_from_urls(url)  # ftp://host:port/...: host and port
        except ImportError as exc:
            raise OSError(
                f"{url}: no fsspec filesystem for {protocol}:// is installed "
                f"({self.scrub(str(exc))}); for s3:// install chunkmaster[s3]"
            ) from None
        except Exception as exc:
            raise self._error(url, exc) from None
        key = f"{protocol}:{sorted(from_url.items())!r}"
        with self._lock:
            fs = self._filesystems.get(key)
            if fs is None:
                try:
                    fs = cls(**{**from_url, **self._options})
                except Exception as exc:
                    raise self._error(url, exc) from None
                self._filesystems[key] = fs
        return fs, fs._strip_protocol(url)

    def _url(self, fs: Any, path: str) -> str:
        """The URL of a path `fs` listed (an HTTP filesystem's paths are whole URLs already)."""
        return str(fs.unstrip_protocol(path))

    def scrub(self, text: str) -> str:
        return scrub(text, self._options)

    def _error(self, url: str, exc: BaseException) -> OSError:
        """`exc` as an OSError naming `url`, its text free of the storage options' values."""
        why = self.scrub(str(exc)) or type(exc).__name__
        if isinstance(exc, FileNotFoundError):
            return FileNotFoundError(f"{url}: not found ({why})")
        if isinstance(exc, PermissionError):
            return PermissionError(f"{url}: access denied ({why})")
        return OSError(f"{url}: {type(exc).__name__}: {why}")

    # ---- listing -----------------------------------------------------------------------------

    def expand(self, pattern: str) -> list[str]:
        """The files matching a URL glob (a plain URL matches itself if it is a file), sorted;
        their sizes are kept from the listing, so `size` costs no request for them."""
        fs, path = self._fs(pattern)
        wild = any(c in path for c in "*?[")
        if wild and pattern.partition("://")[0].lower() in _UNLISTED:
            raise OSError(
                f"{pattern}: HTTP has no listing (a page's links are not one): name each file, "
                "without *, ? or ["
            )
        try:
            fs.invalidate_cache()  # list what is there now, not what an earlier listing saw
            if not wild:
                info = fs.info(path)
                found = {path: info} if info.get("type") != "directory" else {}
            else:
                found = fs.glob(path, detail=True)
        except FileNotFoundError:
            found = {}
        except Exception as exc:
            raise self._error(pattern, exc) from None
        if not found:
            self._check_bucket(fs, path, pattern)
        urls = []
        with self._lock:
            for name, info in found.items():
                if info.get("type") == "directory":
                    continue
                url = self._url(fs, name)
                size = info.get("size")
                if isinstance(size, int):
                    self._sizes[url] = size
                urls.append(url)
        return sorted(urls)

    def _check_bucket(self, fs: Any, path: str, pattern: str) -> None:
        """An object store's empty listing: FileNotFoundError if the bucket itself is missing
        (a typo there is the likely mistake, and the listing does not tell)."""
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if protocol not in _BUCKETED:
            return
        bucket = path.split("/", 1)[0]
        try:
            there = bool(fs.exists(bucket))
        except Exception as exc:
            raise self._error(pattern, exc) from None
        if not there:
            raise FileNotFoundError(f"{pattern}: the bucket {bucket!r} does not exist")

    # ---- Storage -----------------------------------------------------------------------------

    def open(self, path: str) -> IO[bytes]:
        """A buffered file; a size learnt from the listing spares the request that asks it."""
        fs, p = self._fs(path)
        with self._lock:
            known = self._sizes.get(path)
        kwargs: dict[str, Any] = {"block_size": self.block_size, "cache_type": "readahead"}
        try:
            try:
                f: IO[bytes] = fs.open(
                    p, "rb", **kwargs, **({} if known is None else {"size": known})
                )
            except TypeError:  # a filesystem whose files take no size
                f = fs.open(p, "rb", **kwargs)
        except Exception as exc:
            raise self._error(path, exc) from None
        return f

    def size(self, path: str) -> int:
        with self._lock:
            known = self._sizes.get(path)
        if known is not None:
            return known
        fs, p = self._fs(path)
        try:
            size = int(fs.size(p))
        except Exception as exc:
            raise self._error(path, exc) from None
        with self._lock:
            self._sizes[path] = size
        return size

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if not ranges:
            return []
        fs, p = self._fs(path)
        size = self.size(path)
        # Clamp to the file: a range past its end comes back short, never as an error.
        clamped = [(min(o, size), max(0, min(o + n, size) - min(o, size))) for o, n in ranges]
        requests = coalesce(clamped, self.gap, self.merge_limit)
        live = [r for r in requests if r[1] > r[0]]
        try:
            if len(live) == 1 or not getattr(fs, "async_impl", False):
                blobs = [fs.cat_file(p, start=s, end=e) for s, e, _ in live]
            else:
                blobs = fs.cat_ranges(
                    [p] * len(live),
                    [s for s, _, _ in live],
                    [e for _, e, _ in live],
                    batch_size=self.concurrency,
                    on_error="return",
                )
        except Exception as exc:
            raise self._error(path, exc) from None
        out = [b""] * len(ranges)
        for (start, end, members), blob in zip(live, blobs, strict=True):
            if isinstance(blob, BaseException):
                raise self._error(path, blob)
            if len(blob) != end - start:  # e.g. an HTTP server that sends the whole file
                raise OSError(
                    f"{path}: asked for the byte range {start}-{end - 1}, got {len(blob)} bytes "
                    "(a server that ignores byte ranges cannot serve a dataset)"
                )
            view = memoryview(blob)
            for i in members:
                o, n = clamped[i]
                out[i] = bytes(view[o - start : o - start + n]) if len(members) > 1 else blob
        return out


_shared: dict[str, FsspecStorage] = {}
_shared_lock = threading.Lock()


def shared(storage_options: Mapping[str, Any] | None = None) -> FsspecStorage:
    """One FsspecStorage per distinct `storage_options` in this process, so what a listing
    learnt (sizes) and the filesystems' connection pools serve every later read."""
    import json

    key = json.dumps(storage_options or {}, sort_keys=True, default=repr)
    with _shared_lock:
        storage = _shared.get(key)
        if storage is None:
            storage = _shared[key] = FsspecStorage(storage_options)
        return storage

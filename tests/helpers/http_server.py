"""A static HTTP server for tests: a directory served on a random loopback port from a thread
of the test process, answering byte ranges (`Range: bytes=A-B`) with 206 as web servers and
object stores do. With `ranges=False` it ignores them and always sends the whole file, as
Python's own `http.server` does. Every requested path is kept in `requests`."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import threading
from functools import partial
from pathlib import Path
from typing import Any

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the test reads `requests`, not stderr

    def send_head(self) -> Any:
        self.server.requests.append(self.path)
        path = self.translate_path(self.path)
        match = _RANGE.match(self.headers.get("Range", ""))
        if not self.server.ranges or match is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start = int(match.group(1))
        end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
        if start >= size or end < start:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        f = open(path, "rb")  # noqa: SIM115 - copyfile closes it, as the base class does
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._left = end - start + 1
        return f

    def copyfile(self, source: Any, outputfile: Any) -> None:
        left = getattr(self, "_left", None)
        if left is None:
            shutil.copyfileobj(source, outputfile)
            return
        del self._left
        while left > 0:
            block = source.read(min(left, 64 * 1024))
            if not block:
                break
            outputfile.write(block)
            left -= len(block)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    ranges = True
    requests: list[str]


class HttpServer:
    """`directory` served at `url` (http://127.0.0.1:PORT) until `stop()`."""

    def __init__(self, directory: Path, *, ranges: bool = True) -> None:
        handler = partial(_Handler, directory=str(directory))
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.ranges = ranges
        self._server.requests = []
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def requests(self) -> list[str]:
        return list(self._server.requests)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> HttpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
